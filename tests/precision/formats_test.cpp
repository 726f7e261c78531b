// SPDX-License-Identifier: Apache-2.0
// Element formats and quantizers against independent definitions: the nearest representable value
// found by searching the format's whole grid in double precision (ties to the even code), over
// every code, every tie, their neighbours, special values and a million random fp32 bit patterns;
// scale rules against their formulas; 2D-tile copies against exact transposes.
#include <megamoe/precision/formats.hpp>
#include <megamoe/precision/quantize.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace mp = megamoe::precision;

namespace {

/// The positive finite grid of a format as exact doubles, with their codes, ascending.
struct grid {
  std::vector<double> values;
  std::vector<unsigned> codes;
};

template <class F>
grid grid_of() {
  grid g;
  for (unsigned c = 0; c < F::sign_bit; ++c) {
    double const v = mp::detail::code_value<F>(c);
    if (std::isfinite(v)) {
      g.values.push_back(v);
      g.codes.push_back(c);
    }
  }
  return g;
}

/// The reference encoder: nearest grid value, ties to the even code; beyond the largest finite
/// value, saturate or (non-saturating) continue the top binade's spacing and overflow.
template <class F>
unsigned reference_encode(float x, bool saturate, grid const& g) {
  if (std::isnan(x)) return F::kind == mp::special_values::none ? F::max_code : F::nan_code;
  unsigned const sign = std::signbit(x) ? F::sign_bit : 0u;
  double const a = std::fabs(static_cast<double>(x));
  double const top = g.values.back();
  unsigned const overflow = F::kind == mp::special_values::ieee
                                ? (((1u << F::exponent_bits) - 1u) << F::mantissa_bits)
                                : F::nan_code;
  if (a >= top) {
    if (a == top || saturate || F::kind == mp::special_values::none) return sign | F::max_code;
    double const step = top - g.values[g.values.size() - 2];
    if (a < top + step / 2 || (a == top + step / 2 && (F::max_code & 1u) == 0))
      return sign | F::max_code;
    return F::kind == mp::special_values::ieee ? (sign | overflow) : (sign | F::nan_code);
  }
  auto const hi = static_cast<std::size_t>(std::upper_bound(g.values.begin(), g.values.end(), a) -
                                           g.values.begin());
  std::size_t const lo = hi - 1;
  double const below = a - g.values[lo], above = g.values[hi] - a;
  std::size_t pick =
      below < above ? lo : (above < below ? hi : ((g.codes[lo] & 1u) == 0 ? lo : hi));
  return sign | g.codes[pick];
}

/// Every code value, every midpoint between neighbours, one fp32 ulp either side of each, specials.
template <class F>
std::vector<float> interesting_inputs(grid const& g) {
  std::vector<float> xs{0.0F,
                        -0.0F,
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::denorm_min(),
                        std::numeric_limits<float>::min(),
                        std::numeric_limits<float>::max(),
                        1e-30F,
                        1e30F};
  auto around = [&](double v) {
    float const f = static_cast<float>(v);
    for (float y :
         {f, std::nextafter(f, 0.0F), std::nextafter(f, std::numeric_limits<float>::infinity())}) {
      xs.push_back(y);
      xs.push_back(-y);
    }
  };
  for (std::size_t i = 0; i < g.values.size(); ++i) {
    around(g.values[i]);
    if (i + 1 < g.values.size()) around((g.values[i] + g.values[i + 1]) / 2);
  }
  double const top = g.values.back(), step = top - g.values[g.values.size() - 2];
  for (double k : {0.5, 1.0, 1.5, 2.0, 3.0}) around(top + k * step);
  around(g.values[1] / 2);  // half the smallest subnormal: a tie with zero
  around(g.values[1] / 4);
  return xs;
}

template <class F>
void check_against_reference() {
  auto const g = grid_of<F>();
  std::vector<float> xs = interesting_inputs<F>(g);
  std::mt19937 rng(2024);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 1'000'000; ++i) xs.push_back(std::bit_cast<float>(bits(rng)));
  // Values in and near the format's range, where rounding happens.
  std::uniform_real_distribution<double> exponent(std::log2(g.values[1]) - 3,
                                                  std::log2(g.values.back()) + 2);
  for (int i = 0; i < 1'000'000; ++i)
    xs.push_back(static_cast<float>((i % 2 ? -1.0 : 1.0) * std::exp2(exponent(rng))));
  for (bool saturate : {true, false}) {
    long bad = 0;
    for (float x : xs) {
      unsigned const want = reference_encode<F>(x, saturate, g);
      unsigned const got = mp::encode<F>(x, saturate);
      if (got != want && ++bad <= 5)
        ADD_FAILURE() << "x = " << x << " (0x" << std::hex << std::bit_cast<std::uint32_t>(x)
                      << std::dec << ") saturate " << saturate << ": megamoe " << got
                      << ", nearest-even " << want;
    }
    EXPECT_EQ(bad, 0);
  }
  // decode(encode(x)) is the nearest value: no grid value is strictly closer.
  for (std::size_t i = 0; i < xs.size(); i += 97) {
    float const x = xs[i];
    if (!std::isfinite(x) || std::fabs(x) > g.values.back()) continue;
    double const got = mp::decode<F>(mp::encode<F>(x));
    double const err = std::fabs(got - x);
    for (double v : g.values) ASSERT_LE(err, std::fabs(std::fabs(static_cast<double>(x)) - v)) << x;
  }
}

