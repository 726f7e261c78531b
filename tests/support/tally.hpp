// SPDX-License-Identifier: Apache-2.0
// Counts comparisons and mismatches for MPI tests that check many numbers on every rank.
#pragma once

#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
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

  /// Collective over `world`: rank 0 prints `headline`, the checks and the verdict (`success`
  /// when no rank had a mismatch). Returns the exit status.
  [[nodiscard]] int finish(boost::mpi::communicator const& world, std::string const& headline,
                           char const* success) const {
    int const all_failures = boost::mpi::all_reduce(world, failures, std::plus<int>());
    double const all_worst = boost::mpi::all_reduce(world, worst, boost::mpi::maximum<double>());
    if (world.rank() == 0)
      std::cout << headline << ": " << checks << " checks on rank 0, worst rel. error " << all_worst
                << ", "
                << (all_failures == 0 ? success : std::to_string(all_failures) + " mismatches")
                << "\n";
    return all_failures == 0 ? 0 : 1;
  }
};

}  // namespace megamoe::testing
