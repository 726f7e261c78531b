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

}  // namespace
