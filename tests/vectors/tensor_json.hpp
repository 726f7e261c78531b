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
