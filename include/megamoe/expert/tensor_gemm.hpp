// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/tensor_gemm.hpp — the GEMM backend on Eigen Tensor contractions
// (expert::tensor_contraction), the one header through which megamoe includes Eigen's Tensor
// module. A configuration choosing that backend includes it (core/by_need.hpp); the others do not
// parse the module.
//
// EIGEN_USE_THREADS changes what Eigen's Tensor headers declare, so every translation unit of a
// program must agree on it (otherwise the ODR is broken silently). megamoe therefore never defines
// it in a header: it is an INTERFACE compile definition of the CMake target megamoe::megamoe, set
// on every translation unit that links the target, whatever it includes first.
#pragma once

#ifndef EIGEN_USE_THREADS
#error \
    "megamoe needs EIGEN_USE_THREADS on every translation unit: link the CMake target megamoe::megamoe (or add -DEIGEN_USE_THREADS everywhere)"
#endif

#include <megamoe/core/by_need.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/gemm.hpp>
#include <megamoe/expert/tags.hpp>

#include <unsupported/Eigen/CXX11/Tensor>

#include <array>
#include <span>

namespace megamoe::expert {

/// Eigen Tensor contractions on the pool's device, one problem after another (each operand a
/// corner of its leading dimension).
struct tensor_gemm {
  static constexpr gemm_backend id = gemm_backend::tensor_contraction;
  template <gemm_op Op, class T>
  static void run(executor<T>& exec, std::span<gemm_problem<T> const> problems) {
    using matrix = Eigen::TensorMap<Eigen::Tensor<T, 2, Eigen::RowMajor>>;
    using const_matrix = Eigen::TensorMap<Eigen::Tensor<T const, 2, Eigen::RowMajor>>;
    // nt contracts A's and B's columns, nn A's columns with B's rows, tn A's rows with B's rows.
    constexpr std::array<Eigen::IndexPair<int>, 1> dims{
        Eigen::IndexPair<int>(Op == gemm_op::tn ? 0 : 1, Op == gemm_op::nt ? 1 : 0)};
    auto const device = exec.pool().device();
    // Each operand is the [rows, cols] corner of a row-major array whose rows are ld apart.
    auto const corner = [](auto& full, int rows, int cols) {
      return full.slice(Eigen::array<Eigen::Index, 2>{0, 0},
                        Eigen::array<Eigen::Index, 2>{rows, cols});
    };
    auto const stride = [](int ld, int cols) { return ld > 0 ? ld : cols; };
    for (auto const& p : problems) {
      if (p.m == 0 || p.n == 0) continue;
      matrix c_full(p.c, p.m, stride(p.ldc, p.n));
      auto c = corner(c_full, p.m, p.n);
      if (p.k == 0) {
        if (!p.accumulate) c.device(device) = c.constant(T(0));
        continue;
      }
      int const a_rows = Op == gemm_op::tn ? p.k : p.m, a_cols = Op == gemm_op::tn ? p.m : p.k;
      int const b_rows = Op == gemm_op::nt ? p.n : p.k, b_cols = Op == gemm_op::nt ? p.k : p.n;
      const_matrix a_full(p.a, a_rows, stride(p.lda, a_cols));
      const_matrix b_full(p.b, b_rows, stride(p.ldb, b_cols));
      auto const a = corner(a_full, a_rows, a_cols);
      auto const b = corner(b_full, b_rows, b_cols);
      if (p.accumulate) {
        c.device(device) += a.contract(b, dims);
      } else {
        c.device(device) = a.contract(b, dims);
      }
    }
  }
};

}  // namespace megamoe::expert

namespace megamoe::by_need {
/// This header is included.
template <class Dependent>
inline constexpr bool included<module::tensor_gemm, Dependent> = true;
}  // namespace megamoe::by_need
