// SPDX-License-Identifier: Apache-2.0
// megamoe's fp32 AVX-512 GEMM (expert/sgemm_avx512.hpp), called directly where the CPU has
// AVX-512: the kernel against a plain double-precision product on every orientation and every tail
// of its register and cache blocking, row shares bit-identical to the whole product, the packed
// panels of op(A) and op(B) laid out as the micro-kernel reads them (zero past the tails), and a
// share of rows of a problem crossing the kc and nc blocks leaving every other row alone. The
// blocking constants are checked against what its comments promise (registers, cache sizes).

#include <megamoe/expert/sgemm_avx512.hpp>

#include <megamoe/core/cpu_features.hpp>
#include <megamoe/expert/gemm.hpp>

#include "expert/gemm_checks.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace {

using megamoe::expert::gemm_op;
using megamoe::expert::gemm_problem;
using megamoe::expert::gemm_workspace;
using megamoe::testing::avx512_available;
using megamoe::testing::check_kernel;
using megamoe::testing::label;
using megamoe::testing::operands;
using megamoe::testing::with_op;
using blk = megamoe::expert::avx512::sgemm_blocking;

// 14 x 2 accumulators, two vectors of B and one broadcast of A fit the 32 zmm registers.
static_assert(2 * blk::mr + 2 + 1 <= 32);
static_assert(blk::nr == 2 * 16);
static_assert(blk::mc % blk::mr == 0);
static_assert(blk::kc * blk::mr * sizeof(float) == 21 * 1024);        // an A micro-panel in L1
static_assert(blk::kc * blk::nc * sizeof(float) == 384 * 1024);       // a B block in L2
static_assert(blk::mc * blk::kc * sizeof(float) <= 2 * 1024 * 1024);  // an A block in L3
static_assert(blk::a_elements == static_cast<std::size_t>(blk::mc) * blk::kc);
static_assert(blk::b_elements == static_cast<std::size_t>(blk::kc) * blk::nc);

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

#if MEGAMOE_HAS_AVX512_KERNELS
namespace avx = megamoe::expert::avx512;

/// Packs op(A) rows [i0, i0 + mb), depths [p0, p0 + kb) and op(B) depths [p0, p0 + kb), columns
/// [j0, j0 + nb) with orientation Op and checks every entry of every panel.
template <gemm_op Op>
void expect_panels() {
  int const i0 = 3, mb = 31, j0 = 2, nb = 45, p0 = 5, kb = 37;  // tails in every direction
  operands<float> o(Op, {40, 50, 45}, 11);
  int const a_panels = (mb + blk::mr - 1) / blk::mr, b_panels = (nb + blk::nr - 1) / blk::nr;
  float const unset = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> pa(static_cast<std::size_t>(a_panels * blk::mr * kb), unset);
  std::vector<float> pb(static_cast<std::size_t>(b_panels * blk::nr * kb), unset);
  avx::detail::pack_a<Op>(o.a.data(), o.lda, i0, mb, p0, kb, pa.data());
  avx::detail::pack_b<Op>(o.b.data(), o.ldb, p0, kb, j0, nb, pb.data());
  int bad = 0;
  for (int q = 0; q < a_panels; ++q)
    for (int k = 0; k < kb; ++k)
      for (int r = 0; r < blk::mr; ++r) {
        int const row = q * blk::mr + r;
        float const want = row < mb ? static_cast<float>(o.op_a(i0 + row, p0 + k)) : 0.0F;
        float const got = pa[static_cast<std::size_t>((q * kb + k) * blk::mr + r)];
        if (!(got == want) && bad++ < 3)
          ADD_FAILURE() << "A panel " << q << " depth " << k << " row " << r << ": " << got
                        << ", want " << want;
      }
  for (int q = 0; q < b_panels; ++q)
    for (int k = 0; k < kb; ++k)
      for (int c = 0; c < blk::nr; ++c) {
        int const col = q * blk::nr + c;
        float const want = col < nb ? static_cast<float>(o.op_b(p0 + k, j0 + col)) : 0.0F;
        float const got = pb[static_cast<std::size_t>((q * kb + k) * blk::nr + c)];
        if (!(got == want) && bad++ < 3)
          ADD_FAILURE() << "B panel " << q << " depth " << k << " column " << c << ": " << got
                        << ", want " << want;
      }
  EXPECT_EQ(bad, 0);
}
#endif

TEST(Avx512Sgemm, PanelsHoldOpAAndOpBAsTheMicroKernelReadsThem) {
  if (!avx512_available()) GTEST_SKIP() << "this CPU has no AVX-512";
#if MEGAMOE_HAS_AVX512_KERNELS
  expect_panels<gemm_op::nt>();
  expect_panels<gemm_op::nn>();
  expect_panels<gemm_op::tn>();
#endif
}

TEST(Avx512Sgemm, ARowShareAcrossKcAndNcBlocksLeavesOtherRowsAlone) {
  if (!avx512_available()) GTEST_SKIP() << "this CPU has no AVX-512";
#if MEGAMOE_HAS_AVX512_KERNELS
  std::vector<float> packed_a(blk::a_elements), packed_b(blk::b_elements);
  int const begin = 5, end = 47;
  std::uint64_t seed = 20;
  for (gemm_op op : {gemm_op::nt, gemm_op::nn, gemm_op::tn})
    for (bool accumulate : {false, true}) {
      // k crosses one kc slice (384), n one nc block (256).
      operands<float> o(op, {60, 300, 400}, seed++);
      auto const before = o.c;
      auto const p = o.problem(accumulate);
      if (op == gemm_op::nt)
        avx::gemm_rows<gemm_op::nt>(p, begin, end, packed_a.data(), packed_b.data());
      if (op == gemm_op::nn)
        avx::gemm_rows<gemm_op::nn>(p, begin, end, packed_a.data(), packed_b.data());
      if (op == gemm_op::tn)
        avx::gemm_rows<gemm_op::tn>(p, begin, end, packed_a.data(), packed_b.data());
      double const gamma = (o.s.k + 1) * 0x1p-24;
      int bad = 0;
      for (int i = 0; i < o.s.m; ++i)
        for (int j = 0; j < o.ldc; ++j) {
          std::size_t const at = static_cast<std::size_t>(i) * o.ldc + j;
          if (i < begin || i >= end || j >= o.s.n) {
            if (o.c[at] != before[at] && bad++ < 3)
              ADD_FAILURE() << label(op, o.s, accumulate) << ": C(" << i << "," << j
                            << ") outside the share written";
            continue;
          }
          double exact = accumulate ? static_cast<double>(before[at]) : 0.0;
          double magnitude = std::abs(exact);
          for (int q = 0; q < o.s.k; ++q) {
            exact += o.op_a(i, q) * o.op_b(q, j);
            magnitude += std::abs(o.op_a(i, q) * o.op_b(q, j));
          }
          if (!(std::abs(o.c[at] - exact) <= gamma * magnitude) && bad++ < 3)
            ADD_FAILURE() << label(op, o.s, accumulate) << ": C(" << i << "," << j
                          << ") = " << o.c[at] << ", exact " << exact;
        }
      EXPECT_EQ(bad, 0) << label(op, o.s, accumulate);
    }
#endif
}

}  // namespace
