// SPDX-License-Identifier: Apache-2.0
// megamoe/model/attention.hpp — causal multi-head self-attention with rotary position embedding,
// forward and backward, on one rank (TP = CP = 1).
//
// Tokens are [S*B, H] with t = s*B + b. linear_qkv.weight is [3H, H]: rows [0, H) give q, [H, 2H)
// k, [2H, 3H) v; head h uses columns [h*d, (h+1)*d) of each (d = H / heads). RoPE rotates the two
// halves of each head's q and k (the "rotate half" form): for i < d/2 at position s,
//   (u_i, u_{i+d/2}) -> (u_i cos - u_{i+d/2} sin, u_{i+d/2} cos + u_i sin),  angle = s *
//   base^(-2i/d).
// Scores are q.k / sqrt(d) with a causal mask; linear_proj.weight [H, H] maps the heads back.
// Each (sequence, head) pair is one task on the pool; the projections run on every thread
// (threaded_product).
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/model/products.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace megamoe {

template <class T>
class causal_attention {
 public:
  causal_attention(int hidden, int heads, double rope_base = 10000.0)
      : hidden_(hidden), heads_(heads), rope_base_(rope_base) {
    if (hidden < 1 || heads < 1 || hidden % heads != 0 || (hidden / heads) % 2 != 0)
      throw input_error("causal_attention: hidden " + std::to_string(hidden) + " over " +
                        std::to_string(heads) + " heads must give an even head size");
    qkv_weight_ = row_matrix<T>::Zero(3 * hidden, hidden);
    qkv_grad_ = row_matrix<T>::Zero(3 * hidden, hidden);
    proj_weight_ = row_matrix<T>::Zero(hidden, hidden);
    proj_grad_ = row_matrix<T>::Zero(hidden, hidden);
  }

  [[nodiscard]] int hidden() const noexcept { return hidden_; }
  [[nodiscard]] int heads() const noexcept { return heads_; }
  [[nodiscard]] int head_size() const noexcept { return hidden_ / heads_; }

  /// y [S*B, H] from x [S*B, H]; keeps what backward needs.
  void forward(expert::executor<T>& exec, const_row_matrix_map<T> x, int seq, int batch,
               row_matrix_map<T> y) {
    auto& pool = exec.pool();
    if (seq < 1 || batch < 1 || x.rows() != std::int64_t{seq} * batch || x.cols() != hidden_ ||
        y.rows() != x.rows() || y.cols() != hidden_)
      throw input_error("causal_attention: input of shape [" + std::to_string(x.rows()) + ", " +
                        std::to_string(x.cols()) + "] for S = " + std::to_string(seq) +
                        ", B = " + std::to_string(batch) + ", H = " + std::to_string(hidden_));
    seq_ = seq;
    batch_ = batch;
    int const S = seq, d = head_size(), H = hidden_;
    x_ = x;
    int const N = static_cast<int>(x.rows());
    qkv_.resize(N, 3 * H);
    threaded_product<expert::gemm_op::nt>(exec, N, 3 * H, H, x_.data(), H, qkv_weight_.data(), H,
                                          qkv_.data(), 3 * H);
    rope_tables(S);
    auto const pairs = batch * heads_;
    q_.resize(std::int64_t{pairs} * S, d);
    k_.resize(std::int64_t{pairs} * S, d);
    v_.resize(std::int64_t{pairs} * S, d);
    probs_.resize(std::int64_t{pairs} * S, S);
    context_.resize(x.rows(), H);
    T const scale = T(1) / std::sqrt(static_cast<T>(d));
    pool.run(pairs, [&](int pair) {
      int const b = pair / heads_, h = pair % heads_;
      std::int64_t const base = std::int64_t{pair} * S;
      for (int s = 0; s < S; ++s) {
        auto const row = qkv_.row(std::int64_t{s} * batch_ + b);
        rotate(row.segment(h * d, d), s, q_.row(base + s));
        rotate(row.segment(H + h * d, d), s, k_.row(base + s));
        v_.row(base + s) = row.segment(2 * H + h * d, d);
      }
      auto P = probs_.middleRows(base, S);
      P.noalias() = (q_.middleRows(base, S) * k_.middleRows(base, S).transpose()) * scale;
      for (int i = 0; i < S; ++i) {  // causal softmax: position i sees 0..i
        T const top = P.row(i).head(i + 1).maxCoeff();
        P.row(i).head(i + 1) = (P.row(i).head(i + 1).array() - top).exp();
        P.row(i).head(i + 1) /= P.row(i).head(i + 1).sum();
        P.row(i).tail(S - i - 1).setZero();
      }
      row_matrix<T> const out = P * v_.middleRows(base, S);
      for (int s = 0; s < S; ++s)
        context_.row(std::int64_t{s} * batch_ + b).segment(h * d, d) = out.row(s);
    });
    threaded_product<expert::gemm_op::nt>(exec, N, H, H, context_.data(), H, proj_weight_.data(), H,
                                          y.data(), static_cast<int>(y.outerStride()));
  }

  /// dx [S*B, H] from dy of the last forward; adds both weights' gradients.
  void backward(expert::executor<T>& exec, const_row_matrix_map<T> dy, row_matrix_map<T> dx) {
    auto& pool = exec.pool();
    if (dy.rows() != x_.rows() || dy.cols() != hidden_ || dx.rows() != x_.rows() ||
        dx.cols() != hidden_)
      throw input_error("causal_attention: gradient shape does not match the last forward");
    int const S = seq_, d = head_size(), H = hidden_;
    int const N = static_cast<int>(x_.rows());
    int const ldy = static_cast<int>(dy.outerStride());
    threaded_product<expert::gemm_op::tn>(exec, H, H, N, dy.data(), ldy, context_.data(), H,
                                          proj_grad_.data(), H, true);
    grad_context_.resize(N, H);
    threaded_product<expert::gemm_op::nn>(exec, N, H, H, dy.data(), ldy, proj_weight_.data(), H,
                                          grad_context_.data(), H);
    grad_qkv_.resize(x_.rows(), 3 * H);
    T const scale = T(1) / std::sqrt(static_cast<T>(d));
    pool.run(batch_ * heads_, [&](int pair) {
      int const b = pair / heads_, h = pair % heads_;
      std::int64_t const base = std::int64_t{pair} * S;
      row_matrix<T> grad_out(S, d);
      for (int s = 0; s < S; ++s)
        grad_out.row(s) = grad_context_.row(std::int64_t{s} * batch_ + b).segment(h * d, d);
      auto const P = probs_.middleRows(base, S);
      auto const Q = q_.middleRows(base, S);
      auto const K = k_.middleRows(base, S);
      auto const V = v_.middleRows(base, S);
      row_matrix<T> grad_probs = grad_out * V.transpose();
      row_matrix<T> const grad_v = P.transpose() * grad_out;
      // Softmax backward, row by row: dS = P (dP - sum(P dP)); masked entries have P = 0.
      for (int i = 0; i < S; ++i) {
        T const dot = P.row(i).dot(grad_probs.row(i));
        grad_probs.row(i) = (P.row(i).array() * (grad_probs.row(i).array() - dot)) * scale;
      }
      row_matrix<T> const grad_q = grad_probs * K;
      row_matrix<T> const grad_k = grad_probs.transpose() * Q;
      for (int s = 0; s < S; ++s) {
        auto row = grad_qkv_.row(std::int64_t{s} * batch_ + b);
        unrotate(grad_q.row(s), s, row.segment(h * d, d));
        unrotate(grad_k.row(s), s, row.segment(H + h * d, d));
        row.segment(2 * H + h * d, d) = grad_v.row(s);
      }
    });
    threaded_product<expert::gemm_op::tn>(exec, 3 * H, H, N, grad_qkv_.data(), 3 * H, x_.data(), H,
                                          qkv_grad_.data(), H, true);
    threaded_product<expert::gemm_op::nn>(exec, N, H, 3 * H, grad_qkv_.data(), 3 * H,
                                          qkv_weight_.data(), H, dx.data(),
                                          static_cast<int>(dx.outerStride()));
  }

  void zero_grad() {
    qkv_grad_.setZero();
    proj_grad_.setZero();
  }

  /// f(name, value, grad) for `prefix.linear_qkv.weight` and `prefix.linear_proj.weight`.
  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    f(prefix + ".linear_qkv.weight", map(qkv_weight_), map(qkv_grad_));
    f(prefix + ".linear_proj.weight", map(proj_weight_), map(proj_grad_));
  }

  /// Bytes kept from forward to backward (input, rotated q and k, v, probabilities, context).
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return static_cast<std::size_t>(x_.size() + qkv_.size() + q_.size() + k_.size() + v_.size() +
                                    probs_.size() + context_.size()) *
           sizeof(T);
  }

 private:
  static row_matrix_map<T> map(row_matrix<T>& m) { return {m.data(), m.rows(), m.cols()}; }

  void rope_tables(int S) {
    int const half = head_size() / 2;
    if (cos_.rows() == S) return;
    cos_.resize(S, half);
    sin_.resize(S, half);
    for (int s = 0; s < S; ++s)
      for (int i = 0; i < half; ++i) {
        double const angle = s * std::pow(rope_base_, -2.0 * i / static_cast<double>(head_size()));
        cos_(s, i) = static_cast<T>(std::cos(angle));
        sin_(s, i) = static_cast<T>(std::sin(angle));
      }
  }

  template <class In, class Out>
  void rotate(In const& u, int s, Out&& out) const {
    int const half = head_size() / 2;
    for (int i = 0; i < half; ++i) {
      T const c = cos_(s, i), sn = sin_(s, i);
      T const a = u(i), b = u(i + half);
      out(i) = a * c - b * sn;
      out(i + half) = b * c + a * sn;
    }
  }
  /// The transpose of `rotate` (its inverse), for gradients.
  template <class In, class Out>
  void unrotate(In const& g, int s, Out&& out) const {
    int const half = head_size() / 2;
    for (int i = 0; i < half; ++i) {
      T const c = cos_(s, i), sn = sin_(s, i);
      T const a = g(i), b = g(i + half);
      out(i) = a * c + b * sn;
      out(i + half) = b * c - a * sn;
    }
  }

  int hidden_, heads_;
  double rope_base_;
  int seq_ = 0, batch_ = 0;
  row_matrix<T> qkv_weight_, qkv_grad_, proj_weight_, proj_grad_;
  row_matrix<T> x_, qkv_, q_, k_, v_, probs_, context_, cos_, sin_;
  row_matrix<T> grad_context_, grad_qkv_;
};

}  // namespace megamoe
