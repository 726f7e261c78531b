// SPDX-License-Identifier: Apache-2.0
// What one expert GEMM is (expert/gemm_problem.hpp): an empty problem by default (no sizes, no
// operands, C overwritten, per-tensor factors of 1), the field order every backend's braced
// initialisers rely on, and its FLOP count 2mnk in double (no integer overflow for large experts).
#include <megamoe/expert/gemm_problem.hpp>

#include <gtest/gtest.h>

#include <type_traits>

namespace ex = megamoe::expert;

namespace {

static_assert(std::is_aggregate_v<ex::gemm_problem<float>>);
static_assert(std::is_trivially_copyable_v<ex::gemm_problem<double>>);

TEST(GemmProblem, DefaultsToAnEmptyOverwritingProblem) {
  ex::gemm_problem<float> const p;
  EXPECT_EQ(p.m, 0);
  EXPECT_EQ(p.n, 0);
  EXPECT_EQ(p.k, 0);
  EXPECT_EQ(p.a, nullptr);
  EXPECT_EQ(p.b, nullptr);
  EXPECT_EQ(p.c, nullptr);
  EXPECT_EQ(p.lda, 0);
  EXPECT_EQ(p.ldb, 0);
  EXPECT_EQ(p.ldc, 0);
  EXPECT_FALSE(p.accumulate);
  EXPECT_EQ(p.a_unit, 1.0F);
  EXPECT_EQ(p.b_unit, 1.0F);
  EXPECT_EQ(p.flops(), 0.0);
}

TEST(GemmProblem, FieldsInTheOrderTheBackendsInitialiseThem) {
  double a[6] = {}, b[6] = {}, c[4] = {};
  // {m, n, k, a, lda, b, ldb, c, ldc, accumulate}, as grouped_mlp writes its problems.
  ex::gemm_problem<double> const p{2, 2, 3, a, 3, b, 2, c, 2, true};
  EXPECT_EQ(p.m, 2);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.k, 3);
  EXPECT_EQ(p.a, a);
  EXPECT_EQ(p.lda, 3);
  EXPECT_EQ(p.b, b);
  EXPECT_EQ(p.ldb, 2);
  EXPECT_EQ(p.c, c);
  EXPECT_EQ(p.ldc, 2);
  EXPECT_TRUE(p.accumulate);
  EXPECT_EQ(p.a_unit, 1.0F);  // factors left out stay 1
  EXPECT_EQ(p.flops(), 24.0);
}

TEST(GemmProblem, FlopsAreTwoMnkInDouble) {
  ex::gemm_problem<float> p;
  p.m = 4096;
  p.n = 14336;
  p.k = 4096;  // 2mnk = 4.8e11, far beyond int
  EXPECT_EQ(p.flops(), 2.0 * 4096.0 * 14336.0 * 4096.0);
  p.k = 0;
  EXPECT_EQ(p.flops(), 0.0);
  EXPECT_NE(ex::gemm_op::nt, ex::gemm_op::nn);
  EXPECT_NE(ex::gemm_op::nn, ex::gemm_op::tn);
}

}  // namespace