TEST(ElementFormats, E4M3MatchesNearestEvenOnEveryEdgeAndRandomInputs) {
  check_against_reference<mp::e4m3>();
}
TEST(ElementFormats, E5M2MatchesNearestEvenOnEveryEdgeAndRandomInputs) {
  check_against_reference<mp::e5m2>();
}
TEST(ElementFormats, E2M1MatchesNearestEvenOnEveryEdgeAndRandomInputs) {
  check_against_reference<mp::e2m1>();
}

TEST(ElementFormats, DecodeTablesHoldTheSpecValues) {
  EXPECT_EQ(mp::max_finite<mp::e4m3>, 448.0F);
  EXPECT_EQ(mp::max_finite<mp::e5m2>, 57344.0F);
  EXPECT_EQ(mp::max_finite<mp::e2m1>, 6.0F);
  EXPECT_EQ(mp::decode<mp::e4m3>(0x01), std::ldexp(1.0F, -9));
  EXPECT_EQ(mp::decode<mp::e5m2>(0x01), std::ldexp(1.0F, -16));
  EXPECT_TRUE(std::isnan(mp::decode<mp::e4m3>(0x7F)));
  EXPECT_TRUE(std::isinf(mp::decode<mp::e5m2>(0x7C)));
  std::vector<float> const fp4{0, 0.5F, 1, 1.5F, 2, 3, 4, 6};
  for (unsigned c = 0; c < 8; ++c) {
    EXPECT_EQ(mp::decode<mp::e2m1>(static_cast<std::uint8_t>(c)), fp4[c]);
    EXPECT_EQ(mp::decode<mp::e2m1>(static_cast<std::uint8_t>(c | 8)), -fp4[c]);
  }
}

TEST(ElementFormats, Bf16IsNearestEvenAndNotSaturating) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 1'000'000; ++i) {
    float const x = std::bit_cast<float>(bits(rng));
    std::uint16_t const b = mp::to_bf16_bits(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(mp::from_bf16_bits(b)));
      continue;
    }
    // The two bf16 neighbours of x: truncation and the next one up in magnitude.
    std::uint32_t const u = std::bit_cast<std::uint32_t>(x);
    float const down = std::bit_cast<float>(u & 0xFFFF0000u);
    float const up = std::bit_cast<float>((u & 0xFFFF0000u) + 0x10000u);
    double const d_down = std::fabs(static_cast<double>(x) - down);
    double const d_up =
        std::isinf(up) ? std::fabs(static_cast<double>(x) - std::copysign(std::ldexp(1.0, 128), x))
                       : std::fabs(static_cast<double>(x) - up);
    std::uint16_t want = static_cast<std::uint16_t>(u >> 16);
    if (d_up < d_down || (d_up == d_down && (want & 1u))) ++want;
    ASSERT_EQ(b, want) << x;
  }
  EXPECT_EQ(mp::to_bf16_bits(3.4e38F), 0x7F80);  // overflow to Inf
}

TEST(ElementFormats, E8M0RoundsUpToAPowerOfTwo) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> exponent(-120, 120);
  for (int i = 0; i < 100000; ++i) {
    float const v = static_cast<float>(std::exp2(exponent(rng)));
    std::uint8_t const e = mp::e8m0_ceil(v);
    float const p = mp::e8m0_value(e);
    EXPECT_GE(p, v);
    EXPECT_LT(p / 2, v);
    // The OCP rule gives floor(log2 v) - emax; with emax 0 it is the power of two at or below v.
    EXPECT_LE(mp::e8m0_value(mp::e8m0_ocp(v, 0)), v);
    EXPECT_GT(mp::e8m0_value(mp::e8m0_ocp(v, 0)) * 2, v);
    EXPECT_EQ(mp::e8m0_reciprocal(e) * p, 1.0F);
  }
  EXPECT_EQ(mp::e8m0_ceil(0.0F), 0);
  EXPECT_EQ(mp::e8m0_ceil(std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(mp::e8m0_ceil(std::numeric_limits<float>::quiet_NaN()), 0xFF);
}

TEST(Scales, FormulasAndPowerOfTwo) {
  EXPECT_EQ(mp::scale_from_amax(3.5F, 448.0F), 128.0F);
  EXPECT_EQ(mp::scale_from_amax(0.0F, 448.0F), 1.0F);
  EXPECT_EQ(mp::scale_from_amax(std::numeric_limits<float>::infinity(), 448.0F), 1.0F);
  EXPECT_EQ(mp::scale_from_amax(1e-39F, 448.0F), mp::float_max);  // quotient overflows
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> amax(1e-3F, 1e3F);
  for (int i = 0; i < 10000; ++i) {
    float const a = amax(rng);
    float const s = mp::scale_from_amax(a, 448.0F);
    EXPECT_EQ(s, 448.0F / a);
    float const p = mp::scale_from_amax(a, 448.0F, true);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(p) & 0x7FFFFFu, 0u);
    EXPECT_LE(p, s);
    EXPECT_GT(p * 2, s);
    // MXFP8: the block maximum lands within the element range, so nothing saturates.
    std::uint8_t const e = mp::mxfp8_scale<mp::e4m3>(a);
    EXPECT_LE(a * mp::e8m0_reciprocal(e), 448.0F);
  }
}

