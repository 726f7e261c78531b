// SPDX-License-Identifier: Apache-2.0
// Expert capacity and token dropping (router/capacity.hpp): C = ceil(T*k/E * factor) in double,
// dropping by probs and by position against a full sort with the tie rule written out (lower token
// first), pad-to-capacity giving every expert exactly min(C, T) rows with prob-0 fillers, nothing
// dropped when C >= T, and the router-side padding of each expert's count to a multiple.
#include <megamoe/core/tensor.hpp>
#include <megamoe/router/capacity.hpp>

#include "support/routing_inputs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace mm = megamoe;
namespace mr = megamoe::router;

namespace {

using megamoe::testing::random_map;

/// Sparse probs on `map`, from a set of four values so that equal probs are common.
mm::row_matrix<double> tied_probs(mm::mask_matrix const& map, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(1, 4);
  mm::row_matrix<double> p = mm::row_matrix<double>::Zero(map.rows(), map.cols());
  for (Eigen::Index t = 0; t < map.rows(); ++t)
    for (Eigen::Index e = 0; e < map.cols(); ++e)
      if (map(t, e)) p(t, e) = 0.125 * pick(rng);
  return p;
}

/// The tokens expert e keeps: its routed tokens by (prob descending, token ascending) for `probs`,
/// by token ascending for `position`, the first C of them.
std::vector<int> kept_tokens(mm::mask_matrix const& map, mm::row_matrix<double> const& probs, int e,
                             int capacity, mr::drop_policy policy) {
  std::vector<int> routed;
  for (int t = 0; t < map.rows(); ++t)
    if (map(t, e)) routed.push_back(t);
  if (policy == mr::drop_policy::probs)
    std::sort(routed.begin(), routed.end(), [&](int a, int b) {
      return probs(a, e) != probs(b, e) ? probs(a, e) > probs(b, e) : a < b;
    });
  if (static_cast<int>(routed.size()) > capacity) routed.resize(static_cast<std::size_t>(capacity));
  std::sort(routed.begin(), routed.end());
  return routed;
}

TEST(Capacity, ExpertCapacityIsTheCeilingOfTheShareTimesTheFactor) {
  EXPECT_EQ(mr::expert_capacity(10, 2, 4, 1.0), 5);
  EXPECT_EQ(mr::expert_capacity(10, 2, 4, 1.25), 7);  // 6.25
  EXPECT_EQ(mr::expert_capacity(7, 1, 3, 1.0), 3);    // 2.33
  EXPECT_EQ(mr::expert_capacity(8, 2, 8, 0.5), 1);
  EXPECT_EQ(mr::expert_capacity(8, 2, 8, 0.0), 0);
  EXPECT_EQ(mr::expert_capacity(4096, 8, 64, 1.5), 768);
  // In double as the reference (T*k/E first, then times the factor): 50 * 1.1 is
  // 55.00000000000001 there, so the capacity is 56, not 55.
  EXPECT_EQ(mr::expert_capacity(100, 2, 4, 1.1), 56);
}

TEST(Capacity, EachPolicyKeepsItsTokensAndZeroesTheDroppedProbs) {
  int const T = 24, E = 6, k = 2;
  for (auto policy : {mr::drop_policy::probs, mr::drop_policy::position})
    for (double factor : {0.5, 0.75, 1.0}) {
      auto map = random_map(T, E, k, 7);
      auto probs = tied_probs(map, 8);
      auto const map_before = map;
      auto const probs_before = probs;
      std::vector<int> order;
      int const C = mr::apply_capacity(probs, map, k, factor, policy, false, order);
      EXPECT_EQ(C, mr::expert_capacity(T, k, E, factor));
      for (int e = 0; e < E; ++e) {
        auto const keep = kept_tokens(map_before, probs_before, e, C, policy);
        std::vector<int> kept;
        for (int t = 0; t < T; ++t) {
          if (map(t, e)) kept.push_back(t);
          EXPECT_EQ(probs(t, e), map(t, e) ? probs_before(t, e) : 0.0) << t << ", " << e;
        }
        EXPECT_EQ(kept, keep) << "expert " << e << " factor " << factor << " policy "
                              << static_cast<int>(policy);
      }
    }
}

TEST(Capacity, PadToCapacityGivesEveryExpertExactlyCapacityRows) {
  int const T = 20, E = 5, k = 2;
  for (auto policy : {mr::drop_policy::probs, mr::drop_policy::position}) {
    auto map = random_map(T, E, k, 11);
    auto probs = tied_probs(map, 12);
    auto const map_before = map;
    auto const probs_before = probs;
    std::vector<int> order;
    int const C = mr::apply_capacity(probs, map, k, 1.0, policy, true, order);
    ASSERT_EQ(C, 8);
    for (int e = 0; e < E; ++e) {
      // The kept routed tokens, then the lowest-index tokens not routed here, with prob 0.
      auto want = kept_tokens(map_before, probs_before, e, C, policy);
      for (int t = 0; t < T && static_cast<int>(want.size()) < C; ++t)
        if (!map_before(t, e)) want.push_back(t);
      std::sort(want.begin(), want.end());
      std::vector<int> got;
      for (int t = 0; t < T; ++t)
        if (map(t, e)) {
          got.push_back(t);
          EXPECT_EQ(probs(t, e), map_before(t, e) ? probs_before(t, e) : 0.0);
        } else {
          EXPECT_EQ(probs(t, e), 0.0);
        }
      EXPECT_EQ(got, want) << "expert " << e << " policy " << static_cast<int>(policy);
    }
  }
}

TEST(Capacity, NothingIsDroppedWhenCapacityReachesTheTokens) {
  int const T = 6, E = 3, k = 2;
  auto const map_before = random_map(T, E, k, 5);
  auto const probs_before = tied_probs(map_before, 6);
  std::vector<int> order;
  // C = ceil(6 * 2 / 3 * 2) = 8 >= T.
  auto map = map_before;
  auto probs = probs_before;
  EXPECT_EQ(mr::apply_capacity(probs, map, k, 2.0, mr::drop_policy::probs, false, order), 8);
  EXPECT_EQ(map, map_before);
  EXPECT_EQ(probs, probs_before);
  // With padding every expert takes every token (the reference's all-ones capacity mask).
  EXPECT_EQ(mr::apply_capacity(probs, map, k, 2.0, mr::drop_policy::position, true, order), 8);
  EXPECT_EQ(map, mm::mask_matrix::Ones(T, E));
  EXPECT_EQ(probs, probs_before);
}

TEST(Capacity, PadRoutingMapSwitchesOnLowestIndexUnroutedTokens) {
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

TEST(Capacity, PadRoutingMapByHand) {
  // Expert 0 has 1 token (3 fillers: tokens 0, 1, 3), expert 1 has 4 (none), expert 2 none (none).
  mm::mask_matrix map = mm::mask_matrix::Zero(6, 3);
  map(2, 0) = 1;
  for (int t : {0, 1, 4, 5}) map(t, 1) = 1;
  mr::pad_routing_map(map, 4);
  mm::mask_matrix want = mm::mask_matrix::Zero(6, 3);
  for (int t : {0, 1, 2, 3}) want(t, 0) = 1;
  for (int t : {0, 1, 4, 5}) want(t, 1) = 1;
  EXPECT_EQ(map, want);
}

TEST(Capacity, PadRoutingMapRefusesAMultipleBelowOneAndFillsWhatFewTokensAllow) {
  mm::mask_matrix map = mm::mask_matrix::Zero(3, 2);
  map(1, 0) = 1;
  EXPECT_THROW(mr::pad_routing_map(map, 0), mm::input_error);
  EXPECT_THROW(mr::pad_routing_map(map, -4), mm::input_error);
  // Three tokens cannot make a multiple of 4: expert 0 gets every token, expert 1 stays empty.
  mr::pad_routing_map(map, 4);
  EXPECT_EQ(map.col(0).cast<int>().sum(), 3);
  EXPECT_EQ(map.col(1).cast<int>().sum(), 0);
}

}  // namespace
