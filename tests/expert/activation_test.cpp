// SPDX-License-Identifier: Apache-2.0
// The expert activations with the routing prob (expert/activation.hpp): forward ap = act(h) * p
// against the plain statement of tests/reference/moe_reference.hpp (SwiGLU on the gate and linear
// halves, exact erf GELU, squared ReLU), in double and in float; backward dh and dp against
// central differences of the forward in double; nothing written past the row.
#include <megamoe/expert/activation.hpp>

#include "reference/moe_reference.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace ex = megamoe::expert;
namespace ref = megamoe::reference;

namespace {

using ex::activation_function;

constexpr int ffn = 9;

/// One row of fc1's output, [W1] for activation A; no entry within 0.05 of 0 (squared ReLU's kink).
std::vector<double> fc1_row(activation_function a, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.5);
  std::vector<double> h(static_cast<std::size_t>(ex::fc1_width(a, ffn)));
  for (auto& x : h) {
    x = normal(rng);
    if (std::abs(x) < 0.05) x += x < 0 ? -0.05 : 0.05;
  }
  return h;
}

template <activation_function A>
void expect_forward() {
  SCOPED_TRACE(std::string(ex::name_of(A)));
  double const p = 0.37;
  auto const h = fc1_row(A, 1);
  auto const want = ref::act(A, h);
  std::vector<double> ap(ffn + 2, -99.0);  // two sentinels past the row
  ex::activation<A>::forward(h.data(), p, ap.data(), ffn);
  std::vector<float> const h_float(h.begin(), h.end());
  std::vector<float> ap_float(ffn);
  ex::activation<A>::forward(h_float.data(), static_cast<float>(p), ap_float.data(), ffn);
  for (int f = 0; f < ffn; ++f) {
    double const w = want[static_cast<std::size_t>(f)] * p;
    EXPECT_NEAR(ap[static_cast<std::size_t>(f)], w, 1e-15 * (1 + std::abs(w))) << f;
    EXPECT_NEAR(ap_float[static_cast<std::size_t>(f)], w, 2e-6 * (1 + std::abs(w))) << f;
  }
  EXPECT_EQ(ap[ffn], -99.0);
  EXPECT_EQ(ap[ffn + 1], -99.0);
}

template <activation_function A>
void expect_backward() {
  SCOPED_TRACE(std::string(ex::name_of(A)));
  double const p = 0.61;
  auto const h = fc1_row(A, 2);
  std::vector<double> dap(ffn);
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  for (auto& x : dap) x = normal(rng);
  auto objective = [&](std::vector<double> const& hh, double pp) {
    std::vector<double> ap(ffn);
    ex::activation<A>::forward(hh.data(), pp, ap.data(), ffn);
    double f = 0;
    for (int i = 0; i < ffn; ++i)
      f += dap[static_cast<std::size_t>(i)] * ap[static_cast<std::size_t>(i)];
    return f;
  };
  std::vector<double> dh(h.size() + 1, -99.0);
  double const dp = ex::activation<A>::backward(h.data(), dap.data(), p, dh.data(), ffn);
  EXPECT_EQ(dh[h.size()], -99.0);
  double const step = 1e-6;
  for (std::size_t i = 0; i < h.size(); ++i) {
    auto plus = h, minus = h;
    plus[i] += step;
    minus[i] -= step;
    double const numeric = (objective(plus, p) - objective(minus, p)) / (2 * step);
    EXPECT_NEAR(dh[i], numeric, 1e-8 * (1 + std::abs(numeric))) << "dh " << i;
  }
  double const numeric_p = (objective(h, p + step) - objective(h, p - step)) / (2 * step);
  EXPECT_NEAR(dp, numeric_p, 1e-8 * (1 + std::abs(numeric_p)));
  // The reference's backward through act agrees too (d(ap)/dh = p act'(h)).
  std::vector<double> da(ffn);
  for (int i = 0; i < ffn; ++i)
    da[static_cast<std::size_t>(i)] = p * dap[static_cast<std::size_t>(i)];
  auto const want = ref::act_backward(A, h, da);
  for (std::size_t i = 0; i < h.size(); ++i) EXPECT_NEAR(dh[i], want[i], 1e-13) << "dh " << i;
}

