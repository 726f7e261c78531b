// SPDX-License-Identifier: Apache-2.0
// The operand quantizer of the recipes (precision::quantize<F>) against the format quantizers of
// quantize.hpp, which the precision vectors check bit for bit: the same codes, scales and
// dequantized values for every operand format of every recipe, on shapes with partial blocks.
#include <megamoe/core/random.hpp>
#include <megamoe/precision/operands.hpp>
#include <megamoe/precision/quantize.hpp>
#include <megamoe/precision/recipe.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace mm = megamoe;
namespace pr = megamoe::precision;

namespace {

std::vector<float> values(int rows, int cols, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(rows) * cols);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(mm::standard_normal(seed, i) * (1.0 + static_cast<double>(i % 7)));
  return v;
}

/// Values of q in format F as floats.
template <pr::operand_format F>
std::vector<float> values_of(pr::quantized_matrix const& q) {
  std::vector<float> out(static_cast<std::size_t>(q.rows) * q.cols);
  pr::dequantize<F>(
      q, [&](int r, int c, float v) { out[static_cast<std::size_t>(r) * q.cols + c] = v; });
  return out;
}

constexpr int rows = 37, cols = 160;  // partial blocks along both dimensions

TEST(RecipeOperands, PerTensorMatchesTheFormatQuantizer) {
  constexpr auto f = pr::format_of(pr::fp8_tensorwise<pr::current>::value, pr::operand_role::grad,
                                   pr::operand_usage::rowwise);
  static_assert(f.element == pr::element_kind::e5m2 && f.scale == pr::scale_kind::per_tensor);
  auto const v = values(rows, cols, 1);
  float const scale = pr::scale_from_amax(pr::amax_of(v), pr::max_finite<pr::e5m2>);
  pr::quantized_matrix q;
  pr::quantize<f>(v.data(), rows, cols, scale, 0, q);
  auto const want = pr::quantize_per_tensor<pr::e5m2>(v, rows, cols, scale);
  EXPECT_EQ(q.codes, want.codes);
  EXPECT_EQ(values_of<f>(q), pr::dequantize<pr::e5m2>(want));
}

TEST(RecipeOperands, BlockwiseMatchesTheFormatQuantizer) {
  auto const v = values(rows, cols, 2);
  constexpr auto x =
      pr::format_of(pr::fp8_blockwise::value, pr::operand_role::input, pr::operand_usage::rowwise);
  constexpr auto w =
      pr::format_of(pr::fp8_blockwise::value, pr::operand_role::weight, pr::operand_usage::rowwise);
  pr::quantized_matrix qx, qw;
  pr::quantize<x>(v.data(), rows, cols, 1.0F, 0, qx);
  pr::quantize<w>(v.data(), rows, cols, 1.0F, 0, qw);
  auto const wx = pr::quantize_blockwise<pr::e4m3>(v, rows, cols, 1, 128, true);
  auto const ww = pr::quantize_blockwise<pr::e4m3>(v, rows, cols, 128, 128, true);
  EXPECT_EQ(qx.codes, wx.codes);
  EXPECT_EQ(qx.scale_inv, wx.scale_inv);
  EXPECT_EQ(qw.codes, ww.codes);
  EXPECT_EQ(qw.scale_inv, ww.scale_inv);
  EXPECT_EQ(values_of<w>(qw), pr::dequantize<pr::e4m3>(ww));
}

TEST(RecipeOperands, Mxfp8MatchesTheFormatQuantizer) {
  auto const v = values(rows, cols, 3);
  constexpr auto f =
      pr::format_of(pr::mxfp8::value, pr::operand_role::grad, pr::operand_usage::columnwise);
  static_assert(f.block_cols == 32 && f.scale == pr::scale_kind::e8m0_blocks);
  pr::quantized_matrix q;
  pr::quantize<f>(v.data(), rows, cols, 1.0F, 0, q);
  auto const want = pr::quantize_mxfp8<pr::e4m3>(v, rows, cols);
  EXPECT_EQ(q.codes, want.codes);
  EXPECT_EQ(q.scale_codes, want.scales);
  EXPECT_EQ(values_of<f>(q), pr::dequantize<pr::e4m3>(want));
}

TEST(RecipeOperands, Nvfp4MatchesTheFormatQuantizer) {
  auto const v = values(rows, cols, 4);
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
  pr::quantized_matrix qx, qw, qg;
  pr::quantize<x>(v.data(), rows, cols, 1.0F, 0, qx);
  pr::quantize<w>(v.data(), rows, cols, 1.0F, 0, qw);
  pr::quantize<g>(v.data(), rows, cols, 1.0F, 99, qg);
  auto const wx = pr::quantize_nvfp4(v, rows, cols);
  auto const ww = pr::quantize_nvfp4(v, rows, cols, true);
  auto const wg = pr::quantize_nvfp4(v, rows, cols, false, pr::fp4_rounding::stochastic, 99);
  for (auto const& [q, want] : {std::pair{&qx, &wx}, std::pair{&qw, &ww}, std::pair{&qg, &wg}}) {
    EXPECT_EQ(q->codes, want->packed);
    EXPECT_EQ(q->scale_codes, want->scales);
    EXPECT_EQ(q->global_amax, want->global_amax);
  }
  EXPECT_EQ(values_of<w>(qw), pr::dequantize(ww));
}

TEST(RecipeOperands, Bf16IsRoundToNearestEven) {
  auto const v = values(rows, cols, 5);
  constexpr auto f =
      pr::format_of(pr::bf16::value, pr::operand_role::input, pr::operand_usage::rowwise);
  pr::quantized_matrix q;
  pr::quantize<f>(v.data(), rows, cols, 1.0F, 0, q);
  auto const got = values_of<f>(q);
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(got[i], pr::round_to_bf16(v[i]));
  EXPECT_EQ(q.bytes(), 2 * v.size());
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
