// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/all_gather.hpp — the reference's all-gather dispatcher: every rank of the tp_ep
// group gathers all tokens, probs and routing maps, keeps the rows of its local experts, and the
// results go back by a reduce-scatter (which also sums the ETP shards' partial outputs). No count
// exchange and no all-to-all; suited to small EP or large k. Interface: dispatch/local.hpp.
//
// Gathered tokens are rank-major in tp_ep order; each local expert's rows are in gathered token
// order. A drop-and-pad permutation is not needed here: the dropped tokens are already out of the
// map, and filler rows would add exact zeros.
#pragma once

#include <megamoe/core/buffer.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/exchange.hpp>
#include <megamoe/dispatch/groups.hpp>
#include <megamoe/dispatch/token_rows.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/environment.hpp>

#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

namespace megamoe::dispatch {

/// T: the layer's scalar; P: the router's probs type.
template <class T, class P>
class all_gather_dispatcher : public sequential_exchange<all_gather_dispatcher<T, P>, T, P> {
 public:
  all_gather_dispatcher(expert_groups const& groups, int hidden)
      : groups_(groups),
        hidden_(hidden),
        tokens_per_rank_(static_cast<std::size_t>(groups.tp_ep().size())) {}

  /// Collective over tp_ep: the token counts (with an error flag, so a bad map on one rank is an
  /// agreed error on all), then the maps.
  void plan(thread_pool&, mask_matrix const& map, int /*capacity*/,
            std::exception_ptr earlier = nullptr) {
    auto const& comm = groups_.tp_ep();
    int const n = comm.size(), E = groups_.num_experts();
    std::exception_ptr problem = earlier;
    if (!problem && map.cols() != E)
      problem = std::make_exception_ptr(input_error("all_gather dispatcher: the routing map has " +
                                                    std::to_string(map.cols()) +
                                                    " experts, the layer " + std::to_string(E)));
    std::int64_t const mine[2] = {problem ? 1 : 0, map.rows()};
    header_.resize(2 * static_cast<std::size_t>(n));
    {
      parallel::watched_collective const watch(MPI_Comm(comm), "gather_headers", 2);
      MPI_Allgather(mine, 2, MPI_INT64_T, header_.data(), 2, MPI_INT64_T, MPI_Comm(comm));
    }
    bool failed = false;
    gathered_tokens_ = 0;
    for (int r = 0; r < n; ++r) {
      failed = failed || header_[2 * static_cast<std::size_t>(r)] != 0;
      tokens_per_rank_[static_cast<std::size_t>(r)] = header_[2 * static_cast<std::size_t>(r) + 1];
      gathered_tokens_ += header_[2 * static_cast<std::size_t>(r) + 1];
    }
    if (failed) parallel::agree_on_failure(comm, problem);  // every rank saw the flag: all call
    map_.resize(gathered_tokens_, E);
    parallel::all_gather_v(comm, map.data(), map_.data(), tokens_per_rank_, E);
    rows_.assign(map_, 0, groups_.first_expert(), groups_.local_experts());
  }

  /// Sets micro-batch `key`'s plan aside (core/stash.hpp), or brings it back.
  void park(std::uint64_t key) {
    stash_.park(key, tokens_per_rank_, gathered_tokens_, map_, rows_);
  }
  void restore(std::uint64_t key) {
    stash_.restore(key, tokens_per_rank_, gathered_tokens_, map_, rows_);
  }

  [[nodiscard]] int expert_rows() const noexcept { return rows_.rows(); }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_local_expert() const noexcept {
    return rows_.permutation().tokens_per_expert;
  }
  /// The local experts' rows over the gathered tokens (source_token indexes the gathered list).
  [[nodiscard]] token_rows const& gathered_rows() const noexcept { return rows_; }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_rank() const noexcept {
    return tokens_per_rank_;
  }

