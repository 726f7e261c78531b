// SPDX-License-Identifier: Apache-2.0
// The BF16 tile GEMM (expert/tile_gemm.hpp) against a plain double-precision product of the same
// BF16 values, for shapes with tails in every dimension: on the emulated tile unit everywhere, on
// the AMX and AVX512-BF16 units where this process may use them; packing from memory against
// packing value by value, denormals flushed, depths that must agree, and the units following the
// CPU and the environment. Where /proc/cpuinfo lists amx_tile but the AMX test would skip (the OS
// refused, or megamoe's detection is wrong), the test fails instead. The tile backend under the
// experts' FFN is in backends_test.cpp.
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/expert/tile_gemm.hpp>

#include "expert/tile_units.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace tl = megamoe::expert::tiles;

namespace {

using megamoe::testing::amx_skip_reason;
using megamoe::testing::avx512_bf16_skip_reason;
using megamoe::testing::bf16_normal;
using megamoe::testing::cpuinfo_lists;
using megamoe::testing::cpuinfo_lists_amx;

struct shape {
  int m, n, k;
};

// 1x1x1, primes, exact tiles, tails of one in each dimension, more than one panel of B, empty.
std::vector<shape> const shapes = {{1, 1, 1},    {7, 13, 37},  {16, 16, 32},  {17, 16, 32},
                                   {16, 17, 32}, {16, 16, 33}, {32, 32, 64},  {33, 31, 65},
                                   {5, 200, 70}, {97, 131, 3}, {64, 257, 96}, {0, 8, 8},
                                   {8, 0, 8},    {8, 8, 0},    {45, 160, 96}};

/// Runs every shape on `Tiles`, A and B packed in both orientations, and checks each entry
/// against the double product within the fp32 summation bound (K + 2) u sum |a b|.
template <class Tiles>
void matches_double_product(Tiles& tiles, bool transposed) {
  for (auto const [m, n, k] : shapes) {
    SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) +
                 (transposed ? " (transposed operands)" : ""));
    std::vector<float> a(static_cast<std::size_t>(m) * k), b(static_cast<std::size_t>(k) * n);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = bf16_normal(11, i);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = bf16_normal(12, i);
    auto A = [&](int r, int c) { return a[static_cast<std::size_t>(r) * k + c]; };
    auto B = [&](int r, int c) { return b[static_cast<std::size_t>(r) * n + c]; };
    tl::packed_a pa;
    tl::packed_b pb;
    if (transposed) {
      // A given as [K, M] and B as [N, K] (as wgrad and fprop read them).
      std::vector<float> at(a.size()), bt(b.size());
      for (int r = 0; r < m; ++r)
        for (int c = 0; c < k; ++c) at[static_cast<std::size_t>(c) * m + r] = A(r, c);
      for (int r = 0; r < k; ++r)
        for (int c = 0; c < n; ++c) bt[static_cast<std::size_t>(c) * k + r] = B(r, c);
      tl::pack_a(
          m, k, [&](int r, int c) { return at[static_cast<std::size_t>(c) * m + r]; }, pa);
      tl::pack_b(
          k, n, [&](int r, int c) { return bt[static_cast<std::size_t>(c) * k + r]; }, pb);
    } else {
      tl::pack_a(m, k, A, pa);
      tl::pack_b(k, n, B, pb);
    }
    // Accumulating onto a known C with alpha = 0.5 checks the epilogue too.
    std::vector<float> c(static_cast<std::size_t>(m) * n);
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 7) - 3.0F;
    std::vector<float> const c0 = c;
    tl::gemm(tiles, pa, pb, c.data(), n, 0.5F, true);
    double const u = std::ldexp(1.0, -24);
    for (int r = 0; r < m; ++r)
      for (int col = 0; col < n; ++col) {
        double sum = 0.0, magnitude = 0.0;
        for (int i = 0; i < k; ++i) {
          sum += static_cast<double>(A(r, i)) * B(i, col);
          magnitude += std::abs(static_cast<double>(A(r, i)) * B(i, col));
        }
        auto const at = static_cast<std::size_t>(r) * n + col;
        double const want = 0.5 * sum + c0[at];
        double const bound = 0.5 * (k + 2) * u * magnitude + 2 * u * std::abs(want) + 1e-30;
        ASSERT_LE(std::abs(c[at] - want), bound) << "entry (" << r << ", " << col << ")";
      }
  }
}

