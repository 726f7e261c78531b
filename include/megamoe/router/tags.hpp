// SPDX-License-Identifier: Apache-2.0
// megamoe/router/tags.hpp — router policies and their options (tags and parameters only).
//
//   router::top_k<2>                                          softmax after top-k, no balancing
//   router::top_k<2, router::aux_loss<1e-2>, router::z_loss<1e-3>>
//   router::top_k<4, router::softmax_before_topk, router::topk_scaling_factor<2.5>>
//   router::aux_loss_free<8, router::group_limit<8, 4>, router::seq_aux_loss<1e-4>>   (sigmoid +
//   bias) router::top_k<2, router::capacity<1.25, router::drop_position>, router::pad_to_capacity>
//   router::runtime                                           every choice read at start-up
//
// Options come in any order, each kind at most once. Every choice lands in `router::settings`, the
// one plain-value form that the algorithms, the rules and describe() read, for static and run-time
// routers.
#pragma once

#include <megamoe/policy/policy.hpp>

#include <concepts>
#include <optional>
#include <string_view>

namespace megamoe::router {

/// The kind of the `router` slot.
struct kind {};

/// `moe_router_score_function` together with `moe_router_pre_softmax`.
enum class score_function { softmax_after_topk, softmax_before_topk, sigmoid, sqrtsoftplus };
/// `moe_token_drop_policy`.
enum class drop_policy { probs, position };
/// `moe_router_dtype`: the type of the gating GEMM output, the logits and the stored probs.
enum class logits_dtype { fp32, fp64 };

/// Every choice a router makes, as plain values (Megatron field names in the comments).
struct settings {
  int top_k = 2;  // moe_router_topk
  score_function score =
      score_function::softmax_after_topk;       // moe_router_score_function, _pre_softmax
  std::optional<double> topk_scaling_factor;    // moe_router_topk_scaling_factor
  int num_groups = 0;                           // moe_router_num_groups (0: no limit)
  int group_top_k = 0;                          // moe_router_group_topk
  std::optional<double> aux_loss_coeff;         // "aux_loss" in moe_router_load_balancing_type
  std::optional<double> seq_aux_loss_coeff;     // "seq_aux_loss"
  std::optional<double> global_aux_loss_coeff;  // "global_aux_loss"
  bool sinkhorn = false;                        // "sinkhorn"
  std::optional<double> z_loss_coeff;           // moe_z_loss_coeff
  bool expert_bias = false;                     // moe_router_enable_expert_bias
  double bias_update_rate = 1e-3;               // moe_router_bias_update_rate
  std::optional<double> capacity_factor;        // moe_expert_capacity_factor (none: dropless)
  drop_policy token_drop_policy = drop_policy::probs;  // moe_token_drop_policy
  bool pad_to_capacity = false;                        // moe_pad_expert_input_to_capacity
  bool pad_for_quantization = false;                   // moe_router_padding_for_quantization
  int quantization_multiple = 0;                       // 0: the precision recipe's multiple
  logits_dtype dtype = logits_dtype::fp32;             // moe_router_dtype
  std::optional<double> input_jitter_eps;              // moe_input_jitter_eps

