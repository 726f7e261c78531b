// SPDX-License-Identifier: Apache-2.0
// megamoe/router/groups.hpp — the reductions the router's statistics need, as a concept.
//
// Load-balancing counts are summed over process groups: aux and seq-aux over TPxCP, global-aux and
// the expert-bias counts over TPxDPxCP. The router only needs "sum these numbers over my group" and
// "how many ranks are in it", so it takes any type with `size()` and `sum(std::span<double>)`;
// `one_rank` is the single-process case and `parallel::communicator_sum` the MPI one.
#pragma once

#include <concepts>
#include <span>

namespace megamoe::router {

/// A group that can sum per-rank numbers in place (every rank gets the total).
template <class G>
concept count_group = requires(G const& g, std::span<double> values) {
  { g.size() } -> std::convertible_to<int>;
  g.sum(values);
};

/// The group of one rank: the sum is the value itself.
struct one_rank {
  [[nodiscard]] static constexpr int size() noexcept { return 1; }
  static constexpr void sum(std::span<double>) noexcept {}
};

/// The groups a router reduces over. Both are `one_rank` on a single process.
template <count_group TpCp = one_rank, count_group TpDpCp = one_rank>
struct reduction_groups {
  TpCp tp_cp{};       // aux_loss, seq_aux_loss counts and the z-loss divisor
  TpDpCp tp_dp_cp{};  // global_aux_loss counts and the expert-bias update
};

}  // namespace megamoe::router
