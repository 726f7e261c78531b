// SPDX-License-Identifier: Apache-2.0
// The transformer's modules (RMSNorm, token embedding, causal attention with RoPE, multi-head
// latent attention, output layer and cross-entropy) in double precision: every input and weight
// gradient against central finite differences of L = sum(R * y) (or of the loss itself), and each
// forward against a plain loop re-statement of its formula.
#include <megamoe/config/config.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/model/attention.hpp>
#include <megamoe/model/embedding.hpp>
#include <megamoe/model/lm_head.hpp>
#include <megamoe/model/mla.hpp>
#include <megamoe/model/norm.hpp>
#include <megamoe/model/transformer.hpp>

#include "support/rule_of.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace mm = megamoe;

namespace {

using matrix = mm::row_matrix<double>;

matrix random_matrix(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed, double scale = 1.0) {
  matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = scale * mm::standard_normal(seed, static_cast<std::uint64_t>(i));
  return m;
}

mm::const_row_matrix_map<double> in(matrix const& m) {
  return {m.data(), m.rows(), m.cols()};
}
mm::row_matrix_map<double> out(matrix& m) {
  return {m.data(), m.rows(), m.cols()};
}

/// Analytic `grad` of `loss` with respect to every entry of `value` (every `stride`-th), against
/// central differences with step 1e-6: |analytic - numeric| <= 1e-6 * max(1, |numeric|).
void expect_matches_finite_differences(std::string const& what, mm::row_matrix_map<double> value,
                                       matrix const& grad, std::function<double()> const& loss,
                                       int stride = 1) {
  ASSERT_EQ(grad.rows(), value.rows()) << what;
  ASSERT_EQ(grad.cols(), value.cols()) << what;
  double const step = 1e-6;
  int checked = 0;
  for (Eigen::Index i = 0; i < value.size(); i += stride) {
    double const kept = value.data()[i];
    value.data()[i] = kept + step;
    double const up = loss();
    value.data()[i] = kept - step;
    double const down = loss();
    value.data()[i] = kept;
    double const numeric = (up - down) / (2 * step);
    EXPECT_NEAR(grad.data()[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
        << what << " entry " << i;
    ++checked;
  }
  EXPECT_GT(checked, 0) << what;
}

/// The module's parameters by name (value maps into the module; gradients copied out).
template <class Module>
std::map<std::string, mm::row_matrix_map<double>> parameters(Module& m) {
  std::map<std::string, mm::row_matrix_map<double>> out;
  m.for_each_parameter("p", [&](std::string const& name, mm::row_matrix_map<double> value,
                                mm::row_matrix_map<double>) { out.emplace(name, value); });
  return out;
}
template <class Module>
std::map<std::string, matrix> gradients(Module& m) {
  std::map<std::string, matrix> out;
  m.for_each_parameter("p", [&](std::string const& name, mm::row_matrix_map<double>,
                                mm::row_matrix_map<double> grad) { out.emplace(name, grad); });
  return out;
}

TEST(RmsNorm, ForwardIsTheFormulaAndGradientsMatchFiniteDifferences) {
  mm::thread_pool pool(2);
  int const N = 5, H = 6;
  mm::rms_norm<double> norm(H, 1e-5);
  auto params = parameters(norm);
  params.at("p.weight") = random_matrix(1, H, 3);
  matrix x = random_matrix(N, H, 1), R = random_matrix(N, H, 2), y(N, H), dx(N, H);
  norm.forward(pool, in(x), out(y));
  for (int t = 0; t < N; ++t) {
    double const rms = std::sqrt(x.row(t).squaredNorm() / H + 1e-5);
    for (int h = 0; h < H; ++h)
      EXPECT_NEAR(y(t, h), x(t, h) / rms * params.at("p.weight")(0, h), 1e-14);
  }
  auto loss = [&] {
    matrix result(N, H);
    norm.forward(pool, in(x), out(result));
    return (result.array() * R.array()).sum();
  };
  norm.zero_grad();
  norm.forward(pool, in(x), out(y));
  norm.backward(pool, in(R), out(dx));
  auto const grads = gradients(norm);
  expect_matches_finite_differences("rms_norm input", out(x), dx, loss);
  expect_matches_finite_differences("rms_norm weight", params.at("p.weight"), grads.at("p.weight"),
                                    loss);
}

// The residual add fused into the norm's pass, and the input gradient added into a running one,
// against the separate steps; the weight gradient (summed per block of 64 rows) against the sum
// over all rows, on rows that end inside a block.
TEST(RmsNorm, FusedResidualAddAndAccumulatingBackwardEqualTheSeparateSteps) {
  mm::thread_pool pool(2);
  int const N = 150, H = 6;
  mm::rms_norm<double> fused(H, 1e-5), plain(H, 1e-5);
  parameters(fused).at("p.weight") = random_matrix(1, H, 31);
  parameters(plain).at("p.weight") = parameters(fused).at("p.weight");
  matrix const x = random_matrix(N, H, 32), branch = random_matrix(N, H, 33);
  matrix const R = random_matrix(N, H, 34), running = random_matrix(N, H, 35);
  matrix residual = x, y_fused(N, H), y_plain(N, H);
  fused.add_forward(pool, out(residual), in(branch), out(y_fused));
  matrix const sum = x + branch;
  EXPECT_EQ(residual, sum);
  plain.forward(pool, in(sum), out(y_plain));
  EXPECT_EQ(y_fused, y_plain);
  matrix dx_fused = running, dx_plain(N, H);
  fused.backward(pool, in(R), out(dx_fused), true);
  plain.backward(pool, in(R), out(dx_plain));
  EXPECT_LT((dx_fused - (running + dx_plain)).cwiseAbs().maxCoeff(), 1e-14);
  Eigen::RowVectorXd expected = Eigen::RowVectorXd::Zero(H);
  for (int t = 0; t < N; ++t)
    expected += R.row(t).cwiseProduct(sum.row(t)) / std::sqrt(sum.row(t).squaredNorm() / H + 1e-5);
  EXPECT_LT((gradients(fused).at("p.weight") - matrix(expected)).cwiseAbs().maxCoeff(), 1e-12);
  matrix const wrong_rows = random_matrix(N - 1, H, 36);
  EXPECT_THROW(fused.add_forward(pool, out(residual), in(wrong_rows), out(y_fused)),
               mm::input_error);
}

// The reference's padding: the vocabulary padded to a multiple of multiple x TP, cut into TP
// equal parts; a part holds the real ids it covers (maybe none).
TEST(VocabularyShard, PartsOfThePaddedVocabulary) {
  for (int k = 0; k < 4; ++k) {
    auto const p = mm::vocabulary_shard::part_of(256, 128, 4, k);
    EXPECT_EQ(p.first, 128 * k);
    EXPECT_EQ(p.rows, k < 2 ? 128 : 0);
    EXPECT_EQ(p.part_rows, 128);
    EXPECT_EQ(p.whole, 256);
  }
  auto const last = mm::vocabulary_shard::part_of(1000, 128, 2, 1);
  EXPECT_EQ(last.first, 512);
  EXPECT_EQ(last.rows, 488);
  EXPECT_TRUE(last.holds(999) && !last.holds(511) && !last.holds(1000));
  EXPECT_EQ(mm::vocabulary_shard::part_of(7, 128, 1, 0).rows, 7);
}

// A shard of the table gives its rows for its ids and zero rows for the others, and takes the
// gradients of its ids only: two shards' outputs and gradients add up to the whole table's.
TEST(TokenEmbedding, ShardsOfTheTableAddUpToTheWhole) {
  mm::thread_pool pool(2);
  int const V = 7, H = 3;
  mm::token_embedding<double> whole(V, H), low({0, 4, V, 4}, H), high({4, 3, V, 4}, H);
  matrix const table = random_matrix(V, H, 7);
  parameters(whole).at("p.weight") = table;
  parameters(low).at("p.weight") = table.topRows(4);
  parameters(high).at("p.weight") = table.bottomRows(3);
  std::vector<std::int32_t> const ids{6, 0, 3, 4, 4};
  int const N = static_cast<int>(ids.size());
  matrix y(N, H), y_low(N, H), y_high(N, H), R = random_matrix(N, H, 8);
  whole.forward(pool, ids, out(y));
  low.forward(pool, ids, out(y_low));
  high.forward(pool, ids, out(y_high));
  EXPECT_EQ(y, y_low + y_high);
  whole.backward(pool, in(R));
  low.backward(pool, in(R));
  high.backward(pool, in(R));
  matrix both(V, H);
  both << gradients(low).at("p.weight"), gradients(high).at("p.weight");
  EXPECT_EQ(both, gradients(whole).at("p.weight"));
}

TEST(TokenEmbedding, RowsOfTheTableAndGradientsAddPerId) {
  mm::thread_pool pool(2);
  int const V = 7, H = 4;
  mm::token_embedding<double> embedding(V, H);
  auto params = parameters(embedding);
  params.at("p.weight") = random_matrix(V, H, 5);
  std::vector<std::int32_t> const ids{3, 0, 3, 6, 1, 3};
  int const N = static_cast<int>(ids.size());
  matrix y(N, H), R = random_matrix(N, H, 6);
  embedding.forward(pool, ids, out(y));
  for (int t = 0; t < N; ++t)
    EXPECT_EQ(y.row(t), matrix(params.at("p.weight")).row(ids[static_cast<std::size_t>(t)]));
  embedding.backward(pool, in(R));
  auto loss = [&] {
    matrix result(N, H);
    embedding.forward(pool, ids, out(result));
    return (result.array() * R.array()).sum();
  };
  expect_matches_finite_differences("embedding table", params.at("p.weight"),
                                    gradients(embedding).at("p.weight"), loss);
  // lookup() and add_gradient() are forward and backward for ids the caller keeps.
  std::vector<std::int32_t> const other{5, 5, 2, 0, 6, 4};
  matrix z(N, H), kept_grad = gradients(embedding).at("p.weight");
  embedding.lookup(pool, other, out(z));
  for (int t = 0; t < N; ++t)
    EXPECT_EQ(z.row(t), matrix(params.at("p.weight")).row(other[static_cast<std::size_t>(t)]));
  embedding.add_gradient(pool, other, in(R));
  matrix expected_grad = kept_grad;
  for (int t = 0; t < N; ++t) expected_grad.row(other[static_cast<std::size_t>(t)]) += R.row(t);
  EXPECT_LT((matrix(gradients(embedding).at("p.weight")) - expected_grad).cwiseAbs().maxCoeff(),
            1e-15);
  std::vector<std::int32_t> const bad{2, 7};
  matrix two(2, H);
  EXPECT_THROW(embedding.forward(pool, bad, out(two)), mm::input_error);
}

/// Attention by plain loops over (sequence, head, query, key): the formula of attention.hpp, with
/// linear_qkv's rows as the reference lays them out: per query group its query heads, its key
/// head, its value head. Given QK layernorm weights, each query and key head is divided by its
/// root mean square (epsilon 1e-5) and scaled by them before RoPE.
matrix attention_by_loops(matrix const& x, matrix const& wqkv, matrix const& wproj, int S, int B,
                          int heads, int groups, matrix const* q_norm = nullptr,
                          matrix const* k_norm = nullptr) {
  int const H = static_cast<int>(x.cols()), d = H / heads, half = d / 2, per = heads / groups;
  int const block = (per + 2) * d;
  matrix const qkv = x * wqkv.transpose();
  auto rope = [&](Eigen::RowVectorXd u, int s, matrix const* norm) {
    if (norm != nullptr) u = (u / std::sqrt(u.squaredNorm() / d + 1e-5)).cwiseProduct(norm->row(0));
    Eigen::RowVectorXd rotated(d);
    for (int i = 0; i < half; ++i) {
      double const angle = s * std::pow(10000.0, -2.0 * i / d);
      rotated(i) = u(i) * std::cos(angle) - u(i + half) * std::sin(angle);
      rotated(i + half) = u(i + half) * std::cos(angle) + u(i) * std::sin(angle);
    }
    return rotated;
  };
  matrix context = matrix::Zero(x.rows(), H);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < S; ++i) {
        int const g = h / per;
        Eigen::RowVectorXd const q =
            rope(qkv.row(i * B + b).segment(g * block + (h % per) * d, d), i, q_norm);
        std::vector<double> score(static_cast<std::size_t>(i) + 1);
        double top = -1e300, sum = 0.0;
        for (int j = 0; j <= i; ++j) {
          Eigen::RowVectorXd const k =
              rope(qkv.row(j * B + b).segment(g * block + per * d, d), j, k_norm);
          score[static_cast<std::size_t>(j)] = q.dot(k) / std::sqrt(double(d));
          top = std::max(top, score[static_cast<std::size_t>(j)]);
        }
        for (double& s : score) sum += (s = std::exp(s - top));
        for (int j = 0; j <= i; ++j)
          context.row(i * B + b).segment(h * d, d) +=
              score[static_cast<std::size_t>(j)] / sum *
              qkv.row(j * B + b).segment(g * block + (per + 1) * d, d);
      }
  return context * wproj.transpose();
}

/// Multi-head (2 heads, 2 groups) and grouped-query attention (4 heads in 2 groups).
class CausalAttention : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(CausalAttention, ForwardIsTheFormulaAndGradientsMatchFiniteDifferences) {
  mm::thread_pool pool(2);
  mm::expert::executor<double> exec(pool);
  auto const [heads, groups] = GetParam();
  int const S = 5, B = 2, H = 4 * heads, N = S * B, width = H + 2 * groups * (H / heads);
  mm::causal_attention<double> attention(H, heads, groups);
  EXPECT_EQ(attention.qkv_width(), width);
  auto params = parameters(attention);
  params.at("p.linear_qkv.weight") = random_matrix(width, H, 11, 0.4);
  params.at("p.linear_proj.weight") = random_matrix(H, H, 12, 0.4);
  matrix x = random_matrix(N, H, 13), R = random_matrix(N, H, 14), y(N, H), dx(N, H);
  attention.forward(exec, in(x), S, B, out(y));
  matrix const expected = attention_by_loops(
      x, params.at("p.linear_qkv.weight"), params.at("p.linear_proj.weight"), S, B, heads, groups);
  EXPECT_LT((y - expected).cwiseAbs().maxCoeff(), 1e-12);

  // Causal: changing the last position changes no earlier output.
  matrix later = x;
  later.row(N - 1) += Eigen::RowVectorXd::Ones(H);
  matrix y_later(N, H);
  attention.forward(exec, in(later), S, B, out(y_later));
  EXPECT_EQ(y_later.topRows(N - B), y.topRows(N - B));
  EXPECT_NE(y_later.row(N - 1), y.row(N - 1));

  auto loss = [&] {
    matrix result(N, H);
    attention.forward(exec, in(x), S, B, out(result));
    return (result.array() * R.array()).sum();
  };
  attention.zero_grad();
  attention.forward(exec, in(x), S, B, out(y));
  attention.backward(exec, in(R), out(dx));
  auto const grads = gradients(attention);
  expect_matches_finite_differences("attention input", out(x), dx, loss);
  expect_matches_finite_differences("attention linear_qkv", params.at("p.linear_qkv.weight"),
                                    grads.at("p.linear_qkv.weight"), loss, 3);
  expect_matches_finite_differences("attention linear_proj", params.at("p.linear_proj.weight"),
                                    grads.at("p.linear_proj.weight"), loss);
  EXPECT_THROW(mm::causal_attention<double>(6, 4), mm::input_error);     // odd head size
  EXPECT_THROW(mm::causal_attention<double>(8, 4, 3), mm::input_error);  // 3 groups of 4 heads
}

// QK layernorm: the query and key heads normalized (weights away from 1) before RoPE, against the
// loops; every gradient, the norms' weights included, against finite differences.
TEST_P(CausalAttention, QkLayernormNormalizesEachQueryAndKeyHeadBeforeRope) {
  mm::thread_pool pool(2);
  mm::expert::executor<double> exec(pool);
  auto const [heads, groups] = GetParam();
  int const S = 4, B = 2, H = 4 * heads, N = S * B, d = 4, width = H + 2 * groups * d;
  mm::causal_attention<double, true> attention(H, heads, groups);
  auto params = parameters(attention);
  ASSERT_EQ(params.size(), 4U);
  EXPECT_EQ(params.at("p.q_layernorm.weight"), matrix::Ones(1, d));  // norms start at 1
  params.at("p.linear_qkv.weight") = random_matrix(width, H, 41, 0.4);
  params.at("p.linear_proj.weight") = random_matrix(H, H, 42, 0.4);
  params.at("p.q_layernorm.weight") = (random_matrix(1, d, 43, 0.3).array() + 1.0).matrix();
  params.at("p.k_layernorm.weight") = (random_matrix(1, d, 44, 0.3).array() + 1.0).matrix();
  matrix x = random_matrix(N, H, 45), R = random_matrix(N, H, 46), y(N, H), dx(N, H);
  attention.forward(exec, in(x), S, B, out(y));
  matrix const wq = params.at("p.q_layernorm.weight"), wk = params.at("p.k_layernorm.weight");
  matrix const expected =
      attention_by_loops(x, params.at("p.linear_qkv.weight"), params.at("p.linear_proj.weight"), S,
                         B, heads, groups, &wq, &wk);
  EXPECT_LT((y - expected).cwiseAbs().maxCoeff(), 1e-12);
  matrix const without = attention_by_loops(x, params.at("p.linear_qkv.weight"),
                                            params.at("p.linear_proj.weight"), S, B, heads, groups);
  EXPECT_GT((y - without).cwiseAbs().maxCoeff(), 1e-3);  // the norms change the result

  auto loss = [&] {
    matrix result(N, H);
    attention.forward(exec, in(x), S, B, out(result));
    return (result.array() * R.array()).sum();
  };
  attention.zero_grad();
  attention.forward(exec, in(x), S, B, out(y));
  attention.backward(exec, in(R), out(dx));
  auto const grads = gradients(attention);
  expect_matches_finite_differences("attention input", out(x), dx, loss);
  expect_matches_finite_differences("attention linear_qkv", params.at("p.linear_qkv.weight"),
                                    grads.at("p.linear_qkv.weight"), loss, 3);
  for (auto const* name : {"p.q_layernorm.weight", "p.k_layernorm.weight"})
    expect_matches_finite_differences(name, params.at(name), grads.at(name), loss);
}

INSTANTIATE_TEST_SUITE_P(HeadsAndGroups, CausalAttention,
                         ::testing::Values(std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 1}));

TEST(LmHead, CrossEntropyIsTheFormulaAndGradientsMatchFiniteDifferences) {
  mm::thread_pool pool(2);
  mm::expert::executor<double> exec(pool);
  int const N = 6, H = 5, V = 9;
  mm::lm_head<double> head(H, V);
  auto params = parameters(head);
  params.at("p.weight") = random_matrix(V, H, 21, 0.7);
  matrix h = random_matrix(N, H, 22), dh(N, H);
  std::vector<std::int32_t> const targets{0, 8, 3, 3, 5, 1};
  double const loss = head.forward(exec, in(h), targets);
  matrix const logits = h * matrix(params.at("p.weight")).transpose();
  double expected = 0.0;
  for (int t = 0; t < N; ++t)
    expected += std::log(logits.row(t).array().exp().sum()) -
                logits(t, targets[static_cast<std::size_t>(t)]);
  EXPECT_NEAR(loss, expected / N, 1e-13);
  double const scale = 0.5;
  head.zero_grad();
  head.forward(exec, in(h), targets);
  head.backward(exec, scale, out(dh));
  auto scaled_loss = [&] { return scale * head.forward(exec, in(h), targets); };
  auto const grads = gradients(head);
  expect_matches_finite_differences("lm_head input", out(h), dh, scaled_loss);
  expect_matches_finite_differences("lm_head weight", params.at("p.weight"), grads.at("p.weight"),
                                    scaled_loss);
  std::vector<std::int32_t> const bad{0, 9, 1, 1, 1, 1};
  EXPECT_THROW(head.forward(exec, in(h), bad), mm::input_error);
  EXPECT_THROW(mm::lm_head<double>(H, V, 0), mm::input_error);
}

// Two passes over one output layer (as multi-token prediction's depths share it): each pass's
// loss is its valid targets' summed cross-entropy over the given divisor, an ignored target adds
// nothing and gets no gradient, and the backward of each pass (in any order) adds its own
// gradient: against the formula and central differences of the two passes' weighted sum.
TEST(LmHead, PassesWithIgnoredTargetsShareTheWeights) {
  mm::thread_pool pool(2);
  mm::expert::executor<double> exec(pool);
  int const N = 6, H = 5, V = 9;
  mm::lm_head<double> head(H, V, 2 * V);  // blocks of two rows
  auto params = parameters(head);
  params.at("p.weight") = random_matrix(V, H, 41, 0.7);
  matrix h1 = random_matrix(N, H, 42), h2 = random_matrix(N, H, 43), dh1(N, H), dh2(N, H);
  std::vector<std::int32_t> const t1{0, 8, 3, 3, 5, 1};
  std::vector<std::int32_t> const t2{2, mm::ignored_target, 7, 4, mm::ignored_target, 6};
  double const divisor2 = 11.0;  // the valid targets of a whole micro-batch, say
  mm::cross_entropy_pass<double> p1, p2;
  auto formula = [&](matrix const& h, std::vector<std::int32_t> const& t) {
    matrix const logits = h * matrix(params.at("p.weight")).transpose();
    double sum = 0.0;
    for (int r = 0; r < N; ++r)
      if (t[static_cast<std::size_t>(r)] >= 0)
        sum +=
            std::log(logits.row(r).array().exp().sum()) - logits(r, t[static_cast<std::size_t>(r)]);
    return sum;
  };
  EXPECT_NEAR(head.forward(exec, p1, in(h1), t1, 6.0), formula(h1, t1) / 6.0, 1e-13);
  EXPECT_NEAR(head.forward(exec, p2, in(h2), t2, divisor2), formula(h2, t2) / divisor2, 1e-13);
  EXPECT_EQ(p2.token_loss[1], 0.0);
  // The plain forward's mean is over the valid targets.
  EXPECT_NEAR(head.forward(exec, in(h2), t2), formula(h2, t2) / 4.0, 1e-13);
  head.zero_grad();
  head.backward(exec, p2, 0.3, out(dh2));
  head.backward(exec, p1, 0.5, out(dh1));
  EXPECT_EQ(dh2.row(1), Eigen::RowVectorXd::Zero(H));
  EXPECT_EQ(dh2.row(4), Eigen::RowVectorXd::Zero(H));
  auto both = [&] {
    mm::cross_entropy_pass<double> q1, q2;
    return 0.5 * head.forward(exec, q1, in(h1), t1, 6.0) +
           0.3 * head.forward(exec, q2, in(h2), t2, divisor2);
  };
  expect_matches_finite_differences("pass 1 input", out(h1), dh1, both);
  expect_matches_finite_differences("pass 2 input", out(h2), dh2, both);
  expect_matches_finite_differences("shared weight", params.at("p.weight"),
                                    gradients(head).at("p.weight"), both);
  std::vector<std::int32_t> const bad{0, -2, 1, 1, 1, 1};
  EXPECT_THROW(head.forward(exec, p1, in(h1), bad, 6.0), mm::input_error);
  EXPECT_THROW(head.forward(exec, p1, in(h1), t1, 0.0), mm::input_error);
}

// Logits formed two rows at a time (four blocks, the last one short) give the loss and gradients
// of the whole [N, V] at once.
TEST(LmHead, BlocksOfRowsGiveTheSameLossAndGradients) {
  mm::thread_pool pool(2);
  mm::expert::executor<double> exec(pool);
  int const N = 7, H = 5, V = 9;
  mm::lm_head<double> whole(H, V), blocked(H, V, 2 * V + 3);
  matrix const w = random_matrix(V, H, 31, 0.9);
  parameters(whole).at("p.weight") = w;
  parameters(blocked).at("p.weight") = w;
  matrix h = random_matrix(N, H, 32), dh_whole(N, H), dh_blocked(N, H);
  std::vector<std::int32_t> const targets{4, 0, 8, 8, 2, 6, 1};
  double const loss = whole.forward(exec, in(h), targets);
  EXPECT_NEAR(blocked.forward(exec, in(h), targets), loss, 1e-14);
  for (int t = 0; t < N; ++t)
    EXPECT_NEAR(blocked.token_losses()[static_cast<std::size_t>(t)],
                whole.token_losses()[static_cast<std::size_t>(t)], 1e-13);
  whole.backward(exec, 0.25, out(dh_whole));
  blocked.backward(exec, 0.25, out(dh_blocked));
  EXPECT_LT((dh_blocked - dh_whole).cwiseAbs().maxCoeff(), 1e-15);
  EXPECT_LT((matrix(gradients(blocked).at("p.weight")) - matrix(gradients(whole).at("p.weight")))
                .cwiseAbs()
                .maxCoeff(),
            1e-15);
}

}  // namespace

