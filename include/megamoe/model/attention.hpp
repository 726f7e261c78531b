// SPDX-License-Identifier: Apache-2.0
// megamoe/model/attention.hpp — causal self-attention with grouped queries and rotary position
// embedding, forward and backward, on one rank (TP = CP = 1).
//
// Tokens are [S*B, H] with t = s*B + b; d = H / heads; G query groups (key/value heads) of
// P = heads / G query heads each (G = heads: multi-head attention). linear_qkv.weight is
// [(heads + 2G) d, H] in the reference's layout: rows in G blocks of (P + 2) d, block g holding
// the query heads gP .. gP + P - 1, then group g's key head, then its value head, d rows each (a
// tensor-parallel split of whole blocks gives each rank whole groups). RoPE rotates the two
// halves of each head's q and k (the "rotate half" form): for i < d/2 at position s,
//   (u_i, u_{i+d/2}) -> (u_i cos - u_{i+d/2} sin, u_{i+d/2} cos + u_i sin),  angle = s *
//   base^(-2i/d).
// With QK layernorm (`QkLayernorm`, the reference's qk_layernorm) every query head and every key
// head passes an RMSNorm over its d values before RoPE: q_layernorm.weight [d] for the queries,
// k_layernorm.weight [d] for the keys, each shared by its heads.
// Scores are q.k / sqrt(d) with a causal mask; linear_proj.weight [H, H] maps the heads back.
// The attention itself is flash_attention (blocked, online softmax, RoPE fused; backward
// recomputes the scores from the saved log-sum-exp); the projections run on every thread
// (threaded_product).
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/model/flash_attention.hpp>
#include <megamoe/model/norm.hpp>
#include <megamoe/model/products.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace megamoe {

template <class T, bool QkLayernorm = false>
class causal_attention {
 public:
  /// `query_groups` 0: one key/value head per query head; `norm_epsilon` is QK layernorm's.
  causal_attention(int hidden, int heads, int query_groups = 0, double rope_base = 10000.0,
                   double norm_epsilon = 1e-5)
      : hidden_(hidden),
        heads_(heads),
        groups_(query_groups > 0 ? query_groups : heads),
        kernel_(rope_base) {
    if (hidden < 1 || heads < 1 || hidden % heads != 0 || (hidden / heads) % 2 != 0)
      throw input_error("causal_attention: hidden " + std::to_string(hidden) + " over " +
                        std::to_string(heads) + " heads must give an even head size");
    if (heads % groups_ != 0)
      throw input_error("causal_attention: " + std::to_string(groups_) +
                        " query groups do not divide " + std::to_string(heads) + " heads");
    qkv_weight_ = row_matrix<T>::Zero(qkv_width(), hidden);
    qkv_grad_ = row_matrix<T>::Zero(qkv_width(), hidden);
    proj_weight_ = row_matrix<T>::Zero(hidden, hidden);
    proj_grad_ = row_matrix<T>::Zero(hidden, hidden);
    if constexpr (QkLayernorm)
      qk_norm_ = {rms_norm<T>(head_size(), norm_epsilon), rms_norm<T>(head_size(), norm_epsilon)};
  }

  [[nodiscard]] int hidden() const noexcept { return hidden_; }
  [[nodiscard]] int heads() const noexcept { return heads_; }
  [[nodiscard]] int head_size() const noexcept { return hidden_ / heads_; }
  [[nodiscard]] int query_groups() const noexcept { return groups_; }
  /// Rows of linear_qkv.weight, (heads + 2 query_groups) * head size.
  [[nodiscard]] int qkv_width() const noexcept { return (heads_ + 2 * groups_) * head_size(); }

