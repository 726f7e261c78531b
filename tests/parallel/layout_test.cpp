// SPDX-License-Identifier: Apache-2.0
// layout::resolve: derived DP and EDP, and the start-up rules with their ids.
#include <megamoe/parallel/layout.hpp>

#include "support/rule_of.hpp"

#include <gtest/gtest.h>

namespace mm = megamoe;

namespace {
int rule_of(int world, mm::parallel::degrees const& d) {
  return mm::testing::rule_of([&] { (void)mm::parallel::layout::resolve(world, d); });
}
}  // namespace

TEST(Layout, DerivesDataParallelSizesOfBothGrids) {
  auto const l = mm::parallel::layout::resolve(256, {4, 2, 4, 1, 64});
  EXPECT_EQ(l.dp, 8);
  EXPECT_EQ(l.edp, 1);
  EXPECT_EQ(l.decoder_grid().world_size(), 256);
  EXPECT_EQ(l.expert_grid().world_size(), 256);
  auto const folded = mm::parallel::layout::resolve(8, {1, 2, 1, 2, 2});
  EXPECT_EQ(folded.dp, 4);
  EXPECT_EQ(folded.edp, 2);
}

TEST(Layout, StartUpRulesReportTheirIds) {
  EXPECT_EQ(rule_of(8, {2, 1, 1, 1, 4}), 0);
  EXPECT_EQ(rule_of(6, {4, 1, 1, 1, 1}), 17);
  EXPECT_EQ(rule_of(8, {1, 1, 1, 2, 8}), 18);
  EXPECT_EQ(rule_of(8, {1, 0, 1, 1, 1}), 16);
  EXPECT_EQ(rule_of(8, {1, 1, 1, 1, mm::dynamic}), 27);
  EXPECT_EQ(rule_of(0, {1, 1, 1, 1, 1}), 17);
  EXPECT_EQ(rule_of(-4, {1, 1, 1, 1, 1}), 17);
}

TEST(Layout, ExpertGroupRolesCoverEveryExpertGroupType) {
  ASSERT_EQ(mm::parallel::expert_group_roles.size(), mm::parallel::expert_group_types.size());
  for (std::size_t i = 0; i < mm::parallel::expert_group_types.size(); ++i)
    EXPECT_EQ(mm::parallel::expert_group_roles[i].type, mm::parallel::expert_group_types[i]);
}
