// SPDX-License-Identifier: Apache-2.0
// Permutation: the row order, drop-and-pad, unpermute with and without probs, chunk re-ordering,
// each against a direct computation from its definition.
#include <megamoe/dispatch/permute.hpp>
#include <megamoe/router/capacity.hpp>

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace mm = megamoe;
namespace md = megamoe::dispatch;

namespace {

mm::mask_matrix random_map(int tokens, int experts, int k, std::uint32_t seed) {
  std::mt19937 rng(seed);
  mm::mask_matrix map = mm::mask_matrix::Zero(tokens, experts);
  std::vector<int> order(static_cast<std::size_t>(experts));
  for (int t = 0; t < tokens; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int i = 0; i < k; ++i) map(t, order[static_cast<std::size_t>(i)]) = 1;
  }
  return map;
}

TEST(Permute, RowsGroupedByExpertThenTokenAndUnpermuteSumsEachTokensRows) {
  int const T = 12, E = 5, H = 3;
  auto const map = random_map(T, E, 2, 1);
  md::permutation p;
  md::make_permutation(map, p);
  ASSERT_EQ(p.rows(), T * 2);
  for (int j = 1; j < p.rows(); ++j) {
    auto const prev = std::pair(p.row_expert[static_cast<std::size_t>(j - 1)],
                                p.source_token[static_cast<std::size_t>(j - 1)]);
    auto const cur = std::pair(p.row_expert[static_cast<std::size_t>(j)],
                               p.source_token[static_cast<std::size_t>(j)]);
    EXPECT_LT(prev, cur);
  }
  for (int j = 0; j < p.rows(); ++j)
    EXPECT_EQ(
        map(p.source_token[static_cast<std::size_t>(j)], p.row_expert[static_cast<std::size_t>(j)]),
        1);

  mm::row_matrix<float> x(T, H);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(i % 7) - 3.0F;
  mm::row_matrix<float> rows;
  md::permute(x, p, rows);
  mm::row_matrix<double> probs = mm::row_matrix<double>::Zero(T, E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e)
      if (map(t, e)) probs(t, e) = 0.1 * (t + 1) + 0.01 * e;
  std::vector<double> row_probs;
  md::permute_probs(probs, p, row_probs);
  mm::row_matrix<float> out;
  md::unpermute(rows, p, out, std::span<double const>(row_probs));
  for (int t = 0; t < T; ++t) {
    double weight = 0;
    for (int e = 0; e < E; ++e) weight += probs(t, e);
    for (int h = 0; h < H; ++h) EXPECT_NEAR(out(t, h), weight * x(t, h), 1e-5);
  }
  md::unpermute(rows, p, out);
  EXPECT_TRUE(out.isApprox(x * 2.0F));
}

TEST(Permute, DropAndPadGivesEachExpertExactlyCapacityRows) {
  int const T = 10, E = 4, C = 3;
  auto map = random_map(T, E, 1, 2);
  md::permutation p;
  md::make_permutation(map, p, C);
  ASSERT_EQ(p.rows(), E * C);
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(p.tokens_per_expert[static_cast<std::size_t>(e)], C);
    // Routed tokens first (ascending), then the lowest-index others.
    std::vector<int> expected;
    for (int t = 0; t < T; ++t)
      if (map(t, e)) expected.push_back(t);
    for (int t = 0; t < T; ++t)
      if (!map(t, e)) expected.push_back(t);
    expected.resize(C);
    for (int i = 0; i < C; ++i)
      EXPECT_EQ(p.source_token[static_cast<std::size_t>(e * C + i)],
                expected[static_cast<std::size_t>(i)]);
  }
}

TEST(Permute, SortChunksConcatenatesChunksInTheGivenOrder) {
  mm::row_matrix<int> in(7, 2);
  for (int r = 0; r < 7; ++r) in.row(r) << r, 10 * r;
  std::vector<std::int64_t> const sizes{2, 0, 3, 2};
  std::vector<int> const order{3, 0, 2, 1};
  mm::row_matrix<int> out;
  md::sort_chunks(in, std::span<std::int64_t const>(sizes), std::span<int const>(order), out);
  std::vector<int> const expected_rows{5, 6, 0, 1, 2, 3, 4};
  for (int r = 0; r < 7; ++r) EXPECT_EQ(out(r, 0), expected_rows[static_cast<std::size_t>(r)]);
  std::vector<int> const missing{3, 0, 2};
  EXPECT_THROW(
      md::sort_chunks(in, std::span<std::int64_t const>(sizes), std::span<int const>(missing), out),
      mm::input_error);
  std::vector<std::int64_t> const wrong{2, 2};
  EXPECT_THROW(
      md::sort_chunks(in, std::span<std::int64_t const>(wrong), std::span<int const>(order), out),
      mm::input_error);
}

TEST(Permute, PadRoutingMapSwitchesOnLowestIndexUnroutedTokens) {
  auto map = random_map(20, 6, 2, 3);
  auto const before = map;
  mm::router::pad_routing_map(map, 4);
  for (int e = 0; e < 6; ++e) {
    int count = 0, added = 0, last_added = -1, first_skipped_zero = 20;
    for (int t = 0; t < 20; ++t) {
      count += map(t, e);
      if (map(t, e) && !before(t, e)) {
        ++added;
        last_added = t;
      }
      if (!map(t, e)) first_skipped_zero = std::min(first_skipped_zero, t);
      EXPECT_GE(map(t, e), before(t, e));
    }
    EXPECT_EQ(count % 4, 0);
    EXPECT_LT(added, 4);
    if (added > 0) {
      EXPECT_LT(last_added, first_skipped_zero);
    }
  }
}

}  // namespace
