// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/exchange.hpp — what the MoE layer asks of a dispatcher, as a concept, and the
// exchange every dispatcher runs unless it overlaps: dispatch the tokens to their experts' rows,
// let the expert stage compute on them, combine the rows back into tokens; backward the reverse.
//
// The layer calls `forward` / `backward` with the expert stage's computation (`compute(first,
// last)` over local experts [first, last)); a dispatcher that overlaps its exchange with compute
// (dispatch::all_to_all_overlap) calls it once per piece of local experts while the next piece's
// rows arrive, every other dispatcher once for all of them. So the layer has one pipeline.
#pragma once

#include <megamoe/core/stage_times.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>

namespace megamoe::dispatch {

/// A computation over local experts [first, last) (the expert stage's forward or backward).
template <class C>
concept expert_computation = std::invocable<C&, int, int>;

namespace detail {
/// Stands for an expert computation in the concept below.
struct any_expert_computation {
  void operator()(int, int) const noexcept {}
};
}  // namespace detail

/// A dispatcher of rows of T with routing probs of type P, as the MoE layer uses it:
///   plan(pool, map [T,E], capacity, earlier)     collective: decides the rows of a micro-batch
///   expert_rows(), tokens_per_local_expert()      what the local experts see after the plan
///   forward(pool, times, tokens [T,H], rows [N,H], probs [T,E], row_probs [N], expert_out [N,H],
///           out [T,H], compute)                   tokens -> rows, compute, rows -> tokens
///   backward(pool, times, dy [T,H], grad_rows [N,H], grad_row_probs [N], dx [T,H] (added),
///            grad_probs [T,E] (entries set), compute)
///   dispatch(pool, tokens, rows, probs, row_probs) tokens -> rows alone (recomputation)
///   saved_bytes()                                 bookkeeping kept from forward to backward
template <class D, class T, class P>
concept token_dispatcher = requires(D& d, D const& cd, thread_pool& pool, stage_times& times,
                                    mask_matrix const& map, T const* in, T* out,
                                    row_matrix<P> const& probs, row_matrix<P>& grad_probs,
                                    detail::any_expert_computation compute) {
  d.plan(pool, map, 0, std::exception_ptr{});
  d.dispatch(pool, in, out, probs, out);
  { cd.expert_rows() } -> std::convertible_to<int>;
  { cd.tokens_per_local_expert() } -> std::convertible_to<std::span<std::int64_t const>>;
  d.forward(pool, times, in, out, probs, out, in, out, compute);
  d.backward(pool, times, in, out, out, out, grad_probs, compute);
  { cd.saved_bytes() } -> std::convertible_to<std::size_t>;
};

/// The exchange of a dispatcher that does not overlap, from its own `dispatch`, `combine` and
/// `combine_grad`, timed as permute, experts and unpermute: tokens to rows, compute every local
/// expert, rows back to tokens.
template <class D, class T, class P, expert_computation Compute>
void sequential_forward(D& d, thread_pool& pool, stage_times& times, T const* tokens, T* rows,
                        row_matrix<P> const& probs, T* row_probs, T const* expert_out, T* out,
                        Compute&& compute) {
  int const local_experts = static_cast<int>(d.tokens_per_local_expert().size());
  times.time(layer_stage::permute, [&] { d.dispatch(pool, tokens, rows, probs, row_probs); });
  times.time(layer_stage::experts, [&] { compute(0, local_experts); });
  times.time(layer_stage::unpermute, [&] { d.combine(pool, expert_out, out); });
}

/// Its backward: combine's backward is a dispatch of dy (each row takes its token's gradient),
/// dispatch's backward a combine (each token adds its rows' gradients in row order, the probs'
/// gradients go back to their tokens).
template <class D, class T, class P, expert_computation Compute>
void sequential_backward(D& d, thread_pool& pool, stage_times& times, T const* dy, T* grad_rows,
                         T* grad_row_probs, T* dx, row_matrix<P>& grad_probs, Compute&& compute) {
  int const local_experts = static_cast<int>(d.tokens_per_local_expert().size());
  times.time(layer_stage::unpermute, [&] { d.dispatch(pool, dy, grad_rows); });
  times.time(layer_stage::experts, [&] { compute(0, local_experts); });
  times.time(layer_stage::permute,
             [&] { d.combine_grad(pool, grad_rows, grad_row_probs, dx, grad_probs); });
}

/// The forward and backward of a dispatcher `Derived` that does not overlap (CRTP).
template <class Derived, class T, class P>
class sequential_exchange {
 public:
  template <expert_computation Compute>
  void forward(thread_pool& pool, stage_times& times, T const* tokens, T* rows,
               row_matrix<P> const& probs, T* row_probs, T const* expert_out, T* out,
               Compute&& compute) {
    sequential_forward(static_cast<Derived&>(*this), pool, times, tokens, rows, probs, row_probs,
                       expert_out, out, compute);
  }
  template <expert_computation Compute>
  void backward(thread_pool& pool, stage_times& times, T const* dy, T* grad_rows, T* grad_row_probs,
                T* dx, row_matrix<P>& grad_probs, Compute&& compute) {
    sequential_backward(static_cast<Derived&>(*this), pool, times, dy, grad_rows, grad_row_probs,
                        dx, grad_probs, compute);
  }
};

}  // namespace megamoe::dispatch
