// SPDX-License-Identifier: Apache-2.0
// megamoe's quantizer (precision::quantize<F>, quantize.hpp) for every operand format of every
// recipe: bit for bit the independent re-implementation in tests/reference/quantize_reference.hpp
// (codes, scales and dequantized values, on shapes with partial blocks), and the properties the
// recipes rely on (2D tiles transpose exactly, errors within half a step, seeded unbiased
// stochastic rounding, a given NVFP4 global amax).
#include <megamoe/core/random.hpp>
#include <megamoe/precision/quantize.hpp>
#include <megamoe/precision/recipe.hpp>

#include "reference/quantize_reference.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace mm = megamoe;
namespace pr = megamoe::precision;
namespace ref = megamoe::reference;

namespace {

std::vector<float> graded_values(int rows, int cols, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(rows) * cols);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(mm::standard_normal(seed, i) * (1.0 + static_cast<double>(i % 7)));
  return v;
}

/// x in format F through megamoe's quantizer.
template <pr::operand_format F>
pr::quantized_matrix quantized(std::vector<float> const& x, int rows, int cols,
                               float tensor_scale = 1.0F, std::uint64_t seed = 0) {
  pr::quantized_matrix q;
  pr::quantize<F>(x.data(), rows, cols, tensor_scale, seed, q);
  return q;
}

/// Values of q in format F as floats.
template <pr::operand_format F>
std::vector<float> values_of(pr::quantized_matrix const& q) {
  std::vector<float> out(static_cast<std::size_t>(q.rows) * q.cols);
  pr::dequantize<F>(
      q, [&](int r, int c, float v) { out[static_cast<std::size_t>(r) * q.cols + c] = v; });
  return out;
}

/// The E2M1 code of element i of an NVFP4 matrix (two per byte, element 2i low).
std::uint8_t fp4_code(pr::quantized_matrix const& q, std::size_t i) {
  return static_cast<std::uint8_t>((q.codes[i / 2] >> (4 * (i % 2))) & 0xF);
}

constexpr int rows = 37, cols = 160;  // partial blocks along both dimensions

using pr::element_kind;
using pr::scale_kind;
constexpr pr::operand_format e4m3_1x128{element_kind::e4m3, scale_kind::fp32_blocks, 1, 128};
constexpr pr::operand_format e4m3_128x128{element_kind::e4m3, scale_kind::fp32_blocks, 128, 128};
constexpr pr::operand_format mxfp8_e4m3{element_kind::e4m3, scale_kind::e8m0_blocks, 1, 32};
constexpr pr::operand_format nvfp4_1x16{element_kind::e2m1, scale_kind::nvfp4_blocks, 1, 16};
constexpr pr::operand_format nvfp4_16x16{element_kind::e2m1, scale_kind::nvfp4_blocks, 16, 16};
constexpr pr::operand_format nvfp4_1x16_sr{
    element_kind::e2m1, scale_kind::nvfp4_blocks, 1, 16, false, true};

TEST(Quantize, PerTensorMatchesTheReference) {
  constexpr auto f = pr::format_of(pr::fp8_tensorwise<pr::current>::value, pr::operand_role::grad,
                                   pr::operand_usage::rowwise);
  static_assert(f.element == pr::element_kind::e5m2 && f.scale == pr::scale_kind::per_tensor);
  auto const v = graded_values(rows, cols, 1);
  float const scale = pr::scale_from_amax(pr::amax_of(v), pr::max_finite<pr::e5m2>);
  auto const q = quantized<f>(v, rows, cols, scale);
  auto const want = ref::quantize_per_tensor<pr::e5m2>(v, rows, cols, scale);
  EXPECT_EQ(q.codes, want.codes);
  EXPECT_EQ(q.scale_inv, std::vector<float>{want.scale_inv});
  EXPECT_EQ(values_of<f>(q), ref::dequantize<pr::e5m2>(want));
}

TEST(Quantize, BlockwiseMatchesTheReference) {
  auto const v = graded_values(rows, cols, 2);
  constexpr auto x =
      pr::format_of(pr::fp8_blockwise::value, pr::operand_role::input, pr::operand_usage::rowwise);
  constexpr auto w =
      pr::format_of(pr::fp8_blockwise::value, pr::operand_role::weight, pr::operand_usage::rowwise);
  auto const qx = quantized<x>(v, rows, cols), qw = quantized<w>(v, rows, cols);
  auto const wx = ref::quantize_blockwise<pr::e4m3>(v, rows, cols, 1, 128, true);
  auto const ww = ref::quantize_blockwise<pr::e4m3>(v, rows, cols, 128, 128, true);
  EXPECT_EQ(qx.codes, wx.codes);
  EXPECT_EQ(qx.scale_inv, wx.scale_inv);
  EXPECT_EQ(qw.codes, ww.codes);
  EXPECT_EQ(qw.scale_inv, ww.scale_inv);
  EXPECT_EQ(values_of<w>(qw), ref::dequantize<pr::e4m3>(ww));
  // fp32 scales (not powers of two) too.
  auto const q = quantized<e4m3_1x128>(v, rows, cols);
  auto const want = ref::quantize_blockwise<pr::e4m3>(v, rows, cols, 1, 128, false);
  EXPECT_EQ(q.codes, want.codes);
  EXPECT_EQ(q.scale_inv, want.scale_inv);
}

