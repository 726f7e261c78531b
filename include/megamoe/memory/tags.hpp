// SPDX-License-Identifier: Apache-2.0
// megamoe/memory/tags.hpp — the memory slot (tags only): what the layer keeps, recomputes, or
// stores in low precision.
//
//   memory::keep_all                                        save every activation backward needs
//   memory::recompute<memory::moe_act>                      keep fc1's output, redo act * prob
//   memory::recompute<memory::moe_layer>                    redo the whole MoE layer in backward
//   memory::plan<memory::moe_act, memory::quantized_activations>
//
// The module names follow the reference's `recompute_modules`. Quantized storage keeps saved
// activations (and, optionally, the primary weights) as the precision recipe's codes + scales.
#pragma once

#include <megamoe/policy/policy.hpp>

#include <string_view>

namespace megamoe::memory {

/// The kind of the `memory` slot.
struct kind {};

/// Modules recomputed in backward (`recompute_modules`), and what is stored quantized.
struct settings {
  bool moe_act = false;
  bool moe_layer = false;
  bool shared_experts = false;
  bool quantized_activations = false;
  /// The routed experts' weights held as the recipe's codes, their fp32 master in the optimizer.
  bool quantized_weights = false;
  /// True when any module is recomputed.
  [[nodiscard]] constexpr bool recomputes() const { return moe_act || moe_layer || shared_experts; }
  friend constexpr bool operator==(settings const&, settings const&) = default;
};

namespace option {
struct moe_act_kind {};
struct moe_layer_kind {};
struct shared_experts_kind {};
struct quantized_activations_kind {};
struct quantized_weights_kind {};
using all_kinds = boost::mp11::mp_list<moe_act_kind, moe_layer_kind, shared_experts_kind,
                                       quantized_activations_kind, quantized_weights_kind>;
}  // namespace option

/// Recompute the expert activation and prob multiply ("moe_act").
struct moe_act : megamoe::detail::set_flag<option::moe_act_kind, &settings::moe_act> {};
/// Recompute the whole MoE layer ("moe").
struct moe_layer : megamoe::detail::set_flag<option::moe_layer_kind, &settings::moe_layer> {};
/// Recompute the shared expert ("shared_experts").
struct shared_experts
    : megamoe::detail::set_flag<option::shared_experts_kind, &settings::shared_experts> {};
/// Keep fc1's output (the activation's input) as the recipe's codes + scales instead of BF16, as
/// DeepSeek-V3 caches the SwiGLU input in FP8; the GEMM inputs are codes under any FP8/FP4 recipe
/// already (needs an FP8/FP4 recipe, R030).
struct quantized_activations : megamoe::detail::set_flag<option::quantized_activations_kind,
                                                         &settings::quantized_activations> {};
/// Store the primary expert weights as the recipe's codes + scales (needs an FP8/FP4 recipe, R030).
struct quantized_weights
    : megamoe::detail::set_flag<option::quantized_weights_kind, &settings::quantized_weights> {};

/// What to keep, recompute or store quantized; options in any order, each at most once.
template <class... Options>
struct plan {
  using policy_kind = kind;
  static constexpr settings value =
      megamoe::detail::apply_options<option::all_kinds, settings, Options...>(settings{});
  static constexpr std::string_view name = value.recomputes() ? "recompute" : "keep_all";
};

/// Keep every activation the backward pass needs, in the recipe's activation type (the default).
using keep_all = plan<>;

/// Selective recomputation of the given modules (and any storage options).
template <class... Options>
using recompute = plan<Options...>;

}  // namespace megamoe::memory
