// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/groups.hpp — what a dispatcher needs to know about the expert grid: its three
// communicators and where this rank sits in them.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/policy/error.hpp>

#include <boost/mpi/communicator.hpp>

#include <string>

namespace megamoe::dispatch {

/// The dispatcher's view of the expert grid: tp_ep (the dispatcher's group), ep (the all-to-all)
/// and expert_tp (the ETP shards of each local expert). Experts [first_expert(), +local_experts())
/// live on this rank's EP index; every ETP rank of it holds 1/ETP of each of them.
class expert_groups {
 public:
  expert_groups(parallel::process_groups const& groups, int num_experts);

  [[nodiscard]] boost::mpi::communicator const& tp_ep() const noexcept { return *tp_ep_; }
  [[nodiscard]] boost::mpi::communicator const& ep() const noexcept { return *ep_; }
  [[nodiscard]] boost::mpi::communicator const& etp() const noexcept { return *etp_; }
  /// Every rank of this pipeline stage (TP x DP x CP): they build the same layers, so start-up
  /// checks agree over it (another stage may hold another number of MoE layers).
  [[nodiscard]] boost::mpi::communicator const& stage() const noexcept { return *stage_; }
  [[nodiscard]] int ep_size() const noexcept { return ep_->size(); }
  [[nodiscard]] int etp_size() const noexcept { return etp_->size(); }
  [[nodiscard]] int ep_rank() const noexcept { return ep_->rank(); }
  [[nodiscard]] int etp_rank() const noexcept { return etp_->rank(); }
  [[nodiscard]] int num_experts() const noexcept { return experts_; }
  [[nodiscard]] int local_experts() const noexcept { return experts_ / ep_size(); }
  [[nodiscard]] int first_expert() const noexcept { return ep_rank() * local_experts(); }

 private:
  boost::mpi::communicator const* tp_ep_;
  boost::mpi::communicator const* ep_;
  boost::mpi::communicator const* etp_;
  boost::mpi::communicator const* stage_;
  int experts_;
};

}  // namespace megamoe::dispatch

#if MEGAMOE_HEADER_ONLY
#include <megamoe/dispatch/groups.ipp>
#endif
