// SPDX-License-Identifier: Apache-2.0
// AdamW, clipping and the schedule on one rank against a plain re-statement of their formulas.
#include <megamoe/optim/adamw.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace mm = megamoe;
namespace mo = megamoe::optim;

namespace {

/// Two parameters: a matrix (weight decay applies) and a norm weight (it does not).
struct two_parameters {
  mm::row_matrix<double> w = mm::row_matrix<double>::Constant(2, 3, 0.5);
  mm::row_matrix<double> gw = mm::row_matrix<double>::Zero(2, 3);
  mm::row_matrix<double> n = mm::row_matrix<double>::Ones(1, 3);
  mm::row_matrix<double> gn = mm::row_matrix<double>::Zero(1, 3);
  template <class F>
  void for_each_parameter(F&& f) {
    f("decoder.layers.0.mlp.linear_fc1.weight", mm::row_matrix_map<double>(w.data(), 2, 3),
      mm::row_matrix_map<double>(gw.data(), 2, 3), mm::parameter_kind::dense);
    f("decoder.layers.0.input_layernorm.weight", mm::row_matrix_map<double>(n.data(), 1, 3),
      mm::row_matrix_map<double>(gn.data(), 1, 3), mm::parameter_kind::dense);
  }
};

TEST(LrSchedule, WarmupThenCosineToTheMinimum) {
  mo::lr_schedule const s{1e-3, 1e-4, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(1), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  EXPECT_NEAR(s.at(60), 0.5 * (1e-3 + 1e-4), 1e-15);  // half way through the decay
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(500), 1e-4);
  EXPECT_GT(s.at(30), s.at(31));
}

TEST(AdamW, StepsEqualTheFormulaWithClippingAndDecoupledDecay) {
  two_parameters model;
  mo::adamw_settings settings;
  settings.weight_decay = 0.1;
  settings.clip_grad = 0.5;
  mo::distributed_adamw<double> optimizer(model, settings);
  EXPECT_EQ(optimizer.state_elements(), 9);
  // The plain re-statement on copies.
  std::vector<double> p(9), m(9, 0.0), v(9, 0.0);
  for (int i = 0; i < 6; ++i) p[static_cast<std::size_t>(i)] = model.w.data()[i];
  for (int i = 0; i < 3; ++i) p[static_cast<std::size_t>(6 + i)] = model.n.data()[i];
  for (int t = 1; t <= 4; ++t) {
    std::vector<double> g(9);
    for (int i = 0; i < 9; ++i) g[static_cast<std::size_t>(i)] = std::sin(1.3 * i + 0.7 * t);
    for (int i = 0; i < 6; ++i) model.gw.data()[i] = g[static_cast<std::size_t>(i)];
    for (int i = 0; i < 3; ++i) model.gn.data()[i] = g[static_cast<std::size_t>(6 + i)];
    double const lr = 0.01 * t;
    auto const report = optimizer.step(lr);
    double norm = 0.0;
    for (double x : g) norm += x * x;
    norm = std::sqrt(norm);
    double const clip = norm > 0.5 ? 0.5 / (norm + 1e-6) : 1.0;
    EXPECT_NEAR(report.grad_norm, norm, 1e-14);
    EXPECT_NEAR(report.clip_factor, clip, 1e-15);
    for (std::size_t i = 0; i < 9; ++i) {
      double const gi = clip * g[i];
      m[i] = 0.9 * m[i] + 0.1 * gi;
      v[i] = 0.95 * v[i] + 0.05 * gi * gi;
      double const mhat = m[i] / (1 - std::pow(0.9, t)), vhat = v[i] / (1 - std::pow(0.95, t));
      double const decay = i < 6 ? 0.1 * p[i] : 0.0;  // not on the norm
      p[i] -= lr * (mhat / (std::sqrt(vhat) + 1e-8) + decay);
    }
    for (int i = 0; i < 6; ++i)
      EXPECT_NEAR(model.w.data()[i], p[static_cast<std::size_t>(i)], 1e-15) << "step " << t;
    for (int i = 0; i < 3; ++i)
      EXPECT_NEAR(model.n.data()[i], p[static_cast<std::size_t>(6 + i)], 1e-15) << "step " << t;
  }
  EXPECT_EQ(optimizer.steps(), 4);
}

TEST(AdamW, ANonFiniteGradientSkipsTheStep) {
  two_parameters model;
  mo::distributed_adamw<double> optimizer(model, {});
  model.gw(1, 2) = std::numeric_limits<double>::quiet_NaN();
  mm::row_matrix<double> const before = model.w;
  auto const report = optimizer.step(0.1);
  EXPECT_FALSE(report.finite);
  EXPECT_EQ(model.w, before);
  EXPECT_EQ(optimizer.steps(), 0);
}

/// Float parameters spanning several of the optimizer's chunks (2^15 elements), with gradients.
struct large_float_model {
  std::vector<mm::row_matrix<float>> values, grads;
  large_float_model() {
    for (auto [rows, cols] : {std::pair{300, 257}, std::pair{1, 333}, std::pair{97, 41}}) {
      values.push_back(mm::row_matrix<float>::Random(rows, cols));
      grads.push_back(mm::row_matrix<float>::Random(rows, cols) * 0.3f);
    }
  }
  template <class F>
  void for_each_parameter(F&& f) {
    char const* names[] = {"decoder.layers.0.mlp.linear_fc1.weight",
                           "decoder.layers.0.input_layernorm.weight", "output_layer.weight"};
    for (std::size_t i = 0; i < values.size(); ++i)
      f(names[i], mm::row_matrix_map<float>(values[i].data(), values[i].rows(), values[i].cols()),
        mm::row_matrix_map<float>(grads[i].data(), grads[i].rows(), grads[i].cols()),
        mm::parameter_kind::dense);
  }
};

// The norm and the update on the pool's threads, chunk by chunk, give the same bits as on one
// thread (the chunks, not the threads, fix the summation order), over several steps with
// clipping.
TEST(AdamW, ThreadedStepsEqualOneThreadBitForBit) {
  large_float_model one, threaded;
  threaded = one;
  mo::adamw_settings settings;
  settings.clip_grad = 5.0;
  mo::distributed_adamw<float> a(one, settings), b(threaded, settings);
  mm::thread_pool pool(2);
  for (int step = 0; step < 3; ++step) {
    auto const ra = a.step(1e-2);
    auto const rb = b.step(pool, 1e-2);
    EXPECT_EQ(ra.grad_norm, rb.grad_norm);
    EXPECT_EQ(ra.clip_factor, rb.clip_factor);
    EXPECT_LT(ra.clip_factor, 1.0);
    for (std::size_t i = 0; i < one.values.size(); ++i)
      EXPECT_EQ(one.values[i], threaded.values[i]);
  }
}

// step_and_zero_grad: the update of step, then every gradient zero, in fewer passes; a
// non-finite gradient skips the step and keeps the gradients.
TEST(AdamW, StepAndZeroGradEqualsStepThenZeroGrad) {
  large_float_model separate, fused;
  fused = separate;
  mo::adamw_settings settings;
  settings.clip_grad = 5.0;
  mo::distributed_adamw<float> a(separate, settings), b(fused, settings);
  mm::thread_pool pool(2);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < separate.grads.size(); ++i) {
      separate.grads[i] =
          mm::row_matrix<float>::Random(separate.grads[i].rows(), separate.grads[i].cols());
      fused.grads[i] = separate.grads[i];
    }
    auto const ra = a.step(pool, 1e-2);
    a.zero_grad(pool);
    auto const rb = b.step_and_zero_grad(pool, 1e-2);
    EXPECT_EQ(ra.grad_norm, rb.grad_norm);
    for (std::size_t i = 0; i < separate.values.size(); ++i) {
      EXPECT_EQ(separate.values[i], fused.values[i]);
      EXPECT_TRUE(separate.grads[i].isZero(0.0F));
      EXPECT_TRUE(fused.grads[i].isZero(0.0F));
    }
  }
  fused.grads[2](5, 7) = std::numeric_limits<float>::quiet_NaN();
  fused.grads[0](1, 1) = 3.0F;
  auto const values = fused.values;
  EXPECT_FALSE(b.step_and_zero_grad(pool, 1e-2).finite);
  EXPECT_EQ(fused.grads[0](1, 1), 3.0F);
  EXPECT_TRUE(std::isnan(fused.grads[2](5, 7)));
  EXPECT_EQ(fused.values, values);
}

