// SPDX-License-Identifier: Apache-2.0
// megamoe/model/mla.hpp — multi-head latent attention (the reference's multi_latent_attention,
// DeepSeek-V2/V3's MLA), forward and backward, on one rank, under TP and under CP.
//
// Tokens are [S*B, H] with t = s*B + b; n heads; per head dn = qk_head_dim query/key elements
// without position, dr = qk_pos_emb_head_dim rotated ones, dv = v_head_dim value elements.
//   queries   c_q = W_qd x [rq] (linear_q_down_proj), q = W_qu N_q(c_q) (linear_q_up_proj),
//             or q = W_q x (linear_q_proj) without q_lora_rank; per head
//             [q_nope (dn) | q_pe (dr)]
//   latent    W_kvd x = [c_kv (rkv) | k_pe (dr)] (linear_kv_down_proj); W_kvu N_kv(c_kv)
//             per head [k_nope (dn) | v (dv)] (linear_kv_up_proj)
//   norms     with `QkLayernorm` (the reference's qk_layernorm) N_q and N_kv are RMSNorms
//             (q_layernorm [rq], kv_layernorm [rkv]); without it both are the identity, as in
//             the reference
//   RoPE      on q_pe and on k_pe, one k_pe per token shared by every head: the pairs
//             (u_2i, u_2i+1) are written de-interleaved, p_i = u_2i and p_{dr/2+i} = u_2i+1, and
//             rotated as halves, (p_i, p_{dr/2+i}) -> (p_i cos - p_{dr/2+i} sin,
//             p_{dr/2+i} cos + p_i sin) with angle s * base^(-2i/dr) at position s
//   attention Q = [q_nope | rot q_pe], K = [k_nope | rot k_pe] per head, causal softmax of
//             Q.K / sqrt(dn + dr) over V (attention_core, no RoPE in the kernel), then
//             linear_proj [H, n dv].
// Tensor parallelism over TP ranks: the down projections and the norms are replicated (each
// rank's gradients of them are partial, summed over the group), the up projections (or
// linear_q_proj) hold this rank's n / TP heads' rows, linear_proj their columns; the output is
// this rank's part of y and dx its part of the input's gradient, as causal_attention's.
// The five linears read a precision recipe's operands in three objects of two slots each:
// `down` (the query's first projection, linear_kv_down_proj), `up` (linear_q_up_proj,
// linear_kv_up_proj) and `proj` (linear_proj).
#pragma once

#include <megamoe/core/by_need.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/model/attention_core.hpp>
#include <megamoe/model/flash_attention.hpp>
#include <megamoe/model/linear.hpp>
#include <megamoe/model/norm.hpp>
#include <megamoe/model/parameter_layout.hpp>
#include <megamoe/model/tags.hpp>
#include <megamoe/parallel/tags.hpp>

#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe {

/// MLA's sizes, under the reference's names (model/tags.hpp).
using mla_dims = model::mla_settings;

/// The operands of MLA's linears: `down` (linear_q_down_proj or linear_q_proj in slot fc1,
/// linear_kv_down_proj in fc2), `up` (linear_q_up_proj in fc1, linear_kv_up_proj in fc2) and
/// `proj` (linear_proj in fc1).
template <class Ops>
struct mla_operands {
  Ops down{}, up{}, proj{};
};

/// `QLoraRank`: the configuration's q_lora_rank where its type fixes one (then the dims must
/// agree, and whether queries take the low-rank path is known at compile time), or `dynamic`.
template <class T, bool QkLayernorm = false,
          parallel::cp_comm_type CpComm = parallel::cp_comm_type::p2p,
          class Ops = expert::exact_operands, class Backend = expert::grouped_gemm,
          int QLoraRank = dynamic>
class latent_attention {
  static constexpr auto fc1 = expert::linear::fc1;
  static constexpr auto fc2 = expert::linear::fc2;

 public:
  using linears_type = linear_products<T, Ops, Backend>;
  /// memory::quantized_weights: the five weights are held as the recipe's codes.
  static constexpr bool quantized_weights = holds_weight_codes_v<Ops>;

