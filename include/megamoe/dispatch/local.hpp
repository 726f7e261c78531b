// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/local.hpp — the dispatcher of one expert rank (EP = ETP = 1): permutation only.
//
// Every dispatcher has this interface (the layer calls nothing else):
//   plan(pool, map [T,E], capacity, earlier)   collective; decides the expert rows of a
//   micro-batch.
//                                              `earlier`: a failure of this rank before the plan
//                                              (routing), which every rank then reports
//   expert_rows(), tokens_per_local_expert()   what the local experts see
//   dispatch(pool, tokens [T,H], rows, probs [T,E], row_probs)   tokens -> expert rows (+ probs)
//   dispatch(pool, dy [T,H], rows)             the same for the output gradient (combine backward)
//   combine(pool, rows, out [T,H])             expert rows -> tokens (sum of each token's rows)
//   combine_grad(pool, grad_rows, grad_row_probs, dx [T,H] (added), grad_probs [T,E] (entries set))
//                                              dispatch backward
// Rows are grouped by local expert; the all-to-all orders each expert's rows by source rank, then
// token; the others by token.
#pragma once

#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/exchange.hpp>
#include <megamoe/dispatch/token_rows.hpp>

#include <cstdint>
#include <exception>
#include <span>

namespace megamoe::dispatch {

/// T: the layer's scalar; P: the router's probs type.
template <class T, class P>
class local_dispatcher : public sequential_exchange<local_dispatcher<T, P>, T, P> {
 public:
  explicit local_dispatcher(int hidden) : hidden_(hidden) {}

  void plan(thread_pool&, mask_matrix const& map, int capacity,
            std::exception_ptr earlier = nullptr) {
    if (earlier) std::rethrow_exception(earlier);
    rows_.assign(map, capacity);
  }

  [[nodiscard]] int expert_rows() const noexcept { return rows_.rows(); }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_local_expert() const noexcept {
    return rows_.permutation().tokens_per_expert;
  }
  [[nodiscard]] token_rows const& local_rows() const noexcept { return rows_; }

  void dispatch(thread_pool& pool, T const* tokens, T* rows, row_matrix<P> const& probs,
                T* row_probs) {
    rows_.gather(pool, tokens, hidden_, rows);
    rows_.gather_probs(probs, 0, row_probs);
  }
  void dispatch(thread_pool& pool, T const* tokens, T* rows) {
    rows_.gather(pool, tokens, hidden_, rows);
  }
  void combine(thread_pool& pool, T const* rows, T* out) {
    rows_.combine(pool, rows, hidden_, out, false);
  }
  void combine_grad(thread_pool& pool, T const* grad_rows, T const* grad_row_probs, T* dx,
                    row_matrix<P>& grad_probs) {
    rows_.scatter_probs(grad_row_probs, 0, grad_probs);
    rows_.combine(pool, grad_rows, hidden_, dx, true);
  }

  /// Sets micro-batch `key`'s plan aside (core/stash.hpp), or brings it back.
  void park(std::uint64_t key) { stash_.park(key, rows_); }
  void restore(std::uint64_t key) { stash_.restore(key, rows_); }

  /// Bookkeeping kept from forward to backward.
  [[nodiscard]] std::size_t saved_bytes() const noexcept { return rows_.bytes(); }

 private:
  int hidden_;
  token_rows rows_;
  activation_stash<token_rows> stash_;
};

}  // namespace megamoe::dispatch
