// SPDX-License-Identifier: Apache-2.0
// Counts comparisons and mismatches for MPI tests that check many numbers on every rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>

namespace megamoe::testing {

/// |mine - expected| / scale <= rtol, counted; the first ten mismatches are printed.
struct tally {
  int failures = 0, checks = 0;
  double worst = 0.0;
  char const* against = "one rank";
  void close(std::string const& what, double mine, double expected, double scale, double rtol) {
    ++checks;
    double const err = std::abs(mine - expected) / std::max(scale, 1e-30);
    worst = std::max(worst, err);
    if (!(err <= rtol)) {
      if (++failures <= 10)
        std::cerr << what << ": " << mine << " vs " << against << " " << expected << "\n";
    }
  }
};

}  // namespace megamoe::testing
