// SPDX-License-Identifier: Apache-2.0
// The presets of megamoe-train and megamoe-checkpoint: complete configuration types (the model
// slot included) that leave every parallel degree to the job.
#pragma once

#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

#include <string>

namespace megamoe::presets {

namespace mm = megamoe;
namespace rt = megamoe::router;
namespace md = megamoe::model;

/// Every parallel degree is left to the job: TP, CP and PP from their flags (1 for now), ETP
/// following TP, EP taking the expert grid's ranks (or --ep).
using job_mapping =
    mm::parallel::mapping<mm::parallel::tp<mm::dynamic>, mm::parallel::cp<mm::dynamic>,
                          mm::parallel::pp<mm::dynamic>, mm::parallel::ep<mm::dynamic>>;

template <int H, int F, int E, class Router, class Model>
using preset_config = mm::make_config<mm::shape<mm::hidden<H>, mm::ffn<F>, mm::experts<E>>, Router,
                                      mm::dispatch::all_to_all, mm::expert::mlp<mm::expert::swiglu>,
                                      mm::precision::fp32, job_mapping, Model>;

/// tiny: quick runs; small (default): 4 layers, MoE every other layer, 8 experts top-2;
/// fine: fine-grained experts, every layer MoE, 16 experts top-4 with the aux-loss-free router.
using tiny_config = preset_config<64, 128, 4, rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>,
                                  md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<256>,
                                              md::dense_ffn<256>, md::moe_layer_freq<2>>>;
using small_config = preset_config<128, 256, 8, rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>,
                                   md::decoder<md::layers<4>, md::heads<4>, md::vocabulary<256>,
                                               md::dense_ffn<512>, md::moe_layer_freq<2>>>;
using fine_config = preset_config<128, 96, 16, rt::aux_loss_free<4, rt::seq_aux_loss<1e-4>>,
                                  md::decoder<md::layers<4>, md::heads<4>, md::vocabulary<256>>>;
/// medium: big enough that compute decides the step: H 512, 8 layers of 8 heads, MoE every other
/// layer (16 experts of width 1024, top-2), dense SwiGLU layers of width 2048; megamoe-train runs
/// it with sequences of 256 bytes, 8 per micro-batch.
using medium_config =
    preset_config<512, 1024, 16, rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>,
                  md::decoder<md::layers<8>, md::heads<8>, md::vocabulary<256>, md::dense_ffn<2048>,
                              md::moe_layer_freq<2>>>;
/// dense: `small` with each MoE layer's FFN a dense SwiGLU FFN of the experts' width (256), the
/// model `--upcycle` starts `small` from. Such a layer is one expert with top-1 routing, whose
/// probability is exactly 1; model.safetensors names it as the reference names a dense FFN.
using dense_config = preset_config<128, 256, 1, rt::top_k<1, rt::softmax_before_topk>,
                                   md::decoder<md::layers<4>, md::heads<4>, md::vocabulary<256>,
                                               md::dense_ffn<512>, md::moe_layer_freq<2>>>;
static_assert(mm::rules::check<tiny_config>() && mm::rules::check<small_config>() &&
              mm::rules::check<fine_config>() && mm::rules::check<medium_config>() &&
              mm::rules::check<dense_config>());

/// Calls run.template operator()<Config>() with the preset named `name` (tiny, small, fine,
/// medium, dense; small otherwise) and returns what it returns.
template <class Run>
auto with_preset(std::string const& name, Run& run) {
  if (name == "tiny") return run.template operator()<tiny_config>();
  if (name == "fine") return run.template operator()<fine_config>();
  if (name == "medium") return run.template operator()<medium_config>();
  if (name == "dense") return run.template operator()<dense_config>();
  return run.template operator()<small_config>();
}

}  // namespace megamoe::presets