TEST(Quantize, Mxfp8MatchesTheReference) {
  auto const v = graded_values(rows, cols, 3);
  constexpr auto f =
      pr::format_of(pr::mxfp8::value, pr::operand_role::grad, pr::operand_usage::columnwise);
  static_assert(f.block_cols == 32 && f.scale == pr::scale_kind::e8m0_blocks);
  auto const q = quantized<f>(v, rows, cols);
  auto const want = ref::quantize_mxfp8<pr::e4m3>(v, rows, cols);
  EXPECT_EQ(q.codes, want.codes);
  EXPECT_EQ(q.scale_codes, want.scales);
  EXPECT_EQ(values_of<f>(q), ref::dequantize<pr::e4m3>(want));
}

TEST(Quantize, Nvfp4MatchesTheReference) {
  auto const v = graded_values(rows, cols, 4);
  constexpr auto x =
      pr::format_of(pr::nvfp4::value, pr::operand_role::input, pr::operand_usage::rowwise);
  constexpr auto w =
      pr::format_of(pr::nvfp4::value, pr::operand_role::weight, pr::operand_usage::rowwise);
  constexpr auto g =
      pr::format_of(pr::nvfp4::value, pr::operand_role::grad, pr::operand_usage::rowwise);
  static_assert(!x.stochastic && !x.hadamard && w.block_rows == 16 && g.stochastic);
  static_assert(
      pr::format_of(pr::nvfp4::value, pr::operand_role::grad, pr::operand_usage::columnwise)
          .hadamard);
  auto const qx = quantized<x>(v, rows, cols), qw = quantized<w>(v, rows, cols);
  auto const qg = quantized<g>(v, rows, cols, 1.0F, 99);
  auto const wx = ref::quantize_nvfp4(v, rows, cols);
  auto const ww = ref::quantize_nvfp4(v, rows, cols, true);
  auto const wg = ref::quantize_nvfp4(v, rows, cols, false, ref::fp4_rounding::stochastic, 99);
  for (auto const& [q, want] : {std::pair{&qx, &wx}, std::pair{&qw, &ww}, std::pair{&qg, &wg}}) {
    EXPECT_EQ(q->codes, want->packed);
    EXPECT_EQ(q->scale_codes, want->scales);
    EXPECT_EQ(q->global_amax, want->global_amax);
  }
  EXPECT_EQ(values_of<w>(qw), ref::dequantize(ww));
  // A given global amax (the amax of the whole tensor a slice belongs to).
  pr::quantized_matrix q;
  pr::quantize<nvfp4_1x16>(v.data(), rows, cols, 1.0F, 0, q, 3.0F * pr::amax_of(v));
  auto const given = ref::quantize_nvfp4(v, rows, cols, false, ref::fp4_rounding::nearest_even, 0,
                                         3.0F * pr::amax_of(v));
  EXPECT_EQ(q.codes, given.packed);
  EXPECT_EQ(q.scale_codes, given.scales);
  EXPECT_EQ(values_of<nvfp4_1x16>(q), ref::dequantize(given));
}

TEST(Quantize, Bf16IsRoundToNearestEven) {
  auto const v = graded_values(rows, cols, 5);
  constexpr auto f =
      pr::format_of(pr::bf16::value, pr::operand_role::input, pr::operand_usage::rowwise);
  auto const q = quantized<f>(v, rows, cols);
  auto const got = values_of<f>(q);
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(got[i], pr::round_to_bf16(v[i]));
  EXPECT_EQ(q.bytes(), 2 * v.size());
}

std::vector<float> random_matrix(int r, int c, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0F, 2.0F);
  std::vector<float> x(static_cast<std::size_t>(r) * c);
  for (float& v : x) v = normal(rng);
  x[5] = 40.0F;  // an outlier
  return x;
}

std::vector<float> transposed(std::vector<float> const& x, int r, int c) {
  std::vector<float> t(x.size());
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < c; ++j)
      t[static_cast<std::size_t>(j) * r + i] = x[static_cast<std::size_t>(i) * c + j];
  return t;
}

TEST(Quantize, TwoDimensionalTilesGiveTheExactTransposeAsColumnwiseCopy) {
  int const r = 256, c = 384;
  auto const x = random_matrix(r, c, 1);
  auto const xt = transposed(x, r, c);
  auto const a = quantized<e4m3_128x128>(x, r, c), b = quantized<e4m3_128x128>(xt, c, r);
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < c; ++j)
      ASSERT_EQ(a.codes[static_cast<std::size_t>(i) * c + j],
                b.codes[static_cast<std::size_t>(j) * r + i]);
  auto const f = quantized<nvfp4_16x16>(x, r, c), g = quantized<nvfp4_16x16>(xt, c, r);
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < c; ++j)
      ASSERT_EQ(fp4_code(f, static_cast<std::size_t>(i) * c + j),
                fp4_code(g, static_cast<std::size_t>(j) * r + i));
  // Sizes: one byte per FP8 code, half a byte per FP4 code.
  EXPECT_EQ(a.codes.size(), x.size());
  EXPECT_EQ(f.codes.size(), x.size() / 2);
  EXPECT_EQ(f.scale_codes.size(), static_cast<std::size_t>(r / 16 * c / 16));
}

