// SPDX-License-Identifier: Apache-2.0
// activation_stash: what a module keeps between forward and backward, set aside per micro-batch
// and brought back in any order, by moving storage, not copying it.
#include <megamoe/core/buffer.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace mm = megamoe;

namespace {

/// A module's saved state: a matrix, a vector sized once at construction (a setting the next
/// forward relies on), a move-only buffer and a count.
struct module_state {
  mm::row_matrix<float> x;
  std::vector<int> per_expert = std::vector<int>(4, 0);
  mm::buffer<float> kept;
  int rows = 0;
  mm::activation_stash<mm::row_matrix<float>, std::vector<int>, mm::buffer<float>, int> stash;

  void forward(int micro_batch) {
    x = mm::row_matrix<float>::Constant(3, 2, static_cast<float>(micro_batch));
    for (int& c : per_expert) c = micro_batch;  // written in place: needs the size
    kept.reserve(5)[4] = static_cast<float>(10 * micro_batch);
    rows = micro_batch + 1;
  }
  void park(std::uint64_t key) { stash.park(key, x, per_expert, kept, rows); }
  void restore(std::uint64_t key) { stash.restore(key, x, per_expert, kept, rows); }
  [[nodiscard]] bool holds(int micro_batch) const {
    return x.rows() == 3 && x(2, 1) == static_cast<float>(micro_batch) &&
           per_expert == std::vector<int>(4, micro_batch) &&
           kept.data()[4] == static_cast<float>(10 * micro_batch) && rows == micro_batch + 1;
  }
};

TEST(ActivationStash, BringsBackEachMicroBatchInAnyOrder) {
  module_state m;
  for (int k = 0; k < 3; ++k) {
    m.forward(k);
    m.park(static_cast<std::uint64_t>(k));
    EXPECT_EQ(m.per_expert.size(), 4U) << "the live vector keeps its size for the next forward";
  }
  EXPECT_EQ(m.stash.parked(), 3U);
  for (int k : {1, 0, 2}) {
    m.restore(static_cast<std::uint64_t>(k));
    EXPECT_TRUE(m.holds(k)) << "micro-batch " << k;
  }
  EXPECT_EQ(m.stash.parked(), 0U);
}

TEST(ActivationStash, MovesStorageAndReusesFreeSlots) {
  module_state m;
  m.forward(0);
  float const* const first = m.x.data();
  float const* const first_kept = m.kept.data();
  m.park(0);
  m.restore(0);
  EXPECT_EQ(m.x.data(), first) << "set aside and brought back without a copy";
  EXPECT_EQ(m.kept.data(), first_kept);
  // One micro-batch in flight at a time: the same two storages take turns, nothing new.
  std::vector<float const*> seen;
  for (int k = 1; k < 6; ++k) {
    m.forward(k);
    m.park(static_cast<std::uint64_t>(k));
    m.restore(static_cast<std::uint64_t>(k));
    EXPECT_TRUE(m.holds(k));
    seen.push_back(m.x.data());
  }
  for (float const* p : seen) EXPECT_EQ(p, seen.front());
}

TEST(ActivationStash, RefusesAKeyTwiceAndAnUnknownKey) {
  module_state m;
  m.forward(0);
  m.park(5);
  m.forward(1);
  EXPECT_THROW(m.park(5), mm::input_error);
  EXPECT_THROW(m.restore(6), mm::input_error);
  m.stash.clear();
  EXPECT_EQ(m.stash.parked(), 0U);
  EXPECT_THROW(m.restore(5), mm::input_error);
}

}  // namespace
