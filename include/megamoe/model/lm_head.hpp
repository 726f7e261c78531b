// SPDX-License-Identifier: Apache-2.0
// megamoe/model/lm_head.hpp — the output layer and the cross-entropy loss.
//
//   logits = h W^T   (W: output_layer.weight [V, H])
//   loss   = mean over tokens of  log sum_v exp(logits_v) - logits_target
//   dlogits = (softmax(logits) - onehot(target)) / N, scaled by the caller's loss scale
//             (N: the tokens whose target is not ignored)
//
// A pass (`cross_entropy_pass`) holds what one forward keeps for its backward, so one output
// layer serves several passes over other hidden states and targets (multi-token prediction's
// depths share it). A pass's targets may be `ignored_target`, which add no loss and no gradient,
// and its loss is the sum over the others divided by a divisor the caller gives (the number of
// valid targets of the whole micro-batch, when the rows are a part of it).
//
// The logits exist a block of rows at a time (forward keeps each row's log-sum-exp; backward
// forms the block again), so training never holds [N, V] of them.
//
// Vocabulary-parallel (a `vocabulary_shard` and the tensor-parallel group): each rank holds the
// weight rows of its ids and forms only their logits; the ids of the padding beyond the
// vocabulary have no rows, so their logits are masked by not existing. Per block, the ranks
// all-gather each row's (log-sum-exp of its logits, target logit where it holds the target) and
// combine them, so every rank has every token's loss; backward gives this rank's part of dh,
// which the group sums (the caller's reduce-scatter).
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/model/embedding.hpp>
#include <megamoe/model/parameter_layout.hpp>
#include <megamoe/model/products.hpp>
#include <megamoe/parallel/collectives.hpp>

#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace megamoe {

/// A target that adds no loss and no gradient (multi-token prediction's last positions).
inline constexpr std::int32_t ignored_target = -1;

/// What one pass of the output layer keeps from forward to backward: the hidden states, the
/// targets, each row's loss and log-sum-exp, and the divisor of the summed loss.
template <class T>
struct cross_entropy_pass {
  row_matrix<T> h;
  std::vector<std::int32_t> targets;
  std::vector<double> token_loss, log_sum_exp;
  double divisor = 1.0;

  /// Sets micro-batch `key`'s kept values aside (core/stash.hpp), or brings them back.
  void park(std::uint64_t key);
  void restore(std::uint64_t key);
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return static_cast<std::size_t>(h.size()) * sizeof(T) + targets.size() * sizeof(std::int32_t) +
           (token_loss.size() + log_sum_exp.size()) * sizeof(double);
  }

  activation_stash<row_matrix<T>, std::vector<std::int32_t>, std::vector<double>,
                   std::vector<double>, double>
      stash;
};

template <class T>
class lm_head {
 public:
  /// Logits are formed `block_logits` at a time at most (rows of V): about 1 MiB of fp32 by
  /// default, whatever the vocabulary, and at least one row.
  lm_head(int hidden, int vocabulary, std::int64_t block_logits = std::int64_t{1} << 18)
      : lm_head(hidden, vocabulary_shard::all(vocabulary), nullptr, block_logits) {}
  /// Vocabulary-parallel over `tp` (kept by reference): this rank's rows of the output layer.
  lm_head(int hidden, vocabulary_shard shard, boost::mpi::communicator const* tp,
          std::int64_t block_logits = std::int64_t{1} << 18)
      : shard_(shard),
        tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
        weight_(row_matrix<T>::Zero(shard.rows, hidden)),
        grad_(row_matrix<T>::Zero(shard.rows, hidden)),
        block_logits_(block_logits) {
    if (shard.whole < 1 || hidden < 1 || block_logits < 1 || shard.rows < 0 ||
        (tp_ == nullptr && shard.rows != shard.whole))
      throw input_error("lm_head: vocabulary, hidden size and block size must be positive");
  }

