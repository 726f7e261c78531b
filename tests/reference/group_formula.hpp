// SPDX-License-Identifier: Apache-2.0
// A plain, independent statement of which ranks form a process group, for tests.
//
// With axis sizes (tp, cp, ep, dp, pp) and the leftmost axis varying fastest, rank r has
// coordinates c_i = (r / prod_{j<i} s_j) mod s_i. The group of type "a-b" holding r is every rank
// whose coordinates equal r's on the other axes, in ascending order; groups are listed by their
// smallest rank. (Both orders follow from reading ranks as mixed-radix numbers whose rightmost axis
// is most significant.) This is deliberately written from the formula, not from megamoe's
// generator.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe::reference {

/// Axis sizes in the order tp, cp, ep, dp, pp.
using axis_sizes = std::array<int, 5>;

inline int axis_index(std::string_view name) {
  constexpr std::array<std::string_view, 5> names{"tp", "cp", "ep", "dp", "pp"};
  for (int i = 0; i < 5; ++i)
    if (names[static_cast<std::size_t>(i)] == name) return i;
  return -1;
}

/// Which axes a group type such as "tp-dp-cp" spans.
inline std::array<bool, 5> axes_of(std::string_view type) {
  std::array<bool, 5> in{};
  std::size_t start = 0;
  while (start <= type.size()) {
    std::size_t end = type.find('-', start);
    if (end == std::string_view::npos) end = type.size();
    in[static_cast<std::size_t>(axis_index(type.substr(start, end - start)))] = true;
    start = end + 1;
  }
  return in;
}

inline std::array<int, 5> coordinates(axis_sizes const& sizes, int rank) {
  std::array<int, 5> c{};
  for (std::size_t i = 0; i < 5; ++i) {
    c[i] = rank % sizes[i];
    rank /= sizes[i];
  }
  return c;
}

inline int world_of(axis_sizes const& sizes) {
  int w = 1;
  for (int s : sizes) w *= s;
  return w;
}

/// The members of rank's group of the given type, in in-group order.
inline std::vector<int> group_of(axis_sizes const& sizes, std::string_view type, int rank) {
  auto const in = axes_of(type);
  auto const mine = coordinates(sizes, rank);
  std::vector<int> members;
  for (int q = 0; q < world_of(sizes); ++q) {
    auto const theirs = coordinates(sizes, q);
    bool same = true;
    for (std::size_t i = 0; i < 5; ++i) same = same && (in[i] || theirs[i] == mine[i]);
    if (same) members.push_back(q);
  }
  return members;
}

/// Every group of the given type, in creation order.
inline std::vector<std::vector<int>> groups_of(axis_sizes const& sizes, std::string_view type) {
  std::vector<std::vector<int>> groups;
  std::vector<bool> placed(static_cast<std::size_t>(world_of(sizes)), false);
  for (int r = 0; r < world_of(sizes); ++r) {
    if (placed[static_cast<std::size_t>(r)]) continue;
    groups.push_back(group_of(sizes, type, r));
    for (int q : groups.back()) placed[static_cast<std::size_t>(q)] = true;
  }
  return groups;
}

/// The attention grid's sizes: (tp, cp, 1, dp, pp).
inline axis_sizes decoder_sizes(int tp, int cp, int dp, int pp) {
  return {tp, cp, 1, dp, pp};
}
/// The expert grid's sizes: (etp, 1, ep, edp, pp).
inline axis_sizes expert_sizes(int etp, int ep, int edp, int pp) {
  return {etp, 1, ep, edp, pp};
}

}  // namespace megamoe::reference