// The fp32 AVX-512 loops and the portable ones: the same bits, for lengths around the 8 lanes.
TEST(AdamWKernels, Avx512AndPortableLoopsGiveTheSameBits) {
#if MEGAMOE_VECTOR_MATH_AVX512
  if (!mm::cpu().use_avx512()) GTEST_SKIP() << "no AVX-512";
  namespace k = mo::kernels;
  k::adamw_step const s{0.7, 0.9, 0.95, 0.19, 0.0975, 1e-8, 0.1, 3e-3};
  for (int n : {1, 7, 8, 9, 64, 1003}) {
    Eigen::VectorXf const g0 = Eigen::VectorXf::Random(n), p0 = Eigen::VectorXf::Random(n);
    Eigen::VectorXf const m0 = Eigen::VectorXf::Random(n) * 0.1f;
    Eigen::VectorXf const v0 = Eigen::VectorXf::Random(n).cwiseAbs() * 0.01f;
    EXPECT_EQ(k::detail::squares_avx512(g0.data(), n), k::detail::squares_portable(g0.data(), n));
    for (bool decay : {false, true}) {
      Eigen::VectorXf p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
      k::detail::update_avx512(p1.data(), g0.data(), m1.data(), v1.data(), n, s, decay);
      k::detail::update_portable(p2.data(), g0.data(), m2.data(), v2.data(), n, s, decay);
      EXPECT_EQ(p1, p2) << n;
      EXPECT_EQ(m1, m2) << n;
      EXPECT_EQ(v1, v2) << n;
      EXPECT_NE(p1, p0) << n;
      // Zeroing the gradient in the same pass changes nothing else.
      Eigen::VectorXf g3 = g0, p3 = p0, m3 = m0, v3 = v0, g4 = g0, p4 = p0, m4 = m0, v4 = v0;
      k::detail::update_avx512<k::gradient_after::zeroed>(p3.data(), g3.data(), m3.data(),
                                                          v3.data(), n, s, decay);
      k::detail::update_portable<k::gradient_after::zeroed>(p4.data(), g4.data(), m4.data(),
                                                            v4.data(), n, s, decay);
      EXPECT_EQ(p3, p1) << n;
      EXPECT_EQ(m3, m1) << n;
      EXPECT_EQ(v3, v1) << n;
      EXPECT_EQ(p4, p2) << n;
      EXPECT_TRUE(g3.isZero(0.0F) && g4.isZero(0.0F)) << n;
    }
  }
#else
  GTEST_SKIP() << "no AVX-512 kernels on this compiler or architecture";
#endif
}