  latent_attention(int hidden, int heads, mla_dims dims, double rope_base = 10000.0,
                   double norm_epsilon = 1e-5, int tensor_parallel = 1, mla_operands<Ops> ops = {})
      : down_(std::move(ops.down)),
        up_(std::move(ops.up)),
        proj_(std::move(ops.proj)),
        hidden_(hidden),
        heads_(tensor_parallel > 0 ? heads / tensor_parallel : 0),
        dims_(dims),
        rope_(dims.qk_pos_emb_head_dim, rope_base),
        core_(0.0) {
    auto fail = [](std::string const& what) {
      throw input_error("latent_attention: " + what);
    };
    if (hidden < 1 || heads < 1) fail("hidden size and heads must be positive");
    if (tensor_parallel < 1 || heads % tensor_parallel != 0)
      fail(std::to_string(tensor_parallel) + " tensor-parallel ranks do not divide " +
           std::to_string(heads) + " heads");
    if (dims.q_lora_rank < 0 || dims.kv_lora_rank < 1 || dims.qk_head_dim < 1 ||
        dims.v_head_dim < 1)
      fail("q_lora_rank must be at least 0; kv_lora_rank, qk_head_dim and v_head_dim positive");
    if (QLoraRank != dynamic && dims.q_lora_rank != QLoraRank)
      fail("q_lora_rank " + std::to_string(dims.q_lora_rank) + ", the type's " +
           std::to_string(QLoraRank));
    if (dims.qk_pos_emb_head_dim < 2 || dims.qk_pos_emb_head_dim % 2 != 0)
      fail("qk_pos_emb_head_dim " + std::to_string(dims.qk_pos_emb_head_dim) +
           " must be even and positive (RoPE rotates pairs)");
    if (!(rope_base > 0.0)) fail("the RoPE base must be positive");
    int const rq = dims.q_lora_rank;
    int const rkv = dims.kv_lora_rank, dr = dims.qk_pos_emb_head_dim;
    auto zero = [](row_matrix<T>& w, row_matrix<T>& g, std::int64_t rows, std::int64_t cols) {
      w = row_matrix<T>::Zero(rows, cols);
      g = row_matrix<T>::Zero(rows, cols);
    };
    if (low_rank_queries()) {
      zero(q_down_.value, q_down_.grad, rq, hidden);
      zero(q_up_.value, q_up_.grad, query_width(), rq);
    } else {
      zero(q_down_.value, q_down_.grad, query_width(), hidden);
    }
    zero(kv_down_.value, kv_down_.grad, rkv + dr, hidden);
    zero(kv_up_.value, kv_up_.grad, latent_width(), rkv);
    zero(proj_w_.value, proj_w_.grad, hidden, context_width());
    if constexpr (QkLayernorm)
      norms_ = {rms_norm<T>(std::max(1, rq), norm_epsilon), rms_norm<T>(rkv, norm_epsilon)};
    else
      (void)norm_epsilon;
  }

  [[nodiscard]] int hidden() const noexcept { return hidden_; }
  /// Whether queries take the low-rank path (q_lora_rank above 0): the type's QLoraRank where it
  /// fixes one, else the dims'.
  [[nodiscard]] bool low_rank_queries() const noexcept {
    if constexpr (QLoraRank != dynamic)
      return QLoraRank > 0;
    else
      return dims_.q_lora_rank > 0;
  }
  /// This rank's heads (all of them without tensor parallelism).
  [[nodiscard]] int heads() const noexcept { return heads_; }
  [[nodiscard]] mla_dims const& dims() const noexcept { return dims_; }
  /// A head's query/key elements, qk_head_dim + qk_pos_emb_head_dim.
  [[nodiscard]] int qk_size() const noexcept {
    return dims_.qk_head_dim + dims_.qk_pos_emb_head_dim;
  }
  /// This rank's query columns, heads * (qk_head_dim + qk_pos_emb_head_dim).
  [[nodiscard]] int query_width() const noexcept { return heads_ * qk_size(); }
  /// This rank's columns of linear_kv_up_proj's output, heads * (qk_head_dim + v_head_dim).
  [[nodiscard]] int latent_width() const noexcept {
    return heads_ * (dims_.qk_head_dim + dims_.v_head_dim);
  }
  /// This rank's attention output width, heads * v_head_dim (linear_proj's columns).
  [[nodiscard]] int context_width() const noexcept { return heads_ * dims_.v_head_dim; }

