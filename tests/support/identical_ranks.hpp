// SPDX-License-Identifier: Apache-2.0
// A reduction group of identical ranks for the router's tests: every rank holds this rank's data,
// so a sum over the group multiplies by the rank count.
#pragma once

#include <span>

namespace megamoe::testing {

struct identical_ranks {
  int ranks = 1;
  [[nodiscard]] int size() const { return ranks; }
  void sum(std::span<double> values) const {
    for (double& v : values) v *= ranks;
  }
};

}  // namespace megamoe::testing
