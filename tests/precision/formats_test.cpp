// SPDX-License-Identifier: Apache-2.0
// Element formats and quantizers against independent definitions: the nearest representable value
// found by searching the format's whole grid in double precision (ties to the even code), over
// every code, every tie, their neighbours, special values and a million random fp32 bit patterns;
// scale rules against their formulas; 2D-tile copies against exact transposes.
#include <megamoe/precision/formats.hpp>

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

}  // namespace
