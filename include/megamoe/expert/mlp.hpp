// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/mlp.hpp — the routed experts' FFN over permuted rows: parameters, forward and
// backward, on any GEMM backend.
//
// Rows arrive grouped by expert (rows of expert 0, then expert 1, ...), each with its routing prob.
// For the rows x_e of expert e, as the reference's grouped MLP (docs/spec §4, §5):
//   h  = x_e W1_e^T + b1_e                 fc1       [n_e, W1]  (W1 = 2F for SwiGLU, else F)
//   ap = act(h) * p                        prob after the activation, before fc2   [n_e, F]
//   y  = ap W2_e^T + p b2_e                fc2       [n_e, H]   (fc2's bias is scaled by p too)
// Backward gives d(x rows), d(p) per row, and adds every weight gradient into the parameters'
// gradient buffers. Buffers are the caller's: nothing here allocates once its per-expert lists
// have grown.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/expert/activation.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/gemm.hpp>
#include <megamoe/expert/tags.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace megamoe::expert {

/// The sizes of a set of experts.
struct mlp_sizes {
  int experts = 1;
  int hidden = 0;
  int ffn = 0;
  activation_function activation = activation_function::swiglu;
  bool bias = false;
  [[nodiscard]] constexpr int fc1_rows() const { return fc1_width(activation, ffn); }
  friend constexpr bool operator==(mlp_sizes const&, mlp_sizes const&) = default;
};

/// Weights and their gradients for E experts, stored [out, in] as the reference's linear layers
/// (linear_fc1.weight{e} is [W1, H], linear_fc2.weight{e} is [H, F]), each kind in one contiguous
/// block so that a grouped product reaches any expert by offset.
template <class T>
class expert_parameters {
 public:
  explicit expert_parameters(mlp_sizes const& sizes) : sizes_(sizes) {
    if (sizes.experts < 1 || sizes.hidden < 1 || sizes.ffn < 1)
      throw input_error("experts need experts, hidden and ffn sizes of at least 1");
    auto const e = static_cast<std::size_t>(sizes.experts);
    fc1_.assign(e * fc1_size(), T(0));
    fc2_.assign(e * fc2_size(), T(0));
    grad_fc1_.assign(fc1_.size(), T(0));
    grad_fc2_.assign(fc2_.size(), T(0));
    if (sizes.bias) {
      fc1_bias_.assign(e * static_cast<std::size_t>(sizes.fc1_rows()), T(0));
      fc2_bias_.assign(e * static_cast<std::size_t>(sizes.hidden), T(0));
      grad_fc1_bias_.assign(fc1_bias_.size(), T(0));
      grad_fc2_bias_.assign(fc2_bias_.size(), T(0));
    }
  }

  [[nodiscard]] mlp_sizes const& sizes() const noexcept { return sizes_; }

  [[nodiscard]] row_matrix_map<T> fc1(int e) { return {fc1_.data() + e * fc1_size(), w1(), h()}; }
  [[nodiscard]] row_matrix_map<T> fc2(int e) { return {fc2_.data() + e * fc2_size(), h(), f()}; }
  [[nodiscard]] row_matrix_map<T> grad_fc1(int e) {
    return {grad_fc1_.data() + e * fc1_size(), w1(), h()};
  }
  [[nodiscard]] row_matrix_map<T> grad_fc2(int e) {
    return {grad_fc2_.data() + e * fc2_size(), h(), f()};
  }
  /// Biases as [1, n] rows (empty maps without biases).
  [[nodiscard]] row_matrix_map<T> fc1_bias(int e) { return bias_row(fc1_bias_, e, w1()); }
  [[nodiscard]] row_matrix_map<T> fc2_bias(int e) { return bias_row(fc2_bias_, e, h()); }
  [[nodiscard]] row_matrix_map<T> grad_fc1_bias(int e) { return bias_row(grad_fc1_bias_, e, w1()); }
  [[nodiscard]] row_matrix_map<T> grad_fc2_bias(int e) { return bias_row(grad_fc2_bias_, e, h()); }

