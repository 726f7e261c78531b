// SPDX-License-Identifier: Apache-2.0
// The dispatcher of one expert rank (dispatch/local.hpp) against a plain MoE computed token by
// token: the plan's rows and counts, dispatch of tokens and probs, the sequential exchange with a
// fake expert (each row times (1 + expert) times its prob) forward and backward (dx added to,
// grad_probs' routed entries set and no other), drop-and-pad, an earlier failure rethrown by the
// plan, and the bookkeeping it keeps.
#include <megamoe/core/error.hpp>
#include <megamoe/core/stage_times.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/exchange.hpp>
#include <megamoe/dispatch/local.hpp>

#include "support/routing_inputs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <numeric>
#include <random>
#include <vector>

namespace mm = megamoe;
namespace md = megamoe::dispatch;

namespace {

using megamoe::testing::random_map;

static_assert(md::token_dispatcher<md::local_dispatcher<float, float>, float, float>);
static_assert(md::token_dispatcher<md::local_dispatcher<double, float>, double, float>);
static_assert(!md::token_dispatcher<md::local_dispatcher<double, float>, float, float>);

template <class T>
std::vector<T> values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(-8, 8);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(pick(rng)) / 4;  // exact in any float type
  return v;
}

TEST(LocalDispatcher, ForwardAndBackwardEqualAPlainMoE) {
  int const T = 10, E = 4, H = 3;
  auto const map = random_map(T, E, 2, 1);
  mm::row_matrix<double> probs = mm::row_matrix<double>::Zero(T, E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e)
      if (map(t, e)) probs(t, e) = 0.125 * (1 + (t + e) % 4);
  auto const x = values<double>(static_cast<std::size_t>(T * H), 2);
  mm::thread_pool pool(3);
  md::local_dispatcher<double, double> d(H);
  d.plan(pool, map, 0);

  // Rows by expert, then token.
  std::vector<int> source, expert, row_of(static_cast<std::size_t>(T * E), -1);
  for (int e = 0; e < E; ++e)
    for (int t = 0; t < T; ++t)
      if (map(t, e)) {
        row_of[static_cast<std::size_t>(t * E + e)] = static_cast<int>(source.size());
        source.push_back(t);
        expert.push_back(e);
      }
  int const N = static_cast<int>(source.size());
  ASSERT_EQ(d.expert_rows(), N);
  ASSERT_EQ(d.tokens_per_local_expert().size(), static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e)
    EXPECT_EQ(d.tokens_per_local_expert()[static_cast<std::size_t>(e)],
              map.col(e).cast<std::int64_t>().sum());
  EXPECT_EQ(d.saved_bytes(), d.local_rows().bytes());
  EXPECT_GT(d.saved_bytes(), 0U);

  std::vector<double> rows(static_cast<std::size_t>(N * H)), row_probs(static_cast<std::size_t>(N));
  std::vector<double> expert_out(rows.size()), out(static_cast<std::size_t>(T * H), -1.0);
  int calls = 0;
  auto fake_expert = [&](int first, int last) {
    ++calls;
    EXPECT_EQ(first, 0);
    EXPECT_EQ(last, E);
    for (int j = 0; j < N; ++j)
      for (int h = 0; h < H; ++h)
        expert_out[static_cast<std::size_t>(j * H + h)] =
            (1 + expert[static_cast<std::size_t>(j)]) * row_probs[static_cast<std::size_t>(j)] *
            rows[static_cast<std::size_t>(j * H + h)];
  };
  mm::stage_times times;
  d.forward(pool, times, x.data(), rows.data(), probs, row_probs.data(), expert_out.data(),
            out.data(), fake_expert);
  EXPECT_EQ(calls, 1);
  for (int j = 0; j < N; ++j) {
    auto const t = source[static_cast<std::size_t>(j)], e = expert[static_cast<std::size_t>(j)];
    EXPECT_EQ(row_probs[static_cast<std::size_t>(j)], probs(t, e));
    for (int h = 0; h < H; ++h)
      EXPECT_EQ(rows[static_cast<std::size_t>(j * H + h)], x[static_cast<std::size_t>(t * H + h)]);
  }
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      double want = 0;
      for (int e = 0; e < E; ++e)
        if (map(t, e)) want += (1 + e) * probs(t, e) * x[static_cast<std::size_t>(t * H + h)];
      EXPECT_DOUBLE_EQ(out[static_cast<std::size_t>(t * H + h)], want) << "token " << t;
    }

  // Backward: each row takes its token's dy; the fake expert doubles it and gives row j the prob
  // gradient j + 0.5.
  auto const dy = values<double>(static_cast<std::size_t>(T * H), 3);
  std::vector<double> grad_rows(rows.size()), grad_row_probs(row_probs.size());
  std::vector<double> dx(static_cast<std::size_t>(T * H), 1.0);
  mm::row_matrix<double> grad_probs = mm::row_matrix<double>::Constant(T, E, -7.0);
  d.backward(pool, times, dy.data(), grad_rows.data(), grad_row_probs.data(), dx.data(), grad_probs,
             [&](int first, int last) {
               ++calls;
               EXPECT_EQ(first, 0);
               EXPECT_EQ(last, E);
               for (int j = 0; j < N; ++j) {
                 auto const t = source[static_cast<std::size_t>(j)];
                 for (int h = 0; h < H; ++h) {
                   EXPECT_EQ(grad_rows[static_cast<std::size_t>(j * H + h)],
                             dy[static_cast<std::size_t>(t * H + h)]);
                   grad_rows[static_cast<std::size_t>(j * H + h)] *= 2;
                 }
                 grad_row_probs[static_cast<std::size_t>(j)] = j + 0.5;
               }
             });
  EXPECT_EQ(calls, 2);
  for (int t = 0; t < T; ++t) {
    int const routed = map.row(t).cast<int>().sum();
    for (int h = 0; h < H; ++h)
      EXPECT_EQ(dx[static_cast<std::size_t>(t * H + h)],
                1.0 + 2.0 * routed * dy[static_cast<std::size_t>(t * H + h)]);
  }
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      if (!map(t, e)) {
        EXPECT_EQ(grad_probs(t, e), -7.0);
        continue;
      }
      int const row = row_of[static_cast<std::size_t>(t * E + e)];
      EXPECT_EQ(grad_probs(t, e), row + 0.5);
    }
}

