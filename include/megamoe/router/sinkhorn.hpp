// SPDX-License-Identifier: Apache-2.0
// megamoe/router/sinkhorn.hpp — Sinkhorn balancing of the selection: exp(logits) rescaled by rows
// and columns until the column scales settle (the reference's loop), then top-k of the result.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/router/output.hpp>
#include <megamoe/router/plan.hpp>
#include <megamoe/router/scores.hpp>
#include <megamoe/router/top_k.hpp>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

namespace megamoe::router::kernels {

/// Sinkhorn normalisation of exp(cost) ([rows, cols], row-major, in place): rows and columns are
/// rescaled alternately until the mean change of the column scales is at most `tol` (the
/// reference's loop, eps 1e-8). `row_scale` and `col_scale`/`col_old` are scratch of the given
/// sizes. Gives up with an error after `max_iterations`, where the reference would loop forever.
template <class S>
void sinkhorn(S* cost, int rows, int cols, S* row_scale, S* col_scale, S* col_old, S tol = S(1e-4),
              int max_iterations = 100000) {
  S const eps = S(1e-8);
  for (int i = 0; i < rows * cols; ++i) cost[i] = std::exp(cost[i]);
  std::fill(row_scale, row_scale + rows, S(1));
  std::fill(col_scale, col_scale + cols, S(1));
  std::copy(col_scale, col_scale + cols, col_old);
  S error = S(1e9);
  int iteration = 0;
  while (error > tol) {
    if (++iteration > max_iterations)
      throw input_error("sinkhorn routing did not converge in " + std::to_string(max_iterations) +
                        " iterations (logits too large for exp in this precision?)");
    for (int r = 0; r < rows; ++r) {
      S sum = 0;
      for (int c = 0; c < cols; ++c) sum += col_scale[c] * cost[r * cols + c];
      row_scale[r] = (S(1) / static_cast<S>(rows)) * S(1) / (sum + eps);
    }
    for (int c = 0; c < cols; ++c) {
      S sum = 0;
      for (int r = 0; r < rows; ++r) sum += row_scale[r] * cost[r * cols + c];
      col_scale[c] = (S(1) / static_cast<S>(cols)) * S(1) / (sum + eps);
    }
    S change = 0;
    for (int c = 0; c < cols; ++c) change += std::abs(col_old[c] - col_scale[c]);
    error = change / static_cast<S>(cols);
    std::copy(col_scale, col_scale + cols, col_old);
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      cost[r * cols + c] = col_scale[c] * cost[r * cols + c] * row_scale[r];
}

}  // namespace megamoe::router::kernels

namespace megamoe::router {

/// Sinkhorn routing of a micro-batch (training): the probs are the softmax over E (k > 1, plan P
/// normalising) or the sigmoid of each logit, not renormalised; the k experts are the top-k of the
/// Sinkhorn-balanced exp(logits). Eval selects on the probs themselves. L: the router dtype; S: the
/// score type.
template <class L, class S>
class sinkhorn_selection {
 public:
  template <route_plan P>
  void forward(row_matrix<L> const& logits, int k, pass mode, row_matrix<int>& indices,
               row_matrix<L>& probs) {
    static_assert(P.sinkhorn);
    int const T = static_cast<int>(logits.rows()), E = static_cast<int>(logits.cols());
    activation_.resize(T, E);
    scores_.resize(T, E);  // the softmax (k > 1) in S, for the backward
    for (int t = 0; t < T; ++t) {
      if constexpr (P.normalize) {
        kernels::softmax(&logits(t, 0), E, &scores_(t, 0));
        for (int e = 0; e < E; ++e) activation_(t, e) = static_cast<L>(scores_(t, e));
      } else {
        for (int e = 0; e < E; ++e) activation_(t, e) = kernels::sigmoid(logits(t, e));
      }
    }
    if (mode != pass::eval) {
      cost_ = logits.template cast<S>();
      rows_.resize(static_cast<std::size_t>(T));
      cols_.resize(static_cast<std::size_t>(E));
      old_.resize(static_cast<std::size_t>(E));
      kernels::sinkhorn(cost_.data(), T, E, rows_.data(), cols_.data(), old_.data());
      for (int t = 0; t < T; ++t)
        kernels::top_k(std::span<S const>(&cost_(t, 0), static_cast<std::size_t>(E)), k,
                       &indices(t, 0));
    } else {
      for (int t = 0; t < T; ++t)
        kernels::top_k(std::span<L const>(&activation_(t, 0), static_cast<std::size_t>(E)), k,
                       &indices(t, 0));
    }
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i) probs(t, i) = activation_(t, indices(t, i));
  }

  /// Adds the gradient of sum(grad_probs .* probs) over the kept entries to `grad` [T,E].
  template <route_plan P>
  void backward(Eigen::Ref<row_matrix<L> const> const& grad_probs, row_matrix<int> const& indices,
                mask_matrix const& kept, row_matrix<L>& grad) {
    int const T = static_cast<int>(activation_.rows()), E = static_cast<int>(activation_.cols());
    int const k = static_cast<int>(indices.cols());
    ds_.resize(static_cast<std::size_t>(E));
    for (int t = 0; t < T; ++t) {
      std::fill(ds_.begin(), ds_.end(), S(0));
      for (int i = 0; i < k; ++i) {
        int const e = indices(t, i);
        if (kept(t, i)) ds_[static_cast<std::size_t>(e)] = static_cast<S>(grad_probs(t, e));
      }
      if constexpr (P.normalize) {
        S const* sc = &scores_(t, 0);
        S const d = kernels::dot(sc, ds_.data(), E);
        for (int e = 0; e < E; ++e)
          grad(t, e) += static_cast<L>(sc[e] * (ds_[static_cast<std::size_t>(e)] - d));
      } else {
        for (int e = 0; e < E; ++e) {
          L const a = activation_(t, e);
          grad(t, e) += static_cast<L>(ds_[static_cast<std::size_t>(e)]) * a * (L(1) - a);
        }
      }
    }
  }

 private:
  row_matrix<L> activation_;
  row_matrix<S> scores_, cost_;
  std::vector<S> rows_, cols_, old_, ds_;
};

}  // namespace megamoe::router
