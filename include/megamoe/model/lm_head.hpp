// SPDX-License-Identifier: Apache-2.0
// megamoe/model/lm_head.hpp — the output layer and the cross-entropy loss.
//
//   logits = h W^T   (W: output_layer.weight [V, H])
//   loss   = mean over tokens of  log sum_v exp(logits_v) - logits_target
//   dlogits = (softmax(logits) - onehot(target)) / N, scaled by the caller's loss scale
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/model/products.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace megamoe {

template <class T>
class lm_head {
 public:
  lm_head(int hidden, int vocabulary)
      : weight_(row_matrix<T>::Zero(vocabulary, hidden)),
        grad_(row_matrix<T>::Zero(vocabulary, hidden)) {
    if (vocabulary < 1 || hidden < 1)
      throw input_error("lm_head: vocabulary and hidden size must be positive");
  }

  [[nodiscard]] int vocabulary() const noexcept { return static_cast<int>(weight_.rows()); }
  [[nodiscard]] int hidden() const noexcept { return static_cast<int>(weight_.cols()); }

  /// Logits [N, V] of h [N, H] (for sampling; keeps nothing for backward).
  row_matrix<T> const& logits(const_row_matrix_map<T> h) {
    require(h);
    logits_.noalias() = h * weight_.transpose();
    return logits_;
  }

  /// The mean cross-entropy (nats per token) of `targets` under softmax(h W^T); keeps h and the
  /// probabilities for backward. Accumulated in double.
  double forward(expert::executor<T>& exec, const_row_matrix_map<T> h,
                 std::span<std::int32_t const> targets) {
    auto& pool = exec.pool();
    require(h);
    if (std::ssize(targets) != h.rows())
      throw input_error("lm_head: " + std::to_string(targets.size()) + " targets for " +
                        std::to_string(h.rows()) + " tokens");
    for (std::int32_t id : targets)
      if (id < 0 || id >= vocabulary())
        throw input_error("lm_head: target " + std::to_string(id) + " outside the vocabulary of " +
                          std::to_string(vocabulary()));
    h_ = h;
    targets_.assign(targets.begin(), targets.end());
    int const N = static_cast<int>(h.rows()), V = vocabulary(), H = hidden();
    logits_.resize(N, V);
    threaded_product<expert::gemm_op::nt>(exec, N, V, H, h_.data(), H, weight_.data(), H,
                                          logits_.data(), V);
    token_loss_.resize(targets.size());
    parallel_rows(pool, static_cast<int>(h.rows()), [&](int begin, int end) {
      for (int t = begin; t < end; ++t) {
        auto row = logits_.row(t);
        T const top = row.maxCoeff();
        row = (row.array() - top).exp();
        double const sum = row.template cast<double>().sum();
        auto const target = targets_[static_cast<std::size_t>(t)];
        token_loss_[static_cast<std::size_t>(t)] =
            std::log(sum) - std::log(static_cast<double>(row(target)));
        row /= static_cast<T>(sum);  // now the probabilities
      }
    });
    double total = 0.0;
    for (double l : token_loss_) total += l;
    return targets.empty() ? 0.0 : total / static_cast<double>(targets.size());
  }

  /// Each token's loss from the last forward (nats).
  [[nodiscard]] std::span<double const> token_losses() const noexcept { return token_loss_; }

  /// dh [N, H] = scale * d(mean loss)/dh; adds scale * d(mean loss)/dW to the weight gradient.
  void backward(expert::executor<T>& exec, T scale, row_matrix_map<T> dh) {
    auto& pool = exec.pool();
    if (dh.rows() != h_.rows() || dh.cols() != hidden())
      throw input_error("lm_head: gradient shape does not match the last forward");
    T const per_token = targets_.empty() ? T(0) : scale / static_cast<T>(targets_.size());
    parallel_rows(pool, static_cast<int>(h_.rows()), [&](int begin, int end) {
      for (int t = begin; t < end; ++t) {
        logits_(t, targets_[static_cast<std::size_t>(t)]) -= T(1);
        logits_.row(t) *= per_token;
      }
    });
    int const N = static_cast<int>(h_.rows()), V = vocabulary(), H = hidden();
    threaded_product<expert::gemm_op::tn>(exec, V, H, N, logits_.data(), V, h_.data(), H,
                                          grad_.data(), H, true);
    threaded_product<expert::gemm_op::nn>(exec, N, H, V, logits_.data(), V, weight_.data(), H,
                                          dh.data(), static_cast<int>(dh.outerStride()));
  }

  void zero_grad() { grad_.setZero(); }

  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    f(prefix + ".weight", row_matrix_map<T>(weight_.data(), vocabulary(), hidden()),
      row_matrix_map<T>(grad_.data(), vocabulary(), hidden()));
  }

 private:
  void require(const_row_matrix_map<T> const& h) const {
    if (h.cols() != hidden())
      throw input_error("lm_head: input has " + std::to_string(h.cols()) + " columns, expected " +
                        std::to_string(hidden()));
  }

  row_matrix<T> weight_, grad_;
  row_matrix<T> h_, logits_;
  std::vector<std::int32_t> targets_;
  std::vector<double> token_loss_;
};

}  // namespace megamoe
