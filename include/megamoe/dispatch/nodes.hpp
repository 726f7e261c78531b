// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/nodes.hpp — where the ranks of an EP group sit on machines (nodes), for the
// node-aware dispatcher.
//
// A node is the set of ranks that share memory (MPI_Comm_split_type), or, with
// MEGAMOE_RANKS_PER_NODE = r, r consecutive world ranks (to emulate several nodes on one machine;
// r must divide the world size). Nodes are numbered by their lowest EP rank; inside a node, ranks
// by EP rank. Every node must hold the same number of the group's ranks, so that each rank has one
// peer with the same index on every other node (R034).
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/shared_window.hpp>
#include <megamoe/parallel/watchdog.hpp>
#include <megamoe/policy/error.hpp>

#include <mpi.h>
#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace megamoe::dispatch {

/// Parses a MEGAMOE_RANKS_PER_NODE value for a world of `world_size` ranks: a positive integer
/// that divides it, or R034.
MEGAMOE_DECL int parse_ranks_per_node(std::string const& text, int world_size);

/// Collective over `stage`: the emulated node size MEGAMOE_RANKS_PER_NODE (0 when unset: nodes are
/// the ranks that share memory). A bad value, or values that differ between ranks, are an
/// `agreed_config_error` (R034) on every rank of `stage`.
MEGAMOE_DECL int agreed_ranks_per_node(boost::mpi::communicator const& stage);

/// Collective over `stage`, whose every rank calls it with its own `group`: whether `group` lies on
/// one node: its ranks share memory and, when MEGAMOE_RANKS_PER_NODE emulates nodes, sit in one
/// emulated node.
MEGAMOE_DECL bool group_on_one_node(boost::mpi::communicator const& group,
                                    boost::mpi::communicator const& stage);

/// The nodes of one communicator (the EP group): this rank's node and index in it, the node of
/// every member, and two communicators: `node()` (the members on this node) and `peers()` (the
/// members with this rank's index, one per node, ordered by node).
class node_layout {
 public:
  /// Collective over `stage`, which holds `group` (the pipeline stage: every rank of it builds the
  /// layout of its own group at the same point, and another stage may build none). Reads
  /// MEGAMOE_RANKS_PER_NODE; a bad value or unequal nodes in any group of the stage are an
  /// `agreed_config_error` (R034) on every rank of it.
  node_layout(boost::mpi::communicator const& group, boost::mpi::communicator const& stage);

  [[nodiscard]] int nodes() const noexcept { return nodes_; }
  /// Members of the group on each node.
  [[nodiscard]] int ranks_per_node() const noexcept { return per_node_; }
  [[nodiscard]] int node_of(int rank) const { return node_of_[static_cast<std::size_t>(rank)]; }
  [[nodiscard]] int index_of(int rank) const { return index_of_[static_cast<std::size_t>(rank)]; }
  /// The group rank with index `index` on node `node`.
  [[nodiscard]] int rank_at(int node, int index) const {
    return rank_at_[static_cast<std::size_t>(node * per_node_ + index)];
  }
  [[nodiscard]] boost::mpi::communicator const& node() const noexcept { return node_comm_; }
  [[nodiscard]] boost::mpi::communicator const& peers() const noexcept { return peer_comm_; }

 private:
  int nodes_ = 1, per_node_ = 1;
  std::vector<int> node_of_, index_of_, rank_at_;
  boost::mpi::communicator node_comm_, peer_comm_;
};

}  // namespace megamoe::dispatch

#if MEGAMOE_HEADER_ONLY
#include <megamoe/dispatch/nodes.ipp>
#endif