  /// f(part, linears) for each of the three operands' products: ".down", ".up", ".proj".
  template <class F>
  void for_each_linears(F&& f) {
    f(std::string_view(".down"), down_);
    f(std::string_view(".up"), up_);
    f(std::string_view(".proj"), proj_);
  }
  template <class F>
  void for_each_linears(F&& f) const {
    f(std::string_view(".down"), down_);
    f(std::string_view(".up"), up_);
    f(std::string_view(".proj"), proj_);
  }

  /// Context parallelism over `cp` (attention_core's layout; RoPE sees global positions).
  void set_context_parallel(boost::mpi::communicator const& cp) { core_.set_context_parallel(cp); }

  /// y [S*B, H] from x [S*B, H]; keeps what backward needs.
  void forward(expert::executor<T>& exec, const_row_matrix_map<T> x, int seq, int batch,
               row_matrix_map<T> y) {
    if (seq < 1 || batch < 1 || x.rows() != std::int64_t{seq} * batch || x.cols() != hidden_ ||
        y.rows() != x.rows() || y.cols() != hidden_ || (core_.cp_size() > 1 && seq % 2 != 0))
      throw input_error("latent_attention: input of shape [" + std::to_string(x.rows()) +
                        ", " + std::to_string(x.cols()) + "] for S = " + std::to_string(seq) +
                        ", B = " + std::to_string(batch) + ", H = " + std::to_string(hidden_));
    if constexpr (quantized_weights)
      if (!holds_weight_codes())
        throw input_error(
            "latent_attention: memory::quantized_weights: the weights have no codes yet; "
            "call refresh_weight_codes() after writing the weights");
    seq_ = seq;
    batch_ = batch;
    auto& pool = exec.pool();
    int const H = hidden_, N = static_cast<int>(x.rows()), Q = query_width();
    int const rq = dims_.q_lora_rank, rkv = dims_.kv_lora_rank, dr = dims_.qk_pos_emb_head_dim;
    int const KVD = rkv + dr, KVU = latent_width(), C = context_width();
    x_ = x;
    q_.resize(N, Q);
    if (low_rank_queries()) {
      normed_q_.resize(N, rq);
      if constexpr (QkLayernorm) {
        latent_q_.resize(N, rq);
        down_.forward(exec, fc1, N, rq, H, x_.data(), q_down_.value.data(), latent_q_.data(), rq);
        norms_.q.forward(pool, const_view(latent_q_), view(normed_q_));
      } else {
        down_.forward(exec, fc1, N, rq, H, x_.data(), q_down_.value.data(), normed_q_.data(), rq);
      }
      up_.forward(exec, fc1, N, Q, rq, normed_q_.data(), q_up_.value.data(), q_.data(), Q);
    } else {
      down_.forward(exec, fc1, N, Q, H, x_.data(), q_down_.value.data(), q_.data(), Q);
    }
    compressed_.resize(N, KVD);
    down_.forward(exec, fc2, N, KVD, H, x_.data(), kv_down_.value.data(), compressed_.data(), KVD);
    if constexpr (QkLayernorm) {
      latent_kv_ = compressed_.leftCols(rkv);
      normed_kv_.resize(N, rkv);
      norms_.kv.forward(pool, const_view(latent_kv_), view(normed_kv_));
    } else {
      normed_kv_ = compressed_.leftCols(rkv);
    }
    kv_.resize(N, KVU);
    up_.forward(exec, fc2, N, KVU, rkv, normed_kv_.data(), kv_up_.value.data(), kv_.data(), KVU);
    assemble_keys(pool);
    context_.resize(N, C);
    core_.forward(pool, shape(), queries<T const>(q_.data()), queries<T const>(keys_.data()),
                  values<T const>(kv_.data()), {context_.data(), C});
    proj_.forward(exec, fc1, N, H, C, context_.data(), proj_w_.value.data(), y.data(),
                  static_cast<int>(y.outerStride()));
  }

