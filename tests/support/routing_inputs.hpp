// SPDX-License-Identifier: Apache-2.0
// Test helper: routing inputs with known structure — random top-k maps, and logits whose entries in
// a row are far enough apart that no small perturbation changes a choice.
#pragma once

#include <megamoe/core/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace megamoe::testing {

/// A [tokens, experts] map with exactly k experts per token, drawn from `seed`.
inline mask_matrix random_map(int tokens, int experts, int k, std::uint32_t seed) {
  std::mt19937 rng(seed);
  mask_matrix map = mask_matrix::Zero(tokens, experts);
  std::vector<int> order(static_cast<std::size_t>(experts));
  for (int t = 0; t < tokens; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int i = 0; i < k; ++i) map(t, order[static_cast<std::size_t>(i)]) = 1;
  }
  return map;
}

/// Logits [tokens, experts] in double: each row a permutation of `spread` steps plus noise of at
/// most 0.05, so entries of a row are at least spread - 0.1 apart (a central difference of a few
/// 1e-6 moves no top-k, no group choice, no capacity decision).
inline row_matrix<double> separated_logits(int tokens, int experts, std::uint32_t seed,
                                           double spread = 0.35) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> noise(-0.05, 0.05);
  row_matrix<double> z(tokens, experts);
  std::vector<int> order(static_cast<std::size_t>(experts));
  for (int t = 0; t < tokens; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int e = 0; e < experts; ++e)
      z(t, e) = spread * (order[static_cast<std::size_t>(e)] - experts / 2.0) + noise(rng);
  }
  return z;
}

}  // namespace megamoe::testing