  [[nodiscard]] T const* fc1_data(int e) const { return fc1_.data() + e * fc1_size(); }
  [[nodiscard]] T const* fc2_data(int e) const { return fc2_.data() + e * fc2_size(); }
  [[nodiscard]] T* grad_fc1_data(int e) { return grad_fc1_.data() + e * fc1_size(); }
  [[nodiscard]] T* grad_fc2_data(int e) { return grad_fc2_.data() + e * fc2_size(); }
  [[nodiscard]] T const* fc1_bias_data(int e) const {
    return fc1_bias_.data() + static_cast<std::ptrdiff_t>(e) * w1();
  }
  [[nodiscard]] T const* fc2_bias_data(int e) const {
    return fc2_bias_.data() + static_cast<std::ptrdiff_t>(e) * h();
  }
  [[nodiscard]] T* grad_fc1_bias_data(int e) {
    return grad_fc1_bias_.data() + static_cast<std::ptrdiff_t>(e) * w1();
  }
  [[nodiscard]] T* grad_fc2_bias_data(int e) {
    return grad_fc2_bias_.data() + static_cast<std::ptrdiff_t>(e) * h();
  }

  void zero_grad() {
    std::ranges::fill(grad_fc1_, T(0));
    std::ranges::fill(grad_fc2_, T(0));
    std::ranges::fill(grad_fc1_bias_, T(0));
    std::ranges::fill(grad_fc2_bias_, T(0));
  }

  /// Bytes of the weights (and, separately, of their gradients).
  [[nodiscard]] std::size_t weight_bytes() const noexcept {
    return (fc1_.size() + fc2_.size() + fc1_bias_.size() + fc2_bias_.size()) * sizeof(T);
  }

 private:
  [[nodiscard]] int w1() const { return sizes_.fc1_rows(); }
  [[nodiscard]] int h() const { return sizes_.hidden; }
  [[nodiscard]] int f() const { return sizes_.ffn; }
  [[nodiscard]] std::ptrdiff_t fc1_size() const { return std::ptrdiff_t{w1()} * h(); }
  [[nodiscard]] std::ptrdiff_t fc2_size() const { return std::ptrdiff_t{h()} * f(); }
  static row_matrix_map<T> bias_row(std::vector<T>& v, int e, int n) {
    if (v.empty()) return {nullptr, 0, 0};
    return {v.data() + static_cast<std::ptrdiff_t>(e) * n, 1, n};
  }

  mlp_sizes sizes_;
  std::vector<T> fc1_, fc2_, fc1_bias_, fc2_bias_;
  std::vector<T> grad_fc1_, grad_fc2_, grad_fc1_bias_, grad_fc2_bias_;
};

/// Rows grouped by expert: `rows_per_expert[e]` consecutive rows for expert e, in expert order.
template <class T>
struct grouped_rows {
  int count = 0;                                  // N = sum of rows_per_expert
  std::span<std::int64_t const> rows_per_expert;  // [E]
  T const* probs = nullptr;                       // [N] routing prob of each row
};

/// Experts [first, last) of a grouped call (last < 0: through the last expert). An overlapped
/// dispatcher computes one such piece while the next piece's rows are in flight; each expert's
/// products are the same whichever piece runs it.
struct expert_range {
  int first = 0, last = -1;
};

/// The FFN of E experts with activation A on backend B. Holds only its per-expert lists.
template <activation_function A, class Backend, class T>
class grouped_mlp {
 public:
  using activation_type = activation<A>;

  explicit grouped_mlp(mlp_sizes const& sizes)
      : sizes_(sizes),
        problems_(static_cast<std::size_t>(sizes.experts)),
        offsets_(static_cast<std::size_t>(sizes.experts) + 1, 0) {
    if (sizes.activation != A) throw input_error("grouped_mlp: sizes name another activation");
  }

