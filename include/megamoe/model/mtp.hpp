// SPDX-License-Identifier: Apache-2.0
// megamoe/model/mtp.hpp — multi-token prediction's parts (model::multi_token_prediction, D
// depths): a depth's own modules, and each depth's ids and targets of a micro-batch. Depth k
// (1-based) joins RMSNorm(embedding of the ids k places ahead) and RMSNorm(depth k - 1's hidden
// state) through eh_proj [H, 2H], runs one layer of the last decoder layer's kind and its own
// final RMSNorm, and predicts the targets k places ahead through the shared output layer
// (transformer.hpp runs it).
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/model/lm_head.hpp>
#include <megamoe/model/norm.hpp>
#include <megamoe/model/sequence_parallel.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace megamoe {

/// An MTP depth's own modules (its layer is a decoder block): enorm and hnorm, eh_proj [H, 2H]
/// (the normed embedding's columns, then the normed hidden state's; whole on every TP rank, each
/// rank's rows adding their part of its gradient), its final norm, its pass of the output layer
/// and the shifted ids it looked up.
template <class T>
struct mtp_depth {
  rms_norm<T> enorm, hnorm, final_norm;
  row_matrix<T> eh_weight, eh_grad;
  int block = 0;  // its layer, among the model's blocks
  cross_entropy_pass<T> pass;
  std::vector<std::int32_t> ids;
  row_matrix<T> normed_embedding, normed_hidden;  // eh_proj's inputs, this rank's rows
  activation_stash<std::vector<std::int32_t>, row_matrix<T>, row_matrix<T>> stash;

  mtp_depth(int hidden, double epsilon, int block_index)
      : enorm(hidden, epsilon),
        hnorm(hidden, epsilon),
        final_norm(hidden, epsilon),
        eh_weight(row_matrix<T>::Zero(hidden, 2 * hidden)),
        eh_grad(row_matrix<T>::Zero(hidden, 2 * hidden)),
        block(block_index) {}
  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    enorm.for_each_parameter(prefix + ".enorm", f);
    hnorm.for_each_parameter(prefix + ".hnorm", f);
    f(prefix + ".eh_proj.weight", view(eh_weight), view(eh_grad));
    final_norm.for_each_parameter(prefix + ".final_layernorm", f);
  }
  void zero_grad() {
    enorm.zero_grad();
    hnorm.zero_grad();
    eh_grad.setZero();
    final_norm.zero_grad();
  }
  void park(std::uint64_t key) {
    stash.park(key, ids, normed_embedding, normed_hidden);
    for (auto* n : {&enorm, &hnorm, &final_norm}) n->park(key);
    pass.park(key);
  }
  void restore(std::uint64_t key) {
    stash.restore(key, ids, normed_embedding, normed_hidden);
    for (auto* n : {&enorm, &hnorm, &final_norm}) n->restore(key);
    pass.restore(key);
  }
};

/// Each of D depths' ids and targets of a micro-batch: the micro-batch's shifted k places left
/// within each sequence (the ids' last k positions 0, the targets' ignored_target), before CP
/// keeps its chunks, so a CP rank's depths see the tokens past its chunk; and the count of each
/// depth's valid targets over the whole micro-batch.
template <int D>
class mtp_inputs {
 public:
  /// Shifts `tokens` and `targets` [S*B] of the whole micro-batch; under CP (cp above 1) keeps
  /// CP rank `cp_rank`'s chunks of them.
  void shift(std::span<std::int32_t const> tokens, std::span<std::int32_t const> targets, int seq,
             int batch, int cp, int cp_rank) {
    if (seq <= D)
      throw input_error("transformer: " + std::to_string(D) +
                        " multi-token prediction depths need sequences longer than " +
                        std::to_string(seq));
    auto const n = static_cast<std::size_t>(seq) * static_cast<std::size_t>(batch);
    for (int k = 1; k <= D; ++k) {
      auto const at = static_cast<std::size_t>(k - 1);
      shifted_ids_.assign(n, 0);
      shifted_targets_.assign(n, ignored_target);
      auto const ahead = static_cast<std::size_t>(k) * static_cast<std::size_t>(batch);
      std::copy(tokens.begin() + static_cast<std::ptrdiff_t>(ahead), tokens.end(),
                shifted_ids_.begin());
      std::copy(targets.begin() + static_cast<std::ptrdiff_t>(ahead), targets.end(),
                shifted_targets_.begin());
      valid_[at] =
          static_cast<double>(std::count_if(shifted_targets_.begin(), shifted_targets_.end(),
                                            [](std::int32_t t) { return t != ignored_target; }));
      if (cp > 1) {
        keep_context_chunks(shifted_ids_, seq, batch, cp, cp_rank, ids_[at]);
        keep_context_chunks(shifted_targets_, seq, batch, cp, cp_rank, targets_[at]);
      } else {
        ids_[at] = shifted_ids_;
        targets_[at] = shifted_targets_;
      }
    }
  }
  /// Depth k's (1-based) ids, targets (this rank's chunks) and valid targets (all of them).
  [[nodiscard]] std::vector<std::int32_t> const& ids(int k) const {
    return ids_[static_cast<std::size_t>(k - 1)];
  }
  [[nodiscard]] std::vector<std::int32_t> const& targets(int k) const {
    return targets_[static_cast<std::size_t>(k - 1)];
  }
  [[nodiscard]] double valid(int k) const { return valid_[static_cast<std::size_t>(k - 1)]; }

 private:
  std::array<std::vector<std::int32_t>, std::max(D, 1)> ids_, targets_;
  std::array<double, std::max(D, 1)> valid_{};
  std::vector<std::int32_t> shifted_ids_, shifted_targets_;
};

}  // namespace megamoe
