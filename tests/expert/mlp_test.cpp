// SPDX-License-Identifier: Apache-2.0
// The routed experts' FFN (expert/mlp.hpp) against the plain double-precision MLP of
// tests/reference/moe_reference.hpp, row by row: grouped_mlp's forward (fc1, act(h) * p, fc2 with
// its bias times p) and backward (input and prob gradients, every weight and bias gradient added
// into the parameters) for each activation, with and without biases, an expert without rows, in
// double and in float; a range of experts computing only its own; the parameters' layout and
// release; and the size errors.
#include <megamoe/core/error.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/mlp.hpp>

#include "reference/moe_reference.hpp"
#include "support/layer_helpers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace ex = megamoe::expert;
namespace ref = megamoe::reference;

namespace {

using ex::activation_function;
using megamoe::testing::to_mat;

template <class T>
std::vector<T> normal(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(scale * mm::standard_normal(seed, i));
  return v;
}

/// One forward and backward of E = 3 experts with rows {4, 0, 5} (expert 1 has none).
template <activation_function A, class T>
struct mlp_run {
  ex::mlp_sizes sizes;
  std::vector<std::int64_t> per_expert{4, 0, 5};
  int N = 9;
  ex::expert_parameters<T> params;
  std::vector<T> x, dy, probs, fc1, act, out, grad_act, grad_fc1, grad_in, grad_probs;

  explicit mlp_run(bool bias) : sizes{3, 6, 5, A, bias}, params(sizes) {
    int const H = sizes.hidden, F = sizes.ffn, W1 = sizes.fc1_rows();
    for (int e = 0; e < sizes.experts; ++e) {
      auto fill = [&](auto map, std::uint64_t seed) {
        for (Eigen::Index i = 0; i < map.size(); ++i)
          map.data()[i] = static_cast<T>(0.4 * mm::standard_normal(seed, i));
      };
      fill(params.fc1(e), 10 + e);
      fill(params.fc2(e), 20 + e);
      if (bias) {
        fill(params.fc1_bias(e), 30 + e);
        fill(params.fc2_bias(e), 40 + e);
      }
    }
    auto const n = static_cast<std::size_t>(N);
    x = normal<T>(n * H, 1);
    dy = normal<T>(n * H, 2);
    for (int j = 0; j < N; ++j) probs.push_back(static_cast<T>(0.2 + 0.07 * j));
    fc1.assign(n * W1, T(0));
    act.assign(n * F, T(0));
    out.assign(n * H, T(0));
    grad_act.assign(n * F, T(0));
    grad_fc1.assign(n * W1, T(0));
    grad_in.assign(n * H, T(0));
    grad_probs.assign(n, T(0));
  }

