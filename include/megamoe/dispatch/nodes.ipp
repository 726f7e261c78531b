// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/nodes.ipp — the definitions behind nodes.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/dispatch/nodes.hpp>

namespace megamoe::dispatch {

MEGAMOE_DECL int parse_ranks_per_node(std::string const& text, int world_size) {
  bool const digits =
      !text.empty() && text.size() < 9 && text.find_first_not_of("0123456789") == std::string::npos;
  int const r = digits ? std::stoi(text) : 0;
  if (r < 1 || world_size % r != 0)
    throw config_error(rules::id::ranks_per_node_valid, "MEGAMOE_RANKS_PER_NODE='" + text +
                                                            "' for a world of " +
                                                            std::to_string(world_size) + " ranks");
  return r;
}

MEGAMOE_DECL int agreed_ranks_per_node(boost::mpi::communicator const& stage) {
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

MEGAMOE_DECL bool group_on_one_node(boost::mpi::communicator const& group,
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

MEGAMOE_DECL node_layout::node_layout(boost::mpi::communicator const& group,
                                      boost::mpi::communicator const& stage) {
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

}  // namespace megamoe::dispatch
