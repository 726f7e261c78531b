// SPDX-License-Identifier: Apache-2.0
// Permutation (dispatch/permute.hpp): the row order, drop-and-pad, a window of experts,
// unpermute with and without probs (summed in the wider type), chunk re-ordering and the shape
// errors, each against a direct computation from its definition.
#include <megamoe/core/error.hpp>
#include <megamoe/dispatch/permute.hpp>

#include "support/routing_inputs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace mm = megamoe;
namespace md = megamoe::dispatch;

namespace {

using megamoe::testing::random_map;

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

TEST(Permute, AWindowOfExpertsIsNumberedFromZero) {
  int const T = 8, E = 5;
  auto const map = random_map(T, E, 2, 4);
  md::permutation p;
  md::make_permutation(map, p, 0, 1, 3);
  ASSERT_EQ(p.tokens_per_expert.size(), 3U);
  int j = 0;
  for (int e = 1; e < 4; ++e) {
    EXPECT_EQ(p.tokens_per_expert[static_cast<std::size_t>(e - 1)], map.col(e).cast<int>().sum());
    for (int t = 0; t < T; ++t)
      if (map(t, e)) {
        EXPECT_EQ(p.source_token[static_cast<std::size_t>(j)], t);
        EXPECT_EQ(p.row_expert[static_cast<std::size_t>(j)], e - 1);
        ++j;
      }
  }
  EXPECT_EQ(p.rows(), j);
  EXPECT_EQ(p.num_tokens, T);
  EXPECT_FALSE(p.drop_and_pad);
  md::make_permutation(map, p, 0, 3);  // to the last expert
  EXPECT_EQ(p.tokens_per_expert.size(), 2U);
  EXPECT_THROW(md::make_permutation(map, p, 0, 3, 3), mm::input_error);
  EXPECT_THROW(md::make_permutation(map, p, 0, -1, 2), mm::input_error);
}

TEST(Permute, RowCountsMustMatchThePermutation) {
  auto const map = random_map(6, 3, 1, 5);
  md::permutation p;
  md::make_permutation(map, p);
  mm::row_matrix<float> rows, out;
  EXPECT_THROW(md::permute(mm::row_matrix<float>::Zero(5, 2), p, rows), mm::input_error);
  EXPECT_THROW(md::unpermute(mm::row_matrix<float>::Zero(7, 2), p, out), mm::input_error);
  EXPECT_NO_THROW(md::unpermute(mm::row_matrix<float>::Zero(6, 2), p, out));
}

TEST(Permute, UnpermuteSumsInTheWiderOfRowsAndProbs) {
  // One token, three rows: 1, 2^-24, 2^-24. In float each 2^-24 is lost against 1 (ties to even);
  // with fp64 probs the sum is taken in double and rounded once, keeping 1 + 2^-23.
  mm::mask_matrix const map = mm::mask_matrix::Ones(1, 3);
  md::permutation p;
  md::make_permutation(map, p);
  mm::row_matrix<float> rows(3, 1);
  rows << 1.0F, 0x1p-24F, 0x1p-24F;
  std::vector<double> const probs{1.0, 1.0, 1.0};
  mm::row_matrix<float> out;
  md::unpermute(rows, p, out, std::span<double const>(probs));
  EXPECT_EQ(out(0, 0), 1.0F + 0x1p-23F);
  md::unpermute(rows, p, out);
  EXPECT_EQ(out(0, 0), 1.0F);
  std::vector<float> const float_probs{1.0F, 1.0F, 1.0F};
  md::unpermute(rows, p, out, std::span<float const>(float_probs));
  EXPECT_EQ(out(0, 0), 1.0F);
}

}  // namespace
