// SPDX-License-Identifier: Apache-2.0
// megamoe/data/blended_dataset.ipp — the definitions behind blended_dataset.hpp (compiled once
// under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/data/blended_dataset.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace megamoe::data {

MEGAMOE_DECL blend_sample_counts blend_counts(std::span<double const> weights,
                                              std::int64_t size, double surplus) {
  blend_sample_counts out;
  double const grown = 1 + surplus;
  for (double const w : weights) {
    double const share = std::ceil(static_cast<double>(size) * w);
    out.target.push_back(static_cast<std::int64_t>(std::ceil(share * 1.0)));
    out.buffer.push_back(static_cast<std::int64_t>(std::ceil(share * grown)));
  }
  return out;
}

MEGAMOE_DECL blending_indices build_blending_indices(std::span<double const> weights,
                                                     std::int64_t size) {
  if (weights.empty() || weights.size() > static_cast<std::size_t>(INT16_MAX))
    throw std::invalid_argument("megamoe: a blend of 1 to 32767 datasets");
  blending_indices out;
  out.dataset_index.resize(static_cast<std::size_t>(size));
  out.dataset_sample_index.resize(static_cast<std::size_t>(size));
  std::vector<std::int64_t> drawn(weights.size(), 0);
  for (std::int64_t s = 0; s < size; ++s) {
    double const x = std::max(static_cast<double>(s), 1.0);
    std::size_t best = 0;
    double best_error = weights[0] * x - static_cast<double>(drawn[0]);
    for (std::size_t k = 1; k < weights.size(); ++k) {
      double const error = weights[k] * x - static_cast<double>(drawn[k]);
      if (error > best_error) {
        best = k;
        best_error = error;
      }
    }
    out.dataset_index[static_cast<std::size_t>(s)] = static_cast<std::int16_t>(best);
    out.dataset_sample_index[static_cast<std::size_t>(s)] = drawn[best]++;
  }
  return out;
}

MEGAMOE_DECL blending_indices build_exhaustive_blending_indices(
    std::span<std::int64_t const> sizes) {
  if (sizes.empty() || sizes.size() > static_cast<std::size_t>(INT16_MAX))
    throw std::invalid_argument("megamoe: a blend of 1 to 32767 datasets");
  std::int64_t const total = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  std::vector<double> w(sizes.size());
  for (std::size_t k = 0; k < sizes.size(); ++k)
    w[k] = static_cast<double>(sizes[k]) / static_cast<double>(total);
  blending_indices out;
  out.dataset_index.reserve(static_cast<std::size_t>(total));
  out.dataset_sample_index.reserve(static_cast<std::size_t>(total));
  std::vector<std::int64_t> drawn(sizes.size(), 0);
  for (std::int64_t s = 0; s < total; ++s) {
    double const x = std::max(static_cast<double>(s), 1.0);
    std::size_t best = 0;
    double best_error = std::numeric_limits<double>::lowest();
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      if (drawn[k] == sizes[k]) continue;  // this dataset is used up
      double const error = w[k] * x - static_cast<double>(drawn[k]);
      if (error > best_error) {
        best = k;
        best_error = error;
      }
    }
    out.dataset_index.push_back(static_cast<std::int16_t>(best));
    out.dataset_sample_index.push_back(drawn[best]++);
  }
  return out;
}

}  // namespace megamoe::data
