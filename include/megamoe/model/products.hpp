// SPDX-License-Identifier: Apache-2.0
// megamoe/model/products.hpp — one dense matrix product on the pool's threads, through the expert
// GEMM backend (AVX-512 where the CPU has it): the projections of attention and the output layer.
#pragma once

#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/gemm_problem.hpp>

#include <span>

namespace megamoe {

/// C = op(A) op(B), or C += with `accumulate` (expert::gemm_op: nt reads B as [n, k], tn reads A
/// as [k, m]); row-major operands with leading dimensions, split over the threads by rows of C.
template <expert::gemm_op Op, class T>
void threaded_product(expert::executor<T>& exec, int m, int n, int k, T const* a, int lda,
                      T const* b, int ldb, T* c, int ldc, bool accumulate = false) {
  expert::gemm_problem<T> const p{m, n, k, a, lda, b, ldb, c, ldc, accumulate};
  expert::grouped_gemm::run<Op>(exec, std::span<expert::gemm_problem<T> const>(&p, 1));
}

}  // namespace megamoe
