// SPDX-License-Identifier: Apache-2.0
// The expert GEMM kernels against a plain double-precision product: every orientation, shapes
// from 1x1x1 through every tail of the AVX-512 kernel's register and cache blocking, leading
// dimensions wider than the rows, accumulation, row shares.
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/expert/gemm.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using megamoe::expert::gemm_op;
using megamoe::expert::gemm_problem;
using megamoe::expert::gemm_workspace;

struct sizes {
  int m, n, k;
};

/// Operands of one product with random entries in [-1, 1] and padded leading dimensions.
template <class T>
struct operands {
  gemm_op op;
  sizes s;
  int lda, ldb, ldc;
  std::vector<T> a, b, c;

  operands(gemm_op o, sizes sz, std::uint64_t seed) : op(o), s(sz) {
    int const a_rows = op == gemm_op::tn ? s.k : s.m, a_cols = op == gemm_op::tn ? s.m : s.k;
    int const b_rows = op == gemm_op::nt ? s.n : s.k, b_cols = op == gemm_op::nt ? s.k : s.n;
    lda = a_cols + 3;
    ldb = b_cols + 5;
    ldc = s.n + 2;
    std::uint64_t counter = megamoe::splitmix64(seed);
    auto fill = [&](std::vector<T>& v, int rows, int ld) {
      v.assign(static_cast<std::size_t>(std::max(rows, 1)) * static_cast<std::size_t>(ld), T(0));
      for (auto& x : v) x = static_cast<T>(2.0 * megamoe::uniform_open01(counter++) - 1.0);
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

std::vector<sizes> kernel_shapes() {
  // 1x1x1, primes, one either side of the register tile (14 x 32), the 16-wide transposes, the
  // 384-deep slices, the 256-wide B blocks and the 1344-row A blocks.
  return {{1, 1, 1},     {2, 3, 5},     {13, 17, 19},  {14, 32, 16},  {15, 33, 17},
          {29, 31, 7},   {27, 65, 385}, {3, 257, 383}, {100, 77, 33}, {45, 513, 769},
          {1345, 9, 20}, {7, 1, 1000},  {1, 300, 2},   {64, 64, 64},  {131, 259, 401}};
}

std::string label(gemm_op op, sizes s, bool accumulate) {
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

bool avx512_available() {
#if MEGAMOE_HAS_AVX512_KERNELS
  return megamoe::cpu().avx512f;
#else
  return false;
#endif
}

TEST(GemmKernels, EigenGebpMatchesDoubleProductFp32AndFp64) {
  auto eigen = [](gemm_op op, auto const& p, auto& w) {
    with_op(op, p, w, [](auto o, auto const& q, auto& ws) {
      megamoe::expert::gemm_rows_eigen<decltype(o)::value>(q, 0, q.m, ws);
    });
  };
  check_kernel<float>(eigen);
  check_kernel<double>(eigen);
}

TEST(GemmKernels, Avx512MatchesDoubleProduct) {
  if (!avx512_available()) GTEST_SKIP() << "this CPU has no AVX-512 (the Eigen kernel serves fp32)";
#if MEGAMOE_HAS_AVX512_KERNELS
  check_kernel<float>([](gemm_op op, gemm_problem<float> const& p, gemm_workspace<float>& w) {
    with_op(op, p, w, [](auto o, auto const& q, auto& ws) {
      megamoe::expert::gemm_rows_avx512<decltype(o)::value>(q, 0, q.m, ws);
    });
  });
#endif
}

TEST(GemmKernels, Avx512RowSharesAreBitIdenticalToTheWholeProduct) {
  if (!avx512_available()) GTEST_SKIP() << "this CPU has no AVX-512";
#if MEGAMOE_HAS_AVX512_KERNELS
  gemm_workspace<float> workspace;
  for (gemm_op op : {gemm_op::nt, gemm_op::nn, gemm_op::tn}) {
    operands<float> whole(op, {1400, 70, 777}, 7);
    operands<float> cut = whole;
    auto rows = [](auto o, auto const& q, auto& ws, int begin, int end) {
      megamoe::expert::gemm_rows_avx512<decltype(o)::value>(q, begin, end, ws);
    };
    with_op(op, whole.problem(false), workspace,
            [&](auto o, auto const& q, auto& ws) { rows(o, q, ws, 0, q.m); });
    // Shares starting at offsets that are no multiple of the 14-row tile or the 16-row grain.
    int const cuts[] = {0, 1, 15, 16, 333, 1343, 1344, 1399, 1400};
    for (std::size_t i = 0; i + 1 < std::size(cuts); ++i)
      with_op(op, cut.problem(false), workspace,
              [&](auto o, auto const& q, auto& ws) { rows(o, q, ws, cuts[i], cuts[i + 1]); });
    EXPECT_EQ(whole.c, cut.c) << label(op, whole.s, false);
  }
#endif
}

TEST(GemmKernels, ZeroDepthClearsOrKeepsC) {
  for (bool accumulate : {false, true}) {
    operands<float> o(gemm_op::nt, {5, 40, 0}, 3);
    auto const before = o.c;
    gemm_workspace<float> workspace;
    megamoe::expert::gemm<gemm_op::nt>(o.problem(accumulate), workspace);
    expect_product(o, before, accumulate, accumulate ? "k = 0 +=" : "k = 0");
  }
}

TEST(GemmKernels, ProcessKernelFollowsCpuAndEnvironment) {
  using megamoe::expert::gemm_kernel;
  using megamoe::expert::kernel_for;
  char const* disable = std::getenv("MEGAMOE_DISABLE_AVX512");
  bool const disabled =
      disable != nullptr && std::string(disable) != "" && std::string(disable) != "0";
  EXPECT_EQ(megamoe::cpu().avx512_disabled_by_environment, disabled);
  EXPECT_EQ(kernel_for<double>(), gemm_kernel::eigen_gebp);
  EXPECT_EQ(kernel_for<float>(),
            avx512_available() && !disabled ? gemm_kernel::avx512 : gemm_kernel::eigen_gebp);
  // The dispatching entry point gives the product on whichever kernel was chosen.
  check_kernel<float>([](gemm_op op, gemm_problem<float> const& p, gemm_workspace<float>& w) {
    with_op(op, p, w, [](auto o, auto const& q, auto& ws) {
      megamoe::expert::gemm<decltype(o)::value>(q, ws);
    });
  });
}

}  // namespace
