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
inline int parse_ranks_per_node(std::string const& text, int world_size) {
  bool const digits =
      !text.empty() && text.size() < 9 && text.find_first_not_of("0123456789") == std::string::npos;
  int const r = digits ? std::stoi(text) : 0;
  if (r < 1 || world_size % r != 0)
    throw config_error(rules::id::ranks_per_node_valid, "MEGAMOE_RANKS_PER_NODE='" + text +
                                                            "' for a world of " +
                                                            std::to_string(world_size) + " ranks");
  return r;
}

/// Collective over `stage`: the emulated node size MEGAMOE_RANKS_PER_NODE (0 when unset: nodes are
/// the ranks that share memory). A bad value, or values that differ between ranks, are an
/// `agreed_config_error` (R034) on every rank of `stage`.
inline int agreed_ranks_per_node(boost::mpi::communicator const& stage) {
  boost::mpi::communicator const world;
  int per_node = 0;
  parallel::check_on_every_rank(stage, [&] {
    if (char const* text = std::getenv("MEGAMOE_RANKS_PER_NODE"))
      per_node = parse_ranks_per_node(text, world.size());
  });
  int range[2] = {per_node, -per_node};
  {
    parallel::watched_collective const watch(MPI_Comm(stage), "agree_ranks_per_node", 2);
    MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_INT, MPI_MIN, MPI_Comm(stage));
  }
  if (range[0] != -range[1])
    throw parallel::agreed_config_error(rules::id::ranks_per_node_valid,
                                        config_error(rules::id::ranks_per_node_valid,
                                                     "MEGAMOE_RANKS_PER_NODE differs between ranks")
                                            .what());
  return per_node;
}

/// Collective over `stage`, whose every rank calls it with its own `group`: whether `group` lies on
/// one node: its ranks share memory and, when MEGAMOE_RANKS_PER_NODE emulates nodes, sit in one
/// emulated node.
inline bool group_on_one_node(boost::mpi::communicator const& group,
                              boost::mpi::communicator const& stage) {
  int const per_node = agreed_ranks_per_node(stage);
  bool const shared = parallel::ranks_share_memory(group);
  boost::mpi::communicator const world;
  int node[2] = {0, 0};
  if (per_node > 0) node[0] = node[1] = world.rank() / per_node;
  node[1] = -node[1];
  {
    parallel::watched_collective const watch(MPI_Comm(group), "agree_emulated_node", 2);
    MPI_Allreduce(MPI_IN_PLACE, node, 2, MPI_INT, MPI_MIN, MPI_Comm(group));
  }
  return shared && node[0] == -node[1];
}

/// The nodes of one communicator (the EP group): this rank's node and index in it, the node of
/// every member, and two communicators: `node()` (the members on this node) and `peers()` (the
/// members with this rank's index, one per node, ordered by node).
class node_layout {
 public:
  /// Collective over `stage`, which holds `group` (the pipeline stage: every rank of it builds the
  /// layout of its own group at the same point, and another stage may build none). Reads
  /// MEGAMOE_RANKS_PER_NODE; a bad value or unequal nodes in any group of the stage are an
  /// `agreed_config_error` (R034) on every rank of it.
  node_layout(boost::mpi::communicator const& group, boost::mpi::communicator const& stage) {
    int const n = group.size();
    boost::mpi::communicator const world;
    long key = 0;
    int const per_node = agreed_ranks_per_node(stage);
    std::optional<boost::mpi::communicator> shared;
    if (per_node > 0) {
      key = world.rank() / per_node;
    } else {
      MPI_Comm raw = MPI_COMM_NULL;
      parallel::watched_collective const watch(MPI_Comm(group), "split_by_node", 1);
      MPI_Comm_split_type(MPI_Comm(group), MPI_COMM_TYPE_SHARED, group.rank(), MPI_INFO_NULL, &raw);
      shared.emplace(raw, boost::mpi::comm_take_ownership);
    }
    if (shared) {  // the node's name: its lowest world rank
      int lowest = world.rank();
      parallel::watched_collective const watch(MPI_Comm(*shared), "name_node", 1);
      MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, MPI_Comm(*shared));
      key = lowest;
    }
    std::vector<long> keys(static_cast<std::size_t>(n));
    {
      parallel::watched_collective const watch(MPI_Comm(group), "gather_nodes", 1);
      MPI_Allgather(&key, 1, MPI_LONG, keys.data(), 1, MPI_LONG, MPI_Comm(group));
    }
    // Nodes numbered by first appearance in rank order; indices in rank order.
    std::vector<long> seen;
    node_of_.resize(static_cast<std::size_t>(n));
    index_of_.resize(static_cast<std::size_t>(n));
    std::vector<int> filled;
    for (int j = 0; j < n; ++j) {
      auto const it = std::find(seen.begin(), seen.end(), keys[static_cast<std::size_t>(j)]);
      int const node = static_cast<int>(it - seen.begin());
      if (it == seen.end()) {
        seen.push_back(keys[static_cast<std::size_t>(j)]);
        filled.push_back(0);
      }
      node_of_[static_cast<std::size_t>(j)] = node;
      index_of_[static_cast<std::size_t>(j)] = filled[static_cast<std::size_t>(node)]++;
    }
    nodes_ = static_cast<int>(seen.size());
    per_node_ = n / nodes_;
    parallel::check_on_every_rank(stage, [&] {
      if (std::any_of(filled.begin(), filled.end(), [&](int c) { return c != per_node_; })) {
        std::string counts;
        for (int c : filled) counts += (counts.empty() ? "" : ", ") + std::to_string(c);
        throw config_error(rules::id::ranks_per_node_valid,
                           "the " + std::to_string(n) + " ranks of an EP group lie on " +
                               std::to_string(nodes_) + " nodes holding " + counts +
                               " of them; every node must hold the same number");
      }
    });
    rank_at_.resize(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j)
      rank_at_[static_cast<std::size_t>(node_of(j) * per_node_ + index_of(j))] = j;
    int const me = group.rank();
    parallel::watched_collective const watch(MPI_Comm(group), "split_nodes", 2);
    node_comm_ = group.split(node_of(me), me);
    peer_comm_ = group.split(index_of(me), node_of(me));
    MPI_Comm_set_name(MPI_Comm(node_comm_), "ep_node");
    MPI_Comm_set_name(MPI_Comm(peer_comm_), "ep_node_peers");
  }

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