/// Every shape in both orientations on a fresh `Tiles`, which counts its products, into the
/// process's counter too.
template <class Tiles>
void unit_matches_double_product() {
  auto const before = tl::products_issued().load();
  Tiles tiles;
  matches_double_product(tiles, false);
  matches_double_product(tiles, true);
  EXPECT_GT(tiles.products, 0U);
  EXPECT_GT(tl::products_issued().load(), before);
}

TEST(TileGemm, EmulatedTilesMatchTheDoubleProduct) {
  unit_matches_double_product<tl::emulated_tiles>();
}

TEST(TileGemm, EmulatedTilesFlushDenormals) {
  // TDPBF16PS reads BF16 denormals as zero: 2^-130 x 2^10 is 2^-120 exactly, and zero on the tiles.
  tl::packed_a a;
  tl::packed_b b;
  tl::pack_a(
      1, 1, [](int, int) { return std::ldexp(1.0F, -130); }, a);
  tl::pack_b(
      1, 1, [](int, int) { return std::ldexp(1.0F, 10); }, b);
  float c = 1.0F;
  tl::emulated_tiles tiles;
  tl::gemm(tiles, a, b, &c, 1);
  EXPECT_EQ(c, 0.0F);
}

TEST(TileGemm, PackingFromMemoryEqualsPackingByValue) {
  // pack_a / pack_b from an operand in memory (AVX-512 where the CPU has it) against the packers
  // that read value(r, c) one element at a time: the same bits, for every shape, both
  // orientations, a leading dimension wider than the rows, per-tensor factors that are not powers
  // of two, and NaN, infinities, denormals and ties to even among the values.
  float const specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            1.0F + std::ldexp(1.0F, -8),      // a tie: rounds to even (1)
                            1.0F + 3 * std::ldexp(1.0F, -8),  // a tie: rounds up
                            -std::numeric_limits<float>::max()};
  for (auto const [m, n, k] : shapes)
    for (bool const transposed : {false, true})
      for (float const unit : {1.0F, 0.3F, 0.0078125F}) {
        SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) +
                     (transposed ? " transposed" : "") + " unit " + std::to_string(unit));
        // A [m, k] and B [k, n] in storage of rows x cols with 3 spare columns per row.
        auto stored = [&](int rows, int cols, std::uint64_t seed) {
          std::vector<float> v(static_cast<std::size_t>(rows) * (cols + 3));
          for (std::size_t i = 0; i < v.size(); ++i)
            v[i] = i % 11 == 5 ? specials[(i / 11) % std::size(specials)]
                               : static_cast<float>(megamoe::standard_normal(seed, i));
          return v;
        };
        // A is stored [k, m] when transposed (wgrad), B [n, k] (fprop).
        int const a_rows = transposed ? k : m, a_cols = transposed ? m : k;
        int const b_rows = transposed ? n : k, b_cols = transposed ? k : n;
        auto const a = stored(a_rows, a_cols, 3), b = stored(b_rows, b_cols, 4);
        std::ptrdiff_t const lda = a_cols + 3, ldb = b_cols + 3;
        auto at = [&](std::vector<float> const& v, std::ptrdiff_t ld, bool t, int r, int c) {
          return (t ? v[static_cast<std::size_t>(c * ld + r)]
                    : v[static_cast<std::size_t>(r * ld + c)]) /
                 unit;
        };
        tl::packed_a pa_memory, pa_values;
        tl::packed_b pb_memory, pb_values;
        tl::pack_a({a.data(), lda, transposed, unit}, m, k, pa_memory);
        tl::pack_a(
            m, k, [&](int r, int c) { return at(a, lda, transposed, r, c); }, pa_values);
        tl::pack_b({b.data(), ldb, transposed, unit}, k, n, pb_memory);
        tl::pack_b(
            k, n, [&](int r, int c) { return at(b, ldb, transposed, r, c); }, pb_values);
        ASSERT_EQ(pa_memory.bits, pa_values.bits);
        ASSERT_EQ(pb_memory.bits, pb_values.bits);
      }
}

