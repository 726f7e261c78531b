// SPDX-License-Identifier: Apache-2.0
// megamoe/io/whole_tensors.hpp — whole tensors under the reference's names and shapes, assembled
// from rectangles and written as one safetensors file: the one place a trained model (rank 0's
// gather) and a checkpoint (megamoe-checkpoint export) become a single file of whole tensors.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/io/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megamoe::io {

/// The reference's shape of a parameter held as [rows, cols]: norms' weights, biases and the
/// expert bias are vectors.
MEGAMOE_DECL std::vector<std::int64_t> reference_shape(std::string_view name, std::int64_t rows,
                                                       std::int64_t cols);

/// Whole tensors by name, each a row-major [rows, cols] matrix of one dtype with the shape it is
/// written under; filled rectangle by rectangle, written in name order.
class whole_tensors {
 public:
  /// Adds the tensor `name` of T, [rows, cols] as a matrix, written as `shape`, zero-filled (an
  /// element no rectangle covers is written as 0). Adding a name again (another rank's pieces of
  /// it) keeps the first tensor; it must agree in dtype and matrix form.
  template <class T>
  void add(std::string const& name, std::vector<std::int64_t> shape, std::int64_t rows,
           std::int64_t cols) {
    auto const [it, fresh] = tensors_.try_emplace(name);
    auto& t = it->second;
    if (!fresh) {
      if (t.type != dtype_of<T> || t.rows != rows || t.cols != cols)
        throw input_error("whole tensors: " + name + " is added as [" + std::to_string(rows) +
                          ", " + std::to_string(cols) + "] " + dtype_name(dtype_of<T>) +
                          ", before as [" + std::to_string(t.rows) + ", " + std::to_string(t.cols) +
                          "] " + dtype_name(t.type));
      return;
    }
    t.type = dtype_of<T>;
    t.shape = std::move(shape);
    t.rows = rows;
    t.cols = cols;
    t.bytes.assign(static_cast<std::size_t>(rows * cols) * sizeof(T), std::byte{0});
  }
  /// Adds the tensor `name` of T, [rows, cols], written under the reference's shape.
  template <class T>
  void add(std::string const& name, std::int64_t rows, std::int64_t cols) {
    add<T>(name, reference_shape(name, rows, cols), rows, cols);
  }

  /// Places rectangle `r` (its row, col, rows and cols; local_first is not used) of the added
  /// tensor `name`: r.rows x r.cols values of T, row-major.
  template <class T>
  void place(std::string const& name, global_rectangle const& r, T const* values) {
    auto const it = tensors_.find(name);
    if (it == tensors_.end() || it->second.type != dtype_of<T>)
      throw input_error("whole tensors: " + name + " is not added as " + dtype_name(dtype_of<T>));
    auto& t = it->second;
    if (r.rows < 0 || r.cols < 0 || r.row < 0 || r.col < 0 || r.row + r.rows > t.rows ||
        r.col + r.cols > t.cols)
      throw input_error("whole tensors: a rectangle lies outside " + name + "'s [" +
                        std::to_string(t.rows) + ", " + std::to_string(t.cols) + "]");
    std::size_t const row_bytes = static_cast<std::size_t>(r.cols) * sizeof(T);
    if (row_bytes == 0) return;
    std::size_t const stride = static_cast<std::size_t>(t.cols) * sizeof(T);
    std::byte* into = t.bytes.data() + static_cast<std::size_t>(r.row * t.cols + r.col) * sizeof(T);
    for (std::int64_t row = 0; row < r.rows; ++row, into += stride)
      std::memcpy(into, values + row * r.cols, row_bytes);
  }

  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }

  /// Writes every tensor, in name order, and `metadata` to `path`, replacing it whole.
  void write(std::filesystem::path const& path,
             std::map<std::string, std::string> const& metadata) const;

 private:
  struct whole_tensor {
    dtype type = dtype::f32;
    std::vector<std::int64_t> shape;
    std::int64_t rows = 0, cols = 0;
    std::vector<std::byte> bytes;
  };

  std::map<std::string, whole_tensor> tensors_;
};

}  // namespace megamoe::io

#if MEGAMOE_HEADER_ONLY
#include <megamoe/io/whole_tensors.ipp>
#endif
