// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/gemm_problem.hpp — what one expert GEMM is: sizes, operands, orientation.
//
// The three products of an expert FFN, with weights stored [out, in] as the reference stores them:
//   gemm_op::nt  C[m,n]  = A[m,k] B[n,k]^T     fc1 / fc2 forward (x W^T)
//   gemm_op::nn  C[m,n]  = A[m,k] B[k,n]       data gradients (dy W)
//   gemm_op::tn  C[m,n] += A[k,m]^T B[k,n]     weight gradients (dy^T x)
#pragma once

namespace megamoe::expert {

enum class gemm_op { nt, nn, tn };

/// One product C = op(A) op(B) (or C += with `accumulate`), every operand row-major with its own
/// leading dimension. For `tn`, A is stored [k, m]; for `nt`, B is stored [n, k].
template <class T>
struct gemm_problem {
  int m = 0, n = 0, k = 0;
  T const* a = nullptr;
  int lda = 0;
  T const* b = nullptr;
  int ldb = 0;
  T* c = nullptr;
  int ldc = 0;
  bool accumulate = false;
  /// The operands' per-tensor factors: A = a_unit A' and B = b_unit B' where a precision recipe
  /// made A' and B' BF16 values (codes times block scales); 1 otherwise. The fp32 backends read A
  /// and B as they are; the tile backend multiplies A' B' on the tiles and scales by
  /// a_unit * b_unit.
  float a_unit = 1.0F, b_unit = 1.0F;
  [[nodiscard]] double flops() const { return 2.0 * m * n * k; }
};

}  // namespace megamoe::expert
