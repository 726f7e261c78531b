// SPDX-License-Identifier: Apache-2.0
// megamoe/model/norm.hpp — RMSNorm with an explicit backward.
//
//   y = x / rms(x) * w,  rms(x) = sqrt(mean(x^2) + eps)   (per token row)
//   dx = r * (g - x * r^2 * mean(g * x)),  g = dy * w,  r = 1 / rms(x)
//   dw += sum over rows of dy * x * r
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>

#include <cmath>
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
  void forward(thread_pool& pool, const_row_matrix_map<T> x, row_matrix_map<T> y) {
    require(x.rows(), x.cols(), "input");
    x_ = x;
    inverse_rms_.resize(static_cast<std::size_t>(x.rows()));
    int const H = hidden();
    parallel_rows(pool, static_cast<int>(x.rows()), [&](int begin, int end) {
      for (int t = begin; t < end; ++t) {
        T const mean_square = x.row(t).squaredNorm() / static_cast<T>(H);
        T const r = T(1) / std::sqrt(mean_square + static_cast<T>(eps_));
        inverse_rms_[static_cast<std::size_t>(t)] = r;
        y.row(t) = (x.row(t) * r).cwiseProduct(weight_);
      }
    });
  }

  /// dx [N,H] from dy [N,H] of the last forward (dx may alias dy); adds the weight gradient.
  void backward(thread_pool& pool, const_row_matrix_map<T> dy, row_matrix_map<T> dx) {
    require(dy.rows(), dy.cols(), "output gradient");
    if (dy.rows() != x_.rows())
      throw input_error("rms_norm: backward of " + std::to_string(dy.rows()) +
                        " rows after a forward of " + std::to_string(x_.rows()));
    int const H = hidden();
    // The weight gradient first: dx may overwrite dy.
    for (Eigen::Index t = 0; t < dy.rows(); ++t)
      grad_ += dy.row(t).cwiseProduct(x_.row(t)) * inverse_rms_[static_cast<std::size_t>(t)];
    parallel_rows(pool, static_cast<int>(dy.rows()), [&](int begin, int end) {
      for (int t = begin; t < end; ++t) {
        T const r = inverse_rms_[static_cast<std::size_t>(t)];
        auto const g = dy.row(t).cwiseProduct(weight_).eval();
        T const mean_gx = g.dot(x_.row(t)) / static_cast<T>(H);
        dx.row(t) = r * (g - x_.row(t) * (r * r * mean_gx));
      }
    });
  }

  void zero_grad() { grad_.setZero(); }

  /// f(name, value, grad) for the weight, named `prefix.weight`.
  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    f(prefix + ".weight", row_matrix_map<T>(weight_.data(), 1, hidden()),
      row_matrix_map<T>(grad_.data(), 1, hidden()));
  }

  /// Bytes kept from forward to backward.
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return static_cast<std::size_t>(x_.size()) * sizeof(T) + inverse_rms_.size() * sizeof(T);
  }

 private:
  void require(Eigen::Index rows, Eigen::Index cols, char const* what) const {
    if (cols != hidden() || rows < 0)
      throw input_error(std::string("rms_norm: ") + what + " has " + std::to_string(cols) +
                        " columns, the norm " + std::to_string(hidden()));
  }

  row_matrix<T> weight_, grad_;
  double eps_;
  row_matrix<T> x_;
  std::vector<T> inverse_rms_;
};

}  // namespace megamoe
