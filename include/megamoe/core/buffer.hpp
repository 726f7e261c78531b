// SPDX-License-Identifier: Apache-2.0
// megamoe/core/buffer.hpp — a grow-only aligned buffer with matrix views.
//
// A training step asks for the same sizes every time, so a buffer that only ever grows allocates in
// the first step and never again. Views are Eigen maps over the buffer's memory; a view is valid
// until the next call that asks for more room than the buffer has.
#pragma once

#include <megamoe/core/tensor.hpp>

#include <Eigen/Core>

#include <cstddef>
#include <memory>

namespace megamoe {

template <class T>
class buffer {
 public:
  /// At least `elements` elements; grows (dropping the contents) only when it has fewer. The new
  /// memory is made resident at once (a byte of each page written), so that a buffer reserved
  /// for more than it holds yet takes no new memory when a later step uses more of it.
  T* reserve(std::size_t elements) {
    if (elements > capacity_) {
      data_.reset(static_cast<T*>(Eigen::internal::aligned_malloc(elements * sizeof(T))));
      capacity_ = elements;
      auto* const bytes = reinterpret_cast<unsigned char volatile*>(data_.get());
      for (std::size_t at = 0; at < capacity_ * sizeof(T); at += page_bytes) bytes[at] = 0;
    }
    used_ = elements;
    return data_.get();
  }
  /// A [rows, cols] row-major view of the buffer's first rows*cols elements.
  row_matrix_map<T> matrix(Eigen::Index rows, Eigen::Index cols) {
    return {reserve(static_cast<std::size_t>(rows * cols)), rows, cols};
  }
  [[nodiscard]] T* data() const noexcept { return data_.get(); }
  /// Bytes of the last reservation (what the current contents need).
  [[nodiscard]] std::size_t used_bytes() const noexcept { return used_ * sizeof(T); }
  /// Bytes held.
  [[nodiscard]] std::size_t capacity_bytes() const noexcept { return capacity_ * sizeof(T); }

 private:
  struct free_aligned {
    void operator()(T* p) const noexcept { Eigen::internal::aligned_free(p); }
  };
  static constexpr std::size_t page_bytes = 4096;
  std::unique_ptr<T[], free_aligned> data_;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
};

}  // namespace megamoe
