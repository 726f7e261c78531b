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
// passes the rows through. residual_stream holds a micro-batch's rows of the stream and the
// working rows the blocks write. context_chunks<true> keeps a rank's CP chunks of a micro-batch's
// tokens; context_chunks<false> (a type that fixes CP at 1) keeps the micro-batch as given.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/model/norm.hpp>
#include <megamoe/parallel/collectives.hpp>

#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
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

/// A micro-batch's residual stream on this rank, [N / TP, H], and the working rows around it: the
/// norm's output, a branch's (attention's or a dense FFN's) output, and in backward the stream's
/// gradient and a norm's input gradient. An FFN's output joins the stream in the next norm's pass
/// (`pending`), so the stream is read and written once per block.
template <class T, bool TensorParallel>
struct residual_stream {
  row_matrix<T> residual, normed, branch, grad, grad_normed;
  T const* pending = nullptr;  // an FFN's output rows, not yet added to `residual`
  sequence_parallel<T, TensorParallel> sp;
  std::int64_t whole_rows = 0;  // N: all TP ranks' rows together

  /// A micro-batch of `whole` rows, `rows` of them this rank's, of `hidden` columns.
  void start(std::int64_t rows, std::int64_t whole, int hidden) {
    residual.resize(rows, hidden);
    normed.resize(rows, hidden);
    branch.resize(rows, hidden);
    sp.set_rows(rows);
    whole_rows = whole;
    pending = nullptr;
  }
  /// Sizes the backward's rows.
  void start_backward() {
    grad.resize(residual.rows(), residual.cols());
    grad_normed.resize(residual.rows(), residual.cols());
  }
  /// Where a TP-parallel module writes its part of the [N, H] output whose sum over TP is `mine`.
  row_matrix_map<T> whole_output(row_matrix<T>& mine) {
    return sp.whole_output(view(mine), whole_rows);
  }
  [[nodiscard]] const_row_matrix_map<T> pending_rows() const noexcept {
    return {pending, residual.rows(), residual.cols()};
  }
  /// `norm` of the stream into `normed`, the pending FFN output added to the stream first.
  void norm_of_residual(context& ctx, rms_norm<T>& norm) {
    ctx.step_stages.time(step_stage::norms_residuals, [&] {
      if (pending == nullptr)
        norm.forward(ctx.pool(), const_view(residual), view(normed));
      else
        norm.add_forward(ctx.pool(), view(residual), pending_rows(), view(normed));
      pending = nullptr;
    });
  }
  /// The pending FFN output joins the stream (before the rows leave a chunk).
  void settle() {
    if (pending == nullptr) return;
    residual += pending_rows();
    pending = nullptr;
  }
};

/// CP rank `rank`'s two chunks (r and 2 CP - 1 - r) of each sequence of `all` [S*B] into `mine`
/// [S/CP * B].
MEGAMOE_DECL void keep_context_chunks(std::span<std::int32_t const> all, int seq, int batch, int cp,
                                      int rank, std::vector<std::int32_t>& mine);

template <bool ContextParallel>
class context_chunks;

/// CP may be above 1: a rank keeps its two chunks of each sequence of the micro-batch.
template <>
class context_chunks<true> {
 public:
  /// Over `cp` (null: one rank).
  void attach(boost::mpi::communicator const* cp) noexcept { cp_ = cp; }
  [[nodiscard]] int ranks() const noexcept { return cp_ == nullptr ? 1 : cp_->size(); }
  [[nodiscard]] int rank() const noexcept { return cp_ == nullptr ? 0 : cp_->rank(); }

  /// Keeps this rank's chunks of `tokens` and `targets` (empty, or as many) [S*B], for tokens()
  /// and targets(); returns this rank's positions, S / CP.
  int keep(std::span<std::int32_t const> tokens, std::span<std::int32_t const> targets, int seq,
           int batch);
  [[nodiscard]] std::span<std::int32_t const> tokens() const noexcept { return tokens_; }
  [[nodiscard]] std::span<std::int32_t const> targets() const noexcept { return targets_; }

  /// The CP rank that holds position `position` of a sequence of `seq`, and the position among
  /// that rank's S / CP.
  [[nodiscard]] std::pair<int, int> owner_of(int position, int seq) const noexcept {
    int const cp = ranks();
    if (cp == 1) return {0, position};
    int const L = seq / (2 * cp), chunk = position / L;
    return chunk < cp ? std::pair{chunk, position % L}
                      : std::pair{2 * cp - 1 - chunk, L + position % L};
  }

 private:
  boost::mpi::communicator const* cp_ = nullptr;
  std::span<std::int32_t const> tokens_, targets_;
  std::vector<std::int32_t> local_tokens_, local_targets_;
};

/// CP is 1 by the configuration's type: the micro-batch is the rank's own.
template <>
class context_chunks<false> {
 public:
  void attach(boost::mpi::communicator const*) noexcept {}
  [[nodiscard]] static constexpr int ranks() noexcept { return 1; }
  [[nodiscard]] static constexpr int rank() noexcept { return 0; }
  int keep(std::span<std::int32_t const> tokens, std::span<std::int32_t const> targets, int seq,
           int) noexcept {
    tokens_ = tokens;
    targets_ = targets;
    return seq;
  }
  [[nodiscard]] std::span<std::int32_t const> tokens() const noexcept { return tokens_; }
  [[nodiscard]] std::span<std::int32_t const> targets() const noexcept { return targets_; }
  [[nodiscard]] static constexpr std::pair<int, int> owner_of(int position, int) noexcept {
    return {0, position};
  }

 private:
  std::span<std::int32_t const> tokens_, targets_;
};

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/sequence_parallel.ipp>
#endif
