// SPDX-License-Identifier: Apache-2.0
// megamoe/model/mtp.hpp — multi-token prediction's parts (model::multi_token_prediction, D
// depths): a depth's own modules, and each depth's ids and targets of a micro-batch. Depth k
// (1-based) joins RMSNorm(embedding of the ids k places ahead) and RMSNorm(depth k - 1's hidden
// state) through eh_proj [H, 2H], runs one layer of the last decoder layer's kind and its own
// final RMSNorm, and predicts the targets k places ahead through the shared output layer.
// mtp_stack runs the depths' passes on the output layer's stage; the transformer gives it the
// residual stream, the embedding, the output layer and how to run a depth's layer.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/model/embedding.hpp>
#include <megamoe/model/lm_head.hpp>
#include <megamoe/model/norm.hpp>
#include <megamoe/model/parameter_layout.hpp>
#include <megamoe/model/products.hpp>
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
    report_parameter(f, prefix + ".eh_proj.weight", view(eh_weight), view(eh_grad),
                     parameter_cut::whole);
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

/// The D depths of the output layer's stage and their passes. A depth's layer is one of the
/// model's blocks (mtp_depth::block); the transformer runs it forward and backward.
template <class T, int D>
class mtp_stack {
 public:
  [[nodiscard]] int size() const noexcept { return static_cast<int>(depths_.size()); }
  void add_depth(int hidden, double epsilon, int block) { depths_.emplace_back(hidden, epsilon, block); }
  /// Depth k's (1-based) modules.
  [[nodiscard]] mtp_depth<T>& depth(int k) { return depths_.at(static_cast<std::size_t>(k - 1)); }
  [[nodiscard]] mtp_depth<T> const& depth(int k) const {
    return depths_.at(static_cast<std::size_t>(k - 1));
  }
  [[nodiscard]] mtp_inputs<D>& inputs() noexcept { return inputs_; }
  /// The gradient of the decoder's normed output that the depths' backward leaves.
  [[nodiscard]] row_matrix<T> const& carry() const noexcept { return carry_; }

  /// Forward from the decoder's normed output (s.normed, this rank's rows); run_layer(block) runs
  /// a depth's layer on s. Depth k's loss is its valid targets' summed cross-entropy over the whole
  /// micro-batch's valid shifted targets per CP rank (B (S - k) / CP without ignored targets), so
  /// the mean over CP ranks is one rank's. Returns the mean over the depths of their losses.
  template <class Stream, class RunLayer>
  double forward(context& ctx, Stream& s, token_embedding<T>& embedding, lm_head<T>& head, int cp,
                 RunLayer&& run_layer) {
    auto& pool = ctx.pool();
    int const rows = static_cast<int>(s.residual.rows()), H = static_cast<int>(s.residual.cols());
    double loss = 0.0;
    for (int k = 1; k <= D; ++k) {
      auto& d = depth(k);
      d.ids = inputs_.ids(k);
      ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
        embedding_rows_.resize(rows, H);
        embedding.lookup(pool, d.ids, s.whole_output(embedding_rows_));
        s.sp.sum_to_my_rows(view(embedding_rows_));
      });
      ctx.step_stages.time(step_stage::norms_residuals, [&] {
        d.normed_embedding.resize(rows, H);
        d.normed_hidden.resize(rows, H);
        d.enorm.forward(pool, const_view(embedding_rows_), view(d.normed_embedding));
        d.hnorm.forward(pool, const_view(s.normed), view(d.normed_hidden));
        // eh_proj: the embedding's half of its columns, then the hidden state's, added.
        auto& exec = ctx.executor<T>();
        s.residual.resize(rows, H);
        threaded_product<expert::gemm_op::nt>(exec, rows, H, H, d.normed_embedding.data(), H,
                                              d.eh_weight.data(), 2 * H, s.residual.data(), H);
        threaded_product<expert::gemm_op::nt>(exec, rows, H, H, d.normed_hidden.data(), H,
                                              d.eh_weight.data() + H, 2 * H, s.residual.data(), H,
                                              true);
      });
      s.pending = nullptr;
      run_layer(d.block);
      s.norm_of_residual(ctx, d.final_norm);
      ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
        double const divisor = std::max(1.0, inputs_.valid(k)) / cp;
        loss += head.forward(ctx.executor<T>(), d.pass, s.sp.all_rows(const_view(s.normed)),
                             inputs_.targets(k), divisor) /
                D;
      });
    }
    return loss;
  }

  /// Backward, the last depth first, each from its loss times `weight` (the step's scale x
  /// mtp_loss_scaling_factor / D), with s.grad and s.grad_normed sized; backward_layer(block) runs
  /// a depth's layer backward from s.grad. Leaves the gradient of the decoder's normed output in
  /// carry() and adds into the embedding's and every MTP weight's gradient.
  template <class Stream, class BackwardLayer>
  void backward(context& ctx, Stream& s, token_embedding<T>& embedding, lm_head<T>& head, T weight,
                BackwardLayer&& backward_layer) {
    auto& pool = ctx.pool();
    int const rows = static_cast<int>(s.grad.rows()), H = static_cast<int>(s.grad.cols());
    carry_.resize(rows, H);
    grad_embedding_.resize(rows, H);
    grad_hidden_.resize(rows, H);
    for (int k = D; k >= 1; --k) {
      auto& d = depth(k);
      ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
        head.backward(ctx.executor<T>(), d.pass, weight, s.whole_output(s.grad_normed));
        s.sp.sum_to_my_rows(view(s.grad_normed));
      });
      ctx.step_stages.time(step_stage::norms_residuals, [&] {
        if (k < D) s.grad_normed += carry_;  // from depth k + 1's hnorm
        d.final_norm.backward(pool, const_view(s.grad_normed), view(s.grad));
      });
      backward_layer(d.block);  // s.grad: the gradient of eh_proj's output
      ctx.step_stages.time(step_stage::norms_residuals, [&] {
        auto& exec = ctx.executor<T>();
        using expert::gemm_op;
        T* const w = d.eh_weight.data();
        T* const g = d.eh_grad.data();
        T const* const dy = s.grad.data();
        threaded_product<gemm_op::nn>(exec, rows, H, H, dy, H, w, 2 * H, grad_embedding_.data(), H);
        threaded_product<gemm_op::nn>(exec, rows, H, H, dy, H, w + H, 2 * H, grad_hidden_.data(), H);
        threaded_product<gemm_op::tn>(exec, H, H, rows, dy, H, d.normed_embedding.data(), H, g,
                                      2 * H, true);
        threaded_product<gemm_op::tn>(exec, H, H, rows, dy, H, d.normed_hidden.data(), H, g + H,
                                      2 * H, true);
        d.enorm.backward(pool, const_view(grad_embedding_), view(grad_embedding_));
        d.hnorm.backward(pool, const_view(grad_hidden_), view(carry_));
      });
      ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
        embedding.add_gradient(pool, d.ids, s.sp.all_gradient_rows(const_view(grad_embedding_)));
      });
    }
  }

  template <class F>
  void for_each_depth(F&& f) {
    for (auto& d : depths_) f(d);
  }

 private:
  std::vector<mtp_depth<T>> depths_;
  mtp_inputs<D> inputs_;
  row_matrix<T> embedding_rows_, grad_embedding_, grad_hidden_, carry_;
};

}  // namespace megamoe
