// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/process_groups.hpp — a Boost.MPI communicator for every process group of both
// grids, all created at start-up.
//
// Ranks inside each communicator are numbered in the reference's in-group order, so rank i of the
// `ep` communicator is the i-th rank of its group in the reference's list.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/layout.hpp>
#include <megamoe/parallel/watchdog.hpp>

#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace megamoe::parallel {

/// Group types of the attention grid (the order of `decoder_group_types`).
enum class decoder_group { tp, cp, dp, dp_cp, tp_cp, tp_dp, tp_dp_cp, pp, tp_pp };
/// Group types of the expert grid (the order of `expert_group_types`).
enum class expert_group { tp, ep, tp_ep, dp, tp_ep_pp, pp };

class process_groups {
 public:
  /// The communicators' MPI names (what the watchdog prints): the accessors' names.
  static constexpr std::array<char const*, 9> decoder_names{
      "tp", "cp", "dp", "dp_cp", "tp_cp", "tp_dp", "tp_dp_cp", "pp", "tp_pp"};
  static constexpr std::array<char const*, 6> expert_names{"expert_tp", "ep",       "tp_ep",
                                                           "expert_dp", "tp_ep_pp", "expert_pp"};

  /// Collective over `world`. Checks the layout on every rank (R016, R017, R018, R027; the same
  /// error on every rank) and then splits `world` once per group type, in a fixed order.
  process_groups(boost::mpi::communicator const& world, degrees const& d);

  [[nodiscard]] parallel::layout const& layout() const noexcept { return layout_; }

  [[nodiscard]] boost::mpi::communicator const& get(decoder_group g) const {
    return decoder_[static_cast<std::size_t>(g)];
  }
  [[nodiscard]] boost::mpi::communicator const& get(expert_group g) const {
    return expert_[static_cast<std::size_t>(g)];
  }

  // Attention grid.
  [[nodiscard]] auto const& tp() const { return get(decoder_group::tp); }
  [[nodiscard]] auto const& cp() const { return get(decoder_group::cp); }
  [[nodiscard]] auto const& dp() const { return get(decoder_group::dp); }
  [[nodiscard]] auto const& dp_cp() const { return get(decoder_group::dp_cp); }
  /// The router's aux-loss reduction group.
  [[nodiscard]] auto const& tp_cp() const { return get(decoder_group::tp_cp); }
  [[nodiscard]] auto const& tp_dp() const { return get(decoder_group::tp_dp); }
  /// The expert-bias and global-aux reduction group.
  [[nodiscard]] auto const& tp_dp_cp() const { return get(decoder_group::tp_dp_cp); }
  [[nodiscard]] auto const& pp() const { return get(decoder_group::pp); }
  [[nodiscard]] auto const& tp_pp() const { return get(decoder_group::tp_pp); }

  // Expert grid.
  [[nodiscard]] auto const& expert_tp() const { return get(expert_group::tp); }
  [[nodiscard]] auto const& ep() const { return get(expert_group::ep); }
  /// The dispatcher's group (ETP x EP).
  [[nodiscard]] auto const& tp_ep() const { return get(expert_group::tp_ep); }
  /// Expert data parallel: expert gradient reduction and optimizer sharding.
  [[nodiscard]] auto const& expert_dp() const { return get(expert_group::dp); }
  [[nodiscard]] auto const& tp_ep_pp() const { return get(expert_group::tp_ep_pp); }
  [[nodiscard]] auto const& expert_pp() const { return get(expert_group::pp); }

 private:
  /// The communicator of the group holding this rank; its rank order is the group's list order.
  static boost::mpi::communicator split(boost::mpi::communicator const& world,
                                        rank_groups const& groups);

  parallel::layout layout_;
  std::array<boost::mpi::communicator, decoder_group_types.size()> decoder_;
  std::array<boost::mpi::communicator, expert_group_types.size()> expert_;
};

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/process_groups.ipp>
#endif
