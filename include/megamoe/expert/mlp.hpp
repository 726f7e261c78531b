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

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/expert/activation.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/gemm.hpp>
#include <megamoe/expert/tags.hpp>
#include <megamoe/precision/tags.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
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

  /// The weights as [out, in] maps; with 0 rows once release_weights() gave their values away.
  [[nodiscard]] row_matrix_map<T> fc1(int e) {
    if (fc1_.empty()) return {nullptr, 0, h()};
    return {fc1_.data() + e * fc1_size(), w1(), h()};
  }
  [[nodiscard]] row_matrix_map<T> fc2(int e) {
    if (fc2_.empty()) return {nullptr, 0, f()};
    return {fc2_.data() + e * fc2_size(), h(), f()};
  }
  /// Frees the fc1 and fc2 weight values (biases and gradients stay): for weights whose primary
  /// copy is quantized codes kept elsewhere, once an optimizer holds their fp32 masters.
  void release_weights() {
    std::vector<T>().swap(fc1_);
    std::vector<T>().swap(fc2_);
  }
  [[nodiscard]] bool holds_weights() const noexcept { return !fc1_.empty(); }
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

  /// nullptr once released.
  [[nodiscard]] T const* fc1_data(int e) const {
    return fc1_.empty() ? nullptr : fc1_.data() + e * fc1_size();
  }
  [[nodiscard]] T const* fc2_data(int e) const {
    return fc2_.empty() ? nullptr : fc2_.data() + e * fc2_size();
  }
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

/// The operands of the fp32 and fp64 recipes: every GEMM reads the values themselves. A precision
/// recipe's operands (precision::grouped_operands) have the same hooks and return quantized values;
/// `offsets` are the experts' row offsets, [first, last) the experts of the call.
struct exact_operands {
  using usage = precision::operand_usage;
  template <class T>
  struct wgrad_operands {
    T const* grad;
    T const* input;
    std::span<std::int64_t const> offsets;
  };
  /// fprop input of `layer` [N, cols].
  template <class T>
  T const* input(linear, T const* x, int, std::span<std::int64_t const>, int, int) {
    return x;
  }
  /// Weights [E, rows, cols] for fprop (rowwise) or dgrad (columnwise).
  template <class T>
  T const* weight(linear, usage, T const* w, int, int, int, int) {
    return w;
  }
  /// fc1's output after its bias, before the activation.
  template <class T>
  void fc1_output(T*, int, std::span<std::int64_t const>, int, int) {}
  /// fc1's output as backward sees it.
  template <class T>
  T* saved_fc1_output(T* h, int, std::span<std::int64_t const>, int, int) {
    return h;
  }
  /// dgrad's output gradient of `layer` [N, cols].
  template <class T>
  T const* grad(linear, T const* g, int, std::span<std::int64_t const>, int, int) {
    return g;
  }
  /// The per-tensor factor of expert e's values in `buffer` (gemm_problem::a_unit): none here.
  static float unit(operand_buffer, int) { return 1.0F; }
  /// wgrad's operands of `layer`: the gradient given to grad() and the input given to input().
  template <class T>
  wgrad_operands<T> wgrad(linear, T const* g, int, T const* x, int,
                          std::span<std::int64_t const> offsets, int, int) {
    return {g, x, offsets};
  }
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