  void run(mm::thread_pool& pool, ex::expert_range range = {}) {
    ex::executor<T> exec(pool);
    ex::grouped_mlp<A, ex::grouped_gemm, T> mlp(sizes);
    ex::grouped_rows<T> const rows{N, per_expert, probs.data()};
    mlp.forward(exec, params, rows, x.data(), fc1.data(), act.data(), out.data(), range);
    mlp.backward(exec, params, rows, x.data(), fc1.data(), act.data(), dy.data(), grad_act.data(),
                 grad_fc1.data(), grad_in.data(), grad_probs.data(), range);
  }
};

/// Every output and gradient of `run` against the reference, within `tol` of each tensor's
/// largest entry.
template <activation_function A, class T>
void expect_reference(mlp_run<A, T>& r, double tol) {
  int const H = r.sizes.hidden, F = r.sizes.ffn, W1 = r.sizes.fc1_rows();
  bool const bias = r.sizes.bias;
  std::vector<ref::mat> gw1, gw2;
  ref::mat gb1, gb2;
  for (int e = 0; e < r.sizes.experts; ++e) {
    gw1.push_back(ref::zeros(static_cast<std::size_t>(W1), static_cast<std::size_t>(H)));
    gw2.push_back(ref::zeros(static_cast<std::size_t>(H), static_cast<std::size_t>(F)));
    gb1.emplace_back(static_cast<std::size_t>(W1), 0.0);
    gb2.emplace_back(static_cast<std::size_t>(H), 0.0);
  }
  double worst = 0, largest = 0;
  auto compare = [&](double got, double want) {
    worst = std::max(worst, std::abs(got - want));
    largest = std::max(largest, std::abs(want));
  };
  int j = 0;
  for (int e = 0; e < r.sizes.experts; ++e) {
    auto const w1 = to_mat(r.params.fc1(e)), w2 = to_mat(r.params.fc2(e));
    ref::vec b1, b2;
    if (bias) {
      b1 = to_mat(r.params.fc1_bias(e))[0];
      b2 = to_mat(r.params.fc2_bias(e))[0];
    }
    for (std::int64_t i = 0; i < r.per_expert[static_cast<std::size_t>(e)]; ++i, ++j) {
      auto const at = static_cast<std::size_t>(j);
      ref::vec x(r.x.begin() + j * H, r.x.begin() + (j + 1) * H);
      ref::vec dy(r.dy.begin() + j * H, r.dy.begin() + (j + 1) * H);
      double const p = r.probs[at];
      auto const t = ref::mlp_forward(A, w1, w2, bias ? &b1 : nullptr, bias ? &b2 : nullptr, x, p);
      for (int k = 0; k < W1; ++k) compare(r.fc1[at * W1 + k], t.h[static_cast<std::size_t>(k)]);
      for (int k = 0; k < F; ++k) compare(r.act[at * F + k], p * t.a[static_cast<std::size_t>(k)]);
      for (int k = 0; k < H; ++k) compare(r.out[at * H + k], t.y[static_cast<std::size_t>(k)]);
      // Backward: d(ap) = W2^T dy, dp = d(ap).a (+ dy.b2), dh = act'(h) (p d(ap)), dx = W1^T dh.
      auto const dap = ref::times_transposed(w2, dy);
      double dp = 0;
      for (int k = 0; k < F; ++k)
        dp += dap[static_cast<std::size_t>(k)] * t.a[static_cast<std::size_t>(k)];
      if (bias)
        for (int k = 0; k < H; ++k)
          dp += dy[static_cast<std::size_t>(k)] * b2[static_cast<std::size_t>(k)];
      ref::vec da = dap;
      for (double& v : da) v *= p;
      auto const dh = ref::act_backward(A, t.h, da);
      auto const dx = ref::times_transposed(w1, dh);
      compare(r.grad_probs[at], dp);
      for (int k = 0; k < H; ++k) compare(r.grad_in[at * H + k], dx[static_cast<std::size_t>(k)]);
      ref::add_outer(gw2[static_cast<std::size_t>(e)], dy, t.a, p);
      ref::add_outer(gw1[static_cast<std::size_t>(e)], dh, x);
      for (int k = 0; k < H; ++k)
        gb2[static_cast<std::size_t>(e)][static_cast<std::size_t>(k)] +=
            p * dy[static_cast<std::size_t>(k)];
      for (int k = 0; k < W1; ++k)
        gb1[static_cast<std::size_t>(e)][static_cast<std::size_t>(k)] +=
            dh[static_cast<std::size_t>(k)];
    }
  }
  for (int e = 0; e < r.sizes.experts; ++e) {
    auto const g1 = to_mat(r.params.grad_fc1(e)), g2 = to_mat(r.params.grad_fc2(e));
    for (int o = 0; o < W1; ++o)
      for (int i = 0; i < H; ++i)
        compare(g1[static_cast<std::size_t>(o)][static_cast<std::size_t>(i)],
                gw1[static_cast<std::size_t>(e)][static_cast<std::size_t>(o)]
                   [static_cast<std::size_t>(i)]);
    for (int o = 0; o < H; ++o)
      for (int i = 0; i < F; ++i)
        compare(g2[static_cast<std::size_t>(o)][static_cast<std::size_t>(i)],
                gw2[static_cast<std::size_t>(e)][static_cast<std::size_t>(o)]
                   [static_cast<std::size_t>(i)]);
    if (bias) {
      auto const b1 = to_mat(r.params.grad_fc1_bias(e))[0],
                 b2 = to_mat(r.params.grad_fc2_bias(e))[0];
      for (int k = 0; k < W1; ++k)
        compare(b1[static_cast<std::size_t>(k)],
                gb1[static_cast<std::size_t>(e)][static_cast<std::size_t>(k)]);
      for (int k = 0; k < H; ++k)
        compare(b2[static_cast<std::size_t>(k)],
                gb2[static_cast<std::size_t>(e)][static_cast<std::size_t>(k)]);
    }
  }
  EXPECT_LE(worst, tol * largest) << ex::name_of(A) << (bias ? " with biases" : "");
  EXPECT_GT(largest, 0.1);
}

template <activation_function A>
void expect_every_form(mm::thread_pool& pool) {
  for (bool bias : {false, true}) {
    mlp_run<A, double> exact(bias);
    exact.run(pool);
    expect_reference(exact, 1e-13);
    mlp_run<A, float> rounded(bias);
    rounded.run(pool);
    expect_reference(rounded, 1e-5);
  }
}

TEST(GroupedMlp, ForwardAndBackwardMatchThePlainMlp) {
  mm::thread_pool pool(2);
  expect_every_form<activation_function::swiglu>(pool);
  expect_every_form<activation_function::gelu>(pool);
  expect_every_form<activation_function::squared_relu>(pool);
}

TEST(GroupedMlp, BackwardAddsIntoTheWeightGradients) {
  mm::thread_pool pool(2);
  mlp_run<activation_function::swiglu, double> once(true), twice(true);
  once.run(pool);
  twice.run(pool);
  twice.run(pool);
  for (int e = 0; e < 3; ++e) {
    EXPECT_TRUE(twice.params.grad_fc1(e).isApprox(2.0 * once.params.grad_fc1(e))) << e;
    EXPECT_TRUE(twice.params.grad_fc2(e).isApprox(2.0 * once.params.grad_fc2(e))) << e;
    EXPECT_TRUE(twice.params.grad_fc2_bias(e).isApprox(2.0 * once.params.grad_fc2_bias(e))) << e;
  }
  // Input and prob gradients are set, not added.
  EXPECT_EQ(twice.grad_in, once.grad_in);
  EXPECT_EQ(twice.grad_probs, once.grad_probs);
  once.params.zero_grad();
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(once.params.grad_fc1(e).cwiseAbs().maxCoeff(), 0.0);
    EXPECT_EQ(once.params.grad_fc2_bias(e).cwiseAbs().maxCoeff(), 0.0);
  }
}

