// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/rank_generator.hpp — which ranks form each process group (no MPI needed).
//
// A grid numbers the ranks of one world by the axes of an order string, leftmost varying fastest:
// with sizes (s0, s1, ...) a rank is sum_i idx_i * prod_{j<i} s_j. A group of type "a-b" holds the
// ranks that differ only along axes a and b. Groups are listed by the index of the other axes
// (leftmost fastest), and inside a group ranks follow the masked axes (leftmost fastest); that is
// the reference's creation order and in-group rank numbering, which the communicators inherit.
#pragma once

#include <megamoe/core/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe::parallel {

/// The order of both grids: tensor, context, expert, data, pipeline parallel; tp varies fastest.
inline constexpr std::string_view default_order = "tp-cp-ep-dp-pp";

/// One list of ranks per group, in creation order.
using rank_groups = std::vector<std::vector<int>>;

class rank_generator {
 public:
  /// The five axes and their sizes. At most one of cp and ep may exceed 1 (the attention grid has
  /// ep = 1, the expert grid cp = 1). Axes missing from `order` must have size 1 and go at its end.
  rank_generator(int tp, int cp, int ep, int dp, int pp, std::string_view order = default_order) {
    std::array<std::pair<std::string_view, int>, 5> const sizes{
        {{"tp", tp}, {"cp", cp}, {"ep", ep}, {"dp", dp}, {"pp", pp}}};
    for (auto const& [name, size] : sizes)
      if (size < 1)
        throw input_error("rank_generator: axis " + std::string(name) + " has size " +
                          std::to_string(size) + "; every axis needs at least 1");
    if (cp > 1 && ep > 1)
      throw input_error("rank_generator: cp and ep cannot both exceed 1 in one grid (cp " +
                        std::to_string(cp) + ", ep " + std::to_string(ep) + ")");
    for (auto const& token : split(order)) {
      auto const it = std::find_if(sizes.begin(), sizes.end(),
                                   [&](auto const& entry) { return entry.first == token; });
      if (it == sizes.end())
        throw input_error("rank_generator: unknown axis '" + token + "' in order '" +
                          std::string(order) + "' (axes are tp, cp, ep, dp, pp)");
      if (std::find(names_.begin(), names_.end(), token) != names_.end())
        throw input_error("rank_generator: axis '" + token + "' appears twice in order '" +
                          std::string(order) + "'");
      names_.push_back(token);
      sizes_.push_back(it->second);
    }
    for (auto const& [name, size] : sizes) {
      if (std::find(names_.begin(), names_.end(), name) != names_.end()) continue;
      if (size != 1)
        throw input_error("rank_generator: axis " + std::string(name) + " has size " +
                          std::to_string(size) + " but is missing from order '" +
                          std::string(order) + "'");
      names_.emplace_back(name);
      sizes_.push_back(1);
    }
    world_size_ = 1;
    for (int s : sizes_) world_size_ *= s;
  }

  [[nodiscard]] int world_size() const noexcept { return world_size_; }

  /// The full order, with any axes that were missing appended.
  [[nodiscard]] std::string order() const {
    std::string text;
    for (auto const& name : names_) text += (text.empty() ? "" : "-") + name;
    return text;
  }

  /// The groups of the type named by `axes`, e.g. "tp", "dp-cp" or "tp-ep-pp" (the order of the
  /// names in `axes` does not matter).
  [[nodiscard]] rank_groups groups(std::string_view axes) const {
    std::vector<bool> masked(names_.size(), false);
    for (auto const& token : split(axes)) {
      auto const it = std::find(names_.begin(), names_.end(), token);
      if (it == names_.end())
        throw input_error("rank_generator: unknown axis '" + token + "' in group type '" +
                          std::string(axes) + "'");
      masked[static_cast<std::size_t>(it - names_.begin())] = true;
    }
    std::vector<int> in_sizes, in_strides, out_sizes, out_strides;
    int stride = 1;
    for (std::size_t i = 0; i < names_.size(); ++i) {
      (masked[i] ? in_sizes : out_sizes).push_back(sizes_[i]);
      (masked[i] ? in_strides : out_strides).push_back(stride);
      stride *= sizes_[i];
    }
    int const group_size = product(in_sizes);
    int const group_count = world_size_ / group_size;
    rank_groups result(static_cast<std::size_t>(group_count));
    for (int g = 0; g < group_count; ++g) {
      int const base = offset(g, out_sizes, out_strides);
      auto& group = result[static_cast<std::size_t>(g)];
      group.reserve(static_cast<std::size_t>(group_size));
      for (int r = 0; r < group_size; ++r) group.push_back(base + offset(r, in_sizes, in_strides));
    }
    return result;
  }

 private:
  static std::vector<std::string> split(std::string_view text) {
    std::vector<std::string> tokens;
    std::size_t start = 0;
    while (start <= text.size()) {
      std::size_t const end = std::min(text.find('-', start), text.size());
      tokens.emplace_back(text.substr(start, end - start));
      start = end + 1;
    }
    return tokens;
  }
  static int product(std::vector<int> const& values) {
    int p = 1;
    for (int v : values) p *= v;
    return p;
  }
  /// Position of linear index `index` in a sub-grid of `sizes` (leftmost fastest), as a world rank.
  static int offset(int index, std::vector<int> const& sizes, std::vector<int> const& strides) {
    int rank = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      rank += (index % sizes[i]) * strides[i];
      index /= sizes[i];
    }
    return rank;
  }

  std::vector<std::string> names_;
  std::vector<int> sizes_;
  int world_size_ = 1;
};

}  // namespace megamoe::parallel
