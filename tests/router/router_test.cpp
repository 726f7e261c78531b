// SPDX-License-Identifier: Apache-2.0
// The whole router (router/router.hpp): finite-difference gradients in double precision for every
// score function and loss, the modes the reference vectors lack against a plain re-statement of the
// spec (tests/reference/router_reference.hpp), eval / recompute / jitter / bias / Sinkhorn /
// padding behaviour, input errors, and static policies against the run-time router on the shared
// reference files. Its pieces have their own files (scores, top_k, sinkhorn, capacity, losses,
// expert_bias, gating, output, megatron_config, plan).
#include <megamoe/config/config.hpp>
#include <megamoe/router/megatron_config.hpp>
#include <megamoe/router/router.hpp>
#include <megamoe/router/scores.hpp>

#include "support/routing_inputs.hpp"

#include "reference/router_reference.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mr = megamoe::router;

namespace {

using megamoe::testing::separated_logits;

using matrix = mm::row_matrix<double>;

matrix random_matrix(int rows, int cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

/// sum(probs .* R) + scale * (every attached loss).
template <class L>
double total_objective(mr::routing_output<L> const& out, matrix const& weights, double scale) {
  double f = (out.probs.template cast<double>().array() * weights.array()).sum();
  for (auto const* loss : {&out.losses.aux_loss, &out.losses.seq_aux_loss,
                           &out.losses.global_aux_loss, &out.losses.z_loss})
    if (*loss) f += scale * (*loss)->value;
  return f;
}

struct fd_case {
  char const* name;
  mr::settings settings;
  int experts = 8;
  int seq = 6, batch = 2;
  bool padding = false;
  double backward_scale = 1.0;
};

mr::settings with(int k, mr::score_function score) {
  mr::settings s;
  s.top_k = k;
  s.score = score;
  return s;
}

std::vector<fd_case> fd_cases() {
  using sf = mr::score_function;
  std::vector<fd_case> cases;
  auto add = [&](char const* name, mr::settings s, int experts = 8, bool padding = false,
                 double scale = 1.0) {
    cases.push_back({name, s, experts, 6, 2, padding, scale});
  };
  add("softmax_after_topk_k2", with(2, sf::softmax_after_topk));
  add("softmax_before_topk_k3", with(3, sf::softmax_before_topk));
  add("softmax_before_topk_k1", with(1, sf::softmax_before_topk));
  auto s = with(4, sf::sigmoid);
  s.topk_scaling_factor = 2.5;
  add("sigmoid_k4_scaled", s);
  add("sigmoid_k1", with(1, sf::sigmoid));
  add("sqrtsoftplus_k2", with(2, sf::sqrtsoftplus));
  s = with(2, sf::sqrtsoftplus);
  s.expert_bias = true;
  add("sqrtsoftplus_bias", s);
  s = with(4, sf::sigmoid);
  s.num_groups = 4;
  s.group_top_k = 2;
  s.expert_bias = true;
  add("sigmoid_groups_bias", s, 16);
  s = with(2, sf::softmax_before_topk);
  s.num_groups = 4;
  s.group_top_k = 2;
  add("softmax_before_topk_groups", s);
  s = with(2, sf::softmax_after_topk);
  s.aux_loss_coeff = 0.3;
  add("aux_loss_softmax", s);
  s = with(3, sf::sigmoid);
  s.aux_loss_coeff = 0.3;
  add("aux_loss_sigmoid", s);
  s = with(2, sf::sqrtsoftplus);
  s.seq_aux_loss_coeff = 0.2;
  add("seq_aux_loss_sqrtsoftplus", s);
  s = with(2, sf::softmax_after_topk);
  s.global_aux_loss_coeff = 0.2;
  add("global_aux_loss", s);
  s = with(2, sf::softmax_after_topk);
  s.aux_loss_coeff = 0.1;
  s.seq_aux_loss_coeff = 0.2;
  s.global_aux_loss_coeff = 0.3;
  s.z_loss_coeff = 0.05;
  add("loss_list_and_z", s, 8, false, 0.7);
  add("loss_list_and_z_padding", s, 8, true, 0.7);
  s = with(2, sf::softmax_after_topk);
  s.z_loss_coeff = 0.1;
  add("z_loss", s);
  s = with(2, sf::softmax_after_topk);
  s.capacity_factor = 0.5;
  s.aux_loss_coeff = 0.1;
  add("capacity_probs_drop", s);
  s.token_drop_policy = mr::drop_policy::position;
  s.pad_to_capacity = true;
  add("capacity_position_pad", s);
  s = with(2, sf::softmax_after_topk);
  s.sinkhorn = true;
  add("sinkhorn_k2", s);
  s.top_k = 1;
  add("sinkhorn_k1", s);
  return cases;
}

class RouterGradient : public ::testing::TestWithParam<fd_case> {};

TEST_P(RouterGradient, MatchesCentralDifferencesInDouble) {
  auto const& c = GetParam();
  mr::settings s = c.settings;
  s.dtype = mr::logits_dtype::fp64;
  int const T = c.seq * c.batch;
  mr::topk_router<double, double> router(s, c.experts);
  if (s.expert_bias)
    for (int e = 0; e < c.experts; ++e)
      router.state().expert_bias[static_cast<std::size_t>(e)] = 0.01F * static_cast<float>(e % 3);
  matrix const z = separated_logits(T, c.experts, 7);
  matrix const weights = random_matrix(T, c.experts, 11);
  std::vector<std::uint8_t> padding;
  if (c.padding) padding = {0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0};
  mr::batch_shape const batch{c.seq, c.batch};
  router.route(z, batch, {.mode = mr::pass::training, .padding_mask = padding});
  matrix const grad = router.backward(weights, c.backward_scale);

  // Recompute passes reuse the global-aux average of the training pass, as a recomputed layer does.
  double const h = 1e-6;
  double worst = 0.0;
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < c.experts; ++e) {
      matrix zp = z, zm = z;
      zp(t, e) += h;
      zm(t, e) -= h;
      mr::route_options const recompute{.mode = mr::pass::recompute, .padding_mask = padding};
      double const fp =
          total_objective(router.route(zp, batch, recompute), weights, c.backward_scale);
      double const fm =
          total_objective(router.route(zm, batch, recompute), weights, c.backward_scale);
      double const numeric = (fp - fm) / (2 * h);
      worst = std::max(worst, std::abs(numeric - grad(t, e)));
      EXPECT_NEAR(grad(t, e), numeric, 1e-7 + 1e-6 * std::abs(numeric))
          << c.name << " token " << t << " expert " << e;
    }
  // A case whose gradient were identically zero would prove nothing.
  EXPECT_GT(grad.cwiseAbs().maxCoeff(), 1e-3) << c.name;
}

INSTANTIATE_TEST_SUITE_P(EveryScoreAndLoss, RouterGradient, ::testing::ValuesIn(fd_cases()),
                         [](auto const& info) { return std::string(info.param.name); });

TEST(RouterGradient, GatingAndJitterMatchCentralDifferences) {
  mr::settings s = with(2, mr::score_function::softmax_after_topk);
  s.dtype = mr::logits_dtype::fp64;
  s.aux_loss_coeff = 0.2;
  s.input_jitter_eps = 0.05;
  int const T = 8, H = 5, E = 6;
  matrix const x = random_matrix(T, H, 3), w = random_matrix(E, H, 4);
  matrix const weights = random_matrix(T, E, 5);
  mr::topk_router<double, double> router(s, E);
  mr::route_options const options{.jitter_key = 42};
  router.route(x, w, {T, 1}, options);
  matrix grad_x, grad_w;
  router.backward(weights, 1.0, x, w, grad_x, grad_w);
  mr::route_options const again{.mode = mr::pass::recompute, .jitter_key = 42};
  auto objective = [&](matrix const& xx, matrix const& ww) {
    return total_objective(router.route(xx, ww, {T, 1}, again), weights, 1.0);
  };
  double const h = 1e-6;
  for (int i = 0; i < T; ++i)
    for (int j = 0; j < H; ++j) {
      matrix xp = x, xm = x;
      xp(i, j) += h;
      xm(i, j) -= h;
      EXPECT_NEAR(grad_x(i, j), (objective(xp, w) - objective(xm, w)) / (2 * h), 1e-6);
    }
  for (int i = 0; i < E; ++i)
    for (int j = 0; j < H; ++j) {
      matrix wp = w, wm = w;
      wp(i, j) += h;
      wm(i, j) -= h;
      EXPECT_NEAR(grad_w(i, j), (objective(x, wp) - objective(x, wm)) / (2 * h), 1e-6);
    }
}

// ---------------------------------------------------------------------------------------------
// Modes the reference vectors do not hold, against the plain re-statement of the spec.

struct spec_case {
  char const* name;
  mr::settings settings;
  int experts = 8;
  int seq = 8, batch = 2;
  bool padding = false;
  int microbatches = 1;
};

std::vector<spec_case> spec_cases() {
  using sf = mr::score_function;
  std::vector<spec_case> cases;
  auto s = with(2, sf::softmax_after_topk);
  s.global_aux_loss_coeff = 1e-2;
  cases.push_back({"global_aux_three_microbatches", s, 8, 8, 2, false, 3});
  cases.push_back({"global_aux_padding", s, 8, 8, 2, true, 2});
  s = with(3, sf::sqrtsoftplus);
  s.aux_loss_coeff = 1e-2;
  s.expert_bias = true;
  s.topk_scaling_factor = 2.5;
  cases.push_back({"sqrtsoftplus_bias_aux", s});
  s = with(2, sf::softmax_after_topk);
  s.capacity_factor = 0.75;
  s.token_drop_policy = mr::drop_policy::position;
  cases.push_back({"position_drop", s});
  s.pad_to_capacity = true;
  cases.push_back({"position_drop_pad", s});
  s.token_drop_policy = mr::drop_policy::probs;
  s.capacity_factor = 1.5;
  cases.push_back({"probs_pad_to_capacity", s});
  s.capacity_factor = 20.0;  // C > T: every token to every expert
  cases.push_back({"pad_capacity_above_tokens", s});
  s = with(2, sf::softmax_after_topk);
  s.aux_loss_coeff = 1e-2;
  s.seq_aux_loss_coeff = 2e-2;
  s.global_aux_loss_coeff = 3e-2;
  s.z_loss_coeff = 1e-3;
  cases.push_back({"loss_list_and_z", s, 8, 8, 2, false, 2});
  cases.push_back({"loss_list_and_z_padding", s, 8, 4, 4, true, 2});
  cases.push_back({"k1_softmax_before_topk", with(1, sf::softmax_before_topk)});
  s = with(1, sf::sigmoid);
  s.aux_loss_coeff = 1e-2;
  cases.push_back({"k1_sigmoid_aux", s});
  s = with(8, sf::sigmoid);
  s.num_groups = 8;
  s.group_top_k = 4;
  s.expert_bias = true;
  s.seq_aux_loss_coeff = 1e-4;
  s.topk_scaling_factor = 2.5;
  cases.push_back({"sigmoid_e32_groups", s, 32});
  return cases;
}

class RouterSpec : public ::testing::TestWithParam<spec_case> {};

template <class L, class S>
void compare_with_spec(spec_case const& c, double tol) {
  mr::settings s = c.settings;
  s.dtype = std::is_same_v<L, double> ? mr::logits_dtype::fp64 : mr::logits_dtype::fp32;
  int const T = c.seq * c.batch;
  mr::topk_router<L, S> router(s, c.experts);
  std::vector<float> bias;
  if (s.expert_bias) {
    for (int e = 0; e < c.experts; ++e)
      bias.push_back(0.02F * static_cast<float>((e * 5) % 7) - 0.05F);
    router.state().expert_bias = bias;
  }
  std::vector<std::uint8_t> padding;
  std::vector<bool> padding_flags;
  if (c.padding)
    for (int t = 0; t < T; ++t) {
      padding.push_back(t % 5 == 3 ? 1 : 0);
      padding_flags.push_back(t % 5 == 3);
    }
  mm::reference::router_memory memory;
  for (int m = 0; m < c.microbatches; ++m) {
    matrix const z = separated_logits(T, c.experts, 100 + static_cast<std::uint32_t>(m), 0.2);
    auto const& out = router.route(z.cast<L>(), {c.seq, c.batch}, {.padding_mask = padding});
    mm::reference::table zt(static_cast<std::size_t>(T));
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < c.experts; ++e)
        zt[static_cast<std::size_t>(t)].push_back(static_cast<double>(static_cast<L>(z(t, e))));
    auto const expected = mm::reference::route(zt, s, c.batch, bias, padding_flags, memory);
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < c.experts; ++e) {
        ASSERT_EQ(out.routing_map(t, e),
                  expected.map[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)])
            << c.name << " microbatch " << m << " token " << t << " expert " << e;
        ASSERT_NEAR(static_cast<double>(out.probs(t, e)),
                    expected.probs[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)], tol);
      }
    for (int e = 0; e < c.experts; ++e)
      EXPECT_EQ(out.tokens_per_expert[static_cast<std::size_t>(e)],
                expected.tokens_per_expert[static_cast<std::size_t>(e)]);
    auto same_loss = [&](char const* name, auto const& mine, auto const& theirs) {
      ASSERT_EQ(mine.has_value(), theirs.has_value()) << c.name << " " << name;
      if (mine) {
        EXPECT_NEAR(mine->value, *theirs, tol * std::abs(*theirs) + 1e-12) << c.name << " " << name;
      }
    };
    same_loss("aux_loss", out.losses.aux_loss, expected.aux_loss);
    same_loss("seq_aux_loss", out.losses.seq_aux_loss, expected.seq_aux_loss);
    same_loss("global_aux_loss", out.losses.global_aux_loss, expected.global_aux_loss);
    same_loss("z_loss", out.losses.z_loss, expected.z_loss);
  }
}