TEST(GroupedMlp, ARangeOfExpertsComputesOnlyItsOwn) {
  mm::thread_pool pool(2);
  mlp_run<activation_function::gelu, double> whole(true), piece(true);
  whole.run(pool);
  double const unset = -1234.5;
  for (auto* v : {&piece.fc1, &piece.act, &piece.out, &piece.grad_in, &piece.grad_probs})
    std::fill(v->begin(), v->end(), unset);
  piece.run(pool, {1, 3});  // experts 1 (no rows) and 2: rows 4 .. 8
  int const H = 6, W1 = 5;
  for (int j = 0; j < 9; ++j) {
    auto const at = static_cast<std::size_t>(j);
    bool const mine = j >= 4;
    for (int k = 0; k < H; ++k) {
      EXPECT_EQ(piece.out[at * H + k], mine ? whole.out[at * H + k] : unset) << j;
      EXPECT_EQ(piece.grad_in[at * H + k], mine ? whole.grad_in[at * H + k] : unset) << j;
    }
    for (int k = 0; k < W1; ++k)
      EXPECT_EQ(piece.fc1[at * W1 + k], mine ? whole.fc1[at * W1 + k] : unset);
    EXPECT_EQ(piece.grad_probs[at], mine ? whole.grad_probs[at] : unset) << j;
  }
  EXPECT_EQ(piece.params.grad_fc1(0).cwiseAbs().maxCoeff(), 0.0);  // expert 0 untouched
  EXPECT_EQ(piece.params.grad_fc2_bias(0).cwiseAbs().maxCoeff(), 0.0);
  EXPECT_EQ(piece.params.grad_fc1(1).cwiseAbs().maxCoeff(), 0.0);  // no rows, no gradient
  EXPECT_EQ(piece.params.grad_fc1(2), whole.params.grad_fc1(2));
  EXPECT_EQ(piece.params.grad_fc2(2), whole.params.grad_fc2(2));
  EXPECT_EQ(piece.params.grad_fc1_bias(2), whole.params.grad_fc1_bias(2));
}

