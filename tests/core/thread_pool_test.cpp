// SPDX-License-Identifier: Apache-2.0
#include <megamoe/core/thread_pool.hpp>

#include <gtest/gtest.h>

#include <unsupported/Eigen/CXX11/Tensor>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  megamoe::thread_pool pool(3);
  EXPECT_EQ(pool.size(), 3);
  std::vector<std::atomic<int>> hits(1000);
  pool.run(1000, [&](int i) { hits[static_cast<std::size_t>(i)].fetch_add(1); });
  for (auto const& h : hits) EXPECT_EQ(h.load(), 1);
  pool.run(0, [](int) { FAIL() << "no task expected"; });
}

TEST(ThreadPool, TensorContractionOnThePoolMatchesPlainLoops) {
  megamoe::thread_pool pool(2);
  Eigen::Tensor<double, 2, Eigen::RowMajor> a(37, 53), b(53, 29), c(37, 29);
  a.setRandom();
  b.setRandom();
  Eigen::array<Eigen::IndexPair<int>, 1> const dims{Eigen::IndexPair<int>(1, 0)};
  c.device(pool.device()) = a.contract(b, dims);
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 29; ++j) {
      double sum = 0;
      for (int k = 0; k < 53; ++k) sum += a(i, k) * b(k, j);
      EXPECT_NEAR(c(i, j), sum, 1e-12);
    }
}

// The thread waiting in `run` calls the installed hook every wait interval while the tasks run,
// and stops as soon as the hook reports nothing pending.
TEST(ThreadPool, TheWaitingThreadCallsItsHookUntilNothingIsPending) {
  megamoe::thread_pool pool(1);
  pool.set_wait_interval(std::chrono::microseconds(500));
  struct counter {
    int calls = 0, pending_for = 0;
    std::thread::id caller;
  } c{0, 1000000, {}};
  auto const poll = [](void* state) {
    auto* k = static_cast<counter*>(state);
    k->caller = std::this_thread::get_id();
    return ++k->calls < k->pending_for;
  };
  pool.set_wait_hook({poll, &c});
  pool.run(1, [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(60)); });
  EXPECT_GE(c.calls, 5);
  EXPECT_LT(c.calls, 200);
  EXPECT_EQ(c.caller, std::this_thread::get_id());
  c = {0, 3, {}};  // nothing pending after the third call: no more wake-ups
  pool.run(1, [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(40)); });
  EXPECT_EQ(c.calls, 3);
  pool.set_wait_hook({});
  c = {0, 1000000, {}};
  pool.run(1, [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(10)); });
  EXPECT_EQ(c.calls, 0);
}