std::vector<float> random_matrix(int rows, int cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0F, 2.0F);
  std::vector<float> x(static_cast<std::size_t>(rows) * cols);
  for (float& v : x) v = normal(rng);
  x[5] = 40.0F;  // an outlier
  return x;
}

TEST(Quantizers, TwoDimensionalTilesGiveTheExactTransposeAsColumnwiseCopy) {
  int const rows = 256, cols = 384;
  auto const x = random_matrix(rows, cols, 1);
  auto const xt = mp::transposed(x, rows, cols);
  auto const a = mp::quantize_blockwise<mp::e4m3>(x, rows, cols, 128, 128);
  auto const b = mp::quantize_blockwise<mp::e4m3>(xt, cols, rows, 128, 128);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      ASSERT_EQ(a.codes[static_cast<std::size_t>(r) * cols + c],
                b.codes[static_cast<std::size_t>(c) * rows + r]);
  auto const f = mp::quantize_nvfp4(x, rows, cols, true);
  auto const g = mp::quantize_nvfp4(xt, cols, rows, true);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      ASSERT_EQ(f.code(static_cast<std::size_t>(r) * cols + c),
                g.code(static_cast<std::size_t>(c) * rows + r));
  // Sizes: one byte per FP8 code, half a byte per FP4 code.
  EXPECT_EQ(a.codes.size(), x.size());
  EXPECT_EQ(f.packed.size(), x.size() / 2);
  EXPECT_EQ(f.scales.size(), static_cast<std::size_t>(rows / 16 * cols / 16));
}

TEST(Quantizers, DequantizedValuesAreWithinHalfAStepOfTheInput) {
  int const rows = 64, cols = 256;
  auto const x = random_matrix(rows, cols, 2);
  auto const mx = mp::quantize_mxfp8<mp::e4m3>(x, rows, cols);
  auto const mxd = mp::dequantize<mp::e4m3>(mx);
  auto const bw = mp::quantize_blockwise<mp::e4m3>(x, rows, cols, 1, 128, false);
  auto const bwd = mp::dequantize<mp::e4m3>(bw);
  for (std::size_t i = 0; i < x.size(); ++i) {
    // E4M3 has 3 mantissa bits: relative error at most 2^-4 above the subnormal range.
    if (std::fabs(x[i]) > 1e-1F) {
      EXPECT_LE(std::fabs(mxd[i] - x[i]), std::fabs(x[i]) * 0.0625F) << i;
      EXPECT_LE(std::fabs(bwd[i] - x[i]), std::fabs(x[i]) * 0.0625F) << i;
    }
  }
}

TEST(Quantizers, StochasticRoundingIsSeededUnbiasedAndOnlyBetweenNeighbours) {
  int const n = 200000;
  std::vector<float> x(static_cast<std::size_t>(n), 0.8F);
  x[0] = 6.0F;  // fixes the block scale of the first block: global amax 6 -> y = x * 1
  auto const a = mp::quantize_nvfp4(x, 1, n, false, mp::fp4_rounding::stochastic, 11);
  auto const b = mp::quantize_nvfp4(x, 1, n, false, mp::fp4_rounding::stochastic, 11);
  auto const c = mp::quantize_nvfp4(x, 1, n, false, mp::fp4_rounding::stochastic, 12);
  EXPECT_EQ(a.packed, b.packed);
  EXPECT_NE(a.packed, c.packed);
  auto const d = mp::dequantize(a);
  double sum = 0;
  for (std::size_t i = 16; i < d.size(); ++i) sum += d[i];
  double const mean = sum / static_cast<double>(d.size() - 16);
  EXPECT_NEAR(mean, 0.8, 1e-3);  // unbiased up to the E4M3 rounding of the block scales
  // Blocks holding a 6 keep 0.8 at 0.8 (between 0.5 and 1.0): P(up) must be 0.6.
  std::vector<float> mixed(16 * 20000);
  for (std::size_t i = 0; i < mixed.size(); ++i) mixed[i] = i % 16 == 0 ? 6.0F : 0.8F;
  auto const m = mp::quantize_nvfp4(mixed, 1, static_cast<int>(mixed.size()), false,
                                    mp::fp4_rounding::stochastic, 5);
  long up = 0, count = 0;
  for (std::size_t i = 0; i < mixed.size(); ++i) {
    if (i % 16 == 0) continue;
    float const v = mp::decode<mp::e2m1>(m.code(i));
    ASSERT_TRUE(v == 0.5F || v == 1.0F) << v;
    up += v == 1.0F;
    ++count;
  }
  double const p = static_cast<double>(up) / count;
  EXPECT_NEAR(p, 0.6, 4 * std::sqrt(0.24 / count));
}