TEST(GroupedMlp, SizesMustAgree) {
  mm::thread_pool pool(1);
  ex::executor<float> exec(pool);
  ex::mlp_sizes const sizes{2, 4, 3, activation_function::swiglu, false};
  EXPECT_THROW((ex::grouped_mlp<activation_function::gelu, ex::grouped_gemm, float>(sizes)),
               mm::input_error);
  ex::grouped_mlp<activation_function::swiglu, ex::grouped_gemm, float> mlp(sizes);
  ex::expert_parameters<float> params(sizes);
  std::vector<float> x(3 * 4), fc1(3 * 6), act(3 * 3), out(3 * 4), probs(3, 1.0F);
  auto forward = [&](std::vector<std::int64_t> const& per_expert, int count,
                     ex::expert_range range) {
    mlp.forward(exec, params, ex::grouped_rows<float>{count, per_expert, probs.data()}, x.data(),
                fc1.data(), act.data(), out.data(), range);
  };
  EXPECT_NO_THROW(forward({1, 2}, 3, {}));
  EXPECT_THROW(forward({1, 1, 1}, 3, {}), mm::input_error);  // three counts for two experts
  EXPECT_THROW(forward({1, 1}, 3, {}), mm::input_error);     // counts add up to 2
  EXPECT_THROW(forward({1, 2}, 3, {1, 3}), mm::input_error);
  EXPECT_THROW(forward({1, 2}, 3, {2, 1}), mm::input_error);
  EXPECT_THROW(forward({1, 2}, 3, {-1, 1}), mm::input_error);
  EXPECT_NO_THROW(forward({1, 2}, 3, {2, 2}));  // an empty range
}

TEST(ExpertParameters, LayoutBiasesAndRelease) {
  ex::mlp_sizes const sizes{3, 4, 5, activation_function::swiglu, true};
  EXPECT_EQ(sizes.fc1_rows(), 10);
  ex::expert_parameters<double> params(sizes);
  EXPECT_EQ(params.sizes(), sizes);
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(params.fc1(e).rows(), 10);
    EXPECT_EQ(params.fc1(e).cols(), 4);
    EXPECT_EQ(params.fc2(e).rows(), 4);
    EXPECT_EQ(params.fc2(e).cols(), 5);
    EXPECT_EQ(params.fc1(e).data(), params.fc1_data(e));
    EXPECT_EQ(params.fc1_bias(e).cols(), 10);
    EXPECT_EQ(params.fc2_bias(e).cols(), 4);
    EXPECT_EQ(params.fc1(e).cwiseAbs().maxCoeff(), 0.0);  // zero until initialised
  }
  // One block per kind: any expert by offset.
  EXPECT_EQ(params.fc1_data(2) - params.fc1_data(0), 2 * 10 * 4);
  EXPECT_EQ(params.fc2_data(1) - params.fc2_data(0), 4 * 5);
  EXPECT_EQ(params.weight_bytes(), (3 * 10 * 4 + 3 * 4 * 5 + 3 * 10 + 3 * 4) * sizeof(double));
  EXPECT_TRUE(params.holds_weights());
  params.release_weights();
  EXPECT_FALSE(params.holds_weights());
  EXPECT_EQ(params.fc1(0).rows(), 0);
  EXPECT_EQ(params.fc2(0).rows(), 0);
  EXPECT_EQ(params.fc1_data(0), nullptr);
  EXPECT_EQ(params.fc2_data(0), nullptr);
  EXPECT_EQ(params.grad_fc1(2).rows(), 10);  // gradients and biases stay
  EXPECT_EQ(params.fc1_bias(2).cols(), 10);
  EXPECT_EQ(params.weight_bytes(), (3 * 10 + 3 * 4) * sizeof(double));
  // Without biases the bias maps are empty.
  ex::expert_parameters<float> plain({2, 4, 5, activation_function::gelu, false});
  EXPECT_EQ(plain.fc1(0).rows(), 5);
  EXPECT_EQ(plain.fc1_bias(0).size(), 0);
  EXPECT_EQ(plain.grad_fc2_bias(1).size(), 0);
  for (ex::mlp_sizes const bad :
       {ex::mlp_sizes{0, 4, 5}, ex::mlp_sizes{1, 0, 5}, ex::mlp_sizes{1, 4, 0}})
    EXPECT_THROW(ex::expert_parameters<float>{bad}, mm::input_error);
}

}  // namespace
