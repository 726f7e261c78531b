// SPDX-License-Identifier: Apache-2.0
// One rank's side of a permutation (dispatch/token_rows.hpp), against direct loops over its
// definition on one and on several pool threads: gather copies each row from its token, combine
// sums a token's rows in ascending row order (the reference's unpermute order; shown with a sum
// whose float result depends on it) and sets or adds, tokens without rows get zero, the probs go
// to their rows and back for a window of experts, and the bookkeeping's size.
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/token_rows.hpp>

#include "support/routing_inputs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace mm = megamoe;
namespace md = megamoe::dispatch;

namespace {

using megamoe::testing::random_map;

TEST(TokenRows, GatherAndCombineFollowThePermutation) {
  int const T = 11, E = 4, H = 5;
  auto map = random_map(T, E, 2, 1);
  map.row(6).setZero();  // a token without rows
  std::vector<double> tokens(static_cast<std::size_t>(T * H));
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<double>(i % 13) - 6.0;
  for (int threads : {1, 3}) {
    mm::thread_pool pool(threads);
    md::token_rows rows;
    rows.assign(map, 0);
    ASSERT_EQ(rows.tokens(), T);
    ASSERT_EQ(rows.rows(), static_cast<int>(map.cast<int>().sum()));
    // Row order: by expert, then token.
    int j = 0;
    for (int e = 0; e < E; ++e)
      for (int t = 0; t < T; ++t)
        if (map(t, e)) {
          EXPECT_EQ(rows.source_token(j), t);
          EXPECT_EQ(rows.row_expert(j), e);
          ++j;
        }
    std::vector<double> gathered(static_cast<std::size_t>(rows.rows() * H), -1.0);
    rows.gather(pool, tokens.data(), H, gathered.data());
    for (int r = 0; r < rows.rows(); ++r)
      for (int h = 0; h < H; ++h)
        EXPECT_EQ(gathered[static_cast<std::size_t>(r * H + h)],
                  tokens[static_cast<std::size_t>(rows.source_token(r) * H + h)]);
    // Each row times (1 + its index), summed back per token.
    std::vector<double> expert_out(gathered.size());
    for (int r = 0; r < rows.rows(); ++r)
      for (int h = 0; h < H; ++h)
        expert_out[static_cast<std::size_t>(r * H + h)] =
            (1 + r) * gathered[static_cast<std::size_t>(r * H + h)];
    std::vector<double> out(tokens.size(), 99.0);
    rows.combine(pool, expert_out.data(), H, out.data(), false);
    std::vector<double> added(tokens.size(), 1.0);
    rows.combine(pool, expert_out.data(), H, added.data(), true);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        double want = 0;
        for (int r = 0; r < rows.rows(); ++r)
          if (rows.source_token(r) == t)
            want += (1 + r) * tokens[static_cast<std::size_t>(t * H + h)];
        EXPECT_EQ(out[static_cast<std::size_t>(t * H + h)], want) << "token " << t;
        EXPECT_EQ(added[static_cast<std::size_t>(t * H + h)], 1.0 + want) << "token " << t;
      }
    for (int h = 0; h < H; ++h) EXPECT_EQ(out[static_cast<std::size_t>(6 * H + h)], 0.0);
  }
}

TEST(TokenRows, CombineAddsEachTokensRowsInRowOrder) {
  // One token routed to three experts: rows 0, 1, 2. In float, 1e8 - 1e8 + 1 is 1 in that order;
  // any order starting from the 1 loses it (1 + 1e8 rounds to 1e8).
  mm::mask_matrix const map = mm::mask_matrix::Ones(1, 3);
  md::token_rows rows;
  rows.assign(map, 0);
  mm::thread_pool pool(2);
  std::vector<float> const expert_out{1e8F, -1e8F, 1.0F};
  float out = 0.0F;
  rows.combine(pool, expert_out.data(), 1, &out, false);
  EXPECT_EQ(out, 1.0F);
  std::vector<float> const reversed{1.0F, -1e8F, 1e8F};
  rows.combine(pool, reversed.data(), 1, &out, false);
  EXPECT_EQ(out, 0.0F);
}

TEST(TokenRows, ProbsOfAWindowOfExpertsGoToTheirRowsAndBack) {
  int const T = 9, E = 6, first = 2, count = 3;
  auto const map = random_map(T, E, 3, 4);
  mm::row_matrix<double> probs(T, E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) probs(t, e) = map(t, e) ? 0.1 * t + 0.01 * e : 0.0;
  md::token_rows rows;
  rows.assign(map, 0, first, count);
  int routed = 0;
  for (int t = 0; t < T; ++t)
    for (int e = first; e < first + count; ++e) routed += map(t, e);
  ASSERT_EQ(rows.rows(), routed);
  std::vector<float> row_probs(static_cast<std::size_t>(rows.rows()));
  rows.gather_probs(probs, first, row_probs.data());
  for (int r = 0; r < rows.rows(); ++r) {
    EXPECT_LT(rows.row_expert(r), count);  // numbered from 0 inside the window
    EXPECT_EQ(row_probs[static_cast<std::size_t>(r)],
              static_cast<float>(probs(rows.source_token(r), first + rows.row_expert(r))));
  }
  // Back: only the window's routed entries are written.
  mm::row_matrix<double> grad = mm::row_matrix<double>::Constant(T, E, -7.0);
  std::vector<float> grad_rows(row_probs.size());
  for (std::size_t r = 0; r < grad_rows.size(); ++r) grad_rows[r] = 0.5F + static_cast<float>(r);
  rows.scatter_probs(grad_rows.data(), first, grad);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      bool const written = map(t, e) && e >= first && e < first + count;
      if (!written) {
        EXPECT_EQ(grad(t, e), -7.0);
      } else {
        int row = -1;
        for (int r = 0; r < rows.rows(); ++r)
          if (rows.source_token(r) == t && first + rows.row_expert(r) == e) row = r;
        EXPECT_EQ(grad(t, e), 0.5 + row);
      }
    }
}

TEST(TokenRows, DropAndPadAndBookkeeping) {
  int const T = 7, E = 3, C = 4;
  auto const map = random_map(T, E, 1, 9);
  md::token_rows rows;
  rows.assign(map, C);
  EXPECT_EQ(rows.rows(), E * C);
  for (auto n : rows.permutation().tokens_per_expert) EXPECT_EQ(n, C);
  EXPECT_TRUE(rows.permutation().drop_and_pad);
  // Source token and expert per row, the token index (T + 1 starts) and the row order.
  EXPECT_EQ(rows.bytes(), static_cast<std::size_t>(3 * E * C + T + 1) * sizeof(int));
  // Reassigning reuses the object for another map.
  rows.assign(mm::mask_matrix::Zero(T, E), 0);
  EXPECT_EQ(rows.rows(), 0);
  EXPECT_EQ(rows.tokens(), T);
  mm::thread_pool pool(2);
  std::vector<float> out(static_cast<std::size_t>(T * 2), 5.0F);
  rows.combine(pool, static_cast<float const*>(nullptr), 2, out.data(), false);
  EXPECT_EQ(out, std::vector<float>(out.size(), 0.0F));
}

}  // namespace
