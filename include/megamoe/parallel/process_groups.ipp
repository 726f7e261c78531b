// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/process_groups.ipp — the definitions behind process_groups.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/process_groups.hpp>

namespace megamoe::parallel {

MEGAMOE_DECL process_groups::process_groups(boost::mpi::communicator const& world,
                                            degrees const& d) {
  check_on_every_rank(world, [&] { layout_ = parallel::layout::resolve(world.size(), d); });
  rank_generator const decoder = layout_.decoder_grid();
  rank_generator const expert = layout_.expert_grid();
  watched_collective const watch(MPI_Comm(world), "create_process_groups",
                                 std::ssize(decoder_names) + std::ssize(expert_names));
  for (std::size_t i = 0; i < decoder_group_types.size(); ++i) {
    decoder_[i] = split(world, decoder.groups(decoder_group_types[i]));
    MPI_Comm_set_name(MPI_Comm(decoder_[i]), decoder_names[i]);
  }
  for (std::size_t i = 0; i < expert_group_types.size(); ++i) {
    expert_[i] = split(world, expert.groups(expert_group_types[i]));
    MPI_Comm_set_name(MPI_Comm(expert_[i]), expert_names[i]);
  }
}

MEGAMOE_DECL boost::mpi::communicator process_groups::split(boost::mpi::communicator const& world,
                                                            rank_groups const& groups) {
  int const me = world.rank();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    auto const& members = groups[g];
    auto const it = std::find(members.begin(), members.end(), me);
    if (it != members.end())
      return world.split(static_cast<int>(g), static_cast<int>(it - members.begin()));
  }
  // Every rank is in exactly one group of each type; reaching here means a broken generator.
  throw input_error("process_groups: rank " + std::to_string(me) + " is in no group");
}

}  // namespace megamoe::parallel
