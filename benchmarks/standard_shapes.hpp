// SPDX-License-Identifier: Apache-2.0
// The standard benchmark shapes of ../shared/docs/BENCHMARKS.md (tokens per layer call, hidden,
// expert FFN width, experts, top-k) and the median the benchmarks report.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace megamoe::bench {

struct bench_shape {
  int tokens, hidden, ffn, experts, top_k;
};

inline std::map<std::string, bench_shape> const shapes{{"A", {4096, 1024, 2816, 8, 2}},
                                                       {"B", {4096, 1024, 704, 32, 8}},
                                                       {"C", {1024, 256, 512, 16, 4}}};

/// The median (the mean of the middle two for an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t const n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace megamoe::bench
