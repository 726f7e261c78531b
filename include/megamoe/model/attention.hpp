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
// The attention itself is attention_core (flash_attention: blocked, online softmax, RoPE fused;
// backward recomputes the scores from the saved log-sum-exp; context parallelism); the
// projections run on every thread (model/linear.hpp, through the precision recipe's operands).
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/model/attention_core.hpp>
#include <megamoe/model/flash_attention.hpp>
#include <megamoe/model/linear.hpp>
#include <megamoe/model/norm.hpp>
#include <megamoe/model/parameter_layout.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/tags.hpp>

#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe {

template <class T, bool QkLayernorm = false,
          parallel::cp_comm_type CpComm = parallel::cp_comm_type::p2p,
          class Ops = expert::exact_operands, class Backend = expert::grouped_gemm>
class causal_attention {
 public:
  /// linear_qkv and linear_proj in the operands' two slots.
  static constexpr expert::linear qkv_linear = expert::linear::fc1;
  static constexpr expert::linear proj_linear = expert::linear::fc2;
  /// memory::quantized_weights: both projections' weights are held as the recipe's codes.
  static constexpr bool quantized_weights = holds_weight_codes_v<Ops>;

  /// `query_groups` 0: one key/value head per query head; `norm_epsilon` is QK layernorm's. With
  /// tensor parallelism over `tensor_parallel` ranks this rank holds 1/TP of the query groups
  /// (whole groups: its rows of linear_qkv) and their heads, and linear_proj's columns of them
  /// ([H, H / TP]); its output is then its part of y, which the group sums. Under a precision
  /// recipe both projections read `ops`'s operands (model/linear.hpp).
  causal_attention(int hidden, int heads, int query_groups = 0, double rope_base = 10000.0,
                   double norm_epsilon = 1e-5, int tensor_parallel = 1, Ops ops = Ops{})
      : linears_(std::move(ops)),
        hidden_(hidden),
        heads_(tensor_parallel > 0 ? heads / tensor_parallel : 0),
        groups_((query_groups > 0 ? query_groups : heads) / std::max(1, tensor_parallel)),
        head_size_(heads > 0 ? hidden / heads : 0),
        core_(rope_base) {
    if (hidden < 1 || heads < 1 || hidden % heads != 0 || (hidden / heads) % 2 != 0)
      throw input_error("causal_attention: hidden " + std::to_string(hidden) + " over " +
                        std::to_string(heads) + " heads must give an even head size");
    int const groups = query_groups > 0 ? query_groups : heads;
    if (heads % groups != 0)
      throw input_error("causal_attention: " + std::to_string(groups) +
                        " query groups do not divide " + std::to_string(heads) + " heads");
    if (tensor_parallel < 1 || groups % tensor_parallel != 0)
      throw input_error("causal_attention: " + std::to_string(tensor_parallel) +
                        " tensor-parallel ranks do not divide " + std::to_string(groups) +
                        " query groups");
    qkv_weight_ = row_matrix<T>::Zero(qkv_width(), hidden);
    qkv_grad_ = row_matrix<T>::Zero(qkv_width(), hidden);
    proj_weight_ = row_matrix<T>::Zero(hidden, context_width());
    proj_grad_ = row_matrix<T>::Zero(hidden, context_width());
    if constexpr (QkLayernorm)
      qk_norm_ = {rms_norm<T>(head_size(), norm_epsilon), rms_norm<T>(head_size(), norm_epsilon)};
  }

  [[nodiscard]] int hidden() const noexcept { return hidden_; }
  /// This rank's query heads and query groups (all of them without tensor parallelism).
  [[nodiscard]] int heads() const noexcept { return heads_; }
  [[nodiscard]] int head_size() const noexcept { return head_size_; }
  [[nodiscard]] int query_groups() const noexcept { return groups_; }
  /// This rank's rows of linear_qkv.weight, (heads + 2 query_groups) * head size.
  [[nodiscard]] int qkv_width() const noexcept { return (heads_ + 2 * groups_) * head_size(); }
  /// This rank's attention output width, heads * head size (linear_proj's columns).
  [[nodiscard]] int context_width() const noexcept { return heads_ * head_size(); }

