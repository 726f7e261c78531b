// SPDX-License-Identifier: Apache-2.0
// megamoe/policy/shape.hpp — the `shape` slot: model sizes given by named parameters.
//
//   using s = megamoe::shape<megamoe::hidden<1024>, megamoe::ffn<2816>, megamoe::experts<8>>;
//
// Parameters come in any order. hidden, ffn and experts have no default (a missing one breaks
// R001); shared_ffn defaults to 0 (no shared expert). Any size may be `dynamic`, left to start-up.
#pragma once

#include <megamoe/policy/policy.hpp>

namespace megamoe {

/// The kind of the `shape` slot.
struct shape_kind {};

namespace shape_option {
struct hidden_kind {};
struct ffn_kind {};
struct experts_kind {};
struct shared_ffn_kind {};
}  // namespace shape_option

/// Model width H (`hidden_size`).
template <int N>
struct hidden : detail::int_option<shape_option::hidden_kind, N> {};
/// Width F of one routed expert's FFN (`moe_ffn_hidden_size`).
template <int N>
struct ffn : detail::int_option<shape_option::ffn_kind, N> {};
/// Number of routed experts E (`num_moe_experts`).
template <int N>
struct experts : detail::int_option<shape_option::experts_kind, N> {};
/// Width of the shared expert (`moe_shared_expert_intermediate_size`); 0 means none.
template <int N>
struct shared_ffn : detail::int_option<shape_option::shared_ffn_kind, N> {};

/// The sizes of a shape as plain values, for start-up checks and description.
struct shape_sizes {
  int hidden = 0;
  int ffn = 0;
  int experts = 0;
  int shared_ffn = 0;
  friend constexpr bool operator==(shape_sizes const&, shape_sizes const&) = default;
};

template <class... Sizes>
struct shape {
  using policy_kind = shape_kind;

 private:
  using options = detail::option_list<
      boost::mp11::mp_list<shape_option::hidden_kind, shape_option::ffn_kind,
                           shape_option::experts_kind, shape_option::shared_ffn_kind>,
      Sizes...>;

 public:
  static constexpr int hidden_size =
      options::template get<shape_option::hidden_kind, megamoe::hidden<0>>::value;
  static constexpr int ffn_size =
      options::template get<shape_option::ffn_kind, megamoe::ffn<0>>::value;
  static constexpr int num_experts =
      options::template get<shape_option::experts_kind, megamoe::experts<0>>::value;
  static constexpr int shared_ffn_size =
      options::template get<shape_option::shared_ffn_kind, megamoe::shared_ffn<0>>::value;

  static constexpr shape_sizes value{hidden_size, ffn_size, num_experts, shared_ffn_size};
};

}  // namespace megamoe
