// SPDX-License-Identifier: Apache-2.0
// Test helper of the expert GEMM tests (gemm_test, sgemm_avx512_test, backends_test): operands of
// one product with random entries and padded leading dimensions, the check of C against the plain
// double-precision product within the rounding bound of any summation order, and a driver over
// every orientation, shape and accumulate flag.
#pragma once

#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/expert/gemm.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace megamoe::testing {

using expert::gemm_op;
using expert::gemm_problem;
using expert::gemm_workspace;

struct sizes {
  int m, n, k;
};

/// Operands of one product with random entries in [-1, 1] and padded leading dimensions (or
/// contiguous ones with `padded` false).
template <class T>
struct operands {
  gemm_op op;
  sizes s;
  int lda, ldb, ldc;
  std::vector<T> a, b, c;

  operands(gemm_op o, sizes sz, std::uint64_t seed, bool padded = true) : op(o), s(sz) {
    int const a_rows = op == gemm_op::tn ? s.k : s.m, a_cols = op == gemm_op::tn ? s.m : s.k;
    int const b_rows = op == gemm_op::nt ? s.n : s.k, b_cols = op == gemm_op::nt ? s.k : s.n;
    lda = a_cols + (padded ? 3 : 0);
    ldb = b_cols + (padded ? 5 : 0);
    ldc = s.n + (padded ? 2 : 0);
    std::uint64_t counter = splitmix64(seed);
    auto fill = [&](std::vector<T>& v, int rows, int ld) {
      v.assign(static_cast<std::size_t>(std::max(rows, 1)) * static_cast<std::size_t>(ld), T(0));
      for (auto& x : v) x = static_cast<T>(2.0 * uniform_open01(counter++) - 1.0);
    };
    fill(a, a_rows, lda);
    fill(b, b_rows, ldb);
    fill(c, s.m, ldc);
  }
  [[nodiscard]] double op_a(int i, int q) const {
    return op == gemm_op::tn ? a[static_cast<std::size_t>(q) * lda + i]
                             : a[static_cast<std::size_t>(i) * lda + q];
  }
  [[nodiscard]] double op_b(int q, int j) const {
    return op == gemm_op::nt ? b[static_cast<std::size_t>(j) * ldb + q]
                             : b[static_cast<std::size_t>(q) * ldb + j];
  }
  [[nodiscard]] gemm_problem<T> problem(bool accumulate) {
    return {s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c.data(), ldc, accumulate};
  }
};

/// Checks C (computed from `before` with or without accumulation) against the double product,
/// within the rounding bound of any summation order, |err| <= gamma_(k+1) * (sum |a||b| + |c0|),
/// and that the padding columns of C were not touched.
template <class T>
void expect_product(operands<T> const& o, std::vector<T> const& before, bool accumulate,
                    std::string const& what) {
  double const u = std::is_same_v<T, float> ? 0x1p-24 : 0x1p-53;
  double const gamma = (o.s.k + 1) * u / (1.0 - (o.s.k + 1) * u);
  int bad = 0;
  for (int i = 0; i < o.s.m; ++i) {
    for (int j = 0; j < o.s.n; ++j) {
      std::size_t const at = static_cast<std::size_t>(i) * o.ldc + j;
      double exact = accumulate ? static_cast<double>(before[at]) : 0.0;
      double magnitude = std::abs(exact);
      for (int q = 0; q < o.s.k; ++q) {
        exact += o.op_a(i, q) * o.op_b(q, j);
        magnitude += std::abs(o.op_a(i, q) * o.op_b(q, j));
      }
      double const err = std::abs(static_cast<double>(o.c[at]) - exact);
      if (!(err <= gamma * magnitude) && bad++ < 3)
        ADD_FAILURE() << what << ": C(" << i << "," << j << ") = " << o.c[at] << ", exact " << exact
                      << ", error " << err << " above " << gamma * magnitude;
    }
    for (int j = o.s.n; j < o.ldc; ++j) {
      std::size_t const at = static_cast<std::size_t>(i) * o.ldc + j;
      if (o.c[at] != before[at] && bad++ < 3) ADD_FAILURE() << what << ": padding written";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

inline std::vector<sizes> kernel_shapes() {
  // 1x1x1, primes, one either side of the register tile (14 x 32), the 16-wide transposes, the
  // 384-deep slices, the 256-wide B blocks and the 1344-row A blocks.
  return {{1, 1, 1},     {2, 3, 5},     {13, 17, 19},  {14, 32, 16},  {15, 33, 17},
          {29, 31, 7},   {27, 65, 385}, {3, 257, 383}, {100, 77, 33}, {45, 513, 769},
          {1345, 9, 20}, {7, 1, 1000},  {1, 300, 2},   {64, 64, 64},  {131, 259, 401}};
}

inline std::string label(gemm_op op, sizes s, bool accumulate) {
  char const* names[] = {"nt", "nn", "tn"};
  return std::string(names[static_cast<int>(op)]) + " " + std::to_string(s.m) + "x" +
         std::to_string(s.n) + "x" + std::to_string(s.k) + (accumulate ? " +=" : "");
}

/// Runs `run(problem, workspace)` on every orientation, shape and accumulate flag and checks it.
template <class T, class Run>
void check_kernel(Run const& run) {
  gemm_workspace<T> workspace;
  std::uint64_t seed = 1;
  for (gemm_op op : {gemm_op::nt, gemm_op::nn, gemm_op::tn})
    for (sizes s : kernel_shapes())
      for (bool accumulate : {false, true}) {
        operands<T> o(op, s, seed++);
        auto const before = o.c;
        run(op, o.problem(accumulate), workspace);
        expect_product(o, before, accumulate, label(op, s, accumulate));
      }
}

template <gemm_op Op, class T, class Rows>
void dispatch_op(gemm_op op, gemm_problem<T> const& p, gemm_workspace<T>& w, Rows const& rows) {
  if (op == Op) rows(std::integral_constant<gemm_op, Op>{}, p, w);
}
/// Calls rows(op-constant, p, w) for the run-time orientation `op`.
template <class T, class Rows>
void with_op(gemm_op op, gemm_problem<T> const& p, gemm_workspace<T>& w, Rows const& rows) {
  dispatch_op<gemm_op::nt>(op, p, w, rows);
  dispatch_op<gemm_op::nn>(op, p, w, rows);
  dispatch_op<gemm_op::tn>(op, p, w, rows);
}

/// Whether megamoe's AVX-512 kernel may run in this process's CPU.
inline bool avx512_available() {
#if MEGAMOE_HAS_AVX512_KERNELS
  return cpu().avx512f;
#else
  return false;
#endif
}

}  // namespace megamoe::testing
