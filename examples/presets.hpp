// SPDX-License-Identifier: Apache-2.0
// The presets of megamoe-train and megamoe-checkpoint: complete configuration types (the model
// slot included) that leave every parallel degree to the job.
#pragma once

#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/expert/tile_gemm.hpp>
#include <megamoe/model/mla.hpp>

#include <array>
#include <string>
#include <string_view>

namespace megamoe::presets {

namespace mm = megamoe;
namespace rt = megamoe::router;
namespace md = megamoe::model;

/// Every parallel degree is left to the job: TP, CP and PP from their flags (1 for now), ETP
/// following TP, EP taking the expert grid's ranks (or --ep).
using job_mapping =
    mm::parallel::mapping<mm::parallel::tp<mm::dynamic>, mm::parallel::cp<mm::dynamic>,
                          mm::parallel::pp<mm::dynamic>, mm::parallel::ep<mm::dynamic>>;

template <int H, int F, int E, class Router, class Model, class Precision = mm::precision::fp32,
          class Backend = mm::expert::grouped, class Memory = mm::memory::keep_all>
using preset_config =
    mm::make_config<mm::shape<mm::hidden<H>, mm::ffn<F>, mm::experts<E>>, Router,
                    mm::dispatch::all_to_all, mm::expert::mlp<mm::expert::swiglu, Backend>,
                    Precision, job_mapping, Model, Memory>;

/// Each preset is a template over the precision recipe, the GEMM backend and the memory plan
/// (`<name>_config_in`); `<name>_config` is its fp32 configuration.
/// tiny: quick runs; small (default): 4 layers, MoE every other layer, 8 experts top-2;
/// fine: fine-grained experts, every layer MoE, 16 experts top-4 with the aux-loss-free router.
template <class Precision, class Backend = mm::expert::grouped, class Memory = mm::memory::keep_all>
using tiny_config_in =
    preset_config<64, 128, 4, rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>,
                  md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<mm::dynamic>,
                              md::dense_ffn<256>, md::moe_layer_freq<2>>,
                  Precision, Backend, Memory>;
using tiny_config = tiny_config_in<mm::precision::fp32>;
template <class Precision, class Backend = mm::expert::grouped, class Memory = mm::memory::keep_all>
using small_config_in =
    preset_config<128, 256, 8, rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>,
                  md::decoder<md::layers<4>, md::heads<4>, md::vocabulary<mm::dynamic>,
                              md::dense_ffn<512>, md::moe_layer_freq<2>>,
                  Precision, Backend, Memory>;
using small_config = small_config_in<mm::precision::fp32>;
template <class Precision, class Backend = mm::expert::grouped, class Memory = mm::memory::keep_all>
using fine_config_in =
    preset_config<128, 96, 16, rt::aux_loss_free<4, rt::seq_aux_loss<1e-4>>,
                  md::decoder<md::layers<4>, md::heads<4>, md::vocabulary<mm::dynamic>>, Precision,
                  Backend, Memory>;
using fine_config = fine_config_in<mm::precision::fp32>;
/// medium: big enough that compute decides the step: H 512, 8 layers of 8 heads, MoE every other
/// layer (16 experts of width 1024, top-2), dense SwiGLU layers of width 2048; megamoe-train runs
/// it with sequences of 256 bytes, 8 per micro-batch.
template <class Precision, class Backend = mm::expert::grouped, class Memory = mm::memory::keep_all>
using medium_config_in =
    preset_config<512, 1024, 16, rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>,
                  md::decoder<md::layers<8>, md::heads<8>, md::vocabulary<mm::dynamic>,
                              md::dense_ffn<2048>, md::moe_layer_freq<2>>,
                  Precision, Backend, Memory>;
using medium_config = medium_config_in<mm::precision::fp32>;
/// dense: `small` with each MoE layer's FFN a dense SwiGLU FFN of the experts' width (256), the
/// model `--upcycle` starts `small` from. Such a layer is one expert with top-1 routing, whose
/// probability is exactly 1; model.safetensors names it as the reference names a dense FFN.
template <class Precision, class Backend = mm::expert::grouped, class Memory = mm::memory::keep_all>
using dense_config_in =
    preset_config<128, 256, 1, rt::top_k<1, rt::softmax_before_topk>,
                  md::decoder<md::layers<4>, md::heads<4>, md::vocabulary<mm::dynamic>,
                              md::dense_ffn<512>, md::moe_layer_freq<2>>,
                  Precision, Backend, Memory>;
using dense_config = dense_config_in<mm::precision::fp32>;
/// The reference's model families scaled down with their proportions (megamoe-train's
/// family presets):
/// qwen3: Qwen3-MoE's: hidden 256, 6 layers all MoE, grouped-query attention (8 heads, 2 query
/// groups) with QK layernorm, 32 experts of width 128 top-4 with softmax scores over the chosen
/// experts and the global aux loss 1e-3, RoPE base 1e6.
template <class Precision, class Backend = mm::expert::grouped, class Memory = mm::memory::keep_all>
using qwen3_config_in =
    preset_config<256, 128, 32, rt::top_k<4, rt::global_aux_loss<1e-3>>,
                  md::decoder<md::layers<6>, md::heads<8>, md::query_groups<2>,
                              md::vocabulary<mm::dynamic>, md::qk_layernorm<>, md::rope_base<1e6>>,
                  Precision, Backend, Memory>;
using qwen3_config = qwen3_config_in<mm::precision::fp32>;
/// mixtral: Mixtral's: hidden 256, 4 layers all MoE, grouped-query attention (8 heads, 2 query
/// groups), 8 experts of width 512 top-2 with softmax after top-k and the aux loss 1e-2, RoPE
/// base 1e6.
template <class Precision, class Backend = mm::expert::grouped, class Memory = mm::memory::keep_all>
using mixtral_config_in =
    preset_config<256, 512, 8, rt::top_k<2, rt::aux_loss<1e-2>>,
                  md::decoder<md::layers<4>, md::heads<8>, md::query_groups<2>,
                              md::vocabulary<mm::dynamic>, md::rope_base<1e6>>,
                  Precision, Backend, Memory>;
using mixtral_config = mixtral_config_in<mm::precision::fp32>;
/// deepseek: DeepSeek-V3's: hidden 256, 6 layers (the first dense, SwiGLU of width 1024, the
/// rest MoE), multi-head latent attention (4 heads, q_lora_rank 96, kv_lora_rank 64, qk_head_dim
/// 32, qk_pos_emb_head_dim 16, v_head_dim 32) with its latents normed (qk_layernorm), 32 routed
/// experts of width 128 top-4 with sigmoid scores and the expert bias, 4 groups of which the top
/// 2, scaling 2.5, one shared expert of width 128, the sequence aux loss 1e-4, one
/// multi-token prediction depth with loss scale 0.1, and DeepSeek-V3's RMSNorm epsilon 1e-6.
template <class Precision, class Backend = mm::expert::grouped, class Memory = mm::memory::keep_all>
using deepseek_config_in =
    mm::make_config<mm::shape<mm::hidden<256>, mm::ffn<128>, mm::experts<32>, mm::shared_ffn<128>>,
                    rt::aux_loss_free<4, rt::group_limit<4, 2>, rt::topk_scaling_factor<2.5>,
                                      rt::seq_aux_loss<1e-4>>,
                    mm::dispatch::all_to_all, mm::expert::mlp<mm::expert::swiglu, Backend>,
                    Precision, job_mapping,
                    md::decoder<md::layers<6>, md::heads<4>, md::vocabulary<mm::dynamic>,
                                md::dense_ffn<1024>, md::moe_layer_pattern<0, 1, 1, 1, 1, 1>,
                                md::multi_latent_attention<96, 64, 32, 16, 32>, md::qk_layernorm<>,
                                md::multi_token_prediction<1, 0.1>, md::norm_epsilon<1e-6>>,
                    Memory>;
using deepseek_config = deepseek_config_in<mm::precision::fp32>;
static_assert(mm::rules::check<qwen3_config>() && mm::rules::check<mixtral_config>() &&
              mm::rules::check<deepseek_config>());

static_assert(mm::rules::check<tiny_config>() && mm::rules::check<small_config>() &&
              mm::rules::check<fine_config>() && mm::rules::check<medium_config>() &&
              mm::rules::check<dense_config>());

/// The presets by name, with the defaults each gives megamoe-train where they differ from the
/// job's (train::job_options): medium's longer sequences in smaller micro-batches, and fewer steps
/// for the model families, whose FLOPs per token are about three times small's, so that a
/// default run ends in under 10 minutes on two cores.
struct preset_defaults {
  char const* name;
  int steps = 700, seq_len = 128, micro_batch = 16;
};
inline constexpr std::array<preset_defaults, 8> preset_table{{{"tiny"},
                                                              {"small"},
                                                              {"fine"},
                                                              {"medium", 700, 256, 8},
                                                              {"dense"},
                                                              {"qwen3", 120},
                                                              {"mixtral", 160},
                                                              {"deepseek", 100}}};

/// The preset called `name` (small's defaults where none is).
inline preset_defaults const& preset_named(std::string const& name) {
  for (auto const& p : preset_table)
    if (name == p.name) return p;
  return preset_table[1];
}

/// The precision recipes by their command-line names (moe_layer_bench's): every linear layer's
/// GEMMs read the recipe's operands. megamoe-train builds every recipe for every preset, each a
/// configuration of its own.
inline constexpr std::array<std::string_view, 7> precision_names = {
    "fp32", "bf16", "fp8_delayed", "fp8_current", "fp8_blockwise", "mxfp8", "nvfp4"};

/// The GEMM backends by their command-line names: `grouped` (fp32 units) for every recipe, the
/// BF16 units (`avx512_bf16`, `amx`) built for the bf16 recipe on small and medium (the speed
/// comparison).
inline bool bf16_units_built_for(std::string const& preset, std::string const& precision) {
  return precision == "bf16" && (preset == "small" || preset == "medium");
}

/// The linear weights held as the recipe's codes, their fp32 masters in the optimizer
/// (memory::quantized_weights; the reference's --fp8-param-gather and --fp4-param-gather): built
/// for the FP8 and FP4 recipes on the small preset.
inline bool quantized_weights_built_for(std::string const& preset) {
  return preset == "small";
}
using quantized_weights_plan = mm::memory::plan<mm::memory::quantized_weights>;

/// Adam's moments in BF16 (the precision-aware optimizer): each configuration with them is a
/// second build of the whole job, so they are built where the memory study runs: small and medium
/// with their weights in fp32, under every recipe.
inline bool bf16_moments_built_for(std::string const& preset, bool quantized_weights) {
  return (preset == "small" || preset == "medium") && !quantized_weights;
}

/// Calls run.template operator()<Preset<Precision, Backend, Memory>>() with the fp32 recipe, or
/// bf16 on the backend named `backend` (grouped otherwise; the BF16 units where `Units`).
template <template <class, class, class> class Preset, bool Units, class Run>
auto with_unquantized_recipe(std::string const& precision, std::string const& backend, Run& run) {
  namespace pr = mm::precision;
  using mm::expert::grouped;
  using keep = mm::memory::keep_all;
#if MEGAMOE_HAS_AMX_INTRINSICS
  if constexpr (Units) {
    if (precision == "bf16" && backend == "amx")
      return run.template operator()<Preset<pr::bf16, mm::expert::amx, keep>>();
    if (precision == "bf16" && backend == "avx512_bf16")
      return run.template operator()<Preset<pr::bf16, mm::expert::avx512_bf16, keep>>();
  }
#endif
  if (precision == "bf16") return run.template operator()<Preset<pr::bf16, grouped, keep>>();
  return run.template operator()<Preset<pr::fp32, grouped, keep>>();
}

/// The same with the FP8 or FP4 recipe named `precision` (nvfp4 otherwise) on the grouped
/// backend, with memory plan Memory (quantized_weights_plan: the linear weights held as codes).
template <template <class, class, class> class Preset, class Memory = mm::memory::keep_all,
          class Run>
auto with_quantized_recipe(std::string const& precision, Run& run) {
  namespace pr = mm::precision;
  using mm::expert::grouped;
  if (precision == "fp8_delayed")
    return run.template operator()<Preset<pr::fp8_tensorwise<pr::delayed>, grouped, Memory>>();
  if (precision == "fp8_current")
    return run.template operator()<Preset<pr::fp8_tensorwise<pr::current>, grouped, Memory>>();
  if (precision == "fp8_blockwise")
    return run.template operator()<Preset<pr::fp8_blockwise, grouped, Memory>>();
  if (precision == "mxfp8") return run.template operator()<Preset<pr::mxfp8, grouped, Memory>>();
  return run.template operator()<Preset<pr::nvfp4, grouped, Memory>>();
}

/// Calls run.template operator()<Config>() with the fp32 configuration of the preset named
/// `name` (tiny, small, fine, medium, dense; small otherwise) and returns what it returns.
template <class Run>
auto with_preset(std::string const& name, Run& run) {
  if (name == "tiny") return run.template operator()<tiny_config>();
  if (name == "fine") return run.template operator()<fine_config>();
  if (name == "medium") return run.template operator()<medium_config>();
  if (name == "dense") return run.template operator()<dense_config>();
  return run.template operator()<small_config>();
}

}  // namespace megamoe::presets
