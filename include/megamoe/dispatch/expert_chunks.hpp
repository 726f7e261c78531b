// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/expert_chunks.hpp — the plan of an exchange between token ranks and expert
// ranks, shared by the dispatchers that move rows straight to their experts (all_to_all,
// shared_memory).
//
// Permutation 1 groups this rank's tokens by global expert; the per-expert counts (and the rank's
// token count) are all-gathered over tp_ep (the count exchange, which also carries an error flag),
// giving N[i][j][e], the rows rank (ETP i, EP j) sends to expert e. From that table alone every
// rank derives the same splits. The rows of the local experts are then laid out expert-major: chunk
// (i, j, l) holds what rank (i, j) routes to local expert l, and the chunks sit in (l, i, j) order
// (the reference's sort_input_by_local_experts). Drop-and-pad (capacity > 0): every expert has
// exactly C rows on every rank, so the table is known without the exchange; the ranks only check
// that they agree on C. The plan is a value: a pipeline stash keeps it whole per micro-batch.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/dispatch/groups.hpp>
#include <megamoe/dispatch/token_rows.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/watchdog.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe::dispatch {

class expert_chunks {
 public:
  /// Collective over groups.tp_ep(): permutation 1 of `map` and the table. An `earlier` problem, or
  /// a bad map on any rank, becomes the same agreed error on every rank (named after `who`).
  void assign(expert_groups const& groups, mask_matrix const& map, int capacity,
              std::exception_ptr earlier, std::string_view who) {
    int const E = groups.num_experts(), L = groups.local_experts();
    int const EP = groups.ep_size(), ETP = groups.etp_size();
    ep_ = EP;
    experts_ = E;
    std::exception_ptr problem = earlier;
    if (!problem) try {
        if (map.cols() != E)
          throw input_error(std::string(who) + ": the routing map has " +
                            std::to_string(map.cols()) + " experts, the layer " +
                            std::to_string(E));
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

  /// Permutation 1: this rank's rows in global expert order (what it sends).
  [[nodiscard]] token_rows const& send_rows() const noexcept { return send_rows_; }
  /// N[i][j][e], flattened: rows that the rank with ETP index i and EP index j routes to expert e.
  [[nodiscard]] std::span<std::int64_t const> counts() const noexcept { return counts_; }
  [[nodiscard]] std::int64_t count(int i, int j, int e) const {
    return counts_[(static_cast<std::size_t>(i) * ep_ + j) * experts_ + e];
  }
  /// Rows to each EP rank, and from each (this ETP index's part).
  [[nodiscard]] std::span<std::int64_t const> send_splits() const noexcept { return send_splits_; }
  [[nodiscard]] std::span<std::int64_t const> recv_splits() const noexcept { return recv_splits_; }
  /// The local experts' rows that come from each ETP index.
  [[nodiscard]] std::span<std::int64_t const> etp_rows() const noexcept { return etp_rows_; }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_local_expert() const noexcept {
    return local_counts_;
  }
  /// Chunk c = (i, j, l), number (i * EP + j) * L + l: its rows, its start in (i, j, l) order and
  /// its start in the expert-major (l, i, j) order.
  [[nodiscard]] std::span<std::int64_t const> chunk_size() const noexcept { return chunk_size_; }
  [[nodiscard]] std::span<std::int64_t const> source_start() const noexcept {
    return source_start_;
  }
  [[nodiscard]] std::span<std::int64_t const> target_start() const noexcept {
    return target_start_;
  }
  /// Position p of the expert-major order holds chunk chunk_order()[p].
  [[nodiscard]] std::span<int const> chunk_order() const noexcept { return chunk_order_; }
  /// The local experts' rows on this rank, and the part of them EP sends this ETP index.
  [[nodiscard]] std::int64_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::int64_t received() const noexcept { return received_; }
  /// The most tokens any rank of tp_ep has in this micro-batch.
  [[nodiscard]] std::int64_t most_tokens() const noexcept { return most_tokens_; }

  /// Bytes of the bookkeeping (kept from forward to backward).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return send_rows_.bytes() +
           (counts_.size() + chunk_size_.size() * 3 + local_counts_.size()) * sizeof(std::int64_t);
  }

 private:
  /// The count exchange: [error flag, ETP index, EP index, tokens, counts of E experts] from every
  /// rank of tp_ep. A flag anywhere makes every rank throw the same agreed error.
  void exchange_counts(expert_groups const& groups, std::exception_ptr problem) {
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

  /// Drop-and-pad: every rank sends C' = min(C, T) rows to every expert. The ranks only agree on
  /// the error flag, C' and the most tokens (one all-reduce of four numbers), no count exchange.
  void agree_on_capacity(expert_groups const& groups, std::exception_ptr problem, int capacity,
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

  token_rows send_rows_;
  int ep_ = 1, experts_ = 0;
  std::vector<std::int64_t> header_, table_, counts_;
  std::vector<std::int64_t> send_splits_, recv_splits_, etp_rows_, local_counts_;
  std::vector<std::int64_t> chunk_size_, source_start_, target_start_;
  std::vector<int> chunk_order_;
  std::int64_t rows_ = 0, received_ = 0, most_tokens_ = 0;
};

}  // namespace megamoe::dispatch