  /// The projections and their operands (a recipe's codes and delayed-scaling state), on
  /// `Backend` (a BF16 unit only under a recipe, whose operands are BF16 values over units).
  using linears_type = linear_products<T, Ops, Backend>;
  [[nodiscard]] linears_type& linears() noexcept { return linears_; }
  [[nodiscard]] linears_type const& linears() const noexcept { return linears_; }
  /// f(part, linears) for the module's operands' products (one: part ""), as
  /// multi_latent_attention names its three.
  template <class F>
  void for_each_linears(F&& f) {
    f(std::string_view(), linears_);
  }
  template <class F>
  void for_each_linears(F&& f) const {
    f(std::string_view(), linears_);
  }

  /// Context parallelism over `cp` (kept by reference; size 1: none): each sequence is cut into
  /// 2 CP chunks and this rank's rows are chunks r and 2 CP - 1 - r (r its rank in `cp`), in that
  /// order, each S / 2 positions of the B sequences (t = s B + b within the rank's S positions).
  /// Keys and values go around the CP ring (`CpComm` p2p) or are all-gathered (all_gather), and
  /// their gradients come back the same way; RoPE and the causal mask see global positions.
  void set_context_parallel(boost::mpi::communicator const& cp) { core_.set_context_parallel(cp); }

  /// y [S*B, H] from x [S*B, H]; keeps what backward needs.
  void forward(expert::executor<T>& exec, const_row_matrix_map<T> x, int seq, int batch,
               row_matrix_map<T> y);

