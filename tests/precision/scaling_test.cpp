// SPDX-License-Identifier: Apache-2.0
// The scale arithmetic of the recipes (precision/scaling.hpp): per-tensor and power-of-two scales,
// MXFP8 block scales, delayed scaling's history, the random Hadamard transform and row padding.
// The precision vectors check the same functions bit for bit on the spec's worked examples.
#include <megamoe/precision/scaling.hpp>

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace mp = megamoe::precision;

namespace {

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

TEST(DelayedScaling, UsesTheHistoryThenRolls) {
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

TEST(DelayedScaling, TheRecipeSettingsAndPowerOfTwoScales) {
  auto s = mp::delayed_scaling_state::of(mp::fp8_tensorwise<mp::delayed>::value);
  EXPECT_EQ(s.amax_history.size(), 1U);  // the reference MoE setting: 1, most_recent, 0
  EXPECT_EQ(s.algo, mp::amax_compute::most_recent);
  s.power_of_2 = true;
  s.record(3.3F);
  s.update(448.0F);
  EXPECT_EQ(s.scale, 128.0F);  // 448 / 3.3 = 135.76 rounded down
}

TEST(HadamardTransform, PreservesDotProducts) {
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
}

TEST(PadRows, RoundsUpToTheAlignment) {
  EXPECT_EQ(mp::pad_rows(0, 16), 0);
  EXPECT_EQ(mp::pad_rows(1, 16), 16);
  EXPECT_EQ(mp::pad_rows(128, 128), 128);
  EXPECT_EQ(mp::pad_rows(129, 32), 160);
}

}  // namespace