TEST(Quantize, DequantizedValuesAreWithinHalfAStepOfTheInput) {
  int const r = 64, c = 256;
  auto const x = random_matrix(r, c, 2);
  auto const mxd = values_of<mxfp8_e4m3>(quantized<mxfp8_e4m3>(x, r, c));
  auto const bwd = values_of<e4m3_1x128>(quantized<e4m3_1x128>(x, r, c));
  for (std::size_t i = 0; i < x.size(); ++i) {
    // E4M3 has 3 mantissa bits: relative error at most 2^-4 above the subnormal range.
    if (std::fabs(x[i]) > 1e-1F) {
      EXPECT_LE(std::fabs(mxd[i] - x[i]), std::fabs(x[i]) * 0.0625F) << i;
      EXPECT_LE(std::fabs(bwd[i] - x[i]), std::fabs(x[i]) * 0.0625F) << i;
    }
  }
}

TEST(Quantize, StochasticRoundingIsSeededUnbiasedAndOnlyBetweenNeighbours) {
  int const n = 200000;
  std::vector<float> x(static_cast<std::size_t>(n), 0.8F);
  x[0] = 6.0F;  // fixes the block scale of the first block: global amax 6 -> y = x * 1
  auto const a = quantized<nvfp4_1x16_sr>(x, 1, n, 1.0F, 11);
  auto const b = quantized<nvfp4_1x16_sr>(x, 1, n, 1.0F, 11);
  auto const c = quantized<nvfp4_1x16_sr>(x, 1, n, 1.0F, 12);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_NE(a.codes, c.codes);
  auto const d = values_of<nvfp4_1x16_sr>(a);
  double sum = 0;
  for (std::size_t i = 16; i < d.size(); ++i) sum += d[i];
  double const mean = sum / static_cast<double>(d.size() - 16);
  EXPECT_NEAR(mean, 0.8, 1e-3);  // unbiased up to the E4M3 rounding of the block scales
  // Blocks holding a 6 keep 0.8 at 0.8 (between 0.5 and 1.0): P(up) must be 0.6.
  std::vector<float> mixed(16 * 20000);
  for (std::size_t i = 0; i < mixed.size(); ++i) mixed[i] = i % 16 == 0 ? 6.0F : 0.8F;
  auto const m = quantized<nvfp4_1x16_sr>(mixed, 1, static_cast<int>(mixed.size()), 1.0F, 5);
  long up = 0, count = 0;
  for (std::size_t i = 0; i < mixed.size(); ++i) {
    if (i % 16 == 0) continue;
    float const v = pr::decode<pr::e2m1>(fp4_code(m, i));
    ASSERT_TRUE(v == 0.5F || v == 1.0F) << v;
    up += v == 1.0F;
    ++count;
  }
  double const p = static_cast<double>(up) / count;
  EXPECT_NEAR(p, 0.6, 4 * std::sqrt(0.24 / count));
}

TEST(Quantize, PerTensorColumnwiseCopyIsTheTranspose) {
  constexpr pr::operand_format f{element_kind::e4m3, scale_kind::per_tensor};
  auto const x = random_matrix(8, 24, 6);
  float const scale = pr::scale_from_amax(pr::amax_of(x), 448.0F);
  auto const q = quantized<f>(x, 8, 24, scale);
  auto const direct = quantized<f>(transposed(x, 8, 24), 24, 8, scale);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 24; ++j)
      ASSERT_EQ(q.codes[static_cast<std::size_t>(i) * 24 + j],
                direct.codes[static_cast<std::size_t>(j) * 8 + i]);
  EXPECT_EQ(pr::tensor_factor<f>(q), 1.0F / scale);
}

// The table of docs/spec/precision.md §8, checked where it is compiled.
using pr::operand_role;
static_assert(pr::same_copies(pr::fp8_tensorwise<pr::delayed>::value, operand_role::input));
static_assert(pr::same_copies(pr::fp8_blockwise::value, operand_role::weight));
static_assert(!pr::same_copies(pr::fp8_blockwise::value, operand_role::input));
static_assert(!pr::same_copies(pr::mxfp8::value, operand_role::weight));
static_assert(pr::same_copies(pr::nvfp4::value, operand_role::weight));
static_assert(!pr::same_copies(pr::nvfp4::value, operand_role::grad));
static_assert(pr::format_of(pr::fp8_tensorwise<pr::current>::value, operand_role::input,
                            pr::operand_usage::rowwise)
                  .element == pr::element_kind::e4m3);
static_assert(pr::format_of(pr::fp8_tensorwise<pr::current, pr::fp8_format::e4m3>::value,
                            operand_role::grad, pr::operand_usage::rowwise)
                  .element == pr::element_kind::e4m3);

}  // namespace
