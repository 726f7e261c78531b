// SPDX-License-Identifier: Apache-2.0
// Static tests of configuration types: if this file compiles, they pass. Negative checks use
// concepts and `requires`, which reject without stopping the build (mp-units' habit).
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/config/values.hpp>

#include <type_traits>

namespace {
namespace mm = megamoe;
namespace r = megamoe::router;

using small = mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>;

// --- make_config: any order, defaults from megamoe::defaults -------------------------------------
using a = mm::make_config<small, r::top_k<4>, mm::dispatch::all_to_all, mm::precision::bf16>;
using b = mm::make_config<mm::precision::bf16, mm::dispatch::all_to_all, r::top_k<4>, small>;
static_assert(std::is_same_v<a, b>);
static_assert(std::is_same_v<a::expert, mm::defaults::expert>);
static_assert(std::is_same_v<a::memory, mm::defaults::memory>);
static_assert(std::is_same_v<
              mm::make_config<small>,
              mm::basic_config<small, mm::defaults::router, mm::defaults::dispatch,
                               mm::defaults::expert, mm::defaults::precision,
                               mm::defaults::parallel, mm::defaults::memory, mm::defaults::model>>);

// The defaults of megamoe::defaults are the defaults of config_values (what describe() marks).
constexpr auto defaults_values = mm::values_of<mm::make_config<small>>();
static_assert(defaults_values.router == mm::config_values{}.router);
static_assert(defaults_values.names == mm::config_values{}.names);
static_assert(defaults_values.expert == mm::config_values{}.expert);
static_assert(defaults_values.precision == mm::config_values{}.precision);
static_assert(defaults_values.parallel == mm::config_values{}.parallel);
static_assert(defaults_values.memory == mm::config_values{}.memory);
static_assert(defaults_values.dispatch == mm::config_values{}.dispatch);
static_assert(defaults_values.model == mm::config_values{}.model);

// The model slot: sizes by name in any order, query groups following heads, the MoE pattern.
namespace md = mm::model;
constexpr auto decoder_values =
    md::decoder<md::moe_layer_freq<2>, md::vocabulary<256>, md::heads<4>, md::layers<6>,
                md::dense_ffn<96>, md::norm_epsilon<1e-6>>::value;
static_assert(decoder_values.layers == 6 && decoder_values.heads == 4 &&
              decoder_values.query_groups == 4 && decoder_values.vocabulary == 256 &&
              decoder_values.dense_ffn == 96 && decoder_values.norm_epsilon == 1e-6 &&
              decoder_values.rope_base == 10000.0);
static_assert(decoder_values.is_moe(0) && !decoder_values.is_moe(1) && decoder_values.is_moe(4) &&
              decoder_values.has_dense_layer());
constexpr auto listed_values = md::decoder<md::layers<3>, md::moe_layer_pattern<0, 1, 1>>::value;
static_assert(!listed_values.is_moe(0) && listed_values.is_moe(1) && listed_values.is_moe(2) &&
              !listed_values.is_moe(3) && listed_values.has_dense_layer());
static_assert(md::decoder<md::heads<8>, md::query_groups<2>>::value.query_groups == 2);
static_assert(md::decoder<>::value.heads == mm::dynamic &&
              md::decoder<>::value.query_groups == mm::dynamic);
static_assert(mm::model_policy<md::decoder<>> && !mm::model_policy<small>);
// MLA's sizes by the reference's names; none without it.
constexpr auto latent_values =
    md::decoder<md::heads<4>, md::multi_latent_attention<96, 64, 32, 16, 32>>::value;
static_assert(latent_values.mla.enabled() && latent_values.mla.q_lora_rank == 96 &&
              latent_values.mla.kv_lora_rank == 64 && latent_values.mla.qk_head_dim == 32 &&
              latent_values.mla.qk_pos_emb_head_dim == 16 && latent_values.mla.v_head_dim == 32 &&
              latent_values.query_groups == 4);
static_assert(!decoder_values.mla.enabled());

// A struct with named slots is a configuration just as well.
struct named : mm::defaults {
  using shape = small;
  using router = mm::router::top_k<2, mm::router::aux_loss<1e-2>>;
};
static_assert(mm::training_config<named>);
static_assert(mm::rules::check<named>());
static_assert(mm::values_of<named>().router->aux_loss_coeff == 1e-2);

// --- slot concepts accept their own kind only
// ------------------------------------------------------
static_assert(mm::shape_policy<small>);
static_assert(mm::router_policy<r::top_k<2>> && mm::router_policy<r::runtime>);
static_assert(mm::static_router_policy<r::aux_loss_free<2>> &&
              !mm::static_router_policy<r::runtime>);
static_assert(mm::dispatch_policy<mm::dispatch::hierarchical<>>);
static_assert(mm::expert_policy<mm::expert::mlp<mm::expert::gelu, mm::expert::grouped>>);
static_assert(mm::precision_recipe<mm::precision::fp8_tensorwise<mm::precision::current>>);
static_assert(mm::parallel_mapping<mm::parallel::mapping<mm::parallel::ep<2>>>);
static_assert(mm::memory_policy<mm::memory::recompute<mm::memory::moe_act>>);
static_assert(!mm::router_policy<int> && !mm::router_policy<small>);
static_assert(!mm::shape_policy<r::top_k<2>>);
static_assert(!mm::dispatch_policy<mm::expert::mlp<>>);
static_assert(!mm::precision_recipe<mm::memory::keep_all>);
static_assert(!mm::parallel_mapping<mm::parallel::ep<2>>);  // a degree, not a mapping

struct missing_router {
  using shape = small;
  using dispatch = mm::dispatch::local;
  using expert = mm::expert::mlp<>;
  using precision = mm::precision::fp32;
  using parallel = mm::parallel::mapping<>;
  using memory = mm::memory::keep_all;
  using model = mm::model::decoder<>;
};
static_assert(!mm::training_config<missing_router>);
struct router_in_the_wrong_slot : missing_router {
  using router = mm::dispatch::local;
};
static_assert(!mm::training_config<router_in_the_wrong_slot>);

// Constrained templates reject what cannot be a choice.
template <template <class> class Dtype>
concept dtype_rejects_int = requires {
  requires !requires {
    typename Dtype<int>;
  };
};
static_assert(dtype_rejects_int<r::dtype>);
static_assert(requires { typename r::dtype<double>; });
template <template <class> class H>
concept hierarchical_rejects_all_gather = requires {
  requires !requires {
    typename H<mm::dispatch::all_gather>;
  };
};
static_assert(hierarchical_rejects_all_gather<mm::dispatch::hierarchical>);

// --- each policy's choices land in its plain values
// ------------------------------------------------
constexpr auto routed =
    r::top_k<4, r::sigmoid, r::topk_scaling_factor<2.5>, r::group_limit<4, 2>, r::expert_bias<2e-3>,
             r::seq_aux_loss<1e-4>, r::z_loss<1e-3>, r::capacity<1.5, r::drop_position>,
             r::pad_to_capacity, r::pad_for_quantization<16>, r::dtype<double>,
             r::input_jitter<0.01>>::value;
static_assert(routed.top_k == 4 && routed.score == r::score_function::sigmoid);
static_assert(routed.topk_scaling_factor == 2.5 && routed.num_groups == 4 &&
              routed.group_top_k == 2);
static_assert(routed.expert_bias && routed.bias_update_rate == 2e-3);
static_assert(routed.seq_aux_loss_coeff == 1e-4 && !routed.aux_loss_coeff &&
              routed.z_loss_coeff == 1e-3);
static_assert(routed.capacity_factor == 1.5 &&
              routed.token_drop_policy == r::drop_policy::position);
static_assert(routed.pad_to_capacity && routed.pad_for_quantization &&
              routed.quantization_multiple == 16);
static_assert(routed.dtype == r::logits_dtype::fp64 && routed.input_jitter_eps == 0.01);

// Options in another order give the same settings.
static_assert(r::top_k<2, r::aux_loss<1e-2>, r::sigmoid>::value ==
              r::top_k<2, r::sigmoid, r::aux_loss<1e-2>>::value);

// aux_loss_free is top-k with the expert bias on and sigmoid scores unless told otherwise.
static_assert(r::aux_loss_free<8>::value == r::top_k<8, r::sigmoid, r::expert_bias<>>::value);
static_assert(r::aux_loss_free<8, r::sqrtsoftplus>::value.score == r::score_function::sqrtsoftplus);

static_assert(
    mm::expert::mlp<mm::expert::amx, mm::expert::squared_relu, mm::expert::with_bias>::value ==
    mm::expert::settings{mm::expert::activation_function::squared_relu,
                         mm::expert::gemm_backend::amx, true, false});
static_assert(mm::memory::recompute<mm::memory::moe_layer, mm::memory::shared_experts>::value ==
              mm::memory::settings{false, true, true, false, false});
static_assert(mm::memory::plan<mm::memory::quantized_weights, mm::memory::moe_act>::value ==
              mm::memory::settings{true, false, false, false, true});
static_assert(std::is_same_v<mm::memory::keep_all, mm::memory::recompute<>>);
static_assert(mm::memory::keep_all::name == "keep_all" &&
              mm::memory::recompute<mm::memory::moe_act>::name == "recompute");

// Precision recipes: padding multiples and which are quantized.
static_assert(mm::precision::fp8_tensorwise<mm::precision::delayed>::value.padding_multiple == 16);
static_assert(mm::precision::fp8_blockwise::value.padding_multiple == 16);
static_assert(mm::precision::mxfp8::value.padding_multiple == 32);
static_assert(mm::precision::nvfp4::value.padding_multiple == 128);
static_assert(mm::precision::is_quantized(mm::precision::mxfp8::value.recipe));
static_assert(!mm::precision::is_quantized(mm::precision::bf16::value.recipe));
static_assert(std::is_same_v<mm::precision::fp64::master_type, double>);
static_assert(mm::precision::fp8_tensorwise<
                  mm::precision::delayed_scaling<16, mm::precision::amax_compute::max, 1>>::value ==
              mm::precision::settings{mm::precision::recipe_id::fp8_delayed,
                                      mm::precision::fp8_format::hybrid, 16, 16,
                                      mm::precision::amax_compute::max, 1});

// --- the rules as predicates on the values of types (values_of does not run the checks)
// -----------
template <class... P>
constexpr mm::config_values values = mm::values_of<mm::make_config<P...>>();

static_assert(
    !mm::rules::ep_divides_experts(values<small, mm::parallel::mapping<mm::parallel::ep<3>>>));
static_assert(
    mm::rules::ep_divides_experts(values<small, mm::parallel::mapping<mm::parallel::ep<4>>>));
static_assert(!mm::rules::top_k_within_experts(values<small, r::top_k<9>>));
static_assert(
    !mm::rules::expert_bias_needs_sigmoid_family(values<small, r::top_k<2, r::expert_bias<>>>));
static_assert(!mm::rules::softmax_after_topk_needs_k_above_one(values<small, r::top_k<1>>));
static_assert(
    mm::rules::softmax_after_topk_needs_k_above_one(values<small, r::top_k<1, r::sinkhorn>>));
static_assert(!mm::rules::quantization_padding_matches_recipe(
    values<small, r::top_k<2, r::pad_for_quantization<32>>, mm::precision::fp8_blockwise>));
static_assert(mm::rules::quantization_padding_matches_recipe(
    values<small, r::top_k<2, r::pad_for_quantization<>>, mm::precision::nvfp4>));
static_assert(!mm::rules::quantized_storage_needs_quantized_recipe(
    values<small, mm::memory::plan<mm::memory::quantized_activations>>));
static_assert(mm::rules::quantized_storage_needs_quantized_recipe(
    values<small, mm::memory::plan<mm::memory::quantized_activations>, mm::precision::mxfp8>));
// A dynamic value passes at compile time and waits for start-up.
static_assert(mm::rules::ep_divides_experts(
    values<small, mm::parallel::mapping<mm::parallel::ep<mm::dynamic>>>));
static_assert(!mm::rules::values_resolved(
    values<small, mm::parallel::mapping<mm::parallel::ep<mm::dynamic>>>));
static_assert(!mm::rules::values_resolved(values<small, r::runtime>));

// The parallel mapping: defaults of 1, ETP following TP unless given.
static_assert(mm::parallel::mapping<>::value == mm::parallel::degrees{1, 1, 1, 1, 1});
static_assert(mm::parallel::mapping<mm::parallel::tp<4>>::etp == 4);
static_assert(mm::parallel::mapping<mm::parallel::tp<4>, mm::parallel::etp<1>>::etp == 1);
static_assert(
    mm::parallel::mapping<mm::parallel::ep<8>, mm::parallel::pp<2>, mm::parallel::cp<2>>::value ==
    mm::parallel::degrees{1, 2, 2, 1, 8});

// Shapes: named sizes in any order; a missing required size is 0, which R001 rejects.
static_assert(mm::shape<mm::experts<8>, mm::ffn<128>, mm::hidden<64>>::value == small::value);
static_assert(mm::shape<mm::hidden<64>>::num_experts == 0);
static_assert(!mm::rules::shape_sizes_valid(values<mm::shape<mm::hidden<64>, mm::ffn<128>>>));

}  // namespace