  void dispatch(thread_pool& pool, T const* tokens, T* rows, row_matrix<P> const& probs,
                T* row_probs) {
    auto const& comm = groups_.tp_ep();
    int const E = groups_.num_experts();
    probs_.resize(gathered_tokens_, E);
    auto gather_probs =
        parallel::all_gather_v_start(comm, probs.data(), probs_.data(), tokens_per_rank_, E);
    dispatch(pool, tokens, rows);
    gather_probs.wait();
    rows_.gather_probs(probs_, groups_.first_expert(), row_probs);
  }
  void dispatch(thread_pool& pool, T const* tokens, T* rows) {
    T* gathered = gathered_.reserve(static_cast<std::size_t>(gathered_tokens_) * hidden_);
    parallel::all_gather_v(groups_.tp_ep(), tokens, gathered, tokens_per_rank_, hidden_);
    rows_.gather(pool, gathered, hidden_, rows);
  }
  void combine(thread_pool& pool, T const* rows, T* out) {
    T* gathered = gathered_.reserve(static_cast<std::size_t>(gathered_tokens_) * hidden_);
    rows_.combine(pool, rows, hidden_, gathered, false);
    reduce_scatter(pool, gathered, out);
  }
  void combine_grad(thread_pool& pool, T const* grad_rows, T const* grad_row_probs, T* dx,
                    row_matrix<P>& grad_probs) {
    auto const& comm = groups_.tp_ep();
    int const E = groups_.num_experts();
    grad_probs_.resize(gathered_tokens_, E);
    grad_probs_.setZero();
    rows_.scatter_probs(grad_row_probs, groups_.first_expert(), grad_probs_);
    auto scatter_probs = parallel::reduce_scatter_v_start(comm, grad_probs_.data(),
                                                          grad_probs.data(), tokens_per_rank_, E);
    int const mine = static_cast<int>(tokens_per_rank_[static_cast<std::size_t>(comm.rank())]);
    T* partial = partial_.reserve(static_cast<std::size_t>(mine) * hidden_);
    combine(pool, grad_rows, partial);
    parallel_rows(pool, mine, [&](int begin, int end) {
      for (std::ptrdiff_t i = std::ptrdiff_t{begin} * hidden_; i < std::ptrdiff_t{end} * hidden_;
           ++i)
        dx[i] += partial[i];
    });
    scatter_probs.wait();
  }

  /// Sums the ranks' partial [Tg,H] outputs and keeps this rank's block: an all-to-all of the
  /// blocks, then the sum on the pool in rank order (MPI's reduce-scatter sums on one thread, and
  /// its order depends on the algorithm it picks; this one is the same on every run).
  void reduce_scatter(thread_pool& pool, T const* partial, T* out) {
    auto const& comm = groups_.tp_ep();
    int const n = comm.size();
    auto const me = static_cast<std::size_t>(comm.rank());
    std::int64_t const mine = tokens_per_rank_[me];
    mine_each_.assign(static_cast<std::size_t>(n), mine);
    T* blocks = blocks_.reserve(static_cast<std::size_t>(mine * n) * hidden_);
    parallel::all_to_all_v(comm, partial, tokens_per_rank_, blocks, mine_each_, hidden_);
    std::ptrdiff_t const block = mine * hidden_;
    parallel_rows(pool, static_cast<int>(mine), [&](int begin, int end) {
      std::ptrdiff_t const from = std::ptrdiff_t{begin} * hidden_,
                           to = std::ptrdiff_t{end} * hidden_;
      for (std::ptrdiff_t i = from; i < to; ++i) out[i] = blocks[i];
      for (int q = 1; q < n; ++q)
        for (std::ptrdiff_t i = from; i < to; ++i) out[i] += blocks[q * block + i];
    });
  }

  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return rows_.bytes() + static_cast<std::size_t>(map_.size());
  }

 private:
  expert_groups groups_;
  int hidden_;
  std::vector<std::int64_t> header_, tokens_per_rank_;
  std::int64_t gathered_tokens_ = 0;
  mask_matrix map_;
  token_rows rows_;
  buffer<T> gathered_, partial_, blocks_;
  std::vector<std::int64_t> mine_each_;
  row_matrix<P> probs_, grad_probs_;  // gathered, in the router's type
  activation_stash<std::vector<std::int64_t>, std::int64_t, mask_matrix, token_rows> stash_;
};

}  // namespace megamoe::dispatch
