// SPDX-License-Identifier: Apache-2.0
// The straggler report's rule (train/stragglers.hpp), the fault hook's text (train/faults.hpp)
// and the plot's history of expert loads, kept bounded over a long job (train/report.hpp).
#include <megamoe/train/faults.hpp>
#include <megamoe/train/report.hpp>
#include <megamoe/train/stragglers.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace {

namespace mt = megamoe::train;

TEST(Stragglers, NamedOverTheMedianByTheThreshold) {
  // Odd count: the median is the middle rank's (1.0).
  auto const odd = mt::find_stragglers({1.0, 1.3, 0.9, 1.1, 1.0}, 0.15);
  EXPECT_DOUBLE_EQ(odd.median_seconds, 1.0);
  ASSERT_EQ(odd.slow.size(), 1u);
  EXPECT_EQ(odd.slow[0].rank, 1);
  EXPECT_DOUBLE_EQ(odd.slow[0].relative, 1.3);
  // Even count: the mean of the middle two (2.0); slowest first; exactly at the threshold is not
  // over it.
  auto const even = mt::find_stragglers({2.3, 1.0, 3.0, 1.7, 2.6, 3.2}, 0.15);
  EXPECT_DOUBLE_EQ(even.median_seconds, 2.45);
  ASSERT_EQ(even.slow.size(), 2u);
  EXPECT_EQ(even.slow[0].rank, 5);
  EXPECT_EQ(even.slow[1].rank, 2);
  EXPECT_TRUE(mt::find_stragglers({1.0, 1.15, 1.0}, 0.15).slow.empty());
  EXPECT_EQ(mt::find_stragglers({1.0, 1.5, 1.0}, 0.6).slow.size(), 0u);
  EXPECT_TRUE(mt::find_stragglers({}, 0.15).slow.empty());
  EXPECT_TRUE(mt::find_stragglers({0.0, 0.0}, 0.15).slow.empty());
  EXPECT_EQ(mt::find_stragglers({1.0, 1.3, 0.9}, 0.15).compute,
            (std::vector<double>{1.0, 1.3, 0.9}));  // in rank order
}

TEST(Stragglers, PlantedFaults) {
  EXPECT_DOUBLE_EQ(mt::parse_planted_faults("slow:2:40", 2).slow_milliseconds, 40.0);
  EXPECT_DOUBLE_EQ(mt::parse_planted_faults("slow:2:40", 1).slow_milliseconds, 0.0);
  EXPECT_DOUBLE_EQ(mt::parse_planted_faults("slow:1:5,slow:1:2.5", 1).slow_milliseconds, 7.5);
  EXPECT_DOUBLE_EQ(mt::parse_planted_faults("", 0).slow_milliseconds, 0.0);
  auto const both = mt::parse_planted_faults("bitflip:1:15,nan:0:7,slow:1:2", 1);
  EXPECT_EQ(both.bit_flip_step, 15);
  EXPECT_EQ(both.nan_step, 0);
  EXPECT_DOUBLE_EQ(both.slow_milliseconds, 2.0);
  EXPECT_EQ(mt::parse_planted_faults("bitflip:1:15,nan:0:7", 0).nan_step, 7);
  EXPECT_EQ(mt::parse_planted_faults("bitflip:1:15,nan:0:7", 0).bit_flip_step, 0);
  for (char const* bad : {"slow", "slow:1", "slow:x:3", "slow:1:-3", "fast:1:3", "slow:1:3:4",
                          "slow:-1:3", ",", "bitflip:1:0", "nan:1:2.5", "bitflip:1", "nan:-1:3"})
    EXPECT_THROW(mt::parse_planted_faults(bad, 0), megamoe::input_error) << bad;
}

// 100000 steps keep fewer than 600 rows per layer, evenly spread: row i is step 1 + i * stride.
TEST(TrainingHistory, TheLoadHistoryStaysBounded) {
  mt::training_history h;
  h.load.resize(2);
  std::size_t most = 0;
  for (int step = 1; step <= 100000; ++step) {
    if (!h.keeps_load(step)) continue;
    for (auto& rows : h.load) rows.push_back({static_cast<double>(step)});
    h.thin_load();
    most = std::max(most, h.load[0].size());
  }
  EXPECT_LT(most, 600u);
  EXPECT_GE(h.load[0].size(), 300u);
  EXPECT_EQ(h.load_stride, 256);
  for (auto const& rows : h.load)
    for (std::size_t i = 0; i < rows.size(); ++i)
      EXPECT_EQ(rows[i][0], 1.0 + static_cast<double>(i) * h.load_stride);
}

}  // namespace
