// SPDX-License-Identifier: Apache-2.0
// megamoe/model/sequence_parallel.hpp — how the residual stream's rows move under tensor and
// context parallelism. With TP (sequence parallelism) a rank keeps N / TP of its N rows in the
// residual stream: a TP-parallel module (attention, the dense FFN, the embedding, the output
// layer) reads all N gathered over TP and writes its part of an [N, H] output, which a
// reduce-scatter sums into the rank's rows. With CP a rank keeps two of the 2 CP chunks of each
// sequence (chunks r and 2 CP - 1 - r, the reference's load balancing).
//
// sequence_parallel<T, true> holds the buffers and the TP communicator and moves nothing at
// TP 1; sequence_parallel<T, false> (a configuration whose type fixes TP at 1) holds neither and
// passes the rows through.
#pragma once

#include <megamoe/core/tensor.hpp>
#include <megamoe/parallel/collectives.hpp>

#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace megamoe {

template <class T, bool TensorParallel>
class sequence_parallel;

/// TP may be above 1: gathers and reduce-scatters over `tp` where its size is.
template <class T>
class sequence_parallel<T, true> {
 public:
  /// Over `tp` (null: one rank).
  void attach(boost::mpi::communicator const* tp) noexcept { tp_ = tp; }

  /// A micro-batch of `rows` rows of the residual stream on every TP rank.
  void set_rows(std::int64_t rows) { rows_per_tp_.assign(static_cast<std::size_t>(ranks()), rows); }

  /// `mine` [N / TP, H] gathered over TP into all N rows (in rank order: the positions in
  /// order), the forward's; all_gradient_rows keeps its own buffer, for the backward's.
  const_row_matrix_map<T> all_rows(const_row_matrix_map<T> mine) { return gather(mine, whole_); }
  const_row_matrix_map<T> all_gradient_rows(const_row_matrix_map<T> mine) {
    return gather(mine, grad_whole_);
  }
  /// Where a TP-parallel module writes its part of an [N, H] output: `mine` itself without TP;
  /// otherwise a buffer whose sum over TP sum_to_my_rows puts into `mine`.
  row_matrix_map<T> whole_output(row_matrix_map<T> mine, std::int64_t whole_rows) {
    if (ranks() == 1) return mine;
    parts_.resize(whole_rows, mine.cols());
    return {parts_.data(), parts_.rows(), parts_.cols()};
  }
  void sum_to_my_rows(row_matrix_map<T> mine) {
    if (ranks() == 1) return;
    parallel::reduce_scatter_v(*tp_, parts_.data(), mine.data(),
                               std::span<std::int64_t const>(rows_per_tp_),
                               static_cast<int>(mine.cols()));
  }

 private:
  [[nodiscard]] int ranks() const noexcept { return tp_ == nullptr ? 1 : tp_->size(); }
  const_row_matrix_map<T> gather(const_row_matrix_map<T> mine, row_matrix<T>& all) {
    int const tp = ranks();
    if (tp == 1) return mine;
    all.resize(mine.rows() * tp, mine.cols());
    parallel::all_gather_v(*tp_, mine.data(), all.data(),
                           std::span<std::int64_t const>(rows_per_tp_),
                           static_cast<int>(mine.cols()));
    return {all.data(), all.rows(), all.cols()};
  }

  boost::mpi::communicator const* tp_ = nullptr;
  row_matrix<T> whole_, grad_whole_, parts_;  // all N rows (forward, backward); a module's part
  std::vector<std::int64_t> rows_per_tp_;
};

/// TP is 1 by the configuration's type: the rows are the rank's own.
template <class T>
class sequence_parallel<T, false> {
 public:
  void attach(boost::mpi::communicator const*) noexcept {}
  void set_rows(std::int64_t) noexcept {}
  const_row_matrix_map<T> all_rows(const_row_matrix_map<T> mine) noexcept { return mine; }
  const_row_matrix_map<T> all_gradient_rows(const_row_matrix_map<T> mine) noexcept {
    return mine;
  }
  row_matrix_map<T> whole_output(row_matrix_map<T> mine, std::int64_t) noexcept { return mine; }
  void sum_to_my_rows(row_matrix_map<T>) noexcept {}
};

/// CP rank `rank`'s two chunks (r and 2 CP - 1 - r) of each sequence of `all` [S*B] into `mine`
/// [S/CP * B].
inline void keep_context_chunks(std::span<std::int32_t const> all, int seq, int batch, int cp,
                                int rank, std::vector<std::int32_t>& mine) {
  int const L = seq / (2 * cp);
  auto const run = static_cast<std::size_t>(L) * static_cast<std::size_t>(batch);
  mine.resize(2 * run);
  int const chunks[2] = {rank, 2 * cp - 1 - rank};
  for (int i = 0; i < 2; ++i)
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(chunks[i] * run), run,
                mine.begin() + static_cast<std::ptrdiff_t>(i * run));
}

}  // namespace megamoe