namespace {

namespace rt = mm::router;
namespace md = mm::model;
using tiny_moe =
    mm::make_config<mm::shape<mm::hidden<8>, mm::ffn<6>, mm::experts<4>>,
                    rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>, mm::dispatch::local,
                    mm::expert::mlp<mm::expert::swiglu>, mm::precision::fp64,
                    md::decoder<md::layers<2>, md::heads<2>, md::vocabulary<11>, md::dense_ffn<5>,
                                md::moe_layer_freq<2>>>;

/// Three entries of a model parameter's gradient against central differences of `objective`
/// (the whole-model checks: a few entries of each parameter, not all of them).
void expect_entries_match_finite_differences(std::string_view name,
                                             mm::row_matrix_map<double> value, matrix const& grad,
                                             std::function<double()> const& objective) {
  double const step = 1e-6;
  for (int i = 0; i < 3; ++i) {
    Eigen::Index const at = (29 * i + 5) % value.size();
    double const kept = value.data()[at];
    value.data()[at] = kept + step;
    double const up = objective();
    value.data()[at] = kept - step;
    double const down = objective();
    value.data()[at] = kept;
    double const numeric = (up - down) / (2 * step);
    EXPECT_NEAR(grad.data()[at], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
        << name << "[" << at << "]";
  }
}

// A two-layer model (MoE, then dense) in double: every parameter's gradient (a few entries of
// each) against central differences of J = scale * CE + loss_backward_scale * router losses.
TEST(Transformer, WholeModelGradientsMatchFiniteDifferences) {
  mm::transformer<tiny_moe> model;
  model.initialize(3, 0.4);
  EXPECT_TRUE(model.is_moe(0));
  EXPECT_FALSE(model.is_moe(1));
  mm::context ctx(2);
  double const ce_scale = 0.7, router_scale = 0.9;
  ctx.step.loss_backward_scale = router_scale;
  int const S = 4, B = 2;
  std::vector<std::int32_t> const tokens{1, 4, 7, 2, 9, 10, 0, 3};
  std::vector<std::int32_t> const targets{4, 2, 2, 9, 10, 5, 3, 3};
  auto objective = [&] {
    auto const out = model.forward(ctx, tokens, targets, S, B);
    return ce_scale * out.cross_entropy + router_scale * out.router_losses;
  };
  model.zero_grad();
  auto const first = model.forward(ctx, tokens, targets, S, B);
  EXPECT_GT(first.cross_entropy, 0.0);
  EXPECT_GT(first.router_losses, 0.0);
  model.backward(ctx, ce_scale);
  std::vector<std::string> names;
  model.for_each_parameter([&](std::string_view name, auto value, auto grad, mm::parameter_kind) {
    names.emplace_back(name);
    expect_entries_match_finite_differences(name, value, grad, objective);
  });
  std::vector<std::string> const expected{"embedding.word_embeddings.weight",
                                          "decoder.layers.0.input_layernorm.weight",
                                          "decoder.layers.0.self_attention.linear_qkv.weight",
                                          "decoder.layers.0.self_attention.linear_proj.weight",
                                          "decoder.layers.0.pre_mlp_layernorm.weight",
                                          "decoder.layers.0.mlp.router.weight",
                                          "decoder.layers.0.mlp.experts.linear_fc1.weight0",
                                          "decoder.layers.0.mlp.experts.linear_fc1.weight1",
                                          "decoder.layers.0.mlp.experts.linear_fc1.weight2",
                                          "decoder.layers.0.mlp.experts.linear_fc1.weight3",
                                          "decoder.layers.0.mlp.experts.linear_fc2.weight0",
                                          "decoder.layers.0.mlp.experts.linear_fc2.weight1",
                                          "decoder.layers.0.mlp.experts.linear_fc2.weight2",
                                          "decoder.layers.0.mlp.experts.linear_fc2.weight3",
                                          "decoder.layers.1.input_layernorm.weight",
                                          "decoder.layers.1.self_attention.linear_qkv.weight",
                                          "decoder.layers.1.self_attention.linear_proj.weight",
                                          "decoder.layers.1.pre_mlp_layernorm.weight",
                                          "decoder.layers.1.mlp.linear_fc1.weight",
                                          "decoder.layers.1.mlp.linear_fc2.weight",
                                          "decoder.final_layernorm.weight",
                                          "output_layer.weight"};
  EXPECT_EQ(names, expected);
}

/// tiny_moe with multi-head latent attention (q_lora_rank 5, or 0: linear_q_proj), its latents
/// normed with qk_layernorm or not.
template <int QLoraRank, bool QkLayernorm>
using tiny_mla = mm::make_config<
    mm::shape<mm::hidden<8>, mm::ffn<6>, mm::experts<4>>, rt::top_k<2, rt::aux_loss<1e-2>>,
    mm::dispatch::local, mm::expert::mlp<mm::expert::swiglu>, mm::precision::fp64,
    md::decoder<md::layers<2>, md::heads<3>, md::vocabulary<11>, md::dense_ffn<5>,
                md::moe_layer_freq<2>, md::multi_latent_attention<QLoraRank, 4, 3, 4, 5>,
                md::qk_layernorm<QkLayernorm>>>;

// The same check with MLA in every layer: its seven (or four to six) tensors per layer, every
// gradient against central differences; the norms start at 1.
TEST(Transformer, WholeModelWithLatentAttentionGradientsMatchFiniteDifferences) {
  auto check = [](auto model_tag, std::vector<std::string> const& attention_names) {
    using model_type = typename decltype(model_tag)::type;
    model_type model;
    model.initialize(5, 0.4);
    mm::context ctx(2);
    ctx.step.loss_backward_scale = 0.9;
    int const S = 4, B = 2;
    std::vector<std::int32_t> const tokens{1, 4, 7, 2, 9, 10, 0, 3};
    std::vector<std::int32_t> const targets{4, 2, 2, 9, 10, 5, 3, 3};
    auto objective = [&] {
      auto const out = model.forward(ctx, tokens, targets, S, B);
      return 0.7 * out.cross_entropy + 0.9 * out.router_losses;
    };
    model.zero_grad();
    model.forward(ctx, tokens, targets, S, B);
    model.backward(ctx, 0.7);
    std::vector<std::string> names;
    model.for_each_parameter([&](std::string_view name, auto value, auto grad, mm::parameter_kind) {
      if (name.starts_with("decoder.layers.0.self_attention.")) {
        names.emplace_back(name.substr(32));
        if (name.ends_with("layernorm.weight")) {
          EXPECT_EQ(value, matrix::Ones(1, value.cols()));
        }
      }
      expect_entries_match_finite_differences(name, value, grad, objective);
    });
    EXPECT_EQ(names, attention_names);
  };
  check(std::type_identity<mm::transformer<tiny_mla<5, true>>>{},
        {"linear_q_down_proj.weight", "linear_q_up_proj.weight", "linear_kv_down_proj.weight",
         "linear_kv_up_proj.weight", "linear_proj.weight", "q_layernorm.weight",
         "kv_layernorm.weight"});
  check(std::type_identity<mm::transformer<tiny_mla<0, true>>>{},
        {"linear_q_proj.weight", "linear_kv_down_proj.weight", "linear_kv_up_proj.weight",
         "linear_proj.weight", "kv_layernorm.weight"});
  check(std::type_identity<mm::transformer<tiny_mla<5, false>>>{},
        {"linear_q_down_proj.weight", "linear_q_up_proj.weight", "linear_kv_down_proj.weight",
         "linear_kv_up_proj.weight", "linear_proj.weight"});
}

/// tiny_moe with two multi-token prediction depths (loss scale 0.3); the last decoder layer is an
/// MoE layer, so each depth's layer is one.
using tiny_mtp =
    mm::make_config<mm::shape<mm::hidden<8>, mm::ffn<6>, mm::experts<4>>,
                    rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>, mm::dispatch::local,
                    mm::expert::mlp<mm::expert::swiglu>, mm::precision::fp64,
                    md::decoder<md::layers<2>, md::heads<2>, md::vocabulary<11>, md::dense_ffn<5>,
                                md::moe_layer_pattern<0, 1>, md::multi_token_prediction<2, 0.3>>>;
/// MLA with one MTP depth after a dense last layer.
using tiny_mla_mtp =
    mm::make_config<mm::shape<mm::hidden<8>, mm::ffn<6>, mm::experts<4>>,
                    rt::top_k<2, rt::aux_loss<1e-2>>, mm::dispatch::local,
                    mm::expert::mlp<mm::expert::swiglu>, mm::precision::fp64,
                    md::decoder<md::layers<2>, md::heads<3>, md::vocabulary<11>, md::dense_ffn<5>,
                                md::moe_layer_freq<2>, md::multi_latent_attention<5, 4, 3, 4, 5>,
                                md::multi_token_prediction<1, 0.5>>>;

// With MTP the objective is scale * (CE + mtp_loss_scaling_factor * mean of the depths' losses)
// + the router losses (the depths' MoE layers' included): every parameter's gradient, the MTP
// depths' own and their layers' too, against central differences; their names are the
// reference's; each depth's loss is its valid targets' mean (B (S - k), less those ignored in the
// batch); a depth sees the tokens k places ahead (changing the last token changes depth k's losses
// from position S - 1 - k on, the main head's only at S - 1), and its last k positions have no
// target.
TEST(Transformer, MultiTokenPredictionGradientsMatchFiniteDifferences) {
  auto check = [](auto model_tag, double lambda, std::vector<std::string> const& must_have) {
    using model_type = typename decltype(model_tag)::type;
    constexpr int D = model_type::mtp_depths;
    model_type model;
    model.initialize(7, 0.4);
    mm::context ctx(2);
    double const ce_scale = 0.7, router_scale = 0.9;
    ctx.step.loss_backward_scale = router_scale;
    int const S = 5, B = 2;
    std::vector<std::int32_t> const tokens{1, 4, 7, 2, 9, 10, 0, 3, 5, 6};
    // One target is ignored (position 1 of sequence 1): no depth counts it.
    std::vector<std::int32_t> const targets{7, 2, 9, mm::ignored_target, 0, 3, 5, 6, 8, 1};
    auto objective = [&] {
      auto const out = model.forward(ctx, tokens, targets, S, B);
      return ce_scale * (out.cross_entropy + lambda * out.mtp_loss) +
             router_scale * out.router_losses;
    };
    model.zero_grad();
    auto const first = model.forward(ctx, tokens, targets, S, B);
    EXPECT_GT(first.mtp_loss, 0.0);
    double mean = 0.0;
    for (int k = 1; k <= D; ++k) {
      double sum = 0.0, valid = 0.0;
      auto const losses = model.mtp_token_losses(k);
      auto const shifted = model.mtp_targets(k);
      for (int t = 0; t < S * B; ++t) {
        auto const at = static_cast<std::size_t>(t);
        bool const past = t / B >= S - k;
        EXPECT_EQ(shifted[at], past ? mm::ignored_target : targets[at + std::size_t(k * B)]);
        if (shifted[at] == mm::ignored_target) {
          EXPECT_EQ(losses[at], 0.0);
        } else {
          valid += 1.0;
        }
        sum += losses[at];
      }
      EXPECT_EQ(valid, B * (S - k) - (k == 1 ? 1 : 0));  // the ignored target is 1 ahead of s = 0
      mean += sum / valid / D;
    }
    EXPECT_NEAR(first.mtp_loss, mean, 1e-14);
    model.backward(ctx, ce_scale);
    std::vector<std::string> names;
    model.for_each_parameter([&](std::string_view name, auto value, auto grad, mm::parameter_kind) {
      names.emplace_back(name);
      expect_entries_match_finite_differences(name, value, grad, objective);
    });
    for (auto const& name : must_have)
      EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;

    // Which positions see the last token of sequence 0.
    model.forward(ctx, tokens, targets, S, B);
    std::vector<std::vector<double>> before{
        std::vector<double>(model.token_losses().begin(), model.token_losses().end())};
    for (int k = 1; k <= D; ++k)
      before.emplace_back(model.mtp_token_losses(k).begin(), model.mtp_token_losses(k).end());
    auto changed = tokens;
    changed[static_cast<std::size_t>((S - 1) * B)] = 8;
    model.forward(ctx, changed, targets, S, B);
    for (int k = 0; k <= D; ++k) {
      auto const now = k == 0 ? model.token_losses() : model.mtp_token_losses(k);
      for (int s = 0; s < S; ++s) {
        auto const at = static_cast<std::size_t>(s * B);
        auto const was = before[static_cast<std::size_t>(k)][at];
        if (s < S - 1 - k) {
          EXPECT_EQ(now[at], was) << "depth " << k << " s " << s;
        } else if (s + k < S) {
          EXPECT_NE(now[at], was) << "depth " << k << " s " << s;
        }
        EXPECT_EQ(now[at + 1], before[static_cast<std::size_t>(k)][at + 1]);  // sequence 1
      }
    }
    EXPECT_THROW(
        model.forward(ctx, std::span(tokens).first(2 * D), std::span(targets).first(2 * D), D, 2),
        mm::input_error);  // no position would have a target at depth D
  };
  check(std::type_identity<mm::transformer<tiny_mtp>>{}, 0.3,
        {"decoder.layers.1.mlp.router.weight", "output_layer.weight",
         "mtp.layers.0.transformer_layer.input_layernorm.weight",
         "mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight",
         "mtp.layers.0.transformer_layer.mlp.router.weight",
         "mtp.layers.1.transformer_layer.mlp.experts.linear_fc2.weight3",
         "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.0.eh_proj.weight",
         "mtp.layers.1.final_layernorm.weight"});
  check(std::type_identity<mm::transformer<tiny_mla_mtp>>{}, 0.5,
        {"mtp.layers.0.transformer_layer.self_attention.linear_kv_up_proj.weight",
         "mtp.layers.0.transformer_layer.mlp.linear_fc1.weight", "mtp.layers.0.eh_proj.weight"});
}

}  // namespace

namespace {

// What parameter_count() reports from the values alone is what a built model holds.
template <class Config>
void expect_parameter_count_is_what_the_model_holds(mm::startup_values const& given = {}) {
  mm::transformer<Config> model(given);
  std::int64_t held = 0;
  model.for_each_parameter(
      [&](std::string_view, auto value, auto, mm::parameter_kind) { held += value.size(); });
  EXPECT_EQ(held, mm::parameter_count(model.values()));
}

}  // namespace

TEST(Transformer, ParameterCountIsWhatTheModelHolds) {
  expect_parameter_count_is_what_the_model_holds<tiny_moe>();
  using shared_and_biases = mm::make_config<
      mm::shape<mm::hidden<8>, mm::ffn<6>, mm::experts<4>, mm::shared_ffn<10>>, rt::top_k<2>,
      mm::dispatch::local,
      mm::expert::mlp<mm::expert::gelu, mm::expert::with_bias, mm::expert::shared_expert_gate>,
      mm::precision::fp64,
      md::decoder<md::layers<3>, md::heads<2>, md::vocabulary<7>, md::dense_ffn<5>,
                  md::moe_layer_pattern<0, 1, 1>>>;
  expect_parameter_count_is_what_the_model_holds<shared_and_biases>();
  using grouped_query =
      mm::make_config<mm::shape<mm::hidden<16>, mm::ffn<6>, mm::experts<4>>, rt::top_k<2>,
                      mm::dispatch::local, mm::expert::mlp<mm::expert::swiglu>, mm::precision::fp64,
                      md::decoder<md::layers<2>, md::heads<4>, md::query_groups<2>,
                                  md::vocabulary<7>, md::dense_ffn<5>, md::moe_layer_freq<2>>>;
  expect_parameter_count_is_what_the_model_holds<grouped_query>();
  mm::transformer<grouped_query> model;
  model.for_each_parameter([](std::string_view name, auto value, auto, mm::parameter_kind) {
    if (name.ends_with("linear_qkv.weight")) {
      EXPECT_EQ(value.rows(), 16 + 2 * 2 * 4) << name;
    }
  });
  using qk_normed =
      mm::make_config<mm::shape<mm::hidden<16>, mm::ffn<6>, mm::experts<4>>, rt::top_k<2>,
                      mm::dispatch::local, mm::expert::mlp<mm::expert::swiglu>, mm::precision::fp64,
                      md::decoder<md::layers<2>, md::heads<4>, md::query_groups<2>,
                                  md::vocabulary<7>, md::dense_ffn<5>, md::qk_layernorm<>>>;
  expect_parameter_count_is_what_the_model_holds<qk_normed>();
  expect_parameter_count_is_what_the_model_holds<tiny_mla<5, true>>();
  expect_parameter_count_is_what_the_model_holds<tiny_mla<0, true>>();
  expect_parameter_count_is_what_the_model_holds<tiny_mla<5, false>>();
  expect_parameter_count_is_what_the_model_holds<tiny_mla<0, false>>();
  expect_parameter_count_is_what_the_model_holds<tiny_mtp>();
  expect_parameter_count_is_what_the_model_holds<tiny_mla_mtp>();
  mm::transformer<qk_normed> normed;
  normed.initialize(3);
  int norms = 0;
  normed.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    if (name.ends_with("q_layernorm.weight") || name.ends_with("k_layernorm.weight")) {
      ++norms;
      EXPECT_EQ(value, mm::row_matrix<double>::Ones(1, 4)) << name;  // initialized to 1
    }
  });
  EXPECT_EQ(norms, 4);
}