  /// fc1_out [N,W1] (kept for backward), act_out [N,F] (= act(h) * p), out [N,H].
  void forward(executor<T>& exec, expert_parameters<T> const& params, grouped_rows<T> const& rows,
               T const* in, T* fc1_out, T* act_out, T* out, expert_range range = {}) {
    set_offsets(rows, range);
    int const H = sizes_.hidden, W1 = sizes_.fc1_rows(), F = sizes_.ffn;
    run<gemm_op::nt>(exec, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{
          n, W1, H, in + off * H, H, params.fc1_data(e), H, fc1_out + off * W1, W1, false};
    });
    activate(exec, params, rows, fc1_out, act_out, sizes_.bias);
    run<gemm_op::nt>(exec, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{n, H,    F, act_out + off * F, F, params.fc2_data(e), F, out + off * H,
                             H, false};
    });
    if (sizes_.bias)
      for_rows(exec, [&](int j, int e) {
        row_matrix_map<T>(out + std::ptrdiff_t{j} * H, 1, H) +=
            rows.probs[j] * const_row_matrix_map<T>(params.fc2_bias_data(e), 1, H);
      });
  }

  /// act_out = act(fc1_out) * p again, from a kept fc1 output (activation recomputation).
  void recompute_activation(executor<T>& exec, expert_parameters<T> const& params,
                            grouped_rows<T> const& rows, T* fc1_out, T* act_out) {
    set_offsets(rows, {});
    activate(exec, params, rows, fc1_out, act_out, false);
  }

  /// From d(out) [N,H]: grad_act [N,F] and grad_fc1 [N,W1] (work space), grad_in [N,H], and
  /// grad_probs [N]; adds the weight (and bias) gradients into `params`.
  void backward(executor<T>& exec, expert_parameters<T>& params, grouped_rows<T> const& rows,
                T const* in, T const* fc1_out, T const* act_out, T const* grad_out, T* grad_act,
                T* grad_fc1, T* grad_in, T* grad_probs, expert_range range = {}) {
    set_offsets(rows, range);
    int const H = sizes_.hidden, W1 = sizes_.fc1_rows(), F = sizes_.ffn;
    // fc2: d(ap) = dy W2, dW2 += dy^T ap.
    run<gemm_op::nn>(exec, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{
          n, F, H, grad_out + off * H, H, params.fc2_data(e), F, grad_act + off * F, F, false};
    });
    run<gemm_op::tn>(exec, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{
          H, F, n, grad_out + off * H, H, act_out + off * F, F, params.grad_fc2_data(e), F, true};
    });
    // Activation: dp per row, dh = act'(h) * d(ap) * p.
    for_rows(exec, [&](int j, int e) {
      std::ptrdiff_t const r = j;
      T grad_p = activation_type::backward(fc1_out + r * W1, grad_act + r * F, rows.probs[j],
                                           grad_fc1 + r * W1, F);
      if (sizes_.bias)
        grad_p += const_row_matrix_map<T>(grad_out + r * H, 1, H)
                      .cwiseProduct(const_row_matrix_map<T>(params.fc2_bias_data(e), 1, H))
                      .sum();
      grad_probs[j] = grad_p;
    });
    if (sizes_.bias) bias_gradients(exec, params, rows, grad_out, grad_fc1);
    // fc1: dW1 += dh^T x, dx = dh W1.
    run<gemm_op::tn>(exec, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{
          W1, H, n, grad_fc1 + off * W1, W1, in + off * H, H, params.grad_fc1_data(e), H, true};
    });
    run<gemm_op::nn>(exec, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{
          n, H, W1, grad_fc1 + off * W1, W1, params.fc1_data(e), H, grad_in + off * H, H, false};
    });
  }

 private:
  void set_offsets(grouped_rows<T> const& rows, expert_range range) {
    if (rows.rows_per_expert.size() != static_cast<std::size_t>(sizes_.experts))
      throw input_error("grouped_mlp: " + std::to_string(rows.rows_per_expert.size()) +
                        " row counts for " + std::to_string(sizes_.experts) + " experts");
    for (std::size_t e = 0; e < rows.rows_per_expert.size(); ++e)
      offsets_[e + 1] = offsets_[e] + rows.rows_per_expert[e];
    if (offsets_.back() != rows.count)
      throw input_error("grouped_mlp: the row counts add up to " + std::to_string(offsets_.back()) +
                        ", not " + std::to_string(rows.count));
    first_ = range.first;
    last_ = range.last < 0 ? sizes_.experts : range.last;
    if (first_ < 0 || first_ > last_ || last_ > sizes_.experts)
      throw input_error("grouped_mlp: experts [" + std::to_string(range.first) + ", " +
                        std::to_string(range.last) + ") of " + std::to_string(sizes_.experts));
  }

  /// Builds one problem per expert (`make(e, rows, first_row)`) and runs them. Experts without
  /// rows are skipped: they produce no rows and add nothing to their weight gradients.
  template <gemm_op Op, class Make>
  void run(executor<T>& exec, Make const& make) {
    std::size_t used = 0;
    for (int e = first_; e < last_; ++e) {
      auto const n = static_cast<int>(offsets_[static_cast<std::size_t>(e) + 1] -
                                      offsets_[static_cast<std::size_t>(e)]);
      if (n == 0) continue;
      problems_[used++] =
          make(e, n, static_cast<std::ptrdiff_t>(offsets_[static_cast<std::size_t>(e)]));
    }
    Backend::template run<Op>(exec, std::span<gemm_problem<T> const>(problems_.data(), used));
  }

  /// Calls body(row, expert) for every row of the chosen experts, split over the pool.
  template <class Body>
  void for_rows(executor<T>& exec, Body const& body) {
    auto const from = static_cast<int>(offsets_[static_cast<std::size_t>(first_)]);
    auto const count = static_cast<int>(offsets_[static_cast<std::size_t>(last_)]) - from;
    exec.parallel_rows(count, [&](int begin, int end) {
      begin += from;
      end += from;
      auto e = static_cast<int>(std::upper_bound(offsets_.begin(), offsets_.end(), begin) -
                                offsets_.begin()) -
               1;
      for (int j = begin; j < end; ++j) {
        while (offsets_[static_cast<std::size_t>(e) + 1] <= j) ++e;
        body(j, e);
      }
    });
  }

  void activate(executor<T>& exec, expert_parameters<T> const& params, grouped_rows<T> const& rows,
                T* fc1_out, T* act_out, bool add_bias) {
    int const W1 = sizes_.fc1_rows(), F = sizes_.ffn;
    for_rows(exec, [&](int j, int e) {
      T* h = fc1_out + std::ptrdiff_t{j} * W1;
      if (add_bias)
        row_matrix_map<T>(h, 1, W1) += const_row_matrix_map<T>(params.fc1_bias_data(e), 1, W1);
      activation_type::forward(h, rows.probs[j], act_out + std::ptrdiff_t{j} * F, F);
    });
  }

  /// db2_e += sum_j p_j dy_j and db1_e += sum_j dh_j, one task per expert.
  void bias_gradients(executor<T>& exec, expert_parameters<T>& params, grouped_rows<T> const& rows,
                      T const* grad_out, T const* grad_fc1) {
    int const H = sizes_.hidden, W1 = sizes_.fc1_rows();
    exec.pool().run(last_ - first_, [&](int i) {
      int const e = first_ + i;
      row_matrix_map<T> db2(params.grad_fc2_bias_data(e), 1, H);
      row_matrix_map<T> db1(params.grad_fc1_bias_data(e), 1, W1);
      for (auto j = offsets_[static_cast<std::size_t>(e)];
           j < offsets_[static_cast<std::size_t>(e) + 1]; ++j) {
        db2 += rows.probs[j] * const_row_matrix_map<T>(grad_out + j * H, 1, H);
        db1 += const_row_matrix_map<T>(grad_fc1 + j * W1, 1, W1);
      }
    });
  }

  mlp_sizes sizes_;
  std::vector<gemm_problem<T>> problems_;
  std::vector<std::int64_t> offsets_;
  int first_ = 0, last_ = 0;  // the experts of the current call
};

}  // namespace megamoe::expert
