// SPDX-License-Identifier: Apache-2.0
// grouped_operands (precision/operands.hpp): a recipe's GEMM operands for grouped experts. Each
// expert's rows and weights are quantized on their own, with their own per-tensor scale or NVFP4
// amax and blocks that never straddle two experts, so the dequantized operand of every expert
// equals megamoe's quantizer applied to that expert's slice alone; an expert with no rows is
// skipped. Checked for every recipe that rounds operands.
#include <megamoe/core/buffer.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/precision/operands.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mm = megamoe;
namespace pr = megamoe::precision;

namespace {

std::vector<float> normal_values(int rows, int cols, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(rows) * cols);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(mm::standard_normal(seed, i));
  return v;
}

/// The slice's values through quantize<F> with the scale the recipe gives a slice of its own.
template <class Recipe, pr::operand_format F>
std::vector<float> alone(float const* x, int rows, int cols) {
  std::span<float const> const slice(x, static_cast<std::size_t>(rows) * cols);
  float const scale = F.scale == pr::scale_kind::per_tensor
                          ? pr::scale_from_amax(pr::amax_of(slice), pr::max_of(F.element))
                          : 1.0F;
  pr::quantized_matrix q;
  pr::quantize<F>(x, rows, cols, scale, 0, q);
  std::vector<float> out(slice.size());
  pr::dequantize<F>(
      q, [&](int r, int c, float v) { out[static_cast<std::size_t>(r) * cols + c] = v; });
  return out;
}

template <class Recipe>
void every_expert_is_quantized_on_its_own() {
  SCOPED_TRACE(std::string(Recipe::name));
  using operands = pr::grouped_operands<Recipe>;
  mm::thread_pool pool(2);
  mm::buffer<float> rows_a, rows_b, weights;
  operands ops(3);
  ops.bind(pool, rows_a, rows_b, weights);
  // Three experts: 40 rows, none, 35 rows; the third's values are 100 times larger, so a scale
  // shared with the first would be wrong for both.
  int const cols = 64;
  std::vector<std::int64_t> const offsets{0, 40, 40, 75};
  auto x = normal_values(75, cols, 1);
  for (std::size_t i = 40 * cols; i < x.size(); ++i) x[i] *= 100.0F;
  float const* got = ops.input(mm::expert::linear::fc1, x.data(), cols, offsets, 0, 3);
  for (int e = 0; e < 3; ++e) {
    auto const off = offsets[static_cast<std::size_t>(e)];
    int const n = static_cast<int>(offsets[static_cast<std::size_t>(e) + 1] - off);
    if (n == 0) continue;
    auto const want = alone<Recipe, operands::input_row>(x.data() + off * cols, n, cols);
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(got[static_cast<std::size_t>(off * cols) + i], want[i]) << "expert " << e;
  }
  // The weights [E, rows, cols]: each expert's matrix on its own too.
  int const rows = 48;
  auto w = normal_values(3 * rows, cols, 2);
  for (std::size_t i = 0; i < static_cast<std::size_t>(rows) * cols; ++i) w[i] *= 0.01F;
  float const* wq =
      ops.weight(mm::expert::linear::fc1, pr::operand_usage::rowwise, w.data(), rows, cols, 0, 3);
  for (int e = 0; e < 3; ++e) {
    auto const off = static_cast<std::size_t>(e) * rows * cols;
    auto const want = alone<Recipe, operands::weight_row>(w.data() + off, rows, cols);
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(wq[off + i], want[i]) << "weights of expert " << e;
  }
}

TEST(GroupedOperands, EveryExpertIsQuantizedOnItsOwn) {
  every_expert_is_quantized_on_its_own<pr::bf16>();
  every_expert_is_quantized_on_its_own<pr::fp8_tensorwise<pr::current>>();
  every_expert_is_quantized_on_its_own<pr::fp8_blockwise>();
  every_expert_is_quantized_on_its_own<pr::mxfp8>();
  every_expert_is_quantized_on_its_own<pr::nvfp4>();
}

