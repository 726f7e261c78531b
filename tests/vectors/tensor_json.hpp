// SPDX-License-Identifier: Apache-2.0
// Reading the reference's tensors ({dtype, shape, data}, row-major) and comparing them with
// megamoe's, keeping the worst relative error for the summary line.
#pragma once

#include "vectors/object_fields.hpp"
#include "vectors/vector_file.hpp"

#include <megamoe/core/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace megamoe::vectors {

/// The tensor's shape; a mismatch if `j` is not a tensor.
inline std::vector<std::int64_t> shape_of(nlohmann::json const& j, std::string const& what) {
  if (!j.is_object() || !j.contains("shape") || !j.contains("data") || !j.contains("dtype"))
    throw mismatch(what + ": not a tensor object");
  return j.at("shape").get<std::vector<std::int64_t>>();
}

/// A tensor as a [rows, cols] matrix: the first dimensions are flattened into rows ([S,B,H] gives
/// [S*B, H]; a vector [N] gives [N, 1]).
template <class T>
row_matrix<T> matrix_of(nlohmann::json const& j, std::string const& what) {
  auto const shape = shape_of(j, what);
  auto const& data = j.at("data");
  std::int64_t cols = shape.empty() ? 1 : (shape.size() == 1 ? 1 : shape.back());
  std::int64_t total = 1;
  for (auto d : shape) total *= d;
  if (static_cast<std::int64_t>(data.size()) != total)
    throw mismatch(what + ": data has " + std::to_string(data.size()) + " values for its shape");
  row_matrix<T> m(total / std::max<std::int64_t>(cols, 1), cols);
  for (std::int64_t i = 0; i < total; ++i) {
    auto const& value = data[static_cast<std::size_t>(i)];
    // Bool tensors are written as 0/1; accept true/false too.
    m.data()[i] = value.is_boolean() ? static_cast<T>(value.get<bool>()) : value.get<T>();
  }
  return m;
}

/// u of a floating-point type (half an ulp of 1): 2^-24 for float, 2^-53 for double.
template <class T>
constexpr double unit_roundoff() {
  return std::numeric_limits<T>::epsilon() / 2.0;
}

/// gamma_n = n u / (1 - n u): a sum of n products computed in any order in a type of unit roundoff
/// u is within gamma_n sum |a_i b_i| of the exact sum (Higham, Accuracy and Stability, 3.1).
inline double gamma(std::int64_t n, double u) {
  double const nu = static_cast<double>(n) * u;
  return nu < 1.0 ? nu / (1.0 - nu) : std::numeric_limits<double>::infinity();
}

/// The allowance between two evaluations of C = A B in a type of unit roundoff u, each within
/// gamma_K |A||B| of the exact product (K = A's columns), whatever order each sums in:
/// 2 gamma_K (|A||B|)(r, c). `upstream_error`, when given, bounds A's own difference from the
/// reference's A elementwise, which adds (upstream_error |B|)(r, c).
template <class A, class B>
Eigen::MatrixXd product_bound(Eigen::MatrixBase<A> const& a, Eigen::MatrixBase<B> const& b,
                              double u, Eigen::MatrixXd const* upstream_error = nullptr) {
  Eigen::MatrixXd const abs_a = a.template cast<double>().cwiseAbs();
  Eigen::MatrixXd const abs_b = b.template cast<double>().cwiseAbs();
  Eigen::MatrixXd bound = 2.0 * gamma(a.cols(), u) * (abs_a * abs_b);
  if (upstream_error != nullptr) bound += *upstream_error * abs_b;
  return bound;
}

/// Compares tensors element by element within rtol/atol, remembering the worst relative error.
class comparer {
 public:
  template <class A, class B>
  void close(std::string const& what, Eigen::MatrixBase<A> const& mine,
             Eigen::MatrixBase<B> const& expected, double rtol, double atol) {
    same_shape(what, mine, expected);
    ++fields_;
    counting_ = false;
    for (Eigen::Index r = 0; r < mine.rows(); ++r)
      for (Eigen::Index c = 0; c < mine.cols(); ++c)
        scalar_close(what + "[" + std::to_string(r) + "," + std::to_string(c) + "]",
                     static_cast<double>(mine(r, c)), static_cast<double>(expected(r, c)), rtol,
                     atol);
    counting_ = true;
  }

  /// As `close`, with each element's own allowance on top: |mine - expected| <= atol +
  /// rtol |expected| + bound(r, c), where `bound` is the rounding bound of the computation that
  /// produced the element (a dot product's error scales with the sum of |x||w| it adds up, not with
  /// its result, which cancellation can make arbitrarily small).
  template <class A, class B>
  void close_within(std::string const& what, Eigen::MatrixBase<A> const& mine,
                    Eigen::MatrixBase<B> const& expected, double rtol, double atol,
                    Eigen::MatrixXd const& bound) {
    same_shape(what, mine, expected);
    same_shape(what + " (bound)", bound, expected);
    ++fields_;
    counting_ = false;
    for (Eigen::Index r = 0; r < mine.rows(); ++r)
      for (Eigen::Index c = 0; c < mine.cols(); ++c)
        scalar_close(what + "[" + std::to_string(r) + "," + std::to_string(c) + "]",
                     static_cast<double>(mine(r, c)), static_cast<double>(expected(r, c)), rtol,
                     atol + bound(r, c));
    counting_ = true;
  }

  template <class A, class B>
  void exact(std::string const& what, Eigen::MatrixBase<A> const& mine,
             Eigen::MatrixBase<B> const& expected) {
    same_shape(what, mine, expected);
    ++fields_;
    for (Eigen::Index r = 0; r < mine.rows(); ++r)
      for (Eigen::Index c = 0; c < mine.cols(); ++c)
        if (static_cast<double>(mine(r, c)) != static_cast<double>(expected(r, c)))
          throw mismatch(what + "[" + std::to_string(r) + "," + std::to_string(c) + "]: megamoe " +
                         std::to_string(static_cast<double>(mine(r, c))) + ", reference " +
                         std::to_string(static_cast<double>(expected(r, c))));
  }

  void scalar_close(std::string const& what, double mine, double expected, double rtol,
                    double atol) {
    if (counting_) ++fields_;
    double const diff = std::abs(mine - expected);
    if (!(diff <= atol + rtol * std::abs(expected)))
      throw mismatch(what + ": megamoe " + std::to_string(mine) + ", reference " +
                     std::to_string(expected) + " (|diff| " + std::to_string(diff) + ")");
    // Relative error where the relative tolerance is the binding one (tiny values are held to
    // atol).
    if (rtol * std::abs(expected) > atol) worst_ = std::max(worst_, diff / std::abs(expected));
  }

  [[nodiscard]] double worst() const noexcept { return worst_; }
  /// How many fields (tensors or scalars) were compared.
  [[nodiscard]] int fields() const noexcept { return fields_; }

 private:
  template <class A, class B>
  static void same_shape(std::string const& what, Eigen::MatrixBase<A> const& mine,
                         Eigen::MatrixBase<B> const& expected) {
    if (mine.rows() != expected.rows() || mine.cols() != expected.cols())
      throw mismatch(what + ": megamoe has shape [" + std::to_string(mine.rows()) + "," +
                     std::to_string(mine.cols()) + "], the reference [" +
                     std::to_string(expected.rows()) + "," + std::to_string(expected.cols()) + "]");
  }
  double worst_ = 0.0;
  int fields_ = 0;
  bool counting_ = true;
};

}  // namespace megamoe::vectors