  /// dx [S*B, H] from dy of the last forward; adds both weights' gradients. With tensor
  /// parallelism dy is the whole output's gradient and dx this rank's part of the input's.
  void backward(expert::executor<T>& exec, const_row_matrix_map<T> dy, row_matrix_map<T> dx);

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
    report_parameter(f, prefix + ".linear_qkv.weight", view(qkv_weight_), view(qkv_grad_),
                     parameter_cut::rows);
    report_parameter(f, prefix + ".linear_proj.weight", view(proj_weight_), view(proj_grad_),
                     parameter_cut::columns);
    if constexpr (QkLayernorm) {
      qk_norm_.q.for_each_parameter(prefix + ".q_layernorm", f);
      qk_norm_.k.for_each_parameter(prefix + ".k_layernorm", f);
    }
  }

  // memory::quantized_weights: the projections' codes are their primary weights; the fp32
  // values stay until an optimizer takes its shard (then release_weight_values()), and after each
  // update the optimizer hands each whole weight back through for_each_quantized_weight.
  /// Quantizes both weights from their fp32 values (collective over the operands' amax group).
  void refresh_weight_codes() requires quantized_weights {
    if (!holds_weight_values())
      throw input_error(
          "causal_attention: refresh_weight_codes() needs the fp32 weights, which an optimizer "
          "holds now");
    store_linear_weight(linears_.operands(), qkv_linear, qkv_weight_.data(), qkv_width(), hidden_);
    store_linear_weight(linears_.operands(), proj_linear, proj_weight_.data(), hidden_,
                        context_width());
  }
  void release_weight_values() requires quantized_weights {
    qkv_weight_.resize(0, hidden_);
    proj_weight_.resize(0, context_width());
  }
  [[nodiscard]] bool holds_weight_values() const noexcept { return qkv_weight_.rows() > 0; }
  [[nodiscard]] bool holds_weight_codes() const requires quantized_weights {
    return holds_linear_weight(linears_.operands(), qkv_linear, qkv_width(), hidden_) &&
           holds_linear_weight(linears_.operands(), proj_linear, hidden_, context_width());
  }
  /// f(name, store) for `prefix.linear_qkv.weight` and `prefix.linear_proj.weight`, as
  /// for_each_parameter names them; store(w) quantizes the weight from its fp32 values w.
  template <class F>
  void for_each_quantized_weight(std::string const& prefix, F&& f) requires quantized_weights {
    f(std::string_view(prefix + ".linear_qkv.weight"), [&](T const* w) {
      store_linear_weight(linears_.operands(), qkv_linear, w, qkv_width(), hidden_);
    });
    f(std::string_view(prefix + ".linear_proj.weight"), [&](T const* w) {
      store_linear_weight(linears_.operands(), proj_linear, w, hidden_, context_width());
    });
  }

  /// Sets micro-batch `key`'s kept values aside (core/stash.hpp), or brings them back.
  void park(std::uint64_t key);
  void restore(std::uint64_t key);

  /// Bytes kept from forward to backward (input, q k v, context, log-sum-exp per row, the QK
  /// norms' inputs, and under CP the gathered keys and values).
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    std::size_t norms = 0;
    if constexpr (QkLayernorm) norms = qk_norm_.q.saved_bytes() + qk_norm_.k.saved_bytes();
    return static_cast<std::size_t>(x_.size() + qkv_.size() + context_.size()) * sizeof(T) +
           core_.saved_bytes() + norms;
  }

 private:
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
  /// body(norm, first, count) for the query heads' norm (heads [0, P) of each group's block)
  /// and the key heads' (head P).
  template <class Body>
  void for_each_qk_norm(Body&& body) {
    int const per = heads_ / groups_;
    body(qk_norm_.q, 0, per);
    body(qk_norm_.k, per, 1);
  }
  /// The query and key heads through their norms, in place in qkv_.
  void normalize_heads(thread_pool& pool, int tokens) requires QkLayernorm {
    for_each_qk_norm([&](rms_norm<T>& norm, int first, int count) {
      int const rows = tokens * groups_ * count, d = head_size();
      heads_in_.resize(rows, d);
      heads_out_.resize(rows, d);
      move_heads<false>(pool, qkv_.data(), heads_in_.data(), tokens, first, count);
      norm.forward(pool, {heads_in_.data(), rows, d}, view(heads_out_));
      move_heads<true>(pool, qkv_.data(), heads_out_.data(), tokens, first, count);
    });
  }
  /// The normalized heads' gradients in grad_qkv_ become their inputs' (and the norm weights').
  void normalize_heads_backward(thread_pool& pool, int tokens) requires QkLayernorm {
    for_each_qk_norm([&](rms_norm<T>& norm, int first, int count) {
      int const rows = tokens * groups_ * count, d = head_size();
      heads_in_.resize(rows, d);
      move_heads<false>(pool, grad_qkv_.data(), heads_in_.data(), tokens, first, count);
      norm.backward(pool, {heads_in_.data(), rows, d}, view(heads_in_));
      move_heads<true>(pool, grad_qkv_.data(), heads_in_.data(), tokens, first, count);
    });
  }

  linears_type linears_;
  int hidden_, heads_, groups_, head_size_;
  [[no_unique_address]] std::conditional_t<QkLayernorm, qk_norms, no_qk_norms> qk_norm_;
  attention_core<T, CpComm> core_;
  int seq_ = 0, batch_ = 0;
  row_matrix<T> qkv_weight_, qkv_grad_, proj_weight_, proj_grad_;
  row_matrix<T> x_, qkv_, context_;
  row_matrix<T> grad_context_, grad_qkv_;
  row_matrix<T> heads_in_, heads_out_;  // QK layernorm's packed heads
  activation_stash<int, int, row_matrix<T>, row_matrix<T>, row_matrix<T>> stash_;
};

