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

#include <megamoe/core/compiled_once.hpp>
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
              std::exception_ptr earlier, std::string_view who);

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
  void exchange_counts(expert_groups const& groups, std::exception_ptr problem);

  /// Drop-and-pad: every rank sends C' = min(C, T) rows to every expert. The ranks only agree on
  /// the error flag, C' and the most tokens (one all-reduce of four numbers), no count exchange.
  void agree_on_capacity(expert_groups const& groups, std::exception_ptr problem, int capacity,
                         std::string_view who);

  token_rows send_rows_;
  int ep_ = 1, experts_ = 0;
  std::vector<std::int64_t> header_, table_, counts_;
  std::vector<std::int64_t> send_splits_, recv_splits_, etp_rows_, local_counts_;
  std::vector<std::int64_t> chunk_size_, source_start_, target_start_;
  std::vector<int> chunk_order_;
  std::int64_t rows_ = 0, received_ = 0, most_tokens_ = 0;
};

}  // namespace megamoe::dispatch

#if MEGAMOE_HEADER_ONLY
#include <megamoe/dispatch/expert_chunks.ipp>
#endif