  /// dx [S*B, H] from dy of the last forward; adds every weight's gradient. With tensor
  /// parallelism dy is the whole output's gradient and dx this rank's part of the input's.
  void backward(expert::executor<T>& exec, const_row_matrix_map<T> dy, row_matrix_map<T> dx) {
    if (dy.rows() != x_.rows() || dy.cols() != hidden_ || dx.rows() != x_.rows() ||
        dx.cols() != hidden_)
      throw input_error("latent_attention: gradient shape does not match the last forward");
    auto& pool = exec.pool();
    int const H = hidden_, N = static_cast<int>(x_.rows()), Q = query_width();
    int const rq = dims_.q_lora_rank, rkv = dims_.kv_lora_rank, dr = dims_.qk_pos_emb_head_dim;
    int const KVD = rkv + dr, KVU = latent_width(), C = context_width();
    grad_context_.resize(N, C);
    proj_.backward(exec, fc1, N, H, C, dy.data(), static_cast<int>(dy.outerStride()),
                   proj_w_.value.data(), context_.data(), grad_context_.data(), C,
                   proj_w_.grad.data());
    grad_q_.resize(N, Q);
    grad_keys_.resize(N, Q);
    grad_kv_.resize(N, KVU);
    core_.backward(pool, queries<T const>(q_.data()), queries<T const>(keys_.data()),
                   values<T const>(kv_.data()), {context_.data(), C}, {grad_context_.data(), C},
                   queries<T>(grad_q_.data()), queries<T>(grad_keys_.data()),
                   values<T>(grad_kv_.data()));
    grad_compressed_.resize(N, KVD);
    split_key_gradients(pool);
    // The latent's path: linear_kv_up_proj, its norm (if any), then linear_kv_down_proj (with
    // k_pe's).
    grad_latent_.resize(N, rkv);
    up_.backward(exec, fc2, N, KVU, rkv, grad_kv_.data(), KVU, kv_up_.value.data(),
                 normed_kv_.data(), grad_latent_.data(), rkv, kv_up_.grad.data());
    if constexpr (QkLayernorm)
      norms_.kv.backward(pool, const_view(grad_latent_), view(grad_latent_));
    grad_compressed_.leftCols(rkv) = grad_latent_;
    down_.backward(exec, fc2, N, KVD, H, grad_compressed_.data(), KVD, kv_down_.value.data(),
                   x_.data(), dx.data(), static_cast<int>(dx.outerStride()), kv_down_.grad.data());
    // The queries' path, added.
    grad_x_q_.resize(N, H);
    if (low_rank_queries()) {
      grad_latent_q_.resize(N, rq);
      up_.backward(exec, fc1, N, Q, rq, grad_q_.data(), Q, q_up_.value.data(), normed_q_.data(),
                   grad_latent_q_.data(), rq, q_up_.grad.data());
      if constexpr (QkLayernorm)
        norms_.q.backward(pool, const_view(grad_latent_q_), view(grad_latent_q_));
      down_.backward(exec, fc1, N, rq, H, grad_latent_q_.data(), rq, q_down_.value.data(),
                     x_.data(), grad_x_q_.data(), H, q_down_.grad.data());
    } else {
      down_.backward(exec, fc1, N, Q, H, grad_q_.data(), Q, q_down_.value.data(), x_.data(),
                     grad_x_q_.data(), H, q_down_.grad.data());
    }
    dx += grad_x_q_;
  }

  void zero_grad() {
    for_each_weight(
        [](std::string_view, linears_type&, expert::linear, weight& w) { w.grad.setZero(); });
    if constexpr (QkLayernorm) {
      if (low_rank_queries()) norms_.q.zero_grad();
      norms_.kv.zero_grad();
    }
  }