  /// The whole vocabulary (targets are in [0, vocabulary())).
  [[nodiscard]] int vocabulary() const noexcept { return shard_.whole; }
  [[nodiscard]] vocabulary_shard const& shard() const noexcept { return shard_; }
  [[nodiscard]] int hidden() const noexcept { return static_cast<int>(weight_.cols()); }

  /// Logits [N, rows] of h [N, H] for this rank's ids (for sampling; keeps nothing).
  row_matrix<T> const& logits(const_row_matrix_map<T> h);

  /// The mean cross-entropy (nats per token) of `targets` under softmax(h W^T) over the targets
  /// that are not ignored_target, accumulated in double. Keeps h and each row's log-sum-exp for
  /// backward, never the [N, V] logits: they are formed a block of rows at a time and formed
  /// again in backward.
  double forward(expert::executor<T>& exec, const_row_matrix_map<T> h,
                 std::span<std::int32_t const> targets);
  /// The same, the sum divided by `divisor` (under CP: the micro-batch's counted targets over
  /// CP, so that the CP ranks' losses add up to the mean over the whole sequences).
  double forward(expert::executor<T>& exec, const_row_matrix_map<T> h,
                 std::span<std::int32_t const> targets, double divisor) {
    return forward(exec, main_, h, targets, divisor);
  }
  /// One pass: the cross-entropy of the targets that are not ignored_target, summed and divided
  /// by `divisor`; `pass` keeps what backward needs.
  double forward(expert::executor<T>& exec, cross_entropy_pass<T>& pass, const_row_matrix_map<T> h,
                 std::span<std::int32_t const> targets, double divisor);

  /// Each token's loss from the last forward (nats).
  [[nodiscard]] std::span<double const> token_losses() const noexcept { return main_.token_loss; }

  /// dh [N, H] = scale * d(mean loss)/dh; adds scale * d(mean loss)/dW to the weight gradient.
  /// Block by block: the logits again, (softmax - onehot) * scale / N in their place (zero on
  /// ignored rows), then both products.
  void backward(expert::executor<T>& exec, T scale, row_matrix_map<T> dh);
  /// The same for `pass`: (softmax - onehot) * scale / divisor on the rows whose target is not
  /// ignored, zero on the others.
  void backward(expert::executor<T>& exec, cross_entropy_pass<T> const& pass, T scale,
                row_matrix_map<T> dh);

  void zero_grad() { grad_.setZero(); }

  /// Sets micro-batch `key`'s kept hidden states, targets and log-sum-exps aside
  /// (core/stash.hpp), or brings them back.
  void park(std::uint64_t key);
  void restore(std::uint64_t key);

  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    report_parameter(f, prefix + ".weight", row_matrix_map<T>(weight_.data(), shard_.rows, hidden()),
                     row_matrix_map<T>(grad_.data(), shard_.rows, hidden()),
                     parameter_cut::vocabulary_rows);
  }

 private:
  void require(const_row_matrix_map<T> const& h) const {
    if (h.cols() != hidden())
      throw input_error("lm_head: input has " + std::to_string(h.cols()) + " columns, expected " +
                        std::to_string(hidden()));
  }

  /// Every rank's (log-sum-exp, target logit) of each of the block's rows, combined: the
  /// log-sum-exp over all ranks' logits and the target's logit (one rank holds it).
  void combine_over_ranks(int rows);

  /// body(first, rows) for consecutive blocks of at most block_logits_ / (part rows) rows (the
  /// same blocks on every rank of the group).
  template <class Body>
  void for_each_block(int n, Body&& body) {
    auto const per_block = static_cast<int>(
        std::clamp<std::int64_t>(block_logits_ / std::max(1, shard_.part_rows), 1, std::max(1, n)));
    block_.resize(per_block, shard_.rows);
    for (int first = 0; first < n; first += per_block) body(first, std::min(per_block, n - first));
  }

  /// block_ rows [0, rows) = h rows [first, first + rows) W^T.
  void form_logits(expert::executor<T>& exec, row_matrix<T> const& h, int first, int rows);

  vocabulary_shard shard_;
  boost::mpi::communicator const* tp_ = nullptr;  // null: the whole vocabulary here
  row_matrix<T> weight_, grad_;
  std::int64_t block_logits_;
  cross_entropy_pass<T> main_;  // the pass of forward() and backward() without one
  row_matrix<T> block_, logits_;
  std::vector<double> stats_, gathered_;  // per row (log-sum-exp, target logit); every rank's
  std::vector<std::int64_t> rows_per_rank_;
};