  /// y [S*B, H] from x [S*B, H]; keeps what backward needs.
  void forward(expert::executor<T>& exec, const_row_matrix_map<T> x, int seq, int batch,
               row_matrix_map<T> y) {
    if (seq < 1 || batch < 1 || x.rows() != std::int64_t{seq} * batch || x.cols() != hidden_ ||
        y.rows() != x.rows() || y.cols() != hidden_)
      throw input_error("causal_attention: input of shape [" + std::to_string(x.rows()) + ", " +
                        std::to_string(x.cols()) + "] for S = " + std::to_string(seq) +
                        ", B = " + std::to_string(batch) + ", H = " + std::to_string(hidden_));
    seq_ = seq;
    batch_ = batch;
    int const H = hidden_, N = static_cast<int>(x.rows()), W = qkv_width();
    x_ = x;
    qkv_.resize(N, W);
    threaded_product<expert::gemm_op::nt>(exec, N, W, H, x_.data(), H, qkv_weight_.data(), H,
                                          qkv_.data(), W);
    if constexpr (QkLayernorm) normalize_heads(exec.pool(), N);
    context_.resize(N, H);
    lse_.resize(std::size_t(batch) * heads_ * seq);
    auto const qkv = views<T const>(qkv_.data());
    kernel_.forward(exec.pool(), shape(), qkv.q, qkv.k, qkv.v, {context_.data(), H}, lse_.data());
    threaded_product<expert::gemm_op::nt>(exec, N, H, H, context_.data(), H, proj_weight_.data(), H,
                                          y.data(), static_cast<int>(y.outerStride()));
  }

  /// dx [S*B, H] from dy of the last forward; adds both weights' gradients.
  void backward(expert::executor<T>& exec, const_row_matrix_map<T> dy, row_matrix_map<T> dx) {
    if (dy.rows() != x_.rows() || dy.cols() != hidden_ || dx.rows() != x_.rows() ||
        dx.cols() != hidden_)
      throw input_error("causal_attention: gradient shape does not match the last forward");
    int const H = hidden_, N = static_cast<int>(x_.rows()), W = qkv_width();
    int const ldy = static_cast<int>(dy.outerStride());
    threaded_product<expert::gemm_op::tn>(exec, H, H, N, dy.data(), ldy, context_.data(), H,
                                          proj_grad_.data(), H, true);
    grad_context_.resize(N, H);
    threaded_product<expert::gemm_op::nn>(exec, N, H, H, dy.data(), ldy, proj_weight_.data(), H,
                                          grad_context_.data(), H);
    grad_qkv_.resize(N, W);
    auto const qkv = views<T const>(qkv_.data());
    auto const grad = views<T>(grad_qkv_.data());
    kernel_.backward(exec.pool(), shape(), qkv.q, qkv.k, qkv.v, {context_.data(), H},
                     {grad_context_.data(), H}, lse_.data(), grad.q, grad.k, grad.v);
    if constexpr (QkLayernorm) normalize_heads_backward(exec.pool(), N);
    threaded_product<expert::gemm_op::tn>(exec, W, H, N, grad_qkv_.data(), W, x_.data(), H,
                                          qkv_grad_.data(), H, true);
    threaded_product<expert::gemm_op::nn>(exec, N, H, W, grad_qkv_.data(), W, qkv_weight_.data(), H,
                                          dx.data(), static_cast<int>(dx.outerStride()));
  }

  void zero_grad() {
    qkv_grad_.setZero();
    proj_grad_.setZero();
    if constexpr (QkLayernorm) {
      qk_norm_.q.zero_grad();
      qk_norm_.k.zero_grad();
    }
  }