  /// f(name, value, grad) for `prefix.` linear_q_down_proj.weight, linear_q_up_proj.weight (or
  /// linear_q_proj.weight), linear_kv_down_proj.weight, linear_kv_up_proj.weight,
  /// linear_proj.weight, then with QkLayernorm q_layernorm.weight (with q_lora_rank) and
  /// kv_layernorm.weight.
  template <class F>
  void for_each_parameter(std::string const& prefix, F&& f) {
    for_each_weight([&](std::string_view name, linears_type& l, expert::linear, weight& w) {
      // The down projections are whole on every TP rank; the up projections (and linear_q_proj)
      // are cut by heads' rows, linear_proj by heads' columns.
      parameter_cut const cut = &l == &proj_  ? parameter_cut::columns
                                : &w == &kv_down_ || (&w == &q_down_ && low_rank_queries())
                                    ? parameter_cut::whole
                                    : parameter_cut::rows;
      report_parameter(f, prefix + std::string(name), view(w.value), view(w.grad), cut);
    });
    if constexpr (QkLayernorm) {
      if (low_rank_queries()) norms_.q.for_each_parameter(prefix + ".q_layernorm", f);
      norms_.kv.for_each_parameter(prefix + ".kv_layernorm", f);
    }
  }

  // memory::quantized_weights, as causal_attention's: the codes are the primary weights.
  /// Quantizes every weight from its fp32 values (collective over the operands' amax groups).
  void refresh_weight_codes() requires quantized_weights {
    if (!holds_weight_values())
      throw input_error(
          "latent_attention: refresh_weight_codes() needs the fp32 weights, which an "
          "optimizer holds now");
    for_each_weight([](std::string_view, linears_type& l, expert::linear slot, weight& w) {
      store_linear_weight(l.operands(), slot, w.value.data(), w.grad.rows(), w.grad.cols());
    });
  }
  void release_weight_values() requires quantized_weights {
    for_each_weight([](std::string_view, linears_type&, expert::linear, weight& w) {
      w.value.resize(0, w.grad.cols());
    });
  }
  [[nodiscard]] bool holds_weight_values() const noexcept { return kv_down_.value.rows() > 0; }
  [[nodiscard]] bool holds_weight_codes() requires quantized_weights {
    bool all = true;
    for_each_weight([&](std::string_view, linears_type& l, expert::linear slot, weight& w) {
      all = all && holds_linear_weight(l.operands(), slot, w.grad.rows(), w.grad.cols());
    });
    return all;
  }
  /// f(name, store) for each linear's weight, as for_each_parameter names it; store(w) quantizes
  /// the weight from its fp32 values w.
  template <class F>
  void for_each_quantized_weight(std::string const& prefix, F&& f) requires quantized_weights {
    for_each_weight([&](std::string_view name, linears_type& l, expert::linear slot, weight& w) {
      f(std::string_view(prefix + std::string(name)), [&](T const* values) {
        store_linear_weight(l.operands(), slot, values, w.grad.rows(), w.grad.cols());
      });
    });
  }

  /// Sets micro-batch `key`'s kept values aside (core/stash.hpp), or brings them back.
  void park(std::uint64_t key) {
    stash_.park(key, seq_, batch_, x_, normed_q_, q_, normed_kv_, kv_, keys_, context_);
    if constexpr (QkLayernorm) {
      if (low_rank_queries()) norms_.q.park(key);
      norms_.kv.park(key);
    }
    core_.park(key);
  }
  void restore(std::uint64_t key) {
    stash_.restore(key, seq_, batch_, x_, normed_q_, q_, normed_kv_, kv_, keys_, context_);
    if constexpr (QkLayernorm) {
      if (low_rank_queries()) norms_.q.restore(key);
      norms_.kv.restore(key);
    }
    core_.restore(key);
  }

