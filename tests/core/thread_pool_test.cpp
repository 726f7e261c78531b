// SPDX-License-Identifier: Apache-2.0
#include <megamoe/core/thread_pool.hpp>

#include "support/rule_of.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace {
using megamoe::testing::rule_of;

/// Sets an environment variable for one scope.
class scoped_env {
 public:
  scoped_env(char const* name, char const* value) : name_(name) {
    if (char const* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~scoped_env() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  scoped_env(scoped_env const&) = delete;
  scoped_env& operator=(scoped_env const&) = delete;

 private:
  char const* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST(NumThreads, ParsesPositiveIntegersOnly) {
  EXPECT_EQ(megamoe::parse_num_threads("1"), 1);
  EXPECT_EQ(megamoe::parse_num_threads("12"), 12);
  for (char const* bad : {"", "0", "-2", "x", "3x", " 4", "1e3", "99999999999999999999"})
    EXPECT_EQ(rule_of([&] { megamoe::parse_num_threads(bad); }), 28) << "'" << bad << "'";
}

TEST(NumThreads, EnvironmentOverridesCoresPerRank) {
  {
    scoped_env env("MEGAMOE_NUM_THREADS", "3");
    EXPECT_EQ(megamoe::num_threads_from_environment(8), 3);
  }
  {
    scoped_env env("MEGAMOE_NUM_THREADS", nullptr);
    int const cores = megamoe::available_cores();
    EXPECT_EQ(megamoe::num_threads_from_environment(1), cores);
    EXPECT_EQ(megamoe::num_threads_from_environment(cores * 4), 1);  // at least one
    EXPECT_EQ(megamoe::num_threads_from_environment(2), std::max(1, cores / 2));
  }
  {
    scoped_env env("MEGAMOE_NUM_THREADS", "zero");
    EXPECT_EQ(rule_of([] { megamoe::num_threads_from_environment(1); }), 28);
  }
}

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
