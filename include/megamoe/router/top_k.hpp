// SPDX-License-Identifier: Apache-2.0
// megamoe/router/top_k.hpp — selecting experts: top-k over a row of scores, group-limited top-k,
// and the top-k routing of a micro-batch under a plan (scores, selection, probs, and their
// backward). Ties go to the lower index in every top-k, so results never depend on a sort's tie
// order. Templated on the scalars, so fp32 (the reference's precision) and fp64 (finite
// differences) run the same code.
#pragma once

#include <megamoe/core/tensor.hpp>
#include <megamoe/router/plan.hpp>
#include <megamoe/router/scores.hpp>
#include <megamoe/router/tags.hpp>

#include <algorithm>
#include <limits>
#include <span>
#include <vector>

namespace megamoe::router::kernels {

/// The indices of the k largest of `values`, largest first; equal values keep index order.
/// `out` has room for k indices. O(n*k), which is what E <= a few hundred and k <= 16 want.
template <class T>
void top_k(std::span<T const> values, int k, int* out) {
  int filled = 0;
  int const n = static_cast<int>(values.size());
  for (int i = 0; i < n; ++i) {
    T const x = values[i];
    if (filled == k && !(x > values[out[k - 1]])) continue;
    int pos = filled < k ? filled++ : k - 1;
    while (pos > 0 && x > values[out[pos - 1]]) {
      out[pos] = out[pos - 1];
      --pos;
    }
    out[pos] = i;
  }
}

/// Group-limited selection: experts form `groups` contiguous groups; each group scores the sum of
/// its top (k / group_top_k) values, the `group_top_k` best groups stay and every other expert is
/// excluded; then the k best experts are taken. `masked` has room for values.size() entries,
/// `group_scores` for `groups`, `scratch` for max(group size, groups) indices.
template <class T>
void group_limited_top_k(std::span<T const> values, int k, int groups, int group_top_k, int* out,
                         T* masked, T* group_scores, int* scratch) {
  int const n = static_cast<int>(values.size());
  int const group_size = n / groups;
  int const per_group = k / group_top_k;
  for (int g = 0; g < groups; ++g) {
    auto const group = values.subspan(static_cast<std::size_t>(g * group_size),
                                      static_cast<std::size_t>(group_size));
    top_k(group, per_group, scratch);
    T sum = 0;
    for (int i = 0; i < per_group; ++i) sum += group[scratch[i]];
    group_scores[g] = sum;
  }
  top_k(std::span<T const>(group_scores, static_cast<std::size_t>(groups)), group_top_k, scratch);
  std::fill(masked, masked + n, -std::numeric_limits<T>::infinity());
  for (int i = 0; i < group_top_k; ++i) {
    int const g = scratch[i];
    std::copy(values.begin() + g * group_size, values.begin() + (g + 1) * group_size,
              masked + g * group_size);
  }
  top_k(std::span<T const>(masked, static_cast<std::size_t>(n)), k, out);
}

}  // namespace megamoe::router::kernels

namespace megamoe::router {

/// Top-k routing of a micro-batch under plan P: each token's scores (softmax over its k selected
/// logits, softmax over all experts, or the sigmoid-family score plus the expert bias for the
/// selection), its k experts (group-limited where P says so), and its probs (renormalised over the
/// k for the sigmoid family with k > 1, times the scaling factor). Keeps what the backward needs.
/// L: the router dtype; S: the score type.
template <class L, class S>
class topk_selection {
 public:
  /// indices [T,k] (by descending selection score) and probs [T,k] from logits [T,E]; `bias` [E]
  /// is used where P has the expert bias.
  template <route_plan P>
  void forward(row_matrix<L> const& logits, std::span<float const> bias, settings const& s,
               row_matrix<int>& indices, row_matrix<L>& probs) {
    static_assert(!P.sinkhorn);
    int const T = static_cast<int>(logits.rows()), E = static_cast<int>(logits.cols());
    int const k = s.top_k;
    S const scale = s.topk_scaling_factor ? static_cast<S>(*s.topk_scaling_factor) : S(1);
    saved_k_.resize(T, k);
    saved_sum_.resize(T);
    if constexpr (P.score == score_function::softmax_before_topk) scores_.resize(T, E);
    row_.resize(static_cast<std::size_t>(E));
    values_.resize(static_cast<std::size_t>(k));
    for (int t = 0; t < T; ++t) {
      int* idx = &indices(t, 0);
      L const* z = &logits(t, 0);
      if constexpr (P.score == score_function::softmax_after_topk) {
        select<P>(std::span<L const>(z, static_cast<std::size_t>(E)), s, idx, masked_l_, groups_l_);
        for (int i = 0; i < k; ++i)
          values_[static_cast<std::size_t>(i)] = static_cast<S>(z[idx[i]]);
        kernels::softmax(values_.data(), k, &saved_k_(t, 0));
        for (int i = 0; i < k; ++i) probs(t, i) = static_cast<L>(saved_k_(t, i) * scale);
      } else if constexpr (P.score == score_function::softmax_before_topk) {
        S* sc = &scores_(t, 0);
        kernels::softmax(z, E, sc);
        select<P>(std::span<S const>(sc, static_cast<std::size_t>(E)), s, idx, masked_s_,
                  groups_s_);
        for (int i = 0; i < k; ++i) probs(t, i) = static_cast<L>(sc[idx[i]] * scale);
      } else {
        for (int e = 0; e < E; ++e) {
          S r = kernels::score<P.score>(static_cast<S>(z[e]));
          if constexpr (P.expert_bias) r += static_cast<S>(bias[static_cast<std::size_t>(e)]);
          row_[static_cast<std::size_t>(e)] = r;
        }
        select<P>(std::span<S const>(row_.data(), row_.size()), s, idx, masked_s_, groups_s_);
        S sum = 0;
        for (int i = 0; i < k; ++i) {
          S const q = kernels::score<P.score>(static_cast<S>(z[idx[i]]));
          saved_k_(t, i) = q;
          sum += q;
        }
        sum += static_cast<S>(1e-20);
        saved_sum_(t) = sum;
        for (int i = 0; i < k; ++i) {
          S p = saved_k_(t, i);
          if constexpr (P.normalize) p = p / sum;
          probs(t, i) = static_cast<L>(p * scale);
        }
      }
    }
  }