// BF16 moments: the AVX-512 loop (16-bit loads and stores, rounding on the integer lanes) and the
// portable one give the same bits, for lengths around the 16 lanes; NaN moments stay NaN.
TEST(AdamWKernels, Bf16MomentsGiveTheSameBitsOnBothLoops) {
#if MEGAMOE_VECTOR_MATH_AVX512
  if (!mm::cpu().use_avx512()) GTEST_SKIP() << "no AVX-512";
  namespace k = mo::kernels;
  k::adamw_step const s{0.7, 0.9, 0.95, 0.19, 0.0975, 1e-8, 0.1, 3e-3};
  auto const bf16s = [](Eigen::VectorXf const& x) {
    std::vector<mm::bfloat16> out;
    for (float e : x) out.emplace_back(e);
    return out;
  };
  auto const bits = [](std::vector<mm::bfloat16> const& x) {
    std::vector<std::uint16_t> out;
    for (auto e : x) out.push_back(e.bits);
    return out;
  };
  for (int n : {1, 15, 16, 17, 33, 1003}) {
    Eigen::VectorXf const g = Eigen::VectorXf::Random(n), p0 = Eigen::VectorXf::Random(n);
    Eigen::VectorXf v = Eigen::VectorXf::Random(n).cwiseAbs() * 0.01f;
    v(n / 2) = std::numeric_limits<float>::quiet_NaN();
    auto m1 = bf16s(Eigen::VectorXf::Random(n) * 0.1f), v1 = bf16s(v);
    auto m2 = m1, v2 = v1;
    Eigen::VectorXf p1 = p0, p2 = p0;
    k::detail::update_avx512(p1.data(), g.data(), m1.data(), v1.data(), n, s, true);
    k::detail::update_portable(p2.data(), g.data(), m2.data(), v2.data(), n, s, true);
    EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), sizeof(float) * static_cast<std::size_t>(n)))
        << n;
    EXPECT_EQ(bits(m1), bits(m2)) << n;
    EXPECT_EQ(bits(v1), bits(v2)) << n;
    EXPECT_TRUE(std::isnan(static_cast<float>(v1[static_cast<std::size_t>(n / 2)]))) << n;
  }
#else
  GTEST_SKIP() << "no AVX-512 kernels on this compiler or architecture";
