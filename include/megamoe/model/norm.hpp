// SPDX-License-Identifier: Apache-2.0
// megamoe/model/norm.hpp — RMSNorm with an explicit backward.
//
//   y = x / rms(x) * w,  rms(x) = sqrt(mean(x^2) + eps)   (per token row)
//   dx = r * (g - x * r^2 * mean(g * x)),  g = dy * w,  r = 1 / rms(x)
//   dw += sum over rows of dy * x * r
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/model/parameter_layout.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace megamoe {

/// RMSNorm over the hidden dimension of [N, H] rows; keeps its input for backward.
template <class T>
class rms_norm {
 public:
  explicit rms_norm(int hidden, double eps = 1e-5)
      : weight_(row_matrix<T>::Ones(1, hidden)), grad_(row_matrix<T>::Zero(1, hidden)), eps_(eps) {
    if (hidden < 1) throw input_error("rms_norm: hidden size must be positive");
  }

  [[nodiscard]] int hidden() const noexcept { return static_cast<int>(weight_.cols()); }

  /// y [N,H] from x [N,H] (y may not alias x).
  void forward(thread_pool& pool, const_row_matrix_map<T> x, row_matrix_map<T> y);

  /// The residual add and the norm in one pass: residual += branch, then y = norm(residual)
  /// (y may alias neither).
  void add_forward(thread_pool& pool, row_matrix_map<T> residual, const_row_matrix_map<T> branch,
                   row_matrix_map<T> y);

  /// dx [N,H] from dy [N,H] of the last forward (dx may alias dy), or dx += it with `accumulate`
  /// (then dx may not alias dy); adds the weight gradient.
  void backward(thread_pool& pool, const_row_matrix_map<T> dy, row_matrix_map<T> dx,
                bool accumulate = false);

  void zero_grad() { grad_.setZero(); }

  /// f(name, value, grad) for the weight, named `prefix.weight`.
  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    report_parameter(f, prefix + ".weight", row_matrix_map<T>(weight_.data(), 1, hidden()),
                     row_matrix_map<T>(grad_.data(), 1, hidden()), parameter_cut::norm);
  }

  /// Bytes kept from forward to backward.
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return static_cast<std::size_t>(x_.size()) * sizeof(T) + inverse_rms_.size() * sizeof(T);
  }

  /// Sets micro-batch `key`'s kept input aside (core/stash.hpp), or brings it back.
  void park(std::uint64_t key);
  void restore(std::uint64_t key);

 private:
  static constexpr int rows_per_block = 64;

  void start(Eigen::Index rows) {
    x_.resize(rows, hidden());
    inverse_rms_.resize(static_cast<std::size_t>(rows));
  }
  /// Keeps row t of the input and writes y's row t.
  template <class Row>
  void normalize(int t, Row const& x, row_matrix_map<T> y) {
    x_.row(t) = x;
    T const mean_square = x.squaredNorm() / static_cast<T>(hidden());
    T const r = T(1) / std::sqrt(mean_square + static_cast<T>(eps_));
    inverse_rms_[static_cast<std::size_t>(t)] = r;
    y.row(t) = (x * r).cwiseProduct(weight_);
  }

  void require(Eigen::Index rows, Eigen::Index cols, char const* what) const {
    if (cols != hidden() || rows < 0)
      throw input_error(std::string("rms_norm: ") + what + " has " + std::to_string(cols) +
                        " columns, the norm " + std::to_string(hidden()));
  }

  row_matrix<T> weight_, grad_;
  double eps_;
  row_matrix<T> x_, partial_;
  std::vector<T> inverse_rms_;
  activation_stash<row_matrix<T>, std::vector<T>> stash_;
};

// Defined outside the class, these members are not inline: a program built with
// MEGAMOE_SEPARATE_COMPILATION compiles them once for float and double (model/norm.ipp).
template <class T>
void rms_norm<T>::forward(thread_pool& pool, const_row_matrix_map<T> x, row_matrix_map<T> y) {
  require(x.rows(), x.cols(), "input");
  start(x.rows());
  parallel_rows(pool, static_cast<int>(x.rows()), [&](int begin, int end) {
    for (int t = begin; t < end; ++t) normalize(t, x.row(t), y);
  });
}

template <class T>
void rms_norm<T>::add_forward(thread_pool& pool, row_matrix_map<T> residual,
                              const_row_matrix_map<T> branch, row_matrix_map<T> y) {
  require(residual.rows(), residual.cols(), "residual");
  require(branch.rows(), branch.cols(), "branch");
  if (branch.rows() != residual.rows())
    throw input_error("rms_norm: a branch of " + std::to_string(branch.rows()) +
                      " rows for a residual of " + std::to_string(residual.rows()));
  start(residual.rows());
  parallel_rows(pool, static_cast<int>(residual.rows()), [&](int begin, int end) {
    for (int t = begin; t < end; ++t) {
      residual.row(t) += branch.row(t);
      normalize(t, residual.row(t), y);
    }
  });
}

template <class T>
void rms_norm<T>::backward(thread_pool& pool, const_row_matrix_map<T> dy, row_matrix_map<T> dx,
                           bool accumulate) {
  require(dy.rows(), dy.cols(), "output gradient");
  if (dy.rows() != x_.rows())
    throw input_error("rms_norm: backward of " + std::to_string(dy.rows()) +
                      " rows after a forward of " + std::to_string(x_.rows()));
  int const H = hidden(), N = static_cast<int>(dy.rows());
  // One pass per block of rows: each row adds to its block's weight gradient before its dx is
  // written (dx may overwrite that row of dy); the blocks are summed in block order, so the
  // thread count never changes the weight gradient.
  int const blocks = (N + rows_per_block - 1) / rows_per_block;
  partial_.setZero(blocks, H);
  parallel_rows(pool, blocks, [&](int first, int last) {
    for (int k = first; k < last; ++k)
      for (int t = k * rows_per_block; t < std::min(N, (k + 1) * rows_per_block); ++t) {
        T const r = inverse_rms_[static_cast<std::size_t>(t)];
        auto const x = x_.row(t);
        auto const g = dy.row(t).cwiseProduct(weight_);
        partial_.row(k) += dy.row(t).cwiseProduct(x) * r;
        T const mean_gx = g.dot(x) / static_cast<T>(H);
        if (accumulate)
          dx.row(t) += r * (g - x * (r * r * mean_gx));
        else
          dx.row(t) = r * (g - x * (r * r * mean_gx));
      }
  });
  for (int k = 0; k < blocks; ++k) grad_ += partial_.row(k);
}

template <class T>
void rms_norm<T>::park(std::uint64_t key) {
  stash_.park(key, x_, inverse_rms_);
}
template <class T>
void rms_norm<T>::restore(std::uint64_t key) {
  stash_.restore(key, x_, inverse_rms_);
}

#if !MEGAMOE_HEADER_ONLY
extern template class rms_norm<float>;
extern template class rms_norm<double>;
#endif

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/norm.ipp>
#endif