TEST(Activation, ForwardIsTheActivationTimesTheProb) {
  expect_forward<activation_function::swiglu>();
  expect_forward<activation_function::gelu>();
  expect_forward<activation_function::squared_relu>();
}

TEST(Activation, BackwardMatchesCentralDifferences) {
  expect_backward<activation_function::swiglu>();
  expect_backward<activation_function::gelu>();
  expect_backward<activation_function::squared_relu>();
}

// fp32 SwiGLU (16-lane AVX-512 where the CPU has it, Eigen otherwise) against the double one, on
// rows that end inside a vector: outputs, dh and dp within fp32 rounding, nothing written past.
TEST(Activation, SwigluFp32MatchesDoubleOnRowsOfAnyLength) {
  using swiglu = ex::activation<activation_function::swiglu>;
  for (int width : {1, 16, 37, 64}) {
    std::mt19937 rng(static_cast<std::uint32_t>(width));
    std::normal_distribution<double> normal(0.0, 2.0);
    std::vector<double> h(2 * static_cast<std::size_t>(width)), dap(h.size() / 2);
    for (auto& x : h) x = normal(rng);
    for (auto& x : dap) x = normal(rng);
    double const p = 0.83;
    std::vector<double> ap(dap.size()), dh(h.size());
    swiglu::forward(h.data(), p, ap.data(), width);
    double const dp = swiglu::backward(h.data(), dap.data(), p, dh.data(), width);
    std::vector<float> const hf(h.begin(), h.end()), dapf(dap.begin(), dap.end());
    std::vector<float> apf(ap.size() + 1, -99.0f), dhf(dh.size() + 1, -99.0f);
    swiglu::forward(hf.data(), static_cast<float>(p), apf.data(), width);
    float const dpf =
        swiglu::backward(hf.data(), dapf.data(), static_cast<float>(p), dhf.data(), width);
    for (std::size_t i = 0; i < ap.size(); ++i)
      EXPECT_NEAR(apf[i], ap[i], 2e-6 * (1 + std::abs(ap[i]))) << width << " ap " << i;
    for (std::size_t i = 0; i < dh.size(); ++i)
      EXPECT_NEAR(dhf[i], dh[i], 4e-6 * (1 + std::abs(dh[i]))) << width << " dh " << i;
    EXPECT_NEAR(dpf, dp, 1e-5 * (1 + std::abs(dp))) << width;
    EXPECT_EQ(apf[ap.size()], -99.0f);
    EXPECT_EQ(dhf[dh.size()], -99.0f);
  }
}

TEST(Activation, SwigluSplitsGateAndLinearHalves) {
  // h = [gate | linear]: silu(gate) * linear, as torch.chunk(h, 2, -1).
  std::vector<double> const h{0.0, 1.0, -2.0, 3.0, 5.0, 7.0};
  std::vector<double> ap(3);
  ex::activation<activation_function::swiglu>::forward(h.data(), 2.0, ap.data(), 3);
  EXPECT_EQ(ap[0], 0.0);  // silu(0) = 0
  EXPECT_NEAR(ap[1], 2.0 * 5.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(ap[2], 2.0 * 7.0 * -2.0 / (1.0 + std::exp(2.0)), 1e-15);
  // Squared ReLU is zero below zero, GELU is exact at 0 and odd-symmetric around x/2.
  std::vector<double> const x{-1.5, 0.0, 1.5};
  std::vector<double> relu(3), gelu(3);
  ex::activation<activation_function::squared_relu>::forward(x.data(), 1.0, relu.data(), 3);
  EXPECT_EQ(relu, (std::vector<double>{0.0, 0.0, 2.25}));
  ex::activation<activation_function::gelu>::forward(x.data(), 1.0, gelu.data(), 3);
  EXPECT_EQ(gelu[1], 0.0);
  EXPECT_NEAR(gelu[2] - gelu[0], 1.5, 1e-15);  // gelu(x) - gelu(-x) = x
}

}  // namespace