  friend constexpr bool operator==(settings const&, settings const&) = default;
};

namespace option {
struct score_kind {};
struct scaling_kind {};
struct group_limit_kind {};
struct aux_loss_kind {};
struct seq_aux_loss_kind {};
struct global_aux_loss_kind {};
struct sinkhorn_kind {};
struct z_loss_kind {};
struct expert_bias_kind {};
struct capacity_kind {};
struct pad_to_capacity_kind {};
struct pad_for_quantization_kind {};
struct dtype_kind {};
struct input_jitter_kind {};
struct drop_policy_kind {};

using all_kinds =
    boost::mp11::mp_list<score_kind, scaling_kind, group_limit_kind, aux_loss_kind,
                         seq_aux_loss_kind, global_aux_loss_kind, sinkhorn_kind, z_loss_kind,
                         expert_bias_kind, capacity_kind, pad_to_capacity_kind,
                         pad_for_quantization_kind, dtype_kind, input_jitter_kind>;
}  // namespace option

/// Softmax over the k selected logits, so the k probs sum to 1 (the reference's default).
struct softmax_after_topk : megamoe::detail::set_field<option::score_kind, &settings::score,
                                                       score_function::softmax_after_topk> {};
/// Softmax over all experts, then the top k probs, not renormalised (`moe_router_pre_softmax`).
struct softmax_before_topk : megamoe::detail::set_field<option::score_kind, &settings::score,
                                                        score_function::softmax_before_topk> {};
/// sigma(z); renormalised over the k selected when k > 1.
struct sigmoid
    : megamoe::detail::set_field<option::score_kind, &settings::score, score_function::sigmoid> {};
/// sqrt(softplus(z)); renormalised over the k selected when k > 1.
struct sqrtsoftplus : megamoe::detail::set_field<option::score_kind, &settings::score,
                                                 score_function::sqrtsoftplus> {};

/// Multiplies the probs after normalisation (DeepSeek-V3 uses 2.5).
template <double Factor>
struct topk_scaling_factor {
  using option_kind = option::scaling_kind;
  static constexpr void apply(settings& s) { s.topk_scaling_factor = Factor; }
};

/// Group-limited routing: experts in NumGroups contiguous groups, tokens choose GroupTopK groups
/// first.
template <int NumGroups, int GroupTopK>
struct group_limit {
  using option_kind = option::group_limit_kind;
  static constexpr void apply(settings& s) {
    s.num_groups = NumGroups;
    s.group_top_k = GroupTopK;
  }
};

/// Switch-style load-balancing loss over the micro-batch, counts reduced over TPxCP.
template <double Coeff>
struct aux_loss {
  using option_kind = option::aux_loss_kind;
  static constexpr void apply(settings& s) { s.aux_loss_coeff = Coeff; }
};
/// The same loss per sequence, averaged over sequences.
template <double Coeff>
struct seq_aux_loss {
  using option_kind = option::seq_aux_loss_kind;
  static constexpr void apply(settings& s) { s.seq_aux_loss_coeff = Coeff; }
};
/// The same loss with counts reduced over TPxDPxCP and averaged over the global batch so far.
template <double Coeff>
struct global_aux_loss {
  using option_kind = option::global_aux_loss_kind;
  static constexpr void apply(settings& s) { s.global_aux_loss_coeff = Coeff; }
};
/// Sinkhorn balancing of the selection (training); no aux losses with it.
struct sinkhorn : megamoe::detail::set_flag<option::sinkhorn_kind, &settings::sinkhorn> {};
/// Router z-loss, coefficient Coeff.
template <double Coeff>
struct z_loss {
  using option_kind = option::z_loss_kind;
  static constexpr void apply(settings& s) { s.z_loss_coeff = Coeff; }
};
/// Aux-loss-free balancing: an fp32 per-expert bias used for selection only, updated once per
/// global batch by `bias += Rate * sign(mean(c) - c)`.
template <double Rate = 1e-3>
struct expert_bias {
  using option_kind = option::expert_bias_kind;
  static constexpr void apply(settings& s) {
    s.expert_bias = true;
    s.bias_update_rate = Rate;
  }
};

/// Capacity dropping keeps the tokens with the highest probs (`moe_token_drop_policy = probs`).
struct drop_probs {
  using option_kind = option::drop_policy_kind;
  static constexpr drop_policy value = drop_policy::probs;
};
/// Capacity dropping keeps the earliest tokens (`position`); ties go to the lowest token index.
struct drop_position {
  using option_kind = option::drop_policy_kind;
  static constexpr drop_policy value = drop_policy::position;
};

/// Expert capacity C = ceil(T*k/E * Factor); tokens beyond it are dropped by Drop.
template <double Factor, class Drop = drop_probs>
  requires std::same_as<typename Drop::option_kind, option::drop_policy_kind>
struct capacity {
  using option_kind = option::capacity_kind;
  static constexpr void apply(settings& s) {
    s.capacity_factor = Factor;
    s.token_drop_policy = Drop::value;
  }
};
/// Every expert receives exactly C rows; fillers carry prob 0 (static shapes).
struct pad_to_capacity
    : megamoe::detail::set_flag<option::pad_to_capacity_kind, &settings::pad_to_capacity> {};
/// Router-side padding of each expert's count to a multiple A with prob-0 fillers. Multiple 0 takes
/// the precision recipe's (16 FP8, 32 MXFP8, 128 NVFP4).
template <int Multiple = 0>
struct pad_for_quantization {
  using option_kind = option::pad_for_quantization_kind;
  static constexpr void apply(settings& s) {
    s.pad_for_quantization = true;
    s.quantization_multiple = Multiple;
  }
};

/// Router dtype: `float` (default) or `double` for the gating GEMM, the logits and the probs.
template <class T>
  requires std::same_as<T, float> || std::same_as<T, double>
struct dtype {
  using option_kind = option::dtype_kind;
  static constexpr void apply(settings& s) {
    s.dtype = std::same_as<T, double> ? logits_dtype::fp64 : logits_dtype::fp32;
  }
};

/// Multiplies the router input by U(1 - Eps, 1 + Eps) elementwise in training.
template <double Eps>
struct input_jitter {
  using option_kind = option::input_jitter_kind;
  static constexpr void apply(settings& s) { s.input_jitter_eps = Eps; }
};

namespace detail {
constexpr settings with_top_k(int k, score_function score, bool expert_bias) {
  settings s;
  s.top_k = k;
  s.score = score;
  s.expert_bias = expert_bias;
  return s;
}
}  // namespace detail

/// Top-k routing. Defaults: softmax after top-k, no load balancing, no capacity, fp32 logits.
template <int K, class... Options>
struct top_k {
  using policy_kind = kind;
  static constexpr std::string_view name = "top_k";
  static constexpr settings value =
      megamoe::detail::apply_options<option::all_kinds, settings, Options...>(
          detail::with_top_k(K, score_function::softmax_after_topk, false));
  static constexpr int k = value.top_k;
};

/// Aux-loss-free top-k routing (DeepSeek-V3): the expert bias is on and the score defaults to
/// sigmoid.
template <int K, class... Options>
struct aux_loss_free {
  using policy_kind = kind;
  static constexpr std::string_view name = "aux_loss_free";
  static constexpr settings value =
      megamoe::detail::apply_options<option::all_kinds, settings, Options...>(
          detail::with_top_k(K, score_function::sigmoid, true));
  static constexpr int k = value.top_k;
};

/// A router whose every choice is read at start-up (a file, a command line). Its rules run then,
/// with the same ids; the algorithms are the same code as for the static policies.
struct runtime {
  using policy_kind = kind;
  static constexpr std::string_view name = "runtime";
  static constexpr bool is_runtime = true;
};

}  // namespace megamoe::router
