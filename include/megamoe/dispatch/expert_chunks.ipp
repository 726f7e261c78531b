// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/expert_chunks.ipp — the definitions behind expert_chunks.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/dispatch/expert_chunks.hpp>

namespace megamoe::dispatch {

MEGAMOE_DECL void expert_chunks::assign(expert_groups const& groups, mask_matrix const& map,
                                        int capacity, std::exception_ptr earlier,
                                        std::string_view who) {
  int const E = groups.num_experts(), L = groups.local_experts();
  int const EP = groups.ep_size(), ETP = groups.etp_size();
  ep_ = EP;
  experts_ = E;
  std::exception_ptr problem = earlier;
  if (!problem) try {
      if (map.cols() != E)
        throw input_error(std::string(who) + ": the routing map has " + std::to_string(map.cols()) +
                          " experts, the layer " + std::to_string(E));
      send_rows_.assign(map, capacity);
    } catch (...) {
      problem = std::current_exception();
    }
  counts_.assign(static_cast<std::size_t>(ETP) * EP * E, 0);
  if (capacity > 0)
    agree_on_capacity(groups, problem, capacity, who);
  else
    exchange_counts(groups, problem);
  // Splits, ETP row counts, rows per local expert and the chunk table, all from counts_.
  int const me_i = groups.etp_rank(), first = groups.first_expert();
  auto const& mine = send_rows_.permutation().tokens_per_expert;
  send_splits_.assign(static_cast<std::size_t>(EP), 0);
  for (int e = 0; e < E; ++e) send_splits_[static_cast<std::size_t>(e / L)] += mine[e];
  recv_splits_.assign(static_cast<std::size_t>(EP), 0);
  etp_rows_.assign(static_cast<std::size_t>(ETP), 0);
  local_counts_.assign(static_cast<std::size_t>(L), 0);
  chunk_size_.resize(static_cast<std::size_t>(ETP) * EP * L);
  for (int i = 0; i < ETP; ++i)
    for (int j = 0; j < EP; ++j)
      for (int l = 0; l < L; ++l) {
        std::int64_t const n = count(i, j, first + l);
        if (i == me_i) recv_splits_[static_cast<std::size_t>(j)] += n;
        etp_rows_[static_cast<std::size_t>(i)] += n;
        local_counts_[static_cast<std::size_t>(l)] += n;
        chunk_size_[(static_cast<std::size_t>(i) * EP + j) * L + l] = n;
      }
  chunk_order_.resize(chunk_size_.size());
  for (int l = 0, p = 0; l < L; ++l)
    for (int i = 0; i < ETP; ++i)
      for (int j = 0; j < EP; ++j, ++p)
        chunk_order_[static_cast<std::size_t>(p)] = (i * EP + j) * L + l;
  source_start_.resize(chunk_size_.size());
  target_start_.resize(chunk_size_.size());
  std::int64_t at = 0;
  for (std::size_t c = 0; c < chunk_size_.size(); ++c) {
    source_start_[c] = at;
    at += chunk_size_[c];
  }
  rows_ = at;
  at = 0;
  for (int c : chunk_order_) {
    target_start_[static_cast<std::size_t>(c)] = at;
    at += chunk_size_[static_cast<std::size_t>(c)];
  }
  received_ = etp_rows_[static_cast<std::size_t>(me_i)];  // what EP sends this ETP index
}

MEGAMOE_DECL void expert_chunks::exchange_counts(expert_groups const& groups,
                                                 std::exception_ptr problem) {
  auto const& comm = groups.tp_ep();
  int const E = groups.num_experts(), EP = groups.ep_size();
  constexpr std::size_t head = 4;
  std::size_t const width = head + static_cast<std::size_t>(E);
  header_.assign(width, 0);
  header_[0] = problem ? 1 : 0;
  header_[1] = groups.etp_rank();
  header_[2] = groups.ep_rank();
  if (!problem) {
    header_[3] = send_rows_.tokens();
    std::copy(send_rows_.permutation().tokens_per_expert.begin(),
              send_rows_.permutation().tokens_per_expert.end(), header_.begin() + head);
  }
  table_.resize(width * static_cast<std::size_t>(comm.size()));
  {
    parallel::watched_collective const watch(MPI_Comm(comm), "exchange_counts",
                                             static_cast<std::int64_t>(width));
    MPI_Allgather(header_.data(), static_cast<int>(width), MPI_INT64_T, table_.data(),
                  static_cast<int>(width), MPI_INT64_T, MPI_Comm(comm));
  }
  bool failed = false;
  for (int r = 0; r < comm.size(); ++r) failed = failed || table_[width * r] != 0;
  if (failed) parallel::agree_on_failure(comm, problem);
  most_tokens_ = 0;
  for (int r = 0; r < comm.size(); ++r) {
    std::int64_t const* row = table_.data() + width * r;
    most_tokens_ = std::max(most_tokens_, row[3]);
    std::copy(row + head, row + width,
              counts_.begin() + (static_cast<std::ptrdiff_t>(row[1]) * EP + row[2]) * E);
  }
}

MEGAMOE_DECL void expert_chunks::agree_on_capacity(expert_groups const& groups,
                                                   std::exception_ptr problem, int capacity,
                                                   std::string_view who) {
  auto const& comm = groups.tp_ep();
  std::int64_t const tokens = problem ? 0 : send_rows_.permutation().num_tokens;
  std::int64_t const rows_each = std::min<std::int64_t>(capacity, tokens);
  std::int64_t range[4] = {problem ? -1 : 0, rows_each, -rows_each, -tokens};
  {
    parallel::watched_collective const watch(MPI_Comm(comm), "agree_on_capacity", 4);
    MPI_Allreduce(MPI_IN_PLACE, range, 4, MPI_INT64_T, MPI_MIN, MPI_Comm(comm));
  }
  if (range[0] != 0) parallel::agree_on_failure(comm, problem);
  if (range[1] != -range[2])
    parallel::agree_on_failure(
        comm, std::make_exception_ptr(input_error(
                  std::string(who) +
                  ": drop-and-pad needs the same capacity on every rank of the tp_ep group (rows "
                  "per expert range from " +
                  std::to_string(range[1]) + " to " + std::to_string(-range[2]) +
                  "): give every rank the same number of tokens")));
  most_tokens_ = -range[3];
  std::fill(counts_.begin(), counts_.end(), rows_each);
}

}  // namespace megamoe::dispatch
