// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/token_rows.hpp — one rank's side of a permutation: tokens to rows and back,
// split over the thread pool. Every dispatcher uses it for its local steps (the reference's permute
// and unpermute); the all-to-all also for the rows it sends, the all-gather for the gathered
// tokens.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/permute.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace megamoe::dispatch {

/// A permutation with its inverse index: for each token, its rows in ascending order (the order in
/// which the reference's unpermute adds them). Reused across micro-batches without allocating once
/// grown.
class token_rows {
 public:
  /// Builds the permutation of `map`'s experts [first_expert, first_expert + count) and its index.
  template <class Map>
  void assign(Map const& map, int capacity, int first_expert = 0, int count = -1) {
    make_permutation(map, perm_, capacity, first_expert, count);
    index();
  }

  [[nodiscard]] dispatch::permutation const& permutation() const noexcept { return perm_; }
  [[nodiscard]] int rows() const noexcept { return perm_.rows(); }
  [[nodiscard]] int tokens() const noexcept { return perm_.num_tokens; }
  [[nodiscard]] int source_token(int row) const {
    return perm_.source_token[static_cast<std::size_t>(row)];
  }
  [[nodiscard]] int row_expert(int row) const {
    return perm_.row_expert[static_cast<std::size_t>(row)];
  }

  /// Token t's rows, ascending (the order in which combine adds them).
  [[nodiscard]] std::span<int const> rows_of(int t) const {
    auto const at = static_cast<std::size_t>(t);
    return {order_.data() + start_[at], order_.data() + start_[at + 1]};
  }

  /// rows[j] = tokens[source_token[j]] (width elements each).
  template <class T>
  void gather(thread_pool& pool, T const* tokens, int width, T* rows_out) const {
    parallel_rows(pool, rows(), [&](int begin, int end) {
      for (int j = begin; j < end; ++j)
        std::copy_n(tokens + std::ptrdiff_t{source_token(j)} * width, width,
                    rows_out + std::ptrdiff_t{j} * width);
    });
  }

  /// row_probs[j] = probs(source_token[j], first_expert + row_expert[j]), cast to T.
  template <class T, class P>
  void gather_probs(row_matrix<P> const& probs, int first_expert, T* row_probs) const {
    for (int j = 0; j < rows(); ++j)
      row_probs[j] = static_cast<T>(probs(source_token(j), first_expert + row_expert(j)));
  }

  /// grad_probs(source_token[j], first_expert + row_expert[j]) = grad_row_probs[j]; other entries
  /// are left as they are.
  template <class T, class P>
  void scatter_probs(T const* grad_row_probs, int first_expert, row_matrix<P>& grad_probs) const {
    for (int j = 0; j < rows(); ++j)
      grad_probs(source_token(j), first_expert + row_expert(j)) = static_cast<P>(grad_row_probs[j]);
  }

  /// out[t] (+)= the sum of its rows, in row order; tokens with no rows get 0 (or keep their
  /// value).
  template <class T>
  void combine(thread_pool& pool, T const* rows_in, int width, T* out, bool add) const {
    parallel_rows(pool, tokens(), [&](int begin, int end) {
      for (int t = begin; t < end; ++t) {
        row_matrix_map<T> o(out + std::ptrdiff_t{t} * width, 1, width);
        if (!add) o.setZero();
        for (int i = start_[static_cast<std::size_t>(t)];
             i < start_[static_cast<std::size_t>(t) + 1]; ++i)
          o += const_row_matrix_map<T>(
              rows_in + std::ptrdiff_t{order_[static_cast<std::size_t>(i)]} * width, 1, width);
      }
    });
  }

  /// Bytes of the bookkeeping (kept from forward to backward).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return (perm_.source_token.size() + perm_.row_expert.size() + start_.size() + order_.size()) *
           sizeof(int);
  }

 private:
  void index();

  dispatch::permutation perm_;
  std::vector<int> start_, order_, fill_;
};

}  // namespace megamoe::dispatch

#if MEGAMOE_HEADER_ONLY
#include <megamoe/dispatch/token_rows.ipp>
#endif