  /// f(name, value, grad) for `prefix.linear_qkv.weight` and `prefix.linear_proj.weight`, and
  /// with QK layernorm `prefix.q_layernorm.weight` and `prefix.k_layernorm.weight`.
  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    f(prefix + ".linear_qkv.weight", map(qkv_weight_), map(qkv_grad_));
    f(prefix + ".linear_proj.weight", map(proj_weight_), map(proj_grad_));
    if constexpr (QkLayernorm) {
      qk_norm_.q.for_each_parameter(prefix + ".q_layernorm", f);
      qk_norm_.k.for_each_parameter(prefix + ".k_layernorm", f);
    }
  }

  /// Bytes kept from forward to backward (input, q k v, context, log-sum-exp per row, and the
  /// QK norms' inputs).
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    std::size_t norms = 0;
    if constexpr (QkLayernorm) norms = qk_norm_.q.saved_bytes() + qk_norm_.k.saved_bytes();
    return static_cast<std::size_t>(x_.size() + qkv_.size() + context_.size()) * sizeof(T) +
           lse_.size() * sizeof(T) + norms;
  }

 private:
  static row_matrix_map<T> map(row_matrix<T>& m) { return {m.data(), m.rows(), m.cols()}; }
  /// q, k and v of rows laid out as linear_qkv's (per group: its query heads, key, value).
  template <class U>
  struct qkv_views {
    attention::token_view<U> q, k, v;
  };
  template <class U>
  [[nodiscard]] qkv_views<U> views(U* data) const noexcept {
    int const d = head_size(), per = heads_ / groups_;
    std::int64_t const block = std::int64_t(per + 2) * d, ld = qkv_width();
    return {{data, ld, per, block},
            {data + per * d, ld, 1, block},
            {data + (per + 1) * d, ld, 1, block}};
  }
  [[nodiscard]] attention::attention_shape shape() const noexcept {
    return {.seq = seq_,
            .batch = batch_,
            .heads = heads_,
            .query_groups = groups_,
            .qk_head = head_size()};
  }

  /// Each norm sees its heads as rows of d values: the query heads [N * heads, d] (row
  /// (t G + g) P + j: head j of group g of token t) and the key heads [N * G, d].
  struct qk_norms {
    rms_norm<T> q{1}, k{1};
  };
  struct no_qk_norms {};

  /// Copies heads [first, first + count) of every group's block of each qkv row into packed
  /// rows ((t G + g) count + j), or from them back into the qkv rows with `ToQkv`.
  template <bool ToQkv>
  void move_heads(thread_pool& pool, T* qkv, T* packed, int tokens, int first, int count) const {
    int const d = head_size(), per = heads_ / groups_, W = qkv_width();
    std::int64_t const block = std::int64_t(per + 2) * d, run = std::int64_t(count) * d;
    parallel_rows(pool, tokens, [&](int begin, int end) {
      for (int t = begin; t < end; ++t)
        for (int g = 0; g < groups_; ++g) {
          T* const row = qkv + std::int64_t(t) * W + g * block + std::int64_t(first) * d;
          T* const rows = packed + (std::int64_t(t) * groups_ + g) * run;
          if constexpr (ToQkv)
            std::copy(rows, rows + run, row);
          else
            std::copy(row, row + run, rows);
        }
    });
  }
  /// The query heads (first 0, P per group) and the key heads (first P, one) through their norms,
  /// in place in qkv_.
  void normalize_heads(thread_pool& pool, int tokens) {
    int const per = heads_ / groups_, d = head_size();
    for (int which = 0; which < 2; ++which) {
      auto& norm = which == 0 ? qk_norm_.q : qk_norm_.k;
      int const first = which == 0 ? 0 : per, count = which == 0 ? per : 1;
      int const rows = tokens * groups_ * count;
      heads_in_.resize(rows, d);
      heads_out_.resize(rows, d);
      move_heads<false>(pool, qkv_.data(), heads_in_.data(), tokens, first, count);
      norm.forward(pool, {heads_in_.data(), rows, d}, map(heads_out_));
      move_heads<true>(pool, qkv_.data(), heads_out_.data(), tokens, first, count);
    }
  }
  /// The normalized heads' gradients in grad_qkv_ become their inputs' (and the norm weights').
  void normalize_heads_backward(thread_pool& pool, int tokens) {
    int const per = heads_ / groups_, d = head_size();
    for (int which = 0; which < 2; ++which) {
      auto& norm = which == 0 ? qk_norm_.q : qk_norm_.k;
      int const first = which == 0 ? 0 : per, count = which == 0 ? per : 1;
      int const rows = tokens * groups_ * count;
      heads_in_.resize(rows, d);
      move_heads<false>(pool, grad_qkv_.data(), heads_in_.data(), tokens, first, count);
      norm.backward(pool, {heads_in_.data(), rows, d}, map(heads_in_));
      move_heads<true>(pool, grad_qkv_.data(), heads_in_.data(), tokens, first, count);
    }
  }

  int hidden_, heads_, groups_;
  [[no_unique_address]] std::conditional_t<QkLayernorm, qk_norms, no_qk_norms> qk_norm_;
  attention::flash_attention<T> kernel_;
  int seq_ = 0, batch_ = 0;
  row_matrix<T> qkv_weight_, qkv_grad_, proj_weight_, proj_grad_;
  row_matrix<T> x_, qkv_, context_;
  std::vector<T> lse_;
  row_matrix<T> grad_context_, grad_qkv_;
  row_matrix<T> heads_in_, heads_out_;  // QK layernorm's packed heads
};

}  // namespace megamoe
