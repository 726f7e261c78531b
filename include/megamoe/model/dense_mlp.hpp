// SPDX-License-Identifier: Apache-2.0
// megamoe/model/dense_mlp.hpp — the dense FFN of the transformer's non-MoE layers: one expert of
// the grouped FFN on every token (prob 1), so it shares the experts' kernels, activations and
// weight layout (linear_fc1.weight [W1, H] with SwiGLU's gate rows first, linear_fc2.weight [H,
// F]). Under a precision recipe its two GEMMs read the recipe's operands (`Ops`,
// model/linear.hpp's linear_operands_t), as a shared expert's do.
#pragma once

#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/mlp.hpp>
#include <megamoe/model/linear.hpp>
#include <megamoe/model/parameter_layout.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megamoe {

template <class T, expert::activation_function A = expert::activation_function::swiglu,
          class Backend = expert::grouped_gemm, class Ops = expert::exact_operands>
class dense_mlp {
 public:
  static constexpr bool rounds_operands = rounds_operands_v<Ops>;
  /// memory::quantized_weights: both weights are held as the recipe's codes.
  static constexpr bool quantized_weights = holds_weight_codes_v<Ops>;

  dense_mlp(int hidden, int ffn, Ops ops = Ops{})
      : params_(expert::mlp_sizes{1, hidden, ffn, A, false}),
        mlp_(expert::mlp_sizes{1, hidden, ffn, A, false}),
        ops_(std::move(ops)) {}

  /// The recipe's operands (codes kept, delayed-scaling state).
  [[nodiscard]] Ops& operands() noexcept { return ops_; }
  [[nodiscard]] Ops const& operands() const noexcept { return ops_; }
  /// Binds the operands' workspaces to buffers of `f` (before each forward and backward).
  void bind_operands(context& ctx, typename scratch_stack<T>::frame& f) {
    megamoe::bind_operands(ops_, ctx, f);
  }
  /// End of a step for the operands (delayed scaling's amaxes over `replicas`, then histories).
  void end_of_step(parallel::communicator_max const& replicas) {
    if constexpr (rounds_operands) ops_.end_of_step(replicas);
  }

  [[nodiscard]] int hidden() const noexcept { return params_.sizes().hidden; }
  [[nodiscard]] int ffn() const noexcept { return params_.sizes().ffn; }

  /// y [N,H] from x [N,H]; keeps x and the activations for backward.
  void forward(expert::executor<T>& exec, const_row_matrix_map<T> x, row_matrix_map<T> y) {
    if constexpr (quantized_weights)
      if (!holds_weight_codes())
        throw input_error(
            "dense_mlp: memory::quantized_weights: the weights have no codes yet; call "
            "refresh_weight_codes() after writing the weights");
    int const N = static_cast<int>(x.rows());
    x_ = x;
    ones_.assign(static_cast<std::size_t>(N), T(1));
    count_[0] = N;
    fc1_.resize(N, params_.sizes().fc1_rows());
    act_.resize(N, ffn());
    mlp_.forward(exec, params_, rows(), x_.data(), fc1_.data(), act_.data(), y.data(), {}, ops_);
  }

  /// dx [N,H] from dy [N,H] of the last forward; adds the weight gradients.
  void backward(expert::executor<T>& exec, const_row_matrix_map<T> dy, row_matrix_map<T> dx) {
    int const N = static_cast<int>(x_.rows());
    grad_act_.resize(N, ffn());
    grad_fc1_.resize(N, params_.sizes().fc1_rows());
    grad_probs_.resize(static_cast<std::size_t>(N));
    mlp_.backward(exec, params_, rows(), x_.data(), fc1_.data(), act_.data(), dy.data(),
                  grad_act_.data(), grad_fc1_.data(), dx.data(), grad_probs_.data(), {}, ops_);
  }

  void zero_grad() { params_.zero_grad(); }

  /// Sets micro-batch `key`'s kept input and activations aside (core/stash.hpp), or brings them
  /// back.
  void park(std::uint64_t key) { stash_.park(key, x_, fc1_, act_); }
  void restore(std::uint64_t key) { stash_.restore(key, x_, fc1_, act_); }

  // memory::quantized_weights: as causal_attention's projections.
  /// Quantizes both weights from their fp32 values (collective over the operands' amax group).
  void refresh_weight_codes() requires quantized_weights {
    if (!holds_weight_values())
      throw input_error(
          "dense_mlp: refresh_weight_codes() needs the fp32 weights, which an optimizer holds "
          "now");
    store_linear_weight(ops_, expert::linear::fc1, params_.fc1_data(0), fc1_rows(), hidden());
    store_linear_weight(ops_, expert::linear::fc2, params_.fc2_data(0), hidden(), ffn());
  }
  void release_weight_values() requires quantized_weights { params_.release_weights(); }
  [[nodiscard]] bool holds_weight_values() const noexcept { return params_.holds_weights(); }
  [[nodiscard]] bool holds_weight_codes() const requires quantized_weights {
    return holds_linear_weight(ops_, expert::linear::fc1, fc1_rows(), hidden()) &&
           holds_linear_weight(ops_, expert::linear::fc2, hidden(), ffn());
  }
  /// f(name, store) for `prefix.linear_fc1.weight` and `prefix.linear_fc2.weight`, as
  /// for_each_parameter names them; store(w) quantizes the weight from its fp32 values w.
  template <class F>
  void for_each_quantized_weight(std::string const& prefix, F&& f) requires quantized_weights {
    f(std::string_view(prefix + ".linear_fc1.weight"),
      [&](T const* w) { store_linear_weight(ops_, expert::linear::fc1, w, fc1_rows(), hidden()); });
    f(std::string_view(prefix + ".linear_fc2.weight"),
      [&](T const* w) { store_linear_weight(ops_, expert::linear::fc2, w, hidden(), ffn()); });
  }

  /// f(name, value, grad) for `prefix.linear_fc1.weight` and `prefix.linear_fc2.weight`.
  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    report_parameter(f, prefix + ".linear_fc1.weight", params_.fc1(0), params_.grad_fc1(0),
                     expert::fc1_width(A, 1) == 2 ? parameter_cut::swiglu_rows
                                                  : parameter_cut::rows);
    report_parameter(f, prefix + ".linear_fc2.weight", params_.fc2(0), params_.grad_fc2(0),
                     parameter_cut::columns);
  }

 private:
  [[nodiscard]] int fc1_rows() const noexcept { return params_.sizes().fc1_rows(); }
  expert::grouped_rows<T> rows() const {
    return {static_cast<int>(x_.rows()), count_, ones_.data()};
  }

  expert::expert_parameters<T> params_;
  expert::grouped_mlp<A, Backend, T> mlp_;
  Ops ops_;
  row_matrix<T> x_, fc1_, act_, grad_act_, grad_fc1_;
  std::vector<T> ones_, grad_probs_;
  std::array<std::int64_t, 1> count_{};
  activation_stash<row_matrix<T>, row_matrix<T>, row_matrix<T>> stash_;
};

}  // namespace megamoe