TEST(Quantizers, DelayedScalingUsesTheHistoryThenRolls) {
  mp::delayed_scaling_state s(4, mp::delayed_scaling_state::algorithm::max);
  s.amax_history = {2.5F, 2.0F, 3.5F, 1.0F};
  EXPECT_EQ(s.update(448.0F), 3.5F);
  EXPECT_EQ(s.scale, 128.0F);
  EXPECT_EQ(s.amax_history, (std::vector<float>{0.0F, 3.5F, 1.0F, 2.5F}));
  s.record(1.0F);
  s.record(7.0F);
  EXPECT_EQ(s.update(448.0F), 7.0F);
  EXPECT_EQ(s.scale, 64.0F);
}

TEST(Quantizers, HadamardTransformPreservesDotProductsAndFeedsTheColumnwiseCopy) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  for (int trial = 0; trial < 100; ++trial) {
    std::array<float, 16> a{}, b{};
    for (int i = 0; i < 16; ++i) {
      a[static_cast<std::size_t>(i)] = normal(rng);
      b[static_cast<std::size_t>(i)] = normal(rng);
    }
    auto const ya = mp::rht16(a), yb = mp::rht16(b);
    double dot = 0, dot_y = 0;
    for (std::size_t i = 0; i < 16; ++i) {
      dot += static_cast<double>(a[i]) * b[i];
      dot_y += static_cast<double>(ya[i]) * yb[i];
    }
    EXPECT_NEAR(dot, dot_y, 1e-4 * (1 + std::fabs(dot)));  // M is orthogonal: it cancels in dW
  }
  int const tokens = 32, hidden = 16;
  auto const x = random_matrix(tokens, hidden, 4);
  auto const q = mp::quantize_nvfp4_columnwise(x, tokens, hidden);
  EXPECT_EQ(q.grid.rows, hidden);
  EXPECT_EQ(q.grid.cols, tokens);
  auto const plain = mp::quantize_nvfp4_columnwise(x, tokens, hidden, false);
  auto const reference = mp::quantize_nvfp4(mp::transposed(x, tokens, hidden), hidden, tokens);
  EXPECT_EQ(plain.packed, reference.packed);
  EXPECT_NE(q.packed, plain.packed);
}

TEST(Quantizers, PerTensorColumnwiseCopyIsTheTransposeAndDelayedScalesCanBePowersOfTwo) {
  auto const x = random_matrix(8, 24, 6);
  float const scale = mp::scale_from_amax(mp::amax_of(x), 448.0F);
  auto const q = mp::quantize_per_tensor<mp::e4m3>(x, 8, 24, scale);
  auto const t = mp::transposed(q);
  auto const direct = mp::quantize_per_tensor<mp::e4m3>(mp::transposed(x, 8, 24), 24, 8, scale);
  EXPECT_EQ(t.codes, direct.codes);
  auto s = mp::delayed_scaling_state::of(mp::fp8_tensorwise<mp::delayed>::value);
  EXPECT_EQ(s.amax_history.size(), 1U);  // the reference MoE setting: 1, most_recent, 0
  EXPECT_EQ(s.algo, mp::amax_compute::most_recent);
  s.power_of_2 = true;
  s.record(3.3F);
  s.update(448.0F);
  EXPECT_EQ(s.scale, 128.0F);  // 448 / 3.3 = 135.76 rounded down
}

TEST(Quantizers, BadShapesAreRefused) {
  std::vector<float> const x(10, 1.0F);
  EXPECT_THROW(mp::quantize_blockwise<mp::e4m3>(x, 3, 4, 1, 128), megamoe::input_error);
  EXPECT_THROW(mp::quantize_nvfp4(x, 2, 4), megamoe::input_error);
  EXPECT_THROW(mp::rht16_rows_bf16(x, 1, 10), megamoe::input_error);
}

}  // namespace