TEST(Transformer, SizesLeftToStartUpAreGivenOrNamedInTheError) {
  using open = mm::make_config<
      mm::shape<mm::hidden<8>, mm::ffn<6>, mm::experts<4>>, rt::top_k<2>, mm::dispatch::local,
      mm::expert::mlp<mm::expert::swiglu>, mm::precision::fp64,
      md::decoder<md::layers<mm::dynamic>, md::heads<2>, md::vocabulary<mm::dynamic>,
                  md::dense_ffn<5>, md::moe_layer_freq<2>>>;
  try {
    mm::transformer<open> model;
    ADD_FAILURE() << "no error";
  } catch (mm::config_error const& e) {
    EXPECT_EQ(e.rule_id(), 27);
    EXPECT_NE(std::string(e.what()).find("num_layers, vocab_size"), std::string::npos) << e.what();
  }
  mm::transformer<open> model({.layers = 3, .vocabulary = 9});
  EXPECT_EQ(model.layers(), 3);
  EXPECT_TRUE(model.is_moe(0) && !model.is_moe(1) && model.is_moe(2));
  int moe_layers = 0;
  model.for_each_moe_layer([&](auto const&, int) { ++moe_layers; });
  EXPECT_EQ(moe_layers, 2);
  EXPECT_EQ(
      megamoe::testing::rule_of([] { mm::transformer<open> m({.layers = 3, .vocabulary = 0}); }),
      39);
  // A size the type fixes may only be given again with the same value.
  EXPECT_THROW(mm::transformer<open>({.layers = 2, .heads = 3, .vocabulary = 9}), mm::input_error);
}

