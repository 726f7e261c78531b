// SPDX-License-Identifier: Apache-2.0
// megamoe/model/embedding.hpp — the token embedding: a row of a [V, H] table per token id, or,
// vocabulary-parallel, of this rank's rows of it (the other ranks' ids give zero rows, which the
// sum over the tensor-parallel group fills).
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/model/parameter_layout.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace megamoe {

template <class T>
class token_embedding {
 public:
  token_embedding(int vocabulary, int hidden)
      : token_embedding(vocabulary_shard::all(vocabulary), hidden) {}
  /// This rank's rows of a vocabulary-parallel table.
  token_embedding(vocabulary_shard shard, int hidden)
      : shard_(shard),
        weight_(row_matrix<T>::Zero(shard.rows, hidden)),
        grad_(row_matrix<T>::Zero(shard.rows, hidden)) {
    if (shard.whole < 1 || hidden < 1 || shard.rows < 0 || shard.first < 0 ||
        (shard.rows > 0 && shard.first + shard.rows > shard.whole))
      throw input_error("token_embedding: vocabulary and hidden size must be positive");
  }

  /// The whole vocabulary (ids are in [0, vocabulary())).
  [[nodiscard]] int vocabulary() const noexcept { return shard_.whole; }
  [[nodiscard]] vocabulary_shard const& shard() const noexcept { return shard_; }
  [[nodiscard]] int hidden() const noexcept { return static_cast<int>(weight_.cols()); }

  /// out [N,H]: the rows of `ids` (each in [0, V); zero rows for ids another rank holds); keeps
  /// the ids for backward.
  void forward(thread_pool& pool, std::span<std::int32_t const> ids, row_matrix_map<T> out);

  /// Adds dy [N,H] into the rows of the last forward's ids this rank holds.
  void backward(thread_pool& pool, const_row_matrix_map<T> dy);

  /// forward() that keeps nothing: for a caller that runs the table on other ids too (the
  /// multi-token prediction's shifted ids) and keeps them itself.
  void lookup(thread_pool& pool, std::span<std::int32_t const> ids, row_matrix_map<T> out) const;
  /// backward() of a lookup of `ids`: dy [N,H] added into the rows of the ids this rank holds,
  /// each row's additions in token order (the pool's threads take disjoint ranges of the rows,
  /// so none is shared).
  void add_gradient(thread_pool& pool, std::span<std::int32_t const> ids,
                    const_row_matrix_map<T> dy);

  void zero_grad() { grad_.setZero(); }
  /// This rank's rows of the table and of its gradient.
  [[nodiscard]] row_matrix<T>& weight() noexcept { return weight_; }
  [[nodiscard]] row_matrix<T>& gradient() noexcept { return grad_; }

  /// Sets micro-batch `key`'s ids aside (core/stash.hpp), or brings them back.
  void park(std::uint64_t key);
  void restore(std::uint64_t key);

  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    report_parameter(f, prefix + ".weight", row_matrix_map<T>(weight_.data(), shard_.rows, hidden()),
                     row_matrix_map<T>(grad_.data(), shard_.rows, hidden()),
                     parameter_cut::vocabulary_rows);
  }

 private:
  vocabulary_shard shard_;
  row_matrix<T> weight_, grad_;
  std::vector<std::int32_t> ids_;
  activation_stash<std::vector<std::int32_t>> stash_;
};

// Defined outside the class, these members are not inline: a program built with
// MEGAMOE_SEPARATE_COMPILATION compiles them once for float and double (model/embedding.ipp).
template <class T>
void token_embedding<T>::forward(thread_pool& pool, std::span<std::int32_t const> ids,
                                 row_matrix_map<T> out) {
  lookup(pool, ids, out);
  ids_.assign(ids.begin(), ids.end());
}

template <class T>
void token_embedding<T>::backward(thread_pool& pool, const_row_matrix_map<T> dy) {
  if (dy.rows() != std::ssize(ids_) || dy.cols() != hidden())
    throw input_error("token_embedding: gradient shape does not match the last forward");
  add_gradient(pool, ids_, dy);
}

template <class T>
void token_embedding<T>::lookup(thread_pool& pool, std::span<std::int32_t const> ids,
                                row_matrix_map<T> out) const {
  for (std::int32_t id : ids)
    if (id < 0 || id >= vocabulary())
      throw input_error("token_embedding: token id " + std::to_string(id) +
                        " outside the vocabulary of " + std::to_string(vocabulary()));
  if (out.rows() != std::ssize(ids) || out.cols() != hidden())
    throw input_error("token_embedding: output shape does not match the ids");
  parallel_rows(pool, static_cast<int>(ids.size()), [&](int begin, int end) {
    for (int t = begin; t < end; ++t) {
      std::int32_t const id = ids[static_cast<std::size_t>(t)];
      if (shard_.holds(id))
        out.row(t) = weight_.row(id - shard_.first);
      else
        out.row(t).setZero();
    }
  });
}

template <class T>
void token_embedding<T>::add_gradient(thread_pool& pool, std::span<std::int32_t const> ids,
                                      const_row_matrix_map<T> dy) {
  if (dy.rows() != std::ssize(ids) || dy.cols() != hidden())
    throw input_error("token_embedding: gradient shape does not match the ids");
  parallel_rows(pool, shard_.rows, [&](int first, int last) {
    for (std::size_t t = 0; t < ids.size(); ++t) {
      int const row = ids[t] - shard_.first;
      if (row >= first && row < last) grad_.row(row) += dy.row(static_cast<Eigen::Index>(t));
    }
  });
}

template <class T>
void token_embedding<T>::park(std::uint64_t key) {
  stash_.park(key, ids_);
}

template <class T>
void token_embedding<T>::restore(std::uint64_t key) {
  stash_.restore(key, ids_);
}

#if !MEGAMOE_HEADER_ONLY
extern template class token_embedding<float>;
extern template class token_embedding<double>;
#endif

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/embedding.ipp>
#endif
