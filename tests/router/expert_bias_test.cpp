// SPDX-License-Identifier: Apache-2.0
// The router state across micro-batches (router/expert_bias.hpp): at the end of a global batch the
// counts are summed over the TPxDPxCP group (never the TPxCP one), the bias moves by rate *
// sign(mean - count) in fp32 (no move for a count equal to the mean, none at all when frozen), and
// the counts and the global-aux accumulator start again; a router without expert bias only resets
// the accumulator.
#include <megamoe/router/expert_bias.hpp>
#include <megamoe/router/groups.hpp>

#include <gtest/gtest.h>

#include <span>
#include <utility>
#include <vector>

namespace mr = megamoe::router;

namespace {

/// A two-rank group whose other rank holds `other` (added to every sum); counts its calls.
struct two_ranks {
  std::vector<double> other;
  int* calls = nullptr;
  [[nodiscard]] int size() const { return 2; }
  void sum(std::span<double> values) const {
    if (calls) ++*calls;
    for (std::size_t i = 0; i < values.size(); ++i) values[i] += other[i];
  }
};

mr::router_state state_with(std::vector<double> counts, float rate) {
  mr::router_state s;
  s.expert_bias.assign(counts.size(), 0.0F);
  s.local_tokens_per_expert = std::move(counts);
  s.global_tokens_per_expert.assign(s.local_tokens_per_expert.size(), 3.0);
  s.global_aux_steps = 2;
  s.bias_update_rate = rate;
  return s;
}

TEST(RouterState, FinishGlobalBatchMovesTheBiasTowardsTheMeanCount) {
  // Mean 2.4: experts above it lose the rate, those below gain it.
  auto s = state_with({5, 1, 3, 3, 0}, 0.5F);
  s.finish_global_batch(mr::reduction_groups<>{});
  EXPECT_EQ(s.expert_bias, (std::vector<float>{-0.5F, 0.5F, -0.5F, -0.5F, 0.5F}));
  EXPECT_EQ(s.local_tokens_per_expert, (std::vector<double>(5, 0.0)));
  EXPECT_EQ(s.global_tokens_per_expert, (std::vector<double>(5, 0.0)));
  EXPECT_EQ(s.global_aux_steps, 0);
  // A count equal to the mean does not move its bias; the updates add up in fp32.
  s.local_tokens_per_expert = {2, 2, 2, 2, 2};
  s.finish_global_batch(mr::reduction_groups<>{});
  EXPECT_EQ(s.expert_bias, (std::vector<float>{-0.5F, 0.5F, -0.5F, -0.5F, 0.5F}));
  auto small = state_with({1, 0}, 1e-3F);
  for (int i = 0; i < 3; ++i) {
    small.local_tokens_per_expert = {1, 0};
    small.finish_global_batch(mr::reduction_groups<>{});
  }
  float const three_steps = (-1e-3F + -1e-3F) + -1e-3F;
  EXPECT_EQ(small.expert_bias, (std::vector<float>{three_steps, -three_steps}));
}

TEST(RouterState, CountsAreSummedOverTheWideGroupOnly) {
  int wide_calls = 0, narrow_calls = 0;
  // This rank saw [4, 0, 2], the other [0, 8, 2]: summed [4, 8, 4], mean 16/3.
  two_ranks const wide{{0, 8, 2}, &wide_calls};
  two_ranks const narrow{{100, 100, 100}, &narrow_calls};
  auto s = state_with({4, 0, 2}, 0.25F);
  s.finish_global_batch(mr::reduction_groups<two_ranks, two_ranks>{narrow, wide});
  EXPECT_EQ(wide_calls, 1);
  EXPECT_EQ(narrow_calls, 0);
  EXPECT_EQ(s.expert_bias, (std::vector<float>{0.25F, -0.25F, 0.25F}));
  // Alone, this rank's counts [4, 0, 2] (mean 2) would have moved expert 1 up instead.
  auto alone = state_with({4, 0, 2}, 0.25F);
  alone.finish_global_batch(mr::reduction_groups<>{});
  EXPECT_EQ(alone.expert_bias, (std::vector<float>{-0.25F, 0.25F, 0.0F}));
}

TEST(RouterState, FrozenBiasKeepsItsValueButCountsStartAgain) {
  int calls = 0;
  auto s = state_with({5, 0}, 0.5F);
  s.expert_bias = {0.125F, -0.25F};
  s.frozen_expert_bias = true;
  s.finish_global_batch(mr::reduction_groups<mr::one_rank, two_ranks>{{}, {{1, 1}, &calls}});
  EXPECT_EQ(calls, 1);  // still collective: every rank of the group calls
  EXPECT_EQ(s.expert_bias, (std::vector<float>{0.125F, -0.25F}));
  EXPECT_EQ(s.local_tokens_per_expert, (std::vector<double>{0, 0}));
  EXPECT_EQ(s.global_aux_steps, 0);
}

TEST(RouterState, WithoutExpertBiasOnlyTheGlobalAuxAccumulatorResets) {
  int calls = 0;
  mr::router_state s;
  s.global_tokens_per_expert = {1, 2, 3};
  s.global_aux_steps = 4;
  s.finish_global_batch(mr::reduction_groups<mr::one_rank, two_ranks>{{}, {{0, 0, 0}, &calls}});
  EXPECT_EQ(calls, 0);  // no collective: nothing to update
  EXPECT_TRUE(s.expert_bias.empty());
  EXPECT_EQ(s.global_tokens_per_expert, (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(s.global_aux_steps, 0);
  EXPECT_FALSE(s.frozen_expert_bias);
  EXPECT_EQ(s.bias_update_rate, 1e-3F);
}

}  // namespace
