// SPDX-License-Identifier: Apache-2.0
// megamoe/core/tensor.hpp — the row-major matrices and maps megamoe's modules hold (Eigen's Core
// module). Eigen's Tensor module is included only by the one backend that runs on it
// (expert/tensor_gemm.hpp, by need).
#pragma once

#include <Eigen/Core>

#include <cstdint>

namespace megamoe {

/// A dense row-major matrix: [tokens, features] data is stored token after token, as the reference
/// stores its [T, E] and [T, H] tensors.
template <class T>
using row_matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// A view of row-major data owned elsewhere.
template <class T>
using row_matrix_map = Eigen::Map<row_matrix<T>>;
template <class T>
using const_row_matrix_map = Eigen::Map<row_matrix<T> const>;

/// A whole matrix as a map: writable from a writable matrix, read-only from a const one
/// (const_view: read-only from either).
template <class T>
row_matrix_map<T> view(row_matrix<T>& m) {
  return {m.data(), m.rows(), m.cols()};
}
template <class T>
const_row_matrix_map<T> view(row_matrix<T> const& m) {
  return {m.data(), m.rows(), m.cols()};
}
template <class T>
const_row_matrix_map<T> const_view(row_matrix<T> const& m) {
  return {m.data(), m.rows(), m.cols()};
}

/// A 0/1 mask stored one byte per entry ([T, E] routing maps).
using mask_matrix = row_matrix<std::uint8_t>;

}  // namespace megamoe
