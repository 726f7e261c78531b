// SPDX-License-Identifier: Apache-2.0
#include <megamoe/parallel/threads.hpp>

#include "support/rule_of.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

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
