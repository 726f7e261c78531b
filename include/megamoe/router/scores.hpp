// SPDX-License-Identifier: Apache-2.0
// megamoe/router/scores.hpp — the score functions of routing and their derivatives: softmax (over
// all experts or over the k selected), sigmoid and sqrt(softplus), each computed as the reference
// does, in the score type S. `score<F>` / `score_derivative<F>` pick the function at compile time.
#pragma once

#include <megamoe/router/tags.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace megamoe::router::kernels {

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

/// The sigmoid-family score F of a logit (sigmoid or sqrtsoftplus), chosen at compile time.
template <score_function F, class S>
S score(S z) {
  static_assert(F == score_function::sigmoid || F == score_function::sqrtsoftplus);
  if constexpr (F == score_function::sigmoid) {
    return sigmoid(z);
  } else {
    return sqrtsoftplus(z);
  }
}

/// d score / dz given z and the score q, for the sigmoid family.
template <score_function F, class S>
S score_derivative(S z, S q) {
  if constexpr (F == score_function::sigmoid) {
    (void)z;
    return q * (S(1) - q);
  } else {
    return sqrtsoftplus_derivative(z, q);
  }
}

}  // namespace megamoe::router::kernels
