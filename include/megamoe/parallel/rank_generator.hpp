// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/rank_generator.hpp — which ranks form each process group (no MPI needed).
//
// A grid numbers the ranks of one world by the axes of an order string, leftmost varying fastest:
// with sizes (s0, s1, ...) a rank is sum_i idx_i * prod_{j<i} s_j. A group of type "a-b" holds the
// ranks that differ only along axes a and b. Groups are listed by the index of the other axes
// (leftmost fastest), and inside a group ranks follow the masked axes (leftmost fastest); that is
// the reference's creation order and in-group rank numbering, which the communicators inherit.
#pragma once

#include <megamoe/core/compiled_once.hpp>
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
  rank_generator(int tp, int cp, int ep, int dp, int pp, std::string_view order = default_order);

  [[nodiscard]] int world_size() const noexcept { return world_size_; }

  /// The full order, with any axes that were missing appended.
  [[nodiscard]] std::string order() const;

  /// The groups of the type named by `axes`, e.g. "tp", "dp-cp" or "tp-ep-pp" (the order of the
  /// names in `axes` does not matter).
  [[nodiscard]] rank_groups groups(std::string_view axes) const;

 private:
  static std::vector<std::string> split(std::string_view text);
  static int product(std::vector<int> const& values);
  /// Position of linear index `index` in a sub-grid of `sizes` (leftmost fastest), as a world rank.
  static int offset(int index, std::vector<int> const& sizes, std::vector<int> const& strides);

  std::vector<std::string> names_;
  std::vector<int> sizes_;
  int world_size_ = 1;
};

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/rank_generator.ipp>
#endif
