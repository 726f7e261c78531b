// SPDX-License-Identifier: Apache-2.0
// megamoe/router/capacity.hpp — expert capacity, token dropping and routing-map padding.
//
// Tie rule (docs/design.md, "Ties"): wherever the reference leaves a choice among equal candidates
// to torch.topk's order, megamoe keeps the lowest token index. With the `probs` policy an expert
// keeps its C tokens of highest prob (equal probs: lower token first); with `position` it keeps its
// C routed tokens of lowest index; fillers in pad-to-capacity mode are the lowest-index tokens not
// routed to the expert.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/router/tags.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace megamoe::router {

/// C = ceil(T*k/E * factor), computed in double as the reference does (T = local tokens).
inline int expert_capacity(int tokens, int top_k, int experts, double factor) {
  double const per_expert = static_cast<double>(tokens) * top_k / experts;
  return static_cast<int>(std::ceil(per_expert * factor));
}

/// Applies capacity to sparse `probs` [T,E] and `map` [T,E] in place. `order` is scratch for T
/// indices. Returns C. When C >= T no token is dropped; with `pad` every expert then receives all
/// T tokens (the reference's all-ones capacity mask).
template <class P>
int apply_capacity(row_matrix<P>& probs, mask_matrix& map, int top_k, double factor,
                   drop_policy policy, bool pad, std::vector<int>& order) {
  int const tokens = static_cast<int>(probs.rows());
  int const experts = static_cast<int>(probs.cols());
  int const capacity = expert_capacity(tokens, top_k, experts, factor);
  order.resize(static_cast<std::size_t>(tokens));
  for (int e = 0; e < experts; ++e) {
    int keep = std::min(capacity, tokens);
    std::iota(order.begin(), order.end(), 0);
    if (capacity < tokens) {
      if (policy == drop_policy::probs) {
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return probs(a, e) > probs(b, e); });
      } else {
        std::stable_partition(order.begin(), order.end(), [&](int t) { return map(t, e) != 0; });
      }
    }
    // order[0, keep) is the capacity mask of this expert.
    for (int i = 0; i < tokens; ++i) {
      int const t = order[static_cast<std::size_t>(i)];
      bool const in_mask = i < keep;
      if (pad) {
        map(t, e) = in_mask ? 1 : 0;
      } else if (!in_mask) {
        map(t, e) = 0;
      }
      if (!map(t, e)) probs(t, e) = P(0);
    }
  }
  return capacity;
}

/// Router-side padding for quantized experts: each expert's count becomes a multiple of
/// `multiple` by switching on its lowest-index tokens not yet routed to it (their probs stay 0).
/// An expert that lacks enough unrouted tokens (fewer tokens than the multiple) gets all of them.
inline void pad_routing_map(mask_matrix& map, int multiple) {
  if (multiple < 1)
    throw input_error("pad_routing_map: the multiple must be at least 1, got " +
                      std::to_string(multiple));
  int const tokens = static_cast<int>(map.rows());
  for (Eigen::Index e = 0; e < map.cols(); ++e) {
    int count = 0;
    for (int t = 0; t < tokens; ++t) count += map(t, e);
    int to_pad = ((-count) % multiple + multiple) % multiple;
    for (int t = 0; t < tokens && to_pad > 0; ++t) {
      if (!map(t, e)) {
        map(t, e) = 1;
        --to_pad;
      }
    }
  }
}

}  // namespace megamoe::router
