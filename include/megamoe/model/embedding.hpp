// SPDX-License-Identifier: Apache-2.0
// megamoe/model/embedding.hpp — the token embedding: a row of a [V, H] table per token id.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace megamoe {

template <class T>
class token_embedding {
 public:
  token_embedding(int vocabulary, int hidden)
      : weight_(row_matrix<T>::Zero(vocabulary, hidden)),
        grad_(row_matrix<T>::Zero(vocabulary, hidden)) {
    if (vocabulary < 1 || hidden < 1)
      throw input_error("token_embedding: vocabulary and hidden size must be positive");
  }

  [[nodiscard]] int vocabulary() const noexcept { return static_cast<int>(weight_.rows()); }
  [[nodiscard]] int hidden() const noexcept { return static_cast<int>(weight_.cols()); }

  /// out [N,H]: the rows of `ids` (each in [0, V)); keeps the ids for backward.
  void forward(thread_pool& pool, std::span<std::int32_t const> ids, row_matrix_map<T> out) {
    for (std::int32_t id : ids)
      if (id < 0 || id >= vocabulary())
        throw input_error("token_embedding: token id " + std::to_string(id) +
                          " outside the vocabulary of " + std::to_string(vocabulary()));
    if (out.rows() != std::ssize(ids) || out.cols() != hidden())
      throw input_error("token_embedding: output shape does not match the ids");
    ids_.assign(ids.begin(), ids.end());
    parallel_rows(pool, static_cast<int>(ids.size()), [&](int begin, int end) {
      for (int t = begin; t < end; ++t) out.row(t) = weight_.row(ids_[static_cast<std::size_t>(t)]);
    });
  }

  /// Adds dy [N,H] into the rows of the last forward's ids, each row's additions in token order
  /// (the pool's threads take disjoint ranges of the vocabulary, so no row is shared).
  void backward(thread_pool& pool, const_row_matrix_map<T> dy) {
    if (dy.rows() != std::ssize(ids_) || dy.cols() != hidden())
      throw input_error("token_embedding: gradient shape does not match the last forward");
    parallel_rows(pool, vocabulary(), [&](int first, int last) {
      for (std::size_t t = 0; t < ids_.size(); ++t)
        if (ids_[t] >= first && ids_[t] < last)
          grad_.row(ids_[t]) += dy.row(static_cast<Eigen::Index>(t));
    });
  }

  void zero_grad() { grad_.setZero(); }

  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    f(prefix + ".weight", row_matrix_map<T>(weight_.data(), vocabulary(), hidden()),
      row_matrix_map<T>(grad_.data(), vocabulary(), hidden()));
  }

 private:
  row_matrix<T> weight_, grad_;
  std::vector<std::int32_t> ids_;
};

}  // namespace megamoe