  /// Adds the gradient of sum(grad_probs .* probs) with respect to the logits to `grad` [T,E]:
  /// through the scaling, the renormalisation and the score function, for the kept entries
  /// (`kept` [T,k]: not dropped by capacity).
  template <route_plan P>
  void backward(row_matrix<L> const& logits, Eigen::Ref<row_matrix<L> const> const& grad_probs,
                row_matrix<int> const& indices, mask_matrix const& kept, settings const& s,
                row_matrix<L>& grad) {
    int const T = static_cast<int>(logits.rows()), E = static_cast<int>(logits.cols());
    int const k = s.top_k;
    S const scale = s.topk_scaling_factor ? static_cast<S>(*s.topk_scaling_factor) : S(1);
    g_.resize(static_cast<std::size_t>(k));
    ds_.resize(static_cast<std::size_t>(E));
    for (int t = 0; t < T; ++t) {
      int const* idx = &indices(t, 0);
      bool any = false;
      for (int i = 0; i < k; ++i) {
        g_[static_cast<std::size_t>(i)] =
            kept(t, i) ? static_cast<S>(grad_probs(t, idx[i])) * scale : S(0);
        any = any || g_[static_cast<std::size_t>(i)] != S(0);
      }
      if (!any) continue;
      if constexpr (P.score == score_function::softmax_after_topk) {
        S const* p = &saved_k_(t, 0);
        S const d = kernels::dot(p, g_.data(), k);
        for (int i = 0; i < k; ++i)
          grad(t, idx[i]) += static_cast<L>(p[i] * (g_[static_cast<std::size_t>(i)] - d));
      } else if constexpr (P.score == score_function::softmax_before_topk) {
        S const* sc = &scores_(t, 0);
        std::fill(ds_.begin(), ds_.end(), S(0));
        for (int i = 0; i < k; ++i)
          ds_[static_cast<std::size_t>(idx[i])] += g_[static_cast<std::size_t>(i)];
        S const d = kernels::dot(sc, ds_.data(), E);
        for (int e = 0; e < E; ++e)
          grad(t, e) += static_cast<L>(sc[e] * (ds_[static_cast<std::size_t>(e)] - d));
      } else {
        S const* q = &saved_k_(t, 0);
        S const sum = saved_sum_(t);
        S weighted = 0;
        for (int i = 0; i < k; ++i) weighted += g_[static_cast<std::size_t>(i)] * q[i];
        for (int i = 0; i < k; ++i) {
          S dq = g_[static_cast<std::size_t>(i)];
          if constexpr (P.normalize) dq = dq / sum - weighted / (sum * sum);
          grad(t, idx[i]) += static_cast<L>(
              dq * kernels::score_derivative<P.score>(static_cast<S>(logits(t, idx[i])), q[i]));
        }
      }
    }
  }

 private:
  /// The k best of one row: group-limited where P says so.
  template <route_plan P, class T>
  void select(std::span<T const> values, settings const& s, int* out, std::vector<T>& masked,
              std::vector<T>& group_scores) {
    int const k = s.top_k;
    if constexpr (P.group_limit) {
      auto const E = values.size();
      masked.resize(E);
      group_scores.resize(static_cast<std::size_t>(s.num_groups));
      group_scratch_.resize(std::max(E, static_cast<std::size_t>(s.num_groups)));
      kernels::group_limited_top_k(values, k, s.num_groups, s.group_top_k, out, masked.data(),
                                   group_scores.data(), group_scratch_.data());
    } else {
      kernels::top_k(values, k, out);
    }
  }

  row_matrix<S> saved_k_, scores_;
  Eigen::Matrix<S, Eigen::Dynamic, 1> saved_sum_;
  std::vector<S> row_, values_, masked_s_, groups_s_, g_, ds_;
  std::vector<L> masked_l_, groups_l_;
  std::vector<int> group_scratch_;
};

}  // namespace megamoe::router
