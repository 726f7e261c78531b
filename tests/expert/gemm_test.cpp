// SPDX-License-Identifier: Apache-2.0
// The expert GEMM (expert/gemm.hpp) against a plain double-precision product: Eigen's GEBP kernel
// in fp32 and fp64 on every orientation, shapes from 1x1x1 through every tail of the blocking,
// leading dimensions wider than the rows and accumulation; a zero depth clearing or keeping C; and
// the process's kernel choice following the CPU and MEGAMOE_DISABLE_AVX512, with the dispatching
// entry point giving the product on whichever kernel it chose. The AVX-512 kernel called directly
// is in sgemm_avx512_test.cpp.
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/expert/gemm.hpp>

#include "expert/gemm_checks.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

using megamoe::expert::gemm_op;
using megamoe::expert::gemm_problem;
using megamoe::expert::gemm_workspace;
using megamoe::testing::avx512_available;
using megamoe::testing::check_kernel;
using megamoe::testing::expect_product;
using megamoe::testing::operands;
using megamoe::testing::with_op;

TEST(GemmKernels, EigenGebpMatchesDoubleProductFp32AndFp64) {
  auto eigen = [](gemm_op op, auto const& p, auto& w) {
    with_op(op, p, w, [](auto o, auto const& q, auto& ws) {
      megamoe::expert::gemm_rows_eigen<decltype(o)::value>(q, 0, q.m, ws);
    });
  };
  check_kernel<float>(eigen);
  check_kernel<double>(eigen);
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