/// Under wgrad_from_rowwise<R> the inputs' wgrad copy is R's columnwise format applied to the
/// dequantized rowwise copy (quantize, dequantize and transpose by hand here); under R it comes
/// from the values, which differs where an element is an FP8 subnormal in its row's block but a
/// normal number along the tokens.
template <class R>
void wgrad_copy_from_rowwise() {
  SCOPED_TRACE(std::string(R::name));
  using flagged = pr::grouped_operands<pr::wgrad_from_rowwise<R>>;
  using plain = pr::grouped_operands<R>;
  static_assert(flagged::input_col == plain::input_col && flagged::input_row == plain::input_row);
  constexpr auto row = flagged::input_row, col = flagged::input_col;
  mm::thread_pool pool(2);
  mm::buffer<float> rows_a, rows_b, weights;
  flagged with(2);
  plain without(2);
  with.bind(pool, rows_a, rows_b, weights);
  int const cols = 160;
  std::vector<std::int64_t> const offsets{0, 37, 70};
  auto x = normal_values(70, cols, 3);
  for (int r = 0; r < 70; ++r)
    for (int c = 0; c < cols; c += 5) x[static_cast<std::size_t>(r) * cols + c] *= 1e-4F;
  with.input(mm::expert::linear::fc1, x.data(), cols, offsets, 0, 2);
  without.bind(pool, rows_a, rows_b, weights);
  without.input(mm::expert::linear::fc1, x.data(), cols, offsets, 0, 2);
  bool differs = false;
  for (int e = 0; e < 2; ++e) {
    auto const off = offsets[static_cast<std::size_t>(e)];
    int const n = static_cast<int>(offsets[static_cast<std::size_t>(e) + 1] - off);
    pr::quantized_matrix q, want;
    pr::quantize<row>(x.data() + off * cols, n, cols, 1.0F, 0, q);
    std::vector<float> transposed(static_cast<std::size_t>(cols) * n);
    pr::dequantize<row>(q, [&](int r, int c, float v) {
      transposed[static_cast<std::size_t>(c) * n + static_cast<std::size_t>(r)] = v;
    });
    pr::quantize<col>(transposed.data(), cols, n, 1.0F, 0, want);
    auto const& got = with.codes_of(mm::expert::linear::fc1, pr::operand_role::input,
                                    pr::operand_usage::columnwise, e);
    EXPECT_EQ(got.codes, want.codes) << "expert " << e;
    EXPECT_EQ(got.scale_codes, want.scale_codes) << "expert " << e;
    EXPECT_EQ(got.scale_inv, want.scale_inv) << "expert " << e;
    differs |= without
                   .codes_of(mm::expert::linear::fc1, pr::operand_role::input,
                             pr::operand_usage::columnwise, e)
                   .codes != want.codes;
  }
  EXPECT_TRUE(differs) << "the data should tell the two wgrad copies apart";
}

TEST(GroupedOperands, WgradCopyFromRowwiseCodes) {
  wgrad_copy_from_rowwise<pr::mxfp8>();
  wgrad_copy_from_rowwise<pr::fp8_blockwise>();
}

/// A row-local format's rows as bytes and back: codes and block scales as quantize<F> made them,
/// a partial last block included.
template <pr::operand_format F>
void rows_travel_as_bytes() {
  int const rows = 5, cols = 200;
  auto const x = normal_values(rows, cols, 4);
  pr::quantized_matrix q, back;
  pr::quantize<F>(x.data(), rows, cols, 1.0F, 0, q);
  std::vector<std::uint8_t> bytes(rows * pr::row_bytes<F>(cols));
  pr::rows_to_bytes<F>(q, bytes.data());
  pr::rows_from_bytes<F>(bytes.data(), rows, cols, back);
  EXPECT_EQ(back.rows, rows);
  EXPECT_EQ(back.cols, cols);
  EXPECT_EQ(back.codes, q.codes);
  EXPECT_EQ(back.scale_codes, q.scale_codes);
  EXPECT_EQ(back.scale_inv, q.scale_inv);
  // Row 3 alone is bytes [3 * width, 4 * width): the same as quantizing that row alone.
  pr::quantized_matrix one;
  pr::quantize<F>(x.data() + 3 * cols, 1, cols, 1.0F, 0, one);
  std::vector<std::uint8_t> row(pr::row_bytes<F>(cols));
  pr::rows_to_bytes<F>(one, row.data());
  EXPECT_TRUE(std::equal(row.begin(), row.end(),
                         bytes.begin() + 3 * static_cast<std::ptrdiff_t>(row.size())));
}

TEST(QuantizedRows, TravelAsBytes) {
  constexpr auto mx =
      pr::format_of(pr::mxfp8::value, pr::operand_role::input, pr::operand_usage::rowwise);
  constexpr auto block =
      pr::format_of(pr::fp8_blockwise::value, pr::operand_role::input, pr::operand_usage::rowwise);
  static_assert(pr::row_bytes<mx>(200) == 200 + 7 && pr::row_bytes<block>(200) == 200 + 8);
  rows_travel_as_bytes<mx>();
  rows_travel_as_bytes<block>();
}

}  // namespace
