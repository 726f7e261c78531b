// SPDX-License-Identifier: Apache-2.0
// The rank generator against the closed-form statement in tests/reference/group_formula.hpp, for
// every layout of small worlds and a sample of large ones.
#include <megamoe/parallel/layout.hpp>
#include <megamoe/parallel/rank_generator.hpp>

#include "reference/group_formula.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mm = megamoe;
namespace ref = megamoe::reference;

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

/// Checks both grids of one layout against the closed form; returns the number of groups compared.
int check_layout(int world, mm::parallel::degrees const& d) {
  auto const l = mm::parallel::layout::resolve(world, d);
  auto const dec = ref::decoder_sizes(l.tp, l.cp, l.dp, l.pp);
  auto const exp = ref::expert_sizes(l.etp, l.ep, l.edp, l.pp);
  int compared = 0;
  for (auto type : mm::parallel::decoder_group_types) {
    EXPECT_EQ(l.decoder_grid().groups(type), ref::groups_of(dec, type))
        << "decoder " << type << " world " << world << " tp " << d.tp << " cp " << d.cp << " pp "
        << d.pp;
    ++compared;
  }
  for (auto type : mm::parallel::expert_group_types) {
    EXPECT_EQ(l.expert_grid().groups(type), ref::groups_of(exp, type))
        << "expert " << type << " world " << world << " etp " << d.etp << " ep " << d.ep << " pp "
        << d.pp;
    ++compared;
  }
  return compared;
}

}  // namespace

TEST(RankGenerator, MatchesTheClosedFormForEveryLayoutUpTo24Ranks) {
  int layouts = 0;
  for (int world = 1; world <= 24; ++world)
    for (int pp : divisors(world))
      for (int tp : divisors(world / pp))
        for (int cp : divisors(world / pp / tp))
          for (int ep : divisors(world / pp))
            for (int etp : divisors(world / pp / ep)) {
              check_layout(world, {tp, cp, pp, etp, ep});
              ++layouts;
            }
  EXPECT_GT(layouts, 1000);
}

TEST(RankGenerator, MatchesTheClosedFormAt256Ranks) {
  for (auto const& d : std::vector<mm::parallel::degrees>{{4, 2, 4, 1, 64},
                                                          {8, 1, 2, 1, 128},
                                                          {1, 4, 1, 2, 32},
                                                          {2, 2, 2, 4, 8},
                                                          {1, 1, 1, 1, 256}})
    check_layout(256, d);
}

TEST(RankGenerator, ReproducesTheSpecExamples) {
  // World 8, attention TP1 CP2 DP4, experts ETP2 EP2 EDP2.
  auto const p03 = mm::parallel::layout::resolve(8, {1, 2, 1, 2, 2});
  using groups = mm::parallel::rank_groups;
  EXPECT_EQ(p03.decoder_grid().groups("cp"), (groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(p03.expert_grid().groups("tp"), (groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(p03.expert_grid().groups("ep"), (groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(p03.expert_grid().groups("dp"), (groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // World 16, TP2 CP2 DP2 PP2 and ETP1 EP8: the EP groups are the tp-dp-cp groups of each stage.
  auto const p02 = mm::parallel::layout::resolve(16, {2, 2, 2, 1, 8});
  EXPECT_EQ(p02.expert_grid().groups("ep"), p02.decoder_grid().groups("tp-dp-cp"));
  EXPECT_EQ(p02.expert_grid().groups("ep"),
            (groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  // Pipeline groups are the same in both grids.
  EXPECT_EQ(p02.expert_grid().groups("pp"), p02.decoder_grid().groups("pp"));
}

TEST(RankGenerator, TheOrderOfNamesInAGroupTypeDoesNotMatter) {
  mm::parallel::rank_generator const g(2, 2, 1, 3, 2);
  EXPECT_EQ(g.groups("dp-cp"), g.groups("cp-dp"));
  EXPECT_EQ(g.groups("tp-dp-cp"), g.groups("cp-tp-dp"));
  EXPECT_EQ(g.order(), "tp-cp-ep-dp-pp");
}

TEST(RankGenerator, OtherOrdersNumberRanksDifferently) {
  // With dp before tp, dp varies fastest: the tp groups are strided.
  mm::parallel::rank_generator const g(2, 1, 1, 4, 1, "dp-tp-cp-ep-pp");
  EXPECT_EQ(g.groups("tp"), (mm::parallel::rank_groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.groups("dp"), (mm::parallel::rank_groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // Axes missing from the order are appended when their size is 1.
  EXPECT_EQ(mm::parallel::rank_generator(2, 1, 1, 2, 1, "tp-dp").order(), "tp-dp-cp-ep-pp");
}

TEST(RankGenerator, RejectsBadInput) {
  using mm::parallel::rank_generator;
  EXPECT_THROW(rank_generator(1, 2, 2, 1, 1), mm::input_error);           // cp and ep both > 1
  EXPECT_THROW(rank_generator(0, 1, 1, 1, 1), mm::input_error);           // size 0
  EXPECT_THROW(rank_generator(1, 1, 1, 1, 1, "tp-xp"), mm::input_error);  // unknown axis
  EXPECT_THROW(rank_generator(1, 1, 1, 1, 1, "tp-tp"), mm::input_error);  // twice
  EXPECT_THROW(rank_generator(2, 1, 1, 2, 1, "dp-cp-ep-pp"), mm::input_error);  // tp > 1 missing
  EXPECT_THROW(rank_generator(1, 1, 1, 1, 1).groups("tp-zz"), mm::input_error);
}