TEST_P(RouterSpec, Fp64RouterMatchesTheSpec) {
  compare_with_spec<double, double>(GetParam(), 1e-12);
}
TEST_P(RouterSpec, Fp32RouterMatchesTheSpec) {
  compare_with_spec<float, float>(GetParam(), 2e-6);
}
TEST_P(RouterSpec, Fp64LogitsWithFp32ScoresMatchTheSpec) {
  // The reference's fp64 router: logits, z-loss and probs containers in double, scores in fp32.
  compare_with_spec<double, float>(GetParam(), 2e-6);
}

INSTANTIATE_TEST_SUITE_P(ModesBeyondTheVectors, RouterSpec, ::testing::ValuesIn(spec_cases()),
                         [](auto const& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Behaviour: eval, recompute, the bias update, jitter, dense view, padding for quantization.

TEST(RouterBehaviour, EvalModeHasNoLossesNoCountsNoJitter) {
  mr::settings s = with(2, mr::score_function::sigmoid);
  s.expert_bias = true;
  s.aux_loss_coeff = 1e-2;
  s.z_loss_coeff = 1e-3;
  s.input_jitter_eps = 0.1;
  int const T = 6, H = 4, E = 4;
  mm::row_matrix<float> const x = random_matrix(T, H, 1).cast<float>();
  mm::row_matrix<float> const w = random_matrix(E, H, 2).cast<float>();
  mr::topk_router<float> router(s, E);
  auto const& out = router.route(x, w, {T, 1}, {.mode = mr::pass::eval});
  EXPECT_FALSE(out.losses.aux_loss);
  EXPECT_FALSE(out.losses.z_loss);
  for (double c : router.state().local_tokens_per_expert) EXPECT_EQ(c, 0.0);
  // Without jitter the routing is that of the plain logits.
  mm::row_matrix<float> logits;
  mr::gating_forward<float>(x, w, logits);
  mr::topk_router<float> plain(s, E);
  auto const& expected = plain.route(logits, {T, 1}, {.mode = mr::pass::eval});
  EXPECT_EQ(out.probs, expected.probs);
  // Training: losses attached, counts accumulated once per training pass, not on recompute.
  router.route(x, w, {T, 1}, {.jitter_key = 1});
  EXPECT_TRUE(router.output().losses.aux_loss);
  EXPECT_TRUE(router.output().losses.z_loss);
  double total = 0;
  for (double c : router.state().local_tokens_per_expert) total += c;
  EXPECT_EQ(total, T * 2);
  router.route(x, w, {T, 1}, {.mode = mr::pass::recompute, .jitter_key = 1});
  total = 0;
  for (double c : router.state().local_tokens_per_expert) total += c;
  EXPECT_EQ(total, T * 2);
}

TEST(RouterBehaviour, JitterIsReproducibleBoundedAndKeyed) {
  mr::settings s = with(2, mr::score_function::softmax_after_topk);
  s.input_jitter_eps = 0.1;
  int const T = 32, H = 8, E = 8;
  matrix const x = matrix::Ones(T, H);
  matrix const w = matrix::Identity(E, H);
  s.dtype = mr::logits_dtype::fp64;
  mr::topk_router<double> router(s, E);
  matrix const a = (router.route(x, w, {T, 1}, {.jitter_key = 5}), router.output().probs);
  matrix const b = (router.route(x, w, {T, 1}, {.jitter_key = 5}), router.output().probs);
  matrix const c = (router.route(x, w, {T, 1}, {.jitter_key = 6}), router.output().probs);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // z = x * W^T with x all ones and W = I: each logit is one jitter factor.
  router.route(x, w, {T, 1}, {.jitter_key = 5});
  matrix const factors = router.logits();
  EXPECT_GE(factors.minCoeff(), 0.9);
  EXPECT_LE(factors.maxCoeff(), 1.1);
  EXPECT_GT(factors.maxCoeff() - factors.minCoeff(), 0.1);  // spread over the interval
  // The gradient to x is the gating gradient times the factors.
  matrix grad_x, grad_w;
  matrix const upstream = random_matrix(T, E, 9);
  router.backward(upstream, 1.0, x, w, grad_x, grad_w);
  matrix const grad_z = router.backward(upstream, 1.0);
  EXPECT_LT(((grad_z * w).array() * factors.array() - grad_x.array()).abs().maxCoeff(), 1e-15);
  mr::topk_router<double> again(s, E);
  again.route(x, w, {T, 1}, {.jitter_key = 5});
  EXPECT_EQ(again.output().probs, a);
}

TEST(RouterBehaviour, FinishGlobalBatchUpdatesBiasAndResetsAccumulators) {
  mr::settings s = with(1, mr::score_function::sigmoid);
  s.expert_bias = true;
  s.bias_update_rate = 0.5;
  s.global_aux_loss_coeff = 1e-2;
  int const E = 4;
  mr::topk_router<float> router(s, E);
  // Token t prefers expert t % 2: experts 0 and 1 get all 8 tokens, 2 and 3 none.
  mm::row_matrix<float> z = mm::row_matrix<float>::Constant(8, E, -3.0F);
  for (int t = 0; t < 8; ++t) z(t, t % 2) = 3.0F;
  router.route(z, {8, 1});
  router.route(z, {8, 1});
  EXPECT_EQ(router.state().global_aux_steps, 2);
  EXPECT_EQ(router.state().local_tokens_per_expert, (std::vector<double>{8, 8, 0, 0}));
  router.state().finish_global_batch(mr::reduction_groups<>{});
  EXPECT_EQ(router.state().expert_bias, (std::vector<float>{-0.5F, -0.5F, 0.5F, 0.5F}));
  EXPECT_EQ(router.state().local_tokens_per_expert, (std::vector<double>(4, 0.0)));
  EXPECT_EQ(router.state().global_aux_steps, 0);
  // The bias now steers selection (scores for selection only; the probs stay unbiased).
  auto const& out = router.route(z, {8, 1});
  EXPECT_EQ(out.topk_indices(0, 0), 2);  // sigma(-3) + 0.5 now beats sigma(3) - 0.5
  EXPECT_FLOAT_EQ(out.topk_probs(0, 0), 1.0F / (1.0F + std::exp(3.0F)));
  router.state().frozen_expert_bias = true;
  router.state().finish_global_batch(mr::reduction_groups<>{});
  EXPECT_EQ(router.state().expert_bias, (std::vector<float>{-0.5F, -0.5F, 0.5F, 0.5F}));
}

TEST(RouterBehaviour, SinkhornBalancesInTrainingAndTakesPlainTopKInEval) {
  mr::settings s = with(2, mr::score_function::softmax_after_topk);
  s.sinkhorn = true;
  int const T = 16, E = 4;
  // Every token prefers experts 0 and 1 a little.
  mm::row_matrix<float> z(T, E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e)
      z(t, e) = (e < 2 ? 0.3F : 0.0F) + 0.01F * static_cast<float>((t * 7 + e * 3) % 5);
  mr::topk_router<float> router(s, E);
  auto const eval = router.route(z, {T, 1}, {.mode = mr::pass::eval});
  for (int t = 0; t < T; ++t) {
    EXPECT_TRUE(eval.routing_map(t, 0) && eval.routing_map(t, 1)) << t;
    std::vector<float> softmax(static_cast<std::size_t>(E));
    mr::kernels::softmax(&z(t, 0), E, softmax.data());
    EXPECT_FLOAT_EQ(eval.probs(t, 0), softmax[0]);  // act(z) on the map, not renormalised
  }
  auto const& train = router.route(z, {T, 1});
  // The balanced selection spreads the 32 choices: experts 2 and 3 receive tokens too.
  EXPECT_GT(train.tokens_per_expert[2] + train.tokens_per_expert[3], 8);
  EXPECT_EQ(train.tokens_per_expert[0] + train.tokens_per_expert[1] + train.tokens_per_expert[2] +
                train.tokens_per_expert[3],
            T * 2);
}

TEST(RouterBehaviour, PaddingForQuantizationMakesCountsMultiplesWithZeroProbs) {
  mr::settings s = with(2, mr::score_function::softmax_after_topk);
  s.pad_for_quantization = true;
  int const T = 40, E = 8;
  mr::topk_router<float> router(s, E, 16);
  auto const z = separated_logits(T, E, 3).cast<float>().eval();
  auto const& out = router.route(z, {T, 1});
  long routed = 0;
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(out.tokens_per_expert[static_cast<std::size_t>(e)] % 16, 0) << e;
    for (int t = 0; t < T; ++t)
      if (out.routing_map(t, e) && out.probs(t, e) > 0) ++routed;
  }
  EXPECT_EQ(routed, T * 2);  // fillers carry prob 0, routed tokens keep theirs
  EXPECT_THROW(mr::topk_router<float>(s, E), mm::config_error);  // no multiple known
}

TEST(RouterErrors, BadInputsNameTheTensorAndShape) {
  mr::topk_router<float> router(with(2, mr::score_function::softmax_after_topk), 8);
  mm::row_matrix<float> z = mm::row_matrix<float>::Zero(6, 8);
  z(2, 3) = std::nanf("");
  try {
    router.route(z, {6, 1});
    FAIL() << "non-finite logits accepted";
  } catch (mm::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("router logits [6, 8]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("token 2, expert 3"), std::string::npos) << e.what();
  }
  try {
    router.route(mm::row_matrix<float>::Zero(6, 7), {6, 1});
    FAIL() << "wrong expert count accepted";
  } catch (mm::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("[6, 7]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(router.route(mm::row_matrix<float>::Zero(6, 8), {4, 2}), mm::input_error);
  std::vector<std::uint8_t> const short_mask(3, 0);
  EXPECT_THROW(
      router.route(mm::row_matrix<float>::Zero(6, 8), {6, 1}, {.padding_mask = short_mask}),
      mm::input_error);
  mm::row_matrix<float> const x = mm::row_matrix<float>::Zero(6, 5),
                              w = mm::row_matrix<float>::Zero(8, 4);
  EXPECT_THROW(router.route(x, w, {6, 1}), mm::input_error);
  router.route(mm::row_matrix<float>::Zero(6, 8), {6, 1});
  EXPECT_THROW(router.backward(mm::row_matrix<float>::Zero(5, 8)), mm::input_error);
  // A float router refuses fp64 settings, and settings are checked with the rule ids.
  mr::settings fp64 = with(2, mr::score_function::softmax_after_topk);
  fp64.dtype = mr::logits_dtype::fp64;
  EXPECT_THROW(mr::topk_router<float>(fp64, 8), mm::input_error);
  mr::settings bias_softmax = with(2, mr::score_function::softmax_after_topk);
  bias_softmax.expert_bias = true;
  try {
    mr::topk_router<float>(bias_softmax, 8);
    FAIL();
  } catch (mm::config_error const& e) {
    EXPECT_EQ(e.rule_id(), 7);
  }
}

/// A stand-in for a two-rank group whose other rank holds `other_flag` errors and micro-batch size
/// `other_batch` (the same data otherwise).
struct two_rank_group {
  double other_flag = 0.0;
  double other_batch = 0.0;  // 0: the same as this rank
  [[nodiscard]] int size() const { return 2; }
  void sum(std::span<double> v) const {
    if (v.size() == 5) {  // the agreement vector: flag, E, E^2, B, B^2
      double const b = other_batch > 0 ? other_batch : v[3];
      v[0] += other_flag;
      v[1] *= 2;
      v[2] *= 2;
      v[3] += b;
      v[4] += b * b;
    } else {
      for (double& x : v) x *= 2;
    }
  }
};

TEST(RouterErrors, RanksOfAReductionGroupAgreeBeforeReducing) {
  mr::settings s = with(2, mr::score_function::softmax_after_topk);
  s.aux_loss_coeff = 1e-2;
  mr::topk_router<float> router(s, 8);
  auto const z = separated_logits(6, 8, 1).cast<float>().eval();
  using groups = mr::reduction_groups<two_rank_group, mr::one_rank>;
  auto message = [&](two_rank_group g, mm::row_matrix<float> const& logits) {
    try {
      router.route(logits, {3, 2}, {}, groups{g, {}});
    } catch (mm::input_error const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({}, z), "no error");
  EXPECT_NE(message({1.0, 0.0}, z).find("rejected on 1 other rank"), std::string::npos);
  EXPECT_NE(message({0.0, 3.0}, z).find("disagree on micro_batch_size"), std::string::npos);
  mm::row_matrix<float> bad = z;
  bad(0, 0) = std::numeric_limits<float>::infinity();
  EXPECT_NE(message({}, bad).find("non-finite value at token 0, expert 0"), std::string::npos);
  // A bad weight shape goes through the same agreement.
  mm::row_matrix<float> const x = mm::row_matrix<float>::Zero(6, 4),
                              w = mm::row_matrix<float>::Zero(8, 5);
  EXPECT_THROW(router.route(x, w, {3, 2}, {}, groups{}), mm::input_error);
}

// ---------------------------------------------------------------------------------------------
// Static policies against the run-time router on the shared files.

/// A shared reference file from MEGAMOE_REFERENCE_VECTORS, else from the in-repo copy.
nlohmann::json shared_file(std::string const& stem) {
  std::string const name = "/" + stem + ".json";
  char const* env = std::getenv("MEGAMOE_REFERENCE_VECTORS");
  std::ifstream in(env && *env ? std::string(env) + name : std::string());
  if (!in) in.open(std::string(MEGAMOE_DEFAULT_REFERENCE_VECTORS) + name);
  if (!in) throw std::runtime_error("cannot open reference file " + stem);
  return nlohmann::json::parse(in);
}

template <class Policy>
void static_equals_runtime(std::string const& stem) {
  auto const file = shared_file(stem);
  auto const rc = mr::from_megatron(file.at("config"));
  ASSERT_EQ(Policy::value, rc.router)
      << stem << ": the static policy does not say what the file says";
  auto static_router = mr::make_router<Policy>(rc.num_experts);
  mr::topk_router<float> runtime_router(rc.router, rc.num_experts);
  auto const& initial_bias = file.at("state_initial").at("expert_bias");
  if (!initial_bias.is_null()) {
    auto const bias = initial_bias.at("data").get<std::vector<float>>();
    static_router.state().expert_bias = bias;
    runtime_router.state().expert_bias = bias;
  }
  int const E = rc.num_experts;
  for (auto const& mb : file.at("microbatches")) {
    auto const data = mb.at("inputs").at("logits").at("data").get<std::vector<float>>();
    mm::const_row_matrix_map<float> logits(data.data(), static_cast<Eigen::Index>(data.size()) / E,
                                           E);
    mr::batch_shape const batch{*rc.seq_length, *rc.micro_batch_size};
    auto const a = static_router.route(logits, batch);
    auto const b = runtime_router.route(logits, batch);
    EXPECT_EQ(a.probs, b.probs) << stem;
    EXPECT_EQ(a.routing_map, b.routing_map) << stem;
    EXPECT_EQ(a.tokens_per_expert, b.tokens_per_expert) << stem;
    mm::row_matrix<float> const upstream = mm::row_matrix<float>::Ones(logits.rows(), E);
    EXPECT_EQ(static_router.backward(upstream), runtime_router.backward(upstream)) << stem;
  }
  static_router.state().finish_global_batch(mr::reduction_groups<>{});
  runtime_router.state().finish_global_batch(mr::reduction_groups<>{});
  EXPECT_EQ(static_router.state().expert_bias, runtime_router.state().expert_bias);
}

TEST(StaticPolicies, GiveTheRunTimeRoutersResultsOnTheSharedFiles) {
  using namespace mr;
  static_equals_runtime<top_k<2, aux_loss<1e-2>, z_loss<1e-3>>>("r01_softmax_topk2_aux_z");
  static_equals_runtime<top_k<4, softmax_before_topk, topk_scaling_factor<2.5>, aux_loss<1e-2>>>(
      "r02_softmax_presoftmax_topk4_scaled");
  static_equals_runtime<aux_loss_free<4, topk_scaling_factor<2.5>>>("r04_sigmoid_expert_bias_2mb");
  static_equals_runtime<
      aux_loss_free<4, group_limit<4, 2>, seq_aux_loss<1e-3>, topk_scaling_factor<2.5>>>(
      "r05_sigmoid_group_limited_bias_seqaux");
  static_equals_runtime<top_k<2, aux_loss<1e-2>, capacity<1.0, drop_probs>>>("r07_capacity_probs");
  static_equals_runtime<top_k<2, seq_aux_loss<1e-2>>>("r11_seq_aux_loss");
  static_equals_runtime<top_k<2, sinkhorn>>("r16_sinkhorn_topk2");
}

TEST(StaticPolicies, MakeRouterFromAConfiguration) {
  using cfg = mm::make_config<mm::shape<mm::hidden<16>, mm::ffn<32>, mm::experts<8>>,
                              mm::router::top_k<2, mm::router::dtype<double>>>;
  auto router = mr::make_router<cfg>();
  // The same router code as the run-time router's, with its plan in the type.
  static_assert(
      std::is_same_v<
          decltype(router),
          mr::topk_router<double, float,
                          mr::fixed_plan<mr::route_plan{.capacity = mr::capacity_choice::off}>>>);
  static_assert(decltype(router)::plan_in_type && !mr::topk_router<double>::plan_in_type);
  EXPECT_EQ(router.num_experts(), 8);
}

}  // namespace