// Defined outside the classes, these members are not inline: a program built with
// MEGAMOE_SEPARATE_COMPILATION compiles them once for float and double (model/lm_head.ipp).
template <class T>
void cross_entropy_pass<T>::park(std::uint64_t key) {
  stash.park(key, h, targets, token_loss, log_sum_exp, divisor);
}

template <class T>
void cross_entropy_pass<T>::restore(std::uint64_t key) {
  stash.restore(key, h, targets, token_loss, log_sum_exp, divisor);
}

template <class T>
row_matrix<T> const& lm_head<T>::logits(const_row_matrix_map<T> h) {
  require(h);
  logits_.noalias() = h * weight_.transpose();
  return logits_;
}

template <class T>
double lm_head<T>::forward(expert::executor<T>& exec, const_row_matrix_map<T> h,
                           std::span<std::int32_t const> targets) {
  auto const valid = std::count_if(targets.begin(), targets.end(),
                                   [](std::int32_t id) { return id != ignored_target; });
  return forward(exec, main_, h, targets, static_cast<double>(std::max<std::ptrdiff_t>(1, valid)));
}

template <class T>
double lm_head<T>::forward(expert::executor<T>& exec, cross_entropy_pass<T>& pass,
                           const_row_matrix_map<T> h, std::span<std::int32_t const> targets,
                           double divisor) {
  require(h);
  if (std::ssize(targets) != h.rows())
    throw input_error("lm_head: " + std::to_string(targets.size()) + " targets for " +
                      std::to_string(h.rows()) + " tokens");
  for (std::int32_t id : targets)
    if ((id < 0 && id != ignored_target) || id >= vocabulary())
      throw input_error("lm_head: target " + std::to_string(id) + " outside the vocabulary of " +
                        std::to_string(vocabulary()));
  if (!(divisor > 0.0)) throw input_error("lm_head: the loss's divisor must be positive");
  pass.h = h;
  pass.targets.assign(targets.begin(), targets.end());
  pass.divisor = divisor;
  auto const& kept = pass.targets;
  int const N = static_cast<int>(h.rows());
  pass.token_loss.resize(targets.size());
  pass.log_sum_exp.resize(targets.size());
  for_each_block(N, [&](int first, int rows) {
    // Per row: the log-sum-exp of this rank's logits and the target's logit where it holds it.
    stats_.resize(2 * static_cast<std::size_t>(rows));
    if (shard_.rows > 0) form_logits(exec, pass.h, first, rows);
    parallel_rows(exec.pool(), rows, [&](int begin, int end) {
      for (int r = begin; r < end; ++r) {
        auto const t = static_cast<std::size_t>(first + r);
        auto const at = 2 * static_cast<std::size_t>(r);
        if (shard_.rows == 0) {
          stats_[at] = -std::numeric_limits<double>::infinity();
          stats_[at + 1] = 0.0;
          continue;
        }
        auto const row = block_.row(r);
        T const top = row.maxCoeff();
        double const sum = (row.array() - top).exp().template cast<double>().sum();
        stats_[at] = static_cast<double>(top) + std::log(sum);
        stats_[at + 1] =
            shard_.holds(kept[t]) ? static_cast<double>(row(kept[t] - shard_.first)) : 0.0;
      }
    });
    if (tp_ != nullptr) combine_over_ranks(rows);
    for (int r = 0; r < rows; ++r) {
      auto const t = static_cast<std::size_t>(first + r);
      pass.log_sum_exp[t] = stats_[2 * static_cast<std::size_t>(r)];
      pass.token_loss[t] = kept[t] == ignored_target
                               ? 0.0
                               : pass.log_sum_exp[t] - stats_[2 * static_cast<std::size_t>(r) + 1];
    }
  });
  double total = 0.0;
  for (double l : pass.token_loss) total += l;
  return total / divisor;
}

