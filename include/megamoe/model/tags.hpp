// SPDX-License-Identifier: Apache-2.0
// megamoe/model/tags.hpp — the memory slot (tags only): what the layer keeps or recomputes.
//
//   memory::keep_all                                        save every activation backward needs
//   memory::recompute<memory::moe_act>                      keep fc1's output, redo act * prob
//   memory::recompute<memory::moe_layer>                    redo the whole MoE layer in backward
//   memory::recompute<memory::moe_act, memory::shared_experts>
//
// The module names follow the reference's `recompute_modules`.
#pragma once

#include <megamoe/core/policy.hpp>

#include <string_view>

namespace megamoe::memory {

/// The kind of the `memory` slot.
struct kind {};

/// Modules recomputed in backward, as a set (`recompute_modules`).
struct settings {
  bool moe_act = false;
  bool moe_layer = false;
  bool shared_experts = false;
  [[nodiscard]] constexpr bool any() const { return moe_act || moe_layer || shared_experts; }
  friend constexpr bool operator==(settings const&, settings const&) = default;
};

namespace option {
struct moe_act_kind {};
struct moe_layer_kind {};
struct shared_experts_kind {};
using all_kinds = boost::mp11::mp_list<moe_act_kind, moe_layer_kind, shared_experts_kind>;
}  // namespace option

/// The expert activation and prob multiply ("moe_act").
struct moe_act {
  using option_kind = option::moe_act_kind;
  static constexpr void apply(settings& s) { s.moe_act = true; }
};
/// The whole MoE layer ("moe").
struct moe_layer {
  using option_kind = option::moe_layer_kind;
  static constexpr void apply(settings& s) { s.moe_layer = true; }
};
/// The shared expert ("shared_experts").
struct shared_experts {
  using option_kind = option::shared_experts_kind;
  static constexpr void apply(settings& s) { s.shared_experts = true; }
};

/// Selective recomputation of the given modules (at least one).
template <class Module, class... Modules>
struct recompute {
  using policy_kind = kind;
  static constexpr std::string_view name = "recompute";
  static constexpr settings value =
      megamoe::detail::apply_options<option::all_kinds, settings, Module, Modules...>(settings{});
};

/// Keep every activation the backward pass needs (the default).
struct keep_all {
  using policy_kind = kind;
  static constexpr std::string_view name = "keep_all";
  static constexpr settings value{};
};

}  // namespace megamoe::memory
