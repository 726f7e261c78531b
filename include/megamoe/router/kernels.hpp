// SPDX-License-Identifier: Apache-2.0
// megamoe/router/kernels.hpp — per-row building blocks of routing: top-k, softmax, the score
// functions and their derivatives, group-limited selection and Sinkhorn normalisation.
//
// Every kernel is templated on its scalar so that the same code runs in fp32 (the reference's
// precision) and in fp64 (finite-difference checks). Ties in every top-k go to the lower index, so
// results never depend on a sort's tie order.
#pragma once

#include <megamoe/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>

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

/// softmax over n values, computed as the reference does: subtract the maximum, exponentiate,
/// divide by the sum, all in S.
template <class S, class In>
void softmax(In const* x, int n, S* out) {
  S max_value = -std::numeric_limits<S>::infinity();
  for (int i = 0; i < n; ++i) max_value = std::max(max_value, static_cast<S>(x[i]));
  S sum = 0;
  for (int i = 0; i < n; ++i) {
    out[i] = std::exp(static_cast<S>(x[i]) - max_value);
    sum += out[i];
  }
  for (int i = 0; i < n; ++i) out[i] /= sum;
}

/// sum_i a_i b_i. The softmax backward is dx_i = s_i (ds_i - dot(s, ds)).
template <class S>
S dot(S const* a, S const* b, int n) {
  S sum = 0;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

template <class S>
S sigmoid(S z) {
  return S(1) / (S(1) + std::exp(-z));
}

/// softplus with the reference's threshold (beta 1, threshold 20: linear above it).
template <class S>
S softplus(S z) {
  return z > S(20) ? z : std::log1p(std::exp(z));
}

/// sqrt(softplus(z)).
template <class S>
S sqrtsoftplus(S z) {
  return std::sqrt(softplus(z));
}

/// d sqrt(softplus(z)) / dz given z and the value q = sqrt(softplus(z)).
template <class S>
S sqrtsoftplus_derivative(S z, S q) {
  S const dsoftplus = z > S(20) ? S(1) : sigmoid(z);
  return dsoftplus / (S(2) * q);
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