  /// fc1_out [N,W1] (kept for backward), act_out [N,F] (= act(h) * p), out [N,H]. The GEMMs
  /// read what `ops` gives them (exact_operands: the values themselves).
  template <class Operands = exact_operands>
  void forward(executor<T>& exec, expert_parameters<T> const& params, grouped_rows<T> const& rows,
               T const* in, T* fc1_out, T* act_out, T* out, expert_range range = {},
               Operands&& ops = Operands{}) {
    set_offsets(rows, range);
    int const H = sizes_.hidden, W1 = sizes_.fc1_rows(), F = sizes_.ffn;
    auto const offsets = std::span<std::int64_t const>(offsets_);
    T const* x = ops.input(linear::fc1, in, H, offsets, first_, last_);
    T const* w1 = ops.weight(linear::fc1, precision::operand_usage::rowwise, params.fc1_data(0), W1,
                             H, first_, last_);
    run<gemm_op::nt>(exec, ops, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{
          n, W1, H, x + off * H, H, w1 + e * fc1_size(), H, fc1_out + off * W1, W1, false};
    });
    if (sizes_.bias) add_fc1_bias(exec, params, fc1_out);
    ops.fc1_output(fc1_out, W1, offsets, first_, last_);
    activate(exec, rows, fc1_out, act_out);
    T const* ap = ops.input(linear::fc2, static_cast<T const*>(act_out), F, offsets, first_, last_);
    T const* w2 = ops.weight(linear::fc2, precision::operand_usage::rowwise, params.fc2_data(0), H,
                             F, first_, last_);
    run<gemm_op::nt>(exec, ops, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{n, H,    F, ap + off * F, F, w2 + e * fc2_size(), F, out + off * H,
                             H, false};
    });
    if (sizes_.bias)
      for_rows(exec, [&](int j, int e) {
        row_matrix_map<T>(out + std::ptrdiff_t{j} * H, 1, H) +=
            rows.probs[j] * const_row_matrix_map<T>(params.fc2_bias_data(e), 1, H);
      });
  }

  /// act_out = act(fc1_out) * p again, from a kept fc1 output (activation recomputation); a
  /// recipe's operands keep fc2's wgrad copy of it again.
  template <class Operands = exact_operands>
  void recompute_activation(executor<T>& exec, grouped_rows<T> const& rows, T* fc1_out, T* act_out,
                            Operands&& ops = Operands{}) {
    set_offsets(rows, {});
    auto const offsets = std::span<std::int64_t const>(offsets_);
    T const* h = ops.saved_fc1_output(fc1_out, sizes_.fc1_rows(), offsets, first_, last_);
    activate(exec, rows, h, act_out);
    ops.input(linear::fc2, static_cast<T const*>(act_out), sizes_.ffn, offsets, first_, last_);
  }

  /// From d(out) [N,H]: grad_act [N,F] and grad_fc1 [N,W1] (work space), grad_in [N,H], and
  /// grad_probs [N]; adds the weight (and bias) gradients into `params`. grad_in may be grad_out.
  template <class Operands = exact_operands>
  void backward(executor<T>& exec, expert_parameters<T>& params, grouped_rows<T> const& rows,
                T const* in, T* fc1_out, T const* act_out, T const* grad_out, T* grad_act,
                T* grad_fc1, T* grad_in, T* grad_probs, expert_range range = {},
                Operands&& ops = Operands{}) {
    set_offsets(rows, range);
    int const H = sizes_.hidden, W1 = sizes_.fc1_rows(), F = sizes_.ffn;
    auto const offsets = std::span<std::int64_t const>(offsets_);
    using precision::operand_usage;
    // fc2: d(ap) = dy W2, then dW2 += dy^T ap. dgrad goes first everywhere: a recipe's operands
    // share their workspaces between the two GEMMs of a layer.
    T const* dy = ops.grad(linear::fc2, grad_out, H, offsets, first_, last_);
    T const* w2 =
        ops.weight(linear::fc2, operand_usage::columnwise, params.fc2_data(0), H, F, first_, last_);
    run<gemm_op::nn>(exec, ops, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{
          n, F, H, dy + off * H, H, w2 + e * fc2_size(), F, grad_act + off * F, F, false};
    });
    auto const fc2_wgrad = ops.wgrad(linear::fc2, grad_out, H, act_out, F, offsets, first_, last_);
    run<gemm_op::tn>(exec, ops, fc2_wgrad.offsets, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{H, F,
                             n, fc2_wgrad.grad + off * H,
                             H, fc2_wgrad.input + off * F,
                             F, params.grad_fc2_data(e),
                             F, true};
    });
    // Activation: dp per row, dh = act'(h) * d(ap) * p.
    T const* h = ops.saved_fc1_output(fc1_out, W1, offsets, first_, last_);
    auto activation_backward = [&]<bool Wide>() {
      for_rows(exec, [&](int j, int e) {
        std::ptrdiff_t const r = j;
        T grad_p = activation_type::template backward_row<Wide>(
            h + r * W1, grad_act + r * F, rows.probs[j], grad_fc1 + r * W1, F);
        if (sizes_.bias)
          grad_p += const_row_matrix_map<T>(grad_out + r * H, 1, H)
                        .cwiseProduct(const_row_matrix_map<T>(params.fc2_bias_data(e), 1, H))
                        .sum();
        grad_probs[j] = grad_p;
      });
    };
    if (activation_type::template avx512<T>())
      activation_backward.template operator()<true>();
    else
      activation_backward.template operator()<false>();
    if (sizes_.bias) bias_gradients(exec, params, rows, grad_out, grad_fc1);
    // fc1: dx = dh W1, then dW1 += dh^T x. With exact operands wgrad reads `in`, which grad_in
    // may alias, so it goes first; a recipe's wgrad reads only kept codes and grad_fc1.
    constexpr bool exact = std::is_same_v<std::remove_cvref_t<Operands>, exact_operands>;
    auto fc1_wgrad = [&] {
      auto const wg = ops.wgrad(linear::fc1, static_cast<T const*>(grad_fc1), W1, in, H, offsets,
                                first_, last_);
      run<gemm_op::tn>(exec, ops, wg.offsets, [&](int e, int n, std::ptrdiff_t off) {
        return gemm_problem<T>{
            W1, H,   n, wg.grad + off * W1, W1, wg.input + off * H, H, params.grad_fc1_data(e),
            H,  true};
      });
    };
    if constexpr (exact) fc1_wgrad();
    T const* dh =
        ops.grad(linear::fc1, static_cast<T const*>(grad_fc1), W1, offsets, first_, last_);
    T const* w1 = ops.weight(linear::fc1, operand_usage::columnwise, params.fc1_data(0), W1, H,
                             first_, last_);
    run<gemm_op::nn>(exec, ops, [&](int e, int n, std::ptrdiff_t off) {
      return gemm_problem<T>{
          n, H, W1, dh + off * W1, W1, w1 + e * fc1_size(), H, grad_in + off * H, H, false};
    });
    if constexpr (!exact) fc1_wgrad();
  }

 private:
  void set_offsets(grouped_rows<T> const& rows, expert_range range);

  /// Builds one problem per expert (`make(e, rows, first_row)`) and runs them. Experts without
  /// rows are skipped: they produce no rows and add nothing to their weight gradients.
  /// Each problem carries its operands' per-tensor factors from `ops` (A from rows_a, B from the
  /// weights or, for wgrad, rows_b).
  template <gemm_op Op, class Operands, class Make>
  void run(executor<T>& exec, Operands const& ops, Make const& make) {
    run<Op>(exec, ops, offsets_, make);
  }
  /// The same over other row offsets (a recipe's padded wgrad rows).
  template <gemm_op Op, class Operands, class Make>
  void run(executor<T>& exec, Operands const& ops, std::span<std::int64_t const> offsets,
           Make const& make) {
    constexpr operand_buffer b_buffer =
        Op == gemm_op::tn ? operand_buffer::rows_b : operand_buffer::weights;
    std::size_t used = 0;
    for (int e = first_; e < last_; ++e) {
      auto const n = static_cast<int>(offsets[static_cast<std::size_t>(e) + 1] -
                                      offsets[static_cast<std::size_t>(e)]);
      if (n == 0) continue;
      auto& p = problems_[used++];
      p = make(e, n, static_cast<std::ptrdiff_t>(offsets[static_cast<std::size_t>(e)]));
      p.a_unit = ops.unit(operand_buffer::rows_a, e);
      p.b_unit = ops.unit(b_buffer, e);
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

  /// h += b1 per row.
  void add_fc1_bias(executor<T>& exec, expert_parameters<T> const& params, T* fc1_out);

  void activate(executor<T>& exec, grouped_rows<T> const& rows, T const* fc1_out, T* act_out);

  [[nodiscard]] std::ptrdiff_t fc1_size() const {
    return std::ptrdiff_t{sizes_.fc1_rows()} * sizes_.hidden;
  }
  [[nodiscard]] std::ptrdiff_t fc2_size() const {
    return std::ptrdiff_t{sizes_.hidden} * sizes_.ffn;
  }

  /// db2_e += sum_j p_j dy_j and db1_e += sum_j dh_j, one task per expert.
  void bias_gradients(executor<T>& exec, expert_parameters<T>& params, grouped_rows<T> const& rows,
                      T const* grad_out, T const* grad_fc1);

  mlp_sizes sizes_;
  std::vector<gemm_problem<T>> problems_;
  std::vector<std::int64_t> offsets_;
  int first_ = 0, last_ = 0;  // the experts of the current call
};

// Defined outside the class, these members are not inline: a program built with
// MEGAMOE_SEPARATE_COMPILATION compiles them once for each activation in float and double on the
// grouped GEMM (expert/mlp.ipp); forward and backward, templates on the operands, compile where
// they are used.
template <activation_function A, class Backend, class T>
void grouped_mlp<A, Backend, T>::set_offsets(grouped_rows<T> const& rows, expert_range range) {
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

template <activation_function A, class Backend, class T>
void grouped_mlp<A, Backend, T>::add_fc1_bias(executor<T>& exec, expert_parameters<T> const& params,
                                              T* fc1_out) {
  int const W1 = sizes_.fc1_rows();
  for_rows(exec, [&](int j, int e) {
    row_matrix_map<T>(fc1_out + std::ptrdiff_t{j} * W1, 1, W1) +=
        const_row_matrix_map<T>(params.fc1_bias_data(e), 1, W1);
  });
}

template <activation_function A, class Backend, class T>
void grouped_mlp<A, Backend, T>::activate(executor<T>& exec, grouped_rows<T> const& rows,
                                          T const* fc1_out, T* act_out) {
  int const W1 = sizes_.fc1_rows(), F = sizes_.ffn;
  auto activate_rows = [&]<bool Wide>() {
    for_rows(exec, [&](int j, int) {
      activation_type::template forward_row<Wide>(fc1_out + std::ptrdiff_t{j} * W1, rows.probs[j],
                                                  act_out + std::ptrdiff_t{j} * F, F);
    });
  };
  if (activation_type::template avx512<T>())
    activate_rows.template operator()<true>();
  else
    activate_rows.template operator()<false>();
}

template <activation_function A, class Backend, class T>
void grouped_mlp<A, Backend, T>::bias_gradients(executor<T>& exec, expert_parameters<T>& params,
                                                grouped_rows<T> const& rows, T const* grad_out,
                                                T const* grad_fc1) {
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

#if !MEGAMOE_HEADER_ONLY
extern template class grouped_mlp<activation_function::swiglu, grouped_gemm, float>;
extern template class grouped_mlp<activation_function::gelu, grouped_gemm, float>;
extern template class grouped_mlp<activation_function::squared_relu, grouped_gemm, float>;
extern template class grouped_mlp<activation_function::swiglu, grouped_gemm, double>;
extern template class grouped_mlp<activation_function::gelu, grouped_gemm, double>;
extern template class grouped_mlp<activation_function::squared_relu, grouped_gemm, double>;
#endif

}  // namespace megamoe::expert

#if MEGAMOE_HEADER_ONLY
#include <megamoe/expert/mlp.ipp>
#endif
