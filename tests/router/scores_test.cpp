// SPDX-License-Identifier: Apache-2.0
// The score functions of routing (router/scores.hpp) against their definitions in long double:
// softmax (shift-invariant, no overflow for large logits), the dot product its backward uses,
// sigmoid, softplus with the reference's threshold of 20, sqrt(softplus); the derivatives of the
// sigmoid family and the softmax backward formula against central differences in double.
#include <megamoe/router/scores.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace mr = megamoe::router;
namespace mk = megamoe::router::kernels;

namespace {

std::vector<long double> softmax_of(std::vector<double> const& x) {
  long double max_value = x[0];
  for (double v : x) max_value = std::max(max_value, static_cast<long double>(v));
  long double sum = 0;
  std::vector<long double> out;
  for (double v : x) {
    out.push_back(std::exp(static_cast<long double>(v) - max_value));
    sum += out.back();
  }
  for (auto& v : out) v /= sum;
  return out;
}

TEST(Scores, SoftmaxMatchesItsDefinitionAndIgnoresShifts) {
  std::vector<double> const x{0.3, -1.2, 2.5, 0.0, 2.5, -7.0, 1.1};
  int const n = static_cast<int>(x.size());
  auto const want = softmax_of(x);
  std::vector<double> in_double(x.size());
  std::vector<float> in_float(x.size());
  mk::softmax(x.data(), n, in_double.data());  // double logits, scores in double
  mk::softmax(x.data(), n, in_float.data());   // double logits, scores in float
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    auto const at = static_cast<std::size_t>(i);
    EXPECT_NEAR(in_double[at], static_cast<double>(want[at]), 1e-16);
    EXPECT_NEAR(in_float[at], static_cast<double>(want[at]), 1e-7);
    sum += in_double[at];
  }
  EXPECT_NEAR(sum, 1.0, 1e-15);
  EXPECT_EQ(in_double[2], in_double[4]);  // equal logits, equal scores

  // Logits far beyond exp's range give the same scores: the maximum is subtracted first.
  std::vector<double> shifted = x;
  for (double& v : shifted) v += 1000.0;
  std::vector<double> out(x.size());
  mk::softmax(shifted.data(), n, out.data());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(out[i], in_double[i], 1e-13);
  std::vector<float> huge{100.0F, 90.0F};  // exp(100) overflows float
  std::vector<float> two(2);
  mk::softmax(huge.data(), 2, two.data());
  EXPECT_NEAR(two[0], 1.0 / (1.0 + std::exp(-10.0)), 1e-7);
  EXPECT_NEAR(two[1], 1.0 / (1.0 + std::exp(10.0)), 1e-9);
}

TEST(Scores, DotIsTheSumOfProducts) {
  std::vector<double> const a{1.0, -2.0, 3.0, 0.5}, b{4.0, 5.0, -6.0, 8.0};
  EXPECT_EQ(mk::dot(a.data(), b.data(), 4), 4.0 - 10.0 - 18.0 + 4.0);
  EXPECT_EQ(mk::dot(a.data(), b.data(), 0), 0.0);
}

TEST(Scores, SigmoidFamilyMatchesItsDefinitions) {
  for (double z : {-30.0, -8.0, -1.5, -0.1, 0.0, 0.1, 2.0, 7.5, 19.0, 20.0, 20.5, 40.0}) {
    long double const Z = z;
    long double const sigma = 1.0L / (1.0L + std::exp(-Z));
    // softplus is linear above the threshold 20 (beta 1), log1p(exp(z)) up to it.
    long double const softplus = z > 20.0 ? Z : std::log1p(std::exp(Z));
    EXPECT_NEAR(mk::sigmoid(z), static_cast<double>(sigma), 2.5e-16) << z;  // 2 ulps
    EXPECT_NEAR(mk::sigmoid(static_cast<float>(z)), static_cast<double>(sigma), 1e-7) << z;
    EXPECT_NEAR(mk::softplus(z), static_cast<double>(softplus), 1e-15 * (1 + std::abs(z))) << z;
    EXPECT_NEAR(mk::sqrtsoftplus(z), static_cast<double>(std::sqrt(softplus)), 1e-15 * (1 + z * z))
        << z;
    EXPECT_EQ(mk::score<mr::score_function::sigmoid>(z), mk::sigmoid(z));
    EXPECT_EQ(mk::score<mr::score_function::sqrtsoftplus>(z), mk::sqrtsoftplus(z));
  }
  EXPECT_EQ(mk::softplus(25.0), 25.0);  // above the threshold: z itself
  EXPECT_EQ(mk::softplus(20.0), std::log1p(std::exp(20.0)));
}

TEST(Scores, SigmoidFamilyDerivativesMatchCentralDifferences) {
  double const h = 1e-6;
  // Away from softplus's threshold at 20, where the reference's softplus has a kink.
  for (double z : {-9.0, -3.3, -0.7, 0.0, 0.4, 1.9, 5.0, 12.0, 19.5, 21.0, 35.0}) {
    auto fd = [&](auto f) { return (f(z + h) - f(z - h)) / (2 * h); };
    double const q_sigmoid = mk::score<mr::score_function::sigmoid>(z);
    double const q_sqrt = mk::score<mr::score_function::sqrtsoftplus>(z);
    EXPECT_NEAR(mk::score_derivative<mr::score_function::sigmoid>(z, q_sigmoid),
                fd([](double x) { return mk::score<mr::score_function::sigmoid>(x); }), 1e-8)
        << z;
    EXPECT_NEAR(mk::score_derivative<mr::score_function::sqrtsoftplus>(z, q_sqrt),
                fd([](double x) { return mk::score<mr::score_function::sqrtsoftplus>(x); }), 1e-8)
        << z;
    EXPECT_EQ(mk::sqrtsoftplus_derivative(z, q_sqrt),
              (mk::score_derivative<mr::score_function::sqrtsoftplus>(z, q_sqrt)));
  }
}

TEST(Scores, SoftmaxBackwardFormulaMatchesCentralDifferences) {
  // d/dx_i sum_j w_j softmax(x)_j = s_i (w_i - dot(s, w)), the formula the router's backward uses.
  std::vector<double> const x{0.2, -0.9, 1.7, 0.05, -2.2}, w{1.0, -0.5, 0.25, 2.0, -1.5};
  int const n = static_cast<int>(x.size());
  std::vector<double> s(x.size());
  mk::softmax(x.data(), n, s.data());
  double const d = mk::dot(s.data(), w.data(), n);
  auto objective = [&](std::vector<double> const& v) {
    std::vector<double> out(v.size());
    mk::softmax(v.data(), n, out.data());
    return mk::dot(out.data(), w.data(), n);
  };
  double const h = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    auto plus = x, minus = x;
    plus[i] += h;
    minus[i] -= h;
    EXPECT_NEAR(s[i] * (w[i] - d), (objective(plus) - objective(minus)) / (2 * h), 1e-9) << i;
  }
}

}  // namespace