TEST(TileGemm, DepthsMustAgree) {
  tl::packed_a a;
  tl::packed_b b;
  tl::pack_a(
      2, 3, [](int, int) { return 1.0F; }, a);
  tl::pack_b(
      4, 2, [](int, int) { return 1.0F; }, b);
  std::vector<float> c(4);
  tl::emulated_tiles tiles;
  EXPECT_THROW(tl::gemm(tiles, a, b, c.data(), 2), megamoe::input_error);
}

TEST(TileGemm, AmxTilesMatchTheDoubleProduct) {
  if (auto const why = amx_skip_reason(); !why.empty()) GTEST_SKIP() << why;
#if MEGAMOE_HAS_AMX_INTRINSICS
  unit_matches_double_product<tl::hardware_tiles>();
#else
  FAIL() << "AMX usable, but this compiler has no AMX intrinsics";
#endif
}

TEST(TileGemm, VectorTilesMatchTheDoubleProduct) {
  if (auto const why = avx512_bf16_skip_reason(); !why.empty()) GTEST_SKIP() << why;
#if MEGAMOE_HAS_AMX_INTRINSICS
  unit_matches_double_product<tl::vector_tiles>();
#else
  FAIL() << "AVX512-BF16 usable, but this compiler has no x86 intrinsics";
#endif
}

TEST(TileGemm, VectorTilesCountTheTileProductsTheyReplace) {
  if (auto const why = avx512_bf16_skip_reason(); !why.empty()) GTEST_SKIP() << why;
#if MEGAMOE_HAS_AMX_INTRINSICS
  // 33 x 47 x 65: 3 row tiles (two blocks: 2 + 1), 3 column tiles (2 + 1), 3 steps of 32 along K;
  // the emulated tiles issue exactly the products the hardware would.
  tl::packed_a a;
  tl::packed_b b;
  tl::pack_a(
      33, 65, [](int r, int c) { return bf16_normal(1, std::uint64_t(r) * 65 + c); }, a);
  tl::pack_b(
      65, 47, [](int r, int c) { return bf16_normal(2, std::uint64_t(r) * 47 + c); }, b);
  std::vector<float> c(33 * 47);
  tl::vector_tiles vector;
  tl::emulated_tiles emulated;
  tl::gemm(vector, a, b, c.data(), 47);
  tl::gemm(emulated, a, b, c.data(), 47);
  EXPECT_EQ(vector.products, emulated.products);
  EXPECT_EQ(emulated.products, 3U * 3U * 3U);
#endif
}

TEST(TileGemm, Avx512Bf16FollowsCpuAndEnvironment) {
  auto const& cpu = megamoe::cpu();
  if (cpu.avx512_disabled_by_environment) {
    EXPECT_FALSE(cpu.use_avx512_bf16());
    EXPECT_NE(cpu.avx512_bf16_unavailable_reason().find("MEGAMOE_DISABLE_AVX512"),
              std::string::npos);
  }
  if (!cpu.use_avx512_bf16()) {
    EXPECT_NE(cpu.avx512_bf16_unavailable_reason().find("per_expert, grouped, tensor"),
              std::string::npos)
        << "the reason names the fp32 backends";
  } else {
    EXPECT_TRUE(cpu.avx512_bf16_unavailable_reason().empty());
  }
  if (!cpuinfo_lists(" avx512_bf16")) {
    EXPECT_FALSE(cpu.use_avx512_bf16());
  }
}

TEST(TileGemm, AmxFollowsCpuAndEnvironment) {
  auto const& cpu = megamoe::cpu();
  char const* disable = std::getenv("MEGAMOE_DISABLE_AMX");
  bool const disabled =
      disable != nullptr && std::string_view(disable) != "" && std::string_view(disable) != "0";
  EXPECT_EQ(cpu.amx_disabled_by_environment, disabled);
  if (disabled) {
    EXPECT_FALSE(cpu.use_amx());
    EXPECT_NE(cpu.amx_unavailable_reason().find("MEGAMOE_DISABLE_AMX"), std::string::npos);
  }
  if (!cpu.use_amx()) {
    EXPECT_NE(cpu.amx_unavailable_reason().find("per_expert, grouped, tensor"), std::string::npos)
        << "the reason names the fp32 backends";
  } else {
    EXPECT_TRUE(cpu.amx_unavailable_reason().empty());
  }
  if (!cpuinfo_lists_amx()) {
    EXPECT_FALSE(cpu.use_amx());
  }
}

}  // namespace