TEST(LocalDispatcher, DropAndPadGivesEveryExpertCapacityRows) {
  int const T = 8, E = 3, C = 3, H = 2;
  auto const map = random_map(T, E, 1, 5);
  mm::thread_pool pool(1);
  md::local_dispatcher<float, float> d(H);
  d.plan(pool, map, C);
  EXPECT_EQ(d.expert_rows(), E * C);
  for (auto n : d.tokens_per_local_expert()) EXPECT_EQ(n, C);
  // The same rows as the permutation's drop-and-pad order: routed tokens first, then the others.
  for (int e = 0; e < E; ++e) {
    std::vector<int> want;
    for (int t = 0; t < T; ++t)
      if (map(t, e)) want.push_back(t);
    for (int t = 0; t < T; ++t)
      if (!map(t, e)) want.push_back(t);
    for (int i = 0; i < C; ++i)
      EXPECT_EQ(d.local_rows().source_token(e * C + i), want[static_cast<std::size_t>(i)]);
  }
  // Dispatch alone (the recomputation path) gathers the same rows.
  auto const x = values<float>(static_cast<std::size_t>(T * H), 6);
  std::vector<float> rows(static_cast<std::size_t>(E * C * H));
  d.dispatch(pool, x.data(), rows.data());
  for (int j = 0; j < E * C; ++j)
    for (int h = 0; h < H; ++h)
      EXPECT_EQ(rows[static_cast<std::size_t>(j * H + h)],
                x[static_cast<std::size_t>(d.local_rows().source_token(j) * H + h)]);
}

TEST(LocalDispatcher, PlanRethrowsAnEarlierFailure) {
  mm::thread_pool pool(1);
  md::local_dispatcher<float, float> d(4);
  auto const earlier = std::make_exception_ptr(mm::input_error("routing failed"));
  EXPECT_THROW(d.plan(pool, mm::mask_matrix::Ones(2, 2), 0, earlier), mm::input_error);
  EXPECT_NO_THROW(d.plan(pool, mm::mask_matrix::Ones(2, 2), 0));
  EXPECT_EQ(d.expert_rows(), 4);
}

}  // namespace