namespace {

/// MLA by plain loops: the formula of mla.hpp, RoPE written as the reference writes it (the
/// positional part's even and odd elements concatenated, then rotated as halves by
/// [cos, cos] and [sin, sin]); the latents' RMSNorms only with `norms` (qk_layernorm).
/// Parameters by their names under prefix "p".
matrix mla_by_loops(matrix const& x, std::map<std::string, mm::row_matrix_map<double>> const& p,
                    int S, int B, int heads, mm::mla_dims const& dims, bool norms) {
  int const dn = dims.qk_head_dim, dr = dims.qk_pos_emb_head_dim, dv = dims.v_head_dim;
  int const rkv = dims.kv_lora_rank, half = dr / 2;
  auto norm = [&](matrix const& m, std::string const& name) {
    if (!norms) return m;
    auto const& w = p.at(name);
    matrix out = m;
    for (Eigen::Index t = 0; t < m.rows(); ++t)
      out.row(t) = (m.row(t) / std::sqrt(m.row(t).squaredNorm() / double(m.cols()) + 1e-5))
                       .cwiseProduct(w.row(0));
    return out;
  };
  matrix const q = dims.q_lora_rank > 0
                       ? matrix(norm(x * p.at("p.linear_q_down_proj.weight").transpose(),
                                     "p.q_layernorm.weight") *
                                p.at("p.linear_q_up_proj.weight").transpose())
                       : matrix(x * p.at("p.linear_q_proj.weight").transpose());
  matrix const compressed = x * p.at("p.linear_kv_down_proj.weight").transpose();
  matrix const kv = norm(compressed.leftCols(rkv), "p.kv_layernorm.weight") *
                    p.at("p.linear_kv_up_proj.weight").transpose();
  auto rope = [&](Eigen::RowVectorXd const& u, int s) {
    Eigen::RowVectorXd cat(dr), rotated_half(dr), cos(dr), sin(dr);
    for (int i = 0; i < half; ++i) {
      cat(i) = u(2 * i);
      cat(half + i) = u(2 * i + 1);
      double const angle = s * std::pow(10000.0, -2.0 * i / dr);
      cos(i) = cos(half + i) = std::cos(angle);
      sin(i) = sin(half + i) = std::sin(angle);
    }
    rotated_half << -cat.tail(half), cat.head(half);
    return Eigen::RowVectorXd(cat.cwiseProduct(cos) + rotated_half.cwiseProduct(sin));
  };
  matrix context = matrix::Zero(x.rows(), heads * dv);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < S; ++i) {
        auto const qi = q.row(i * B + b).segment(h * (dn + dr), dn + dr);
        Eigen::RowVectorXd query(dn + dr);
        query << qi.head(dn), rope(qi.tail(dr), i);
        std::vector<double> score(static_cast<std::size_t>(i) + 1);
        double top = -1e300, sum = 0.0;
        for (int j = 0; j <= i; ++j) {
          Eigen::RowVectorXd key(dn + dr);
          key << kv.row(j * B + b).segment(h * (dn + dv), dn),
              rope(compressed.row(j * B + b).segment(rkv, dr), j);
          score[static_cast<std::size_t>(j)] = query.dot(key) / std::sqrt(double(dn + dr));
          top = std::max(top, score[static_cast<std::size_t>(j)]);
        }
        for (double& s : score) sum += (s = std::exp(s - top));
        for (int j = 0; j <= i; ++j)
          context.row(i * B + b).segment(h * dv, dv) +=
              score[static_cast<std::size_t>(j)] / sum *
              kv.row(j * B + b).segment(h * (dn + dv) + dn, dv);
      }
  return context * p.at("p.linear_proj.weight").transpose();
}