#endif
}

TEST(AdamW, FloatParametersKeepFloatState) {
  static_assert(std::is_same_v<mo::distributed_adamw<float>::exp_avg_type, float>);
  static_assert(std::is_same_v<mo::distributed_adamw<double>::exp_avg_sq_type, double>);
  static_assert(
      std::is_same_v<mo::distributed_adamw<float, mo::bf16_moments>::exp_avg_type, mm::bfloat16>);
}

// Moments in BF16 (the reference's --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16): each step
// equals a plain fp32 re-statement whose moments are rounded to BF16 after each update (the
// parameter's update reads the moments before that rounding), over several steps with clipping
// and over every chunk of a large model; the moments take half the bytes.
TEST(AdamW, Bf16MomentsEqualTheUpdateWithMomentsRoundedToBf16) {
  large_float_model model;
  mo::adamw_settings settings;
  settings.clip_grad = 5.0;
  mo::distributed_adamw<float, mo::bf16_moments> optimizer(model, settings);
  large_float_model fp32_model = model;
  mo::distributed_adamw<float> fp32_optimizer(fp32_model, settings);
  EXPECT_EQ(optimizer.state_bytes() * 2, fp32_optimizer.state_bytes());
  EXPECT_EQ(optimizer.state_bytes_saved(), optimizer.state_bytes());
  EXPECT_EQ(fp32_optimizer.state_bytes_saved(), 0U);
  std::vector<std::vector<float>> p, m, v;
  for (auto const& value : model.values) {
    p.emplace_back(value.data(), value.data() + value.size());
    m.emplace_back(static_cast<std::size_t>(value.size()), 0.0F);
    v.emplace_back(static_cast<std::size_t>(value.size()), 0.0F);
  }
  mm::thread_pool pool(2);
  for (int t = 1; t <= 3; ++t) {
    for (std::size_t i = 0; i < model.grads.size(); ++i) {
      model.grads[i] =
          mm::row_matrix<float>::Random(model.grads[i].rows(), model.grads[i].cols()) * 0.5f;
      fp32_model.grads[i] = model.grads[i];
    }
    double squares = 0.0;
    for (auto const& g : model.grads) squares += g.cast<double>().squaredNorm();
    double const norm = std::sqrt(squares);
    auto const report = optimizer.step(pool, 1e-2);
    fp32_optimizer.step(pool, 1e-2);
    ASSERT_LT(report.clip_factor, 1.0);
    EXPECT_NEAR(report.grad_norm, norm, 1e-9 * norm);
    auto const f = [](double x) { return static_cast<float>(x); };
    float const clip = f(report.clip_factor), c1 = f(1 - std::pow(0.9, t)),
                c2 = f(1 - std::pow(0.95, t)), lr = f(1e-2);
    for (std::size_t k = 0; k < p.size(); ++k) {
      float const wd = k == 1 ? 0.0F : f(0.1);  // not on the norm weight
      for (std::size_t i = 0; i < p[k].size(); ++i) {
        float const g = clip * model.grads[k].data()[i];
        float const mi = f(0.9) * m[k][i] + f(1.0 - 0.9) * g;
        float const vi = f(0.95) * v[k][i] + f(1.0 - 0.95) * g * g;
        m[k][i] = mm::round_to_bf16(mi);
        v[k][i] = mm::round_to_bf16(vi);
        p[k][i] = p[k][i] - lr * ((mi / c1) / (std::sqrt(vi / c2) + f(1e-8)) + wd * p[k][i]);
      }
      ASSERT_EQ(0, std::memcmp(p[k].data(), model.values[k].data(), p[k].size() * sizeof(float)))
          << "parameter " << k << ", step " << t;
    }
    // The rounding is felt: the parameters leave the fp32-moment run's.
    if (t > 1) {
      EXPECT_NE(model.values[0], fp32_model.values[0]) << t;
    }
  }
  // What a checkpoint saves: the moments themselves, as BF16.
  std::size_t k = 0;
  optimizer.for_each_shard_piece([&](auto const& piece) {
    for (std::int64_t i = 0; i < piece.count; ++i) {
      EXPECT_EQ(static_cast<float>(piece.exp_avg[i]), m[k][static_cast<std::size_t>(i)]);
      EXPECT_EQ(static_cast<float>(piece.exp_avg_sq[i]), v[k][static_cast<std::size_t>(i)]);
    }
    ++k;
  });
  EXPECT_EQ(k, p.size());
}

}  // namespace
