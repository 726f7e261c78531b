// SPDX-License-Identifier: Apache-2.0
// The gating linear (router/gating.hpp): logits = x W^T computed in the router dtype from float
// parameters, and its backward dx = dz W, dW = dz^T x, against plain loops in double; shape errors
// name the tensors and their shapes.
#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/router/gating.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

namespace mm = megamoe;
namespace mr = megamoe::router;

namespace {

template <class T>
mm::row_matrix<T> random_matrix(int rows, int cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  mm::row_matrix<T> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(normal(rng));
  return m;
}

TEST(Gating, ForwardIsXTimesWTransposedInTheRouterDtype) {
  int const T = 5, H = 37, E = 4;
  auto const x = random_matrix<float>(T, H, 1);
  auto const w = random_matrix<float>(E, H, 2);
  mm::row_matrix<double> in_double;
  mm::row_matrix<float> in_float;
  mr::gating_forward<double>(x, w, in_double);
  mr::gating_forward<float>(x, w, in_float);
  ASSERT_EQ(in_double.rows(), T);
  ASSERT_EQ(in_double.cols(), E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      double want = 0, magnitude = 0;
      for (int h = 0; h < H; ++h) {
        want += static_cast<double>(x(t, h)) * w(e, h);
        magnitude += std::abs(static_cast<double>(x(t, h)) * w(e, h));
      }
      // fp64 logits from float parameters are the exact products summed in double.
      EXPECT_NEAR(in_double(t, e), want, 1e-14 * magnitude);
      EXPECT_NEAR(in_float(t, e), want, (H + 1) * 0x1p-24 * magnitude);
    }
}

TEST(Gating, BackwardGivesDxAndDwInTheRouterDtype) {
  int const T = 6, H = 9, E = 5;
  auto const x = random_matrix<float>(T, H, 3);
  auto const w = random_matrix<float>(E, H, 4);
  auto const dz = random_matrix<double>(T, E, 5);
  mm::row_matrix<float> grad_x, grad_w;
  mr::gating_backward<double>(dz, x, w, grad_x, grad_w);
  ASSERT_EQ(grad_x.rows(), T);
  ASSERT_EQ(grad_x.cols(), H);
  ASSERT_EQ(grad_w.rows(), E);
  ASSERT_EQ(grad_w.cols(), H);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      double want = 0, magnitude = 0;
      for (int e = 0; e < E; ++e) {
        want += dz(t, e) * w(e, h);
        magnitude += std::abs(dz(t, e) * w(e, h));
      }
      // Computed in double, then rounded once to the parameters' float.
      EXPECT_NEAR(grad_x(t, h), want, 0x1p-24 * std::abs(want) + 1e-14 * magnitude)
          << t << ", " << h;
    }
  for (int e = 0; e < E; ++e)
    for (int h = 0; h < H; ++h) {
      double want = 0, magnitude = 0;
      for (int t = 0; t < T; ++t) {
        want += dz(t, e) * x(t, h);
        magnitude += std::abs(dz(t, e) * x(t, h));
      }
      EXPECT_NEAR(grad_w(e, h), want, 0x1p-24 * std::abs(want) + 1e-14 * magnitude)
          << e << ", " << h;
    }
}

TEST(Gating, ShapeErrorsNameTheTensors) {
  mm::row_matrix<float> const x = mm::row_matrix<float>::Zero(3, 5),
                              w = mm::row_matrix<float>::Zero(4, 6);
  mm::row_matrix<float> logits;
  try {
    mr::gating_forward<float>(x, w, logits);
    FAIL() << "hidden sizes 5 and 6 accepted";
  } catch (mm::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("router input has shape [3, 5] but the router weight is "
                                         "[4, 6] (the hidden sizes differ)"),
              std::string::npos)
        << e.what();
  }
  try {
    mr::require_shape(x, 3, 4, "the thing");
    FAIL() << "[3, 5] accepted as [3, 4]";
  } catch (mm::input_error const& e) {
    EXPECT_EQ(std::string(e.what()), "the thing has shape [3, 5], expected [3, 4]");
  }
  EXPECT_NO_THROW(mr::require_shape(x, 3, 5, "the thing"));
  EXPECT_THROW(mr::require_shape(w, 6, 4, "the weight"), mm::input_error);  // transposed
}

}  // namespace
