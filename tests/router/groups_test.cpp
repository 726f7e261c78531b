// SPDX-License-Identifier: Apache-2.0
// The reductions the router's statistics need (router/groups.hpp): what satisfies `count_group`
// (a size and an in-place sum over spans of double), the single-rank group that leaves every value
// as it is, and `reduction_groups` holding its two groups (one rank each by default).
#include <megamoe/router/groups.hpp>

#include <gtest/gtest.h>
#include "support/identical_ranks.hpp"

#include <span>
#include <type_traits>
#include <vector>

namespace mr = megamoe::router;

namespace {

using megamoe::testing::identical_ranks;
struct size_only {
  [[nodiscard]] int size() const { return 1; }
};
struct sums_floats {
  [[nodiscard]] int size() const { return 1; }
  void sum(std::span<float>) const {}
};

static_assert(mr::count_group<mr::one_rank>);
static_assert(mr::count_group<identical_ranks>);
static_assert(!mr::count_group<size_only>);
static_assert(!mr::count_group<sums_floats>);  // counts are doubles
static_assert(!mr::count_group<int>);
static_assert(mr::one_rank::size() == 1);
static_assert(std::is_same_v<decltype(mr::reduction_groups<>{}.tp_cp), mr::one_rank>);
static_assert(std::is_same_v<decltype(mr::reduction_groups<>{}.tp_dp_cp), mr::one_rank>);

TEST(ReductionGroups, OneRankLeavesItsValuesAndGroupsKeepTheirMembers) {
  std::vector<double> values{1.5, -2.0, 0.0, 7.25};
  auto const before = values;
  mr::one_rank::sum(values);
  EXPECT_EQ(values, before);
  EXPECT_EQ(mr::one_rank{}.size(), 1);

  mr::reduction_groups<identical_ranks, identical_ranks> const groups{{2}, {6}};
  EXPECT_EQ(groups.tp_cp.size(), 2);
  EXPECT_EQ(groups.tp_dp_cp.size(), 6);
  groups.tp_cp.sum(values);
  EXPECT_EQ(values, (std::vector<double>{3.0, -4.0, 0.0, 14.5}));
  groups.tp_dp_cp.sum(values);
  EXPECT_EQ(values, (std::vector<double>{18.0, -24.0, 0.0, 87.0}));
}

}  // namespace