template <class T>
void lm_head<T>::backward(expert::executor<T>& exec, T scale, row_matrix_map<T> dh) {
  backward(exec, main_, scale, dh);
}

template <class T>
void lm_head<T>::backward(expert::executor<T>& exec, cross_entropy_pass<T> const& pass, T scale,
                          row_matrix_map<T> dh) {
  if (dh.rows() != pass.h.rows() || dh.cols() != hidden())
    throw input_error("lm_head: gradient shape does not match the last forward");
  int const N = static_cast<int>(pass.h.rows()), V = shard_.rows, H = hidden();
  T const per_token = static_cast<T>(static_cast<double>(scale) / pass.divisor);
  if (V == 0) {  // no ids here: no part of dh
    dh.setZero();
    return;
  }
  auto const& kept = pass.targets;
  for_each_block(N, [&](int first, int rows) {
    form_logits(exec, pass.h, first, rows);
    parallel_rows(exec.pool(), rows, [&](int begin, int end) {
      for (int r = begin; r < end; ++r) {
        auto const t = static_cast<std::size_t>(first + r);
        auto row = block_.row(r);
        if (kept[t] == ignored_target) {
          row.setZero();
          continue;
        }
        T const lse = static_cast<T>(pass.log_sum_exp[t]);
        row = (row.array() - lse).exp() * per_token;
        if (shard_.holds(kept[t])) row(kept[t] - shard_.first) -= per_token;
      }
    });
    threaded_product<expert::gemm_op::tn>(exec, V, H, rows, block_.data(), V,
                                          pass.h.row(first).data(), H, grad_.data(), H, true);
    threaded_product<expert::gemm_op::nn>(exec, rows, H, V, block_.data(), V, weight_.data(), H,
                                          dh.row(first).data(), static_cast<int>(dh.outerStride()));
  });
}

template <class T>
void lm_head<T>::park(std::uint64_t key) {
  main_.park(key);
}

template <class T>
void lm_head<T>::restore(std::uint64_t key) {
  main_.restore(key);
}

template <class T>
void lm_head<T>::combine_over_ranks(int rows) {
  int const ranks = tp_->size();
  rows_per_rank_.assign(static_cast<std::size_t>(ranks), rows);
  gathered_.resize(stats_.size() * static_cast<std::size_t>(ranks));
  parallel::all_gather_v(*tp_, stats_.data(), gathered_.data(),
                         std::span<std::int64_t const>(rows_per_rank_), 2);
  for (int r = 0; r < rows; ++r) {
    double top = -std::numeric_limits<double>::infinity(), target = 0.0;
    for (int k = 0; k < ranks; ++k) top = std::max(top, gathered_[2 * std::size_t(k * rows + r)]);
    double sum = 0.0;
    for (int k = 0; k < ranks; ++k) {
      auto const at = 2 * std::size_t(k * rows + r);
      sum += std::exp(gathered_[at] - top);
      target += gathered_[at + 1];
    }
    stats_[2 * std::size_t(r)] = top + std::log(sum);
    stats_[2 * std::size_t(r) + 1] = target;
  }
}

template <class T>
void lm_head<T>::form_logits(expert::executor<T>& exec, row_matrix<T> const& h, int first,
                             int rows) {
  int const V = shard_.rows, H = hidden();
  threaded_product<expert::gemm_op::nt>(exec, rows, V, H, h.row(first).data(), H, weight_.data(), H,
                                        block_.data(), V);
}

#if !MEGAMOE_HEADER_ONLY
extern template struct cross_entropy_pass<float>;
extern template struct cross_entropy_pass<double>;
extern template class lm_head<float>;
extern template class lm_head<double>;
#endif

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/lm_head.ipp>
#endif