  /// Bytes kept from forward to backward (input, normed latents, queries, keys, up-projected
  /// keys and values, context, the norms' inputs, the core's log-sum-exp and gathered rows).
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    std::size_t norms = 0;
    if constexpr (QkLayernorm)
      norms = (low_rank_queries() ? norms_.q.saved_bytes() : 0) + norms_.kv.saved_bytes();
    return static_cast<std::size_t>(x_.size() + normed_q_.size() + q_.size() + normed_kv_.size() +
                                    kv_.size() + keys_.size() + context_.size()) *
               sizeof(T) +
           norms + core_.saved_bytes();
  }

 private:
  struct weight {
    row_matrix<T> value, grad;
  };
  struct latent_norms {
    rms_norm<T> q{1}, kv{1};
  };
  struct no_latent_norms {};

  /// f(name suffix, products, slot, weight) for the linears in forward order.
  template <class F>
  void for_each_weight(F&& f) {
    if (low_rank_queries()) {
      f(".linear_q_down_proj.weight", down_, fc1, q_down_);
      f(".linear_q_up_proj.weight", up_, fc1, q_up_);
    } else {
      f(".linear_q_proj.weight", down_, fc1, q_down_);
    }
    f(".linear_kv_down_proj.weight", down_, fc2, kv_down_);
    f(".linear_kv_up_proj.weight", up_, fc2, kv_up_);
    f(".linear_proj.weight", proj_, fc1, proj_w_);
  }

  [[nodiscard]] attention::attention_shape shape() const noexcept {
    return {.seq = seq_,
            .batch = batch_,
            .heads = heads_,
            .query_groups = heads_,
            .qk_head = qk_size(),
            .v_head = dims_.v_head_dim};
  }
  /// Rows of heads of qk_size() elements side by side (queries, keys, their gradients).
  template <class U>
  [[nodiscard]] attention::token_view<U> queries(U* data) const noexcept {
    return {data, query_width()};
  }
  /// The value heads of linear_kv_up_proj's rows (per head [k_nope | v]).
  template <class U>
  [[nodiscard]] attention::token_view<U> values(U* data) const noexcept {
    return {data + dims_.qk_head_dim, latent_width(), 1, dims_.qk_head_dim + dims_.v_head_dim};
  }
  /// The position of row t (t = s B + b of this rank's positions).
  [[nodiscard]] int position_of(int t) const noexcept { return core_.position(t / batch_, seq_); }

  /// u (dr elements) becomes its rotation at position s, in place, through `p` (dr scratch).
  void rotate(T* u, T* p, int s) const {
    int const half = dims_.qk_pos_emb_head_dim / 2;
    T const* const cos = rope_.cos_at(s);
    T const* const sin = rope_.sin_at(s);
    for (int i = 0; i < half; ++i) {
      p[i] = u[2 * i];
      p[half + i] = u[2 * i + 1];
    }
    for (int i = 0; i < half; ++i) {
      u[i] = p[i] * cos[i] - p[half + i] * sin[i];
      u[half + i] = p[half + i] * cos[i] + p[i] * sin[i];
    }
  }
  /// g (dr elements), the gradient of a rotated part, becomes its input's, in place.
  void unrotate(T* g, T* p, int s) const {
    int const half = dims_.qk_pos_emb_head_dim / 2;
    T const* const cos = rope_.cos_at(s);
    T const* const sin = rope_.sin_at(s);
    for (int i = 0; i < half; ++i) {
      p[i] = g[i] * cos[i] + g[half + i] * sin[i];
      p[half + i] = g[half + i] * cos[i] - g[i] * sin[i];
    }
    for (int i = 0; i < half; ++i) {
      g[2 * i] = p[i];
      g[2 * i + 1] = p[half + i];
    }
  }

  /// Rotates every head's q_pe in q_ and builds keys_: per head [k_nope | rotated k_pe].
  void assemble_keys(thread_pool& pool) {
    int const N = static_cast<int>(q_.rows()), Q = query_width(), KVU = latent_width();
    int const dn = dims_.qk_head_dim, dr = dims_.qk_pos_emb_head_dim, dv = dims_.v_head_dim;
    int const rkv = dims_.kv_lora_rank, d = qk_size();
    rope_.ensure(seq_ * core_.cp_size());
    keys_.resize(N, Q);
    rope_scratch_.resize(N, 2 * dr);  // per token: a rotation's scratch, the rotated k_pe
    parallel_rows(pool, N, [&](int begin, int end) {
      for (int t = begin; t < end; ++t) {
        T* const scratch = rope_scratch_.data() + std::int64_t(t) * 2 * dr;
        T* const pe = scratch + dr;
        int const s = position_of(t);
        T* const q = q_.data() + std::int64_t(t) * Q;
        for (int h = 0; h < heads_; ++h) rotate(q + h * d + dn, scratch, s);
        T const* const k_pe = compressed_.data() + std::int64_t(t) * (rkv + dr) + rkv;
        std::copy(k_pe, k_pe + dr, pe);
        rotate(pe, scratch, s);
        T const* const kv = kv_.data() + std::int64_t(t) * KVU;
        T* const k = keys_.data() + std::int64_t(t) * Q;
        for (int h = 0; h < heads_; ++h) {
          std::copy(kv + h * (dn + dv), kv + h * (dn + dv) + dn, k + h * d);
          std::copy(pe, pe + dr, k + h * d + dn);
        }
      }
    });
  }
  /// From grad_keys_: k_nope's gradients into grad_kv_ (beside v's), k_pe's (summed over the
  /// heads, un-rotated) into grad_compressed_'s last dr columns; q_pe's un-rotated in grad_q_.
  void split_key_gradients(thread_pool& pool) {
    int const N = static_cast<int>(q_.rows()), Q = query_width(), KVU = latent_width();
    int const dn = dims_.qk_head_dim, dr = dims_.qk_pos_emb_head_dim, dv = dims_.v_head_dim;
    int const rkv = dims_.kv_lora_rank, d = qk_size();
    rope_scratch_.resize(N, 2 * dr);
    parallel_rows(pool, N, [&](int begin, int end) {
      for (int t = begin; t < end; ++t) {
        T* const scratch = rope_scratch_.data() + std::int64_t(t) * 2 * dr;
        int const s = position_of(t);
        T* const dq = grad_q_.data() + std::int64_t(t) * Q;
        for (int h = 0; h < heads_; ++h) unrotate(dq + h * d + dn, scratch, s);
        T const* const dk = grad_keys_.data() + std::int64_t(t) * Q;
        T* const dkv = grad_kv_.data() + std::int64_t(t) * KVU;
        T* const dpe = grad_compressed_.data() + std::int64_t(t) * (rkv + dr) + rkv;
        std::fill(dpe, dpe + dr, T(0));
        for (int h = 0; h < heads_; ++h) {
          std::copy(dk + h * d, dk + h * d + dn, dkv + h * (dn + dv));
          for (int i = 0; i < dr; ++i) dpe[i] += dk[h * d + dn + i];
        }
        unrotate(dpe, scratch, s);
      }
    });
  }

  linears_type down_, up_, proj_;
  int hidden_, heads_;
  mla_dims dims_;
  [[no_unique_address]] std::conditional_t<QkLayernorm, latent_norms, no_latent_norms> norms_;
  attention::rope_table<T> rope_;
  attention_core<T, CpComm> core_;
  int seq_ = 0, batch_ = 0;
  weight q_down_, q_up_, kv_down_, kv_up_, proj_w_;
  row_matrix<T> x_, latent_q_, normed_q_, q_, compressed_, latent_kv_, normed_kv_, kv_, keys_,
      context_;
  row_matrix<T> grad_context_, grad_q_, grad_keys_, grad_kv_, grad_compressed_, grad_latent_,
      grad_latent_q_, grad_x_q_;
  row_matrix<T> rope_scratch_;  // per token, reused every step: nothing allocated once sized
  activation_stash<int, int, row_matrix<T>, row_matrix<T>, row_matrix<T>, row_matrix<T>,
                   row_matrix<T>, row_matrix<T>, row_matrix<T>>
      stash_;
};

}  // namespace megamoe

namespace megamoe::by_need {
/// This header is included.
template <class Dependent>
inline constexpr bool included<module::latent_attention, Dependent> = true;
}  // namespace megamoe::by_need