// Defined outside the class, these members are not inline: a program built with
// MEGAMOE_SEPARATE_COMPILATION compiles them once for float and double with exact operands, P2P
// context parallelism and the grouped GEMM (model/attention.ipp); other instances compile where
// they are used.
template <class T, bool QkLayernorm, parallel::cp_comm_type CpComm, class Ops, class Backend>
void causal_attention<T, QkLayernorm, CpComm, Ops, Backend>::forward(expert::executor<T>& exec,
                                                                     const_row_matrix_map<T> x,
                                                                     int seq, int batch,
                                                                     row_matrix_map<T> y) {
  if (seq < 1 || batch < 1 || x.rows() != std::int64_t{seq} * batch || x.cols() != hidden_ ||
      y.rows() != x.rows() || y.cols() != hidden_ || (core_.cp_size() > 1 && seq % 2 != 0))
    throw input_error("causal_attention: input of shape [" + std::to_string(x.rows()) + ", " +
                      std::to_string(x.cols()) + "] for S = " + std::to_string(seq) +
                      ", B = " + std::to_string(batch) + ", H = " + std::to_string(hidden_));
  if constexpr (quantized_weights)
    if (!holds_weight_codes())
      throw input_error(
          "causal_attention: memory::quantized_weights: the projections' weights have no "
          "codes yet; call refresh_weight_codes() after writing the weights");
  seq_ = seq;
  batch_ = batch;
  int const H = hidden_, N = static_cast<int>(x.rows()), W = qkv_width(), C = context_width();
  x_ = x;
  qkv_.resize(N, W);
  linears_.forward(exec, qkv_linear, N, W, H, x_.data(), qkv_weight_.data(), qkv_.data(), W);
  if constexpr (QkLayernorm) normalize_heads(exec.pool(), N);
  context_.resize(N, C);
  auto const qkv = views<T const>(qkv_.data());
  core_.forward(exec.pool(), shape(), qkv.q, qkv.k, qkv.v, {context_.data(), C});
  linears_.forward(exec, proj_linear, N, H, C, context_.data(), proj_weight_.data(), y.data(),
                   static_cast<int>(y.outerStride()));
}

template <class T, bool QkLayernorm, parallel::cp_comm_type CpComm, class Ops, class Backend>
void causal_attention<T, QkLayernorm, CpComm, Ops, Backend>::backward(expert::executor<T>& exec,
                                                                      const_row_matrix_map<T> dy,
                                                                      row_matrix_map<T> dx) {
  if (dy.rows() != x_.rows() || dy.cols() != hidden_ || dx.rows() != x_.rows() ||
      dx.cols() != hidden_)
    throw input_error("causal_attention: gradient shape does not match the last forward");
  int const H = hidden_, N = static_cast<int>(x_.rows()), W = qkv_width(), C = context_width();
  int const ldy = static_cast<int>(dy.outerStride());
  grad_context_.resize(N, C);
  linears_.backward(exec, proj_linear, N, H, C, dy.data(), ldy, proj_weight_.data(),
                    context_.data(), grad_context_.data(), C, proj_grad_.data());
  grad_qkv_.resize(N, W);
  auto const qkv = views<T const>(qkv_.data());
  auto const grad = views<T>(grad_qkv_.data());
  core_.backward(exec.pool(), qkv.q, qkv.k, qkv.v, {context_.data(), C}, {grad_context_.data(), C},
                 grad.q, grad.k, grad.v);
  if constexpr (QkLayernorm) normalize_heads_backward(exec.pool(), N);
  linears_.backward(exec, qkv_linear, N, W, H, grad_qkv_.data(), W, qkv_weight_.data(), x_.data(),
                    dx.data(), static_cast<int>(dx.outerStride()), qkv_grad_.data());
}

template <class T, bool QkLayernorm, parallel::cp_comm_type CpComm, class Ops, class Backend>
void causal_attention<T, QkLayernorm, CpComm, Ops, Backend>::park(std::uint64_t key) {
  stash_.park(key, seq_, batch_, x_, qkv_, context_);
  core_.park(key);
  if constexpr (QkLayernorm) {
    qk_norm_.q.park(key);
    qk_norm_.k.park(key);
  }
}

template <class T, bool QkLayernorm, parallel::cp_comm_type CpComm, class Ops, class Backend>
void causal_attention<T, QkLayernorm, CpComm, Ops, Backend>::restore(std::uint64_t key) {
  stash_.restore(key, seq_, batch_, x_, qkv_, context_);
  core_.restore(key);
  if constexpr (QkLayernorm) {
    qk_norm_.q.restore(key);
    qk_norm_.k.restore(key);
  }
}

#if !MEGAMOE_HEADER_ONLY
extern template class causal_attention<float, false>;
extern template class causal_attention<float, true>;
extern template class causal_attention<double, false>;
#endif

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/attention.ipp>
#endif