/// q_lora_rank 6 (queries through the low-rank path) and 0 (linear_q_proj), each with the
/// latents' norms (qk_layernorm) and without.
class MultiLatentAttention : public ::testing::TestWithParam<std::tuple<int, bool>> {};

template <bool Norms>
void check_latent_attention(int q_lora_rank) {
  mm::thread_pool pool(2);
  mm::expert::executor<double> exec(pool);
  int const S = 5, B = 2, H = 8, heads = 2, N = S * B;
  // dn odd and dv != dn, so a mixed-up layout cannot pass.
  mm::mla_dims const dims{.q_lora_rank = q_lora_rank,
                          .kv_lora_rank = 4,
                          .qk_head_dim = 3,
                          .qk_pos_emb_head_dim = 4,
                          .v_head_dim = 5};
  using module = mm::latent_attention<double, Norms>;
  module attention(H, heads, dims);
  EXPECT_EQ(attention.query_width(), heads * 7);
  EXPECT_EQ(attention.context_width(), heads * 5);
  auto params = parameters(attention);
  ASSERT_EQ(params.size(),
            (q_lora_rank > 0 ? 5U : 4U) + (Norms ? (q_lora_rank > 0 ? 2U : 1U) : 0U));
  EXPECT_EQ(params.contains("p.kv_layernorm.weight"), Norms);
  if constexpr (Norms) {
    EXPECT_EQ(params.at("p.kv_layernorm.weight"), matrix::Ones(1, 4));  // norms start at 1
  }
  std::uint64_t seed = 70;
  for (auto& [name, value] : params) {
    value = random_matrix(value.rows(), value.cols(), ++seed, 0.5);
    if (name.ends_with("layernorm.weight")) value.array() += 1.0;
  }
  EXPECT_EQ(params.at("p.linear_kv_down_proj.weight").rows(), 4 + 4);
  EXPECT_EQ(params.at("p.linear_kv_up_proj.weight").rows(), heads * (3 + 5));
  matrix x = random_matrix(N, H, 81), R = random_matrix(N, H, 82), y(N, H), dx(N, H);
  attention.forward(exec, in(x), S, B, out(y));
  EXPECT_LT((y - mla_by_loops(x, params, S, B, heads, dims, Norms)).cwiseAbs().maxCoeff(), 1e-12);

  // Causal: changing the last position changes no earlier output.
  matrix later = x;
  later.row(N - 1) += Eigen::RowVectorXd::Ones(H);
  matrix y_later(N, H);
  attention.forward(exec, in(later), S, B, out(y_later));
  EXPECT_EQ(y_later.topRows(N - B), y.topRows(N - B));
  EXPECT_NE(y_later.row(N - 1), y.row(N - 1));

  auto loss = [&] {
    matrix result(N, H);
    attention.forward(exec, in(x), S, B, out(result));
    return (result.array() * R.array()).sum();
  };
  attention.zero_grad();
  attention.forward(exec, in(x), S, B, out(y));
  attention.backward(exec, in(R), out(dx));
  auto const grads = gradients(attention);
  expect_matches_finite_differences("MLA input", out(x), dx, loss);
  for (auto& [name, value] : params)
    expect_matches_finite_differences("MLA " + name, value, grads.at(name), loss);

  EXPECT_THROW(module(H, 3, dims, 1e4, 1e-5, 2), mm::input_error);
  auto odd = dims;
  odd.qk_pos_emb_head_dim = 3;  // RoPE rotates pairs
  EXPECT_THROW(module(H, heads, odd), mm::input_error);
  EXPECT_THROW(attention.forward(exec, in(x), S + 1, B, out(y)), mm::input_error);
}

TEST_P(MultiLatentAttention, ForwardIsTheFormulaAndGradientsMatchFiniteDifferences) {
  auto const [q_lora_rank, norms] = GetParam();
  if (norms)
    check_latent_attention<true>(q_lora_rank);
  else
    check_latent_attention<false>(q_lora_rank);
}

INSTANTIATE_TEST_SUITE_P(QueryRankAndNorms, MultiLatentAttention,
                         ::testing::Combine(::testing::Values(6, 0), ::testing::Bool()));

}  // namespace
