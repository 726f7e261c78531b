// SPDX-License-Identifier: Apache-2.0
// megamoe/model/flash_attention.hpp — causal softmax attention computed block by block with an
// online softmax, never holding a [S, S] score matrix: forward gives the output and each row's
// log-sum-exp; backward recomputes the scores from them.
//
// Tokens are t = s*B + b. Element c of head h at position s of sequence b lies at
// data[(s*B + b)*ld + h*head + c] of a `token_view`, so q, k and v are read straight from a fused
// [T, 3H] projection and the output is written into [T, H]. Query head h reads key/value head
// h / (heads / query_groups) (grouped-query attention); query/key heads have qk_head elements,
// value heads v_head (they may differ). Query row s is at position query_offset + s, key row t at
// key_offset + t, and a query sees the keys at or before its position (context-parallel chunks
// pass their offsets). RoPE ("rotate half", as causal_attention documents) is applied to q and k
// as their tiles are loaded and undone on their gradients as those are stored.
//
// Work: forward tasks are (sequence, head, query block), heaviest blocks first, so the causal
// triangle's uneven blocks balance over the pool; backward tasks are (sequence, key/value head),
// each owning its heads' gradients. The tile products and the softmax run on AVX-512 where the CPU
// has it (fp32) and on portable loops otherwise (model/flash_attention_tiles.hpp); scratch is per
// pool thread and only grows.
//
// Context parallelism: attention over disjoint sets of keys (key_offset, key_seq) merges by the
// rows' log-sum-exp (merge_partial); backward over each set, given the merged output and
// log-sum-exp, gives that set's dk and dv and its share of dq (the shares sum to dq).
//
// Operands: with `same_operands` the products take the values as they are; with `bf16_operands`
// (fp32 only) every operand of a tile product is a BF16 value (q, k, v and the output gradient
// rounded as their tiles are staged, the probabilities P and dS rounded before the products that
// take them) and out, dq, dk and dv are stored as BF16 values, while products accumulate, and the
// softmax and log-sum-exp run, in fp32: the numerics of BF16 flash attention. A product of two
// BF16 values is exact in fp32, so the fp32 tile kernels compute what BF16 units compute, up to
// the order of the additions.
#pragma once

#include <megamoe/core/bf16.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/core/vector_math.hpp>
#include <megamoe/model/flash_attention_tiles.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace megamoe::attention {

/// Rows of token-major data: head h of token t starts at data[t*ld + head_offset(h, size)]. By
/// default the heads lie side by side (offset h*size); with heads_per_block > 0 they come in
/// blocks of that many heads, block_stride elements apart (the reference's linear_qkv output: per
/// query group its query heads, then its key head, then its value head).
template <class T>
struct token_view {
  T* data = nullptr;
  std::int64_t ld = 0;
  int heads_per_block = 0;
  std::int64_t block_stride = 0;

  [[nodiscard]] std::int64_t head_offset(int h, int size) const noexcept {
    if (heads_per_block <= 0) return std::int64_t(h) * size;
    return std::int64_t(h / heads_per_block) * block_stride +
           std::int64_t(h % heads_per_block) * size;
  }
  /// Head h (of `size` elements) of token t.
  [[nodiscard]] T* head(std::int64_t t, int h, int size) const noexcept {
    return data + t * ld + head_offset(h, size);
  }
};

/// The sizes of one attention call.
struct attention_shape {
  int seq = 0;           // query positions per sequence
  int key_seq = 0;       // key/value positions per sequence (0: seq)
  int batch = 0;         // sequences
  int heads = 0;         // query heads
  int query_groups = 0;  // key/value heads (0: heads); divides heads
  int qk_head = 0;       // query/key head size (even with RoPE)
  int v_head = 0;        // value head size (0: qk_head)
  int query_offset = 0;  // position of query row 0
  int key_offset = 0;    // position of key row 0
  double scale = 0.0;    // score scale (0: 1 / sqrt(qk_head))

  [[nodiscard]] int keys() const noexcept { return key_seq > 0 ? key_seq : seq; }
  [[nodiscard]] int groups() const noexcept { return query_groups > 0 ? query_groups : heads; }
  [[nodiscard]] int value_head() const noexcept { return v_head > 0 ? v_head : qk_head; }
  [[nodiscard]] double score_scale() const noexcept {
    return scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(qk_head));
  }
  /// Throws input_error naming the first size that cannot work.
  void check(bool rope) const;
};

/// cos and sin of RoPE's angles, position s and pair i < head/2: s * base^(-2i/head).
template <class T>
class rope_table {
 public:
  rope_table(int head, double base) : head_(head), base_(base) {}
  /// Makes positions [0, positions) available.
  void ensure(int positions) {
    int const half = head_ / 2, have = static_cast<int>(cos_.size()) / std::max(1, half);
    if (positions <= have) return;
    cos_.resize(static_cast<std::size_t>(positions) * half);
    sin_.resize(cos_.size());
    for (int s = have; s < positions; ++s)
      for (int i = 0; i < half; ++i) {
        double const angle = s * std::pow(base_, -2.0 * i / static_cast<double>(head_));
        cos_[static_cast<std::size_t>(s) * half + i] = static_cast<T>(std::cos(angle));
        sin_[static_cast<std::size_t>(s) * half + i] = static_cast<T>(std::sin(angle));
      }
  }
  [[nodiscard]] int head() const noexcept { return head_; }
  [[nodiscard]] T const* cos_at(int s) const { return cos_.data() + std::size_t(s) * (head_ / 2); }
  [[nodiscard]] T const* sin_at(int s) const { return sin_.data() + std::size_t(s) * (head_ / 2); }

 private:
  int head_;
  double base_;
  std::vector<T> cos_, sin_;
};

/// Which tile kernels run: AVX-512 (fp32, where the CPU has it) or portable loops.
enum class attention_kernel { portable, avx512 };

/// The products' operands as they are.
struct same_operands {
  static constexpr bool rounds = false;
  template <class T>
  static T round(T x) noexcept {
    return x;
  }
};

/// The products' operands and the stored results rounded to BF16 (fp32 kernels only).
struct bf16_operands {
  static constexpr bool rounds = true;
  static float round(float x) noexcept { return round_to_bf16(x); }
};

namespace detail {

/// Query and key rows per block.
inline constexpr int block = 64;

/// One pool thread's tiles and whole-sequence buffers.
template <class T>
struct scratch {
  std::vector<T> q, k, kt, vt, v, o, dout, dq, dk, dv, scores, dscores, max, sum, alpha, lse, d;
  std::vector<int> valid;
};

template <class T>
void grow(std::vector<T>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace detail

/// Causal attention by blocks. Holds the RoPE table and per-thread scratch, which only grow.
template <class T, class Operands = same_operands>
class flash_attention {
  static_assert(!Operands::rounds || std::is_same_v<T, float>,
                "flash_attention: BF16 operands are rounded from fp32; T must be float");

 public:
  /// `rope_base` > 0 applies RoPE of that base to q and k; 0 applies none.
  explicit flash_attention(double rope_base = 10000.0)
      : rope_base_(rope_base),
        kernel_(std::is_same_v<T, float> && cpu().use_avx512() ? attention_kernel::avx512
                                                               : attention_kernel::portable) {}

  [[nodiscard]] attention_kernel kernel() const noexcept { return kernel_; }
  /// Forces a kernel (tests compare them); avx512 needs fp32 and the CPU's AVX-512.
  void set_kernel(attention_kernel k) {
    if (k == attention_kernel::avx512 &&
        !(MEGAMOE_VECTOR_MATH_AVX512 && std::is_same_v<T, float> && cpu().use_avx512()))
      throw input_error("flash attention: the AVX-512 kernel needs fp32 and a CPU with AVX-512");
    kernel_ = k;
  }

  /// out = softmax(scale q k^T, causal) v per head; lse [batch][heads][seq] gets each row's
  /// log-sum-exp of its scaled scores (natural log).
  void forward(thread_pool& pool, attention_shape const& shape, token_view<T const> q,
               token_view<T const> k, token_view<T const> v, token_view<T> out, T* lse);

  /// dq, dk, dv (overwritten) from dout, given the forward's inputs, output and lse.
  void backward(thread_pool& pool, attention_shape const& shape, token_view<T const> q,
                token_view<T const> k, token_view<T const> v, token_view<T const> out,
                token_view<T const> dout, T const* lse, token_view<T> dq, token_view<T> dk,
                token_view<T> dv);

 private:
  static constexpr int bs = detail::block;

  void prepare(thread_pool& pool, attention_shape const& shape) {
    shape.check(rope_base_ > 0);
    if (rope_base_ > 0) {
      if (!rope_ || rope_->head() != shape.qk_head) rope_.emplace(shape.qk_head, rope_base_);
      rope_->ensure(std::max(shape.query_offset + shape.seq, shape.key_offset + shape.keys()));
    }
    scratch_.resize(static_cast<std::size_t>(std::max(1, pool.size())));
    // Every thread's scratch grows here, before the tasks fan out, to what forward and backward
    // need, so which thread takes which task never decides whether a call allocates.
    auto const b = std::size_t(bs), Sq = std::size_t(shape.seq), Sk = std::size_t(shape.keys());
    auto const hk = std::size_t(shape.qk_head), hv = std::size_t(shape.value_head());
    for (auto& w : scratch_) {
      detail::grow(w.q, std::max(b, Sq) * hk);
      detail::grow(w.k, Sk * hk);
      detail::grow(w.kt, std::max(b, Sk) * hk);
      detail::grow(w.v, b * hv);
      detail::grow(w.o, b * hv);
      detail::grow(w.vt, Sk * hv);
      detail::grow(w.dq, Sq * hk);
      detail::grow(w.dout, Sq * hv);
      detail::grow(w.dk, Sk * hk);
      detail::grow(w.dv, Sk * hv);
      detail::grow(w.scores, b * b);
      detail::grow(w.dscores, b * b);
      for (auto* a : {&w.max, &w.sum, &w.alpha}) detail::grow(*a, b);
      detail::grow(w.lse, Sq);
      detail::grow(w.d, Sq);
      detail::grow(w.valid, b);
    }
  }
  detail::scratch<T>& mine(thread_pool& pool) {
    return scratch_[static_cast<std::size_t>(std::max(0, pool.current_thread()))];
  }

  /// Row `src` (head size n) into `dst`, rotated at `position` and times `factor`; `sign` -1
  /// applies the rotation's transpose (its inverse), which takes gradients back.
  void rotate_row(T const* src, int n, int position, T factor, T* dst, T sign = T(1)) const {
    if (!rope_) {
      for (int c = 0; c < n; ++c) dst[c] = Operands::round(src[c] * factor);
      return;
    }
    int const half = n / 2;
    T const* cs = rope_->cos_at(position);
    T const* sn = rope_->sin_at(position);
    for (int i = 0; i < half; ++i) {
      T const a = src[i], b = src[i + half], s = sign * sn[i];
      dst[i] = Operands::round((a * cs[i] - b * s) * factor);
      dst[i + half] = Operands::round((b * cs[i] + a * s) * factor);
    }
  }

  /// n values from src to dst, rounded as the operands are.
  static void stage(T const* src, int n, T* dst) {
    for (int c = 0; c < n; ++c) dst[c] = Operands::round(src[c]);
  }
  /// A rows x cols tile (row stride ld) rounded in place, where the operands are rounded.
  static void round_tile(int rows, int cols, T* tile, std::ptrdiff_t ld) {
    if constexpr (Operands::rounds)
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) tile[r * ld + c] = Operands::round(tile[r * ld + c]);
  }

  /// Keys row r of a query block sees, among `count` keys starting at key row `first`.
  static int visible(attention_shape const& s, int query_row, int first, int count) {
    int const last = s.query_offset + query_row - s.key_offset;  // last key row it sees
    return std::clamp(last - first + 1, 0, count);
  }

  template <class Tiles>
  void forward_with(thread_pool& pool, attention_shape const& s, token_view<T const> q,
                    token_view<T const> k, token_view<T const> v, token_view<T> out, T* lse) {
    int const S = s.seq, K = s.keys(), B = s.batch, dk = s.qk_head, dv = s.value_head();
    int const per_group = s.heads / s.groups();
    int const qblocks = (S + bs - 1) / bs, pairs = B * s.heads;
    T const scale = static_cast<T>(s.score_scale());
    pool.run(qblocks * pairs, [&](int task) {
      int const qb = qblocks - 1 - task / pairs, pair = task % pairs;  // heaviest blocks first
      int const b = pair / s.heads, h = pair % s.heads, g = h / per_group;
      int const q0 = qb * bs, mq = std::min(bs, S - q0);
      auto& w = mine(pool);
      for (int r = 0; r < mq; ++r)
        rotate_row(q.head(std::int64_t(q0 + r) * B + b, h, dk), dk, s.query_offset + q0 + r, scale,
                   w.q.data() + std::size_t(r) * dk);
      std::fill(w.o.begin(), w.o.begin() + std::ptrdiff_t(mq) * dv, T(0));
      std::fill(w.max.begin(), w.max.begin() + mq, -std::numeric_limits<T>::infinity());
      std::fill(w.sum.begin(), w.sum.begin() + mq, T(0));
      int const key_end = std::min(K, s.query_offset + q0 + mq - s.key_offset);
      for (int k0 = 0; k0 < key_end; k0 += bs) {
        int const nk = std::min(bs, key_end - k0);
        T* row = w.k.data();  // one rotated key row
        for (int j = 0; j < nk; ++j) {
          auto const token = std::int64_t(k0 + j) * B + b;
          rotate_row(k.head(token, g, dk), dk, s.key_offset + k0 + j, T(1), row);
          for (int c = 0; c < dk; ++c) w.kt[std::size_t(c) * bs + j] = row[c];
          stage(v.head(token, g, dv), dv, w.v.data() + std::size_t(j) * dv);
        }
        for (int r = 0; r < mq; ++r) w.valid[r] = visible(s, q0 + r, k0, nk);
        Tiles::product(mq, nk, dk, w.q.data(), dk, 1, w.kt.data(), bs, w.scores.data(), bs, false);
        Tiles::softmax_forward(mq, nk, w.scores.data(), bs, w.valid.data(), w.max.data(),
                               w.sum.data(), w.alpha.data());
        round_tile(mq, nk, w.scores.data(), bs);
        for (int r = 0; r < mq; ++r)
          if (w.alpha[r] != T(1))
            for (int c = 0; c < dv; ++c) w.o[std::size_t(r) * dv + c] *= w.alpha[r];
        Tiles::product(mq, dv, nk, w.scores.data(), bs, 1, w.v.data(), dv, w.o.data(), dv, true);
      }
      for (int r = 0; r < mq; ++r) {
        T* dst = out.head(std::int64_t(q0 + r) * B + b, h, dv);
        T const total = w.sum[r];
        T const inv = total > T(0) ? T(1) / total : T(0);
        for (int c = 0; c < dv; ++c) dst[c] = Operands::round(w.o[std::size_t(r) * dv + c] * inv);
        lse[(std::int64_t(b) * s.heads + h) * S + q0 + r] =
            total > T(0) ? w.max[r] + std::log(total) : -std::numeric_limits<T>::infinity();
      }
    });
  }

  template <class Tiles>
  void backward_with(thread_pool& pool, attention_shape const& s, token_view<T const> q,
                     token_view<T const> k, token_view<T const> v, token_view<T const> out,
                     token_view<T const> dout, T const* lse, token_view<T> dq, token_view<T> dk,
                     token_view<T> dv) {
    int const S = s.seq, K = s.keys(), B = s.batch, hk = s.qk_head, hv = s.value_head();
    int const per_group = s.heads / s.groups();
    T const scale = static_cast<T>(s.score_scale());
    pool.run(B * s.groups(), [&](int task) {
      int const b = task / s.groups(), g = task % s.groups();
      auto& w = mine(pool);
      auto const Sq = std::size_t(S), Sk = std::size_t(K);
      // This group's keys (rotated; also transposed) and values (transposed).
      for (int t = 0; t < K; ++t) {
        auto const token = std::int64_t(t) * B + b;
        T* row = w.k.data() + std::size_t(t) * hk;
        rotate_row(k.head(token, g, hk), hk, s.key_offset + t, T(1), row);
        for (int c = 0; c < hk; ++c) w.kt[std::size_t(c) * Sk + t] = row[c];
        T const* vrow = v.head(token, g, hv);
        for (int c = 0; c < hv; ++c) w.vt[std::size_t(c) * Sk + t] = Operands::round(vrow[c]);
      }
      std::fill(w.dk.begin(), w.dk.begin() + std::ptrdiff_t(Sk * hk), T(0));
      std::fill(w.dv.begin(), w.dv.begin() + std::ptrdiff_t(Sk * hv), T(0));
      for (int h = g * per_group; h < (g + 1) * per_group; ++h) {
        for (int r = 0; r < S; ++r) {
          auto const token = std::int64_t(r) * B + b;
          rotate_row(q.head(token, h, hk), hk, s.query_offset + r, scale,
                     w.q.data() + std::size_t(r) * hk);
          T const* o = out.head(token, h, hv);
          T const* go = dout.head(token, h, hv);
          T* staged = w.dout.data() + std::size_t(r) * hv;
          stage(go, hv, staged);
          T dot = 0;
          for (int c = 0; c < hv; ++c) dot += o[c] * staged[c];
          w.d[r] = dot;
          w.lse[r] = lse[(std::int64_t(b) * s.heads + h) * S + r];
        }
        std::fill(w.dq.begin(), w.dq.begin() + std::ptrdiff_t(Sq * hk), T(0));
        for (int k0 = 0; k0 < K; k0 += bs) {
          int const nk = std::min(bs, K - k0);
          // The first query row that sees key row k0.
          int const first_q = std::max(0, s.key_offset + k0 - s.query_offset);
          for (int q0 = first_q / bs * bs; q0 < S; q0 += bs) {
            int const mq = std::min(bs, S - q0);
            for (int r = 0; r < mq; ++r) w.valid[r] = visible(s, q0 + r, k0, nk);
            T* sc = w.scores.data();
            T* ds = w.dscores.data();
            T const* qi = w.q.data() + std::size_t(q0) * hk;
            T const* doi = w.dout.data() + std::size_t(q0) * hv;
            Tiles::product(mq, nk, hk, qi, hk, 1, w.kt.data() + k0, K, sc, bs, false);
            Tiles::product(mq, nk, hv, doi, hv, 1, w.vt.data() + k0, K, ds, bs, false);
            Tiles::softmax_backward(mq, nk, sc, ds, bs, w.valid.data(), w.lse.data() + q0,
                                    w.d.data() + q0);
            round_tile(mq, nk, sc, bs);
            round_tile(mq, nk, ds, bs);
            // dV_j += P^T dO_i, dK_j += dS^T (scale q_i), dq_i += dS K_j.
            Tiles::product(nk, hv, mq, sc, 1, bs, doi, hv, w.dv.data() + std::size_t(k0) * hv, hv,
                           true);
            Tiles::product(nk, hk, mq, ds, 1, bs, qi, hk, w.dk.data() + std::size_t(k0) * hk, hk,
                           true);
            Tiles::product(mq, hk, nk, ds, bs, 1, w.k.data() + std::size_t(k0) * hk, hk,
                           w.dq.data() + std::size_t(q0) * hk, hk, true);
          }
        }
        for (int r = 0; r < S; ++r)
          rotate_row(w.dq.data() + std::size_t(r) * hk, hk, s.query_offset + r, scale,
                     dq.head(std::int64_t(r) * B + b, h, hk), T(-1));
      }
      for (int t = 0; t < K; ++t) {
        auto const token = std::int64_t(t) * B + b;
        rotate_row(w.dk.data() + std::size_t(t) * hk, hk, s.key_offset + t, T(1),
                   dk.head(token, g, hk), T(-1));
        stage(w.dv.data() + std::size_t(t) * hv, hv, dv.head(token, g, hv));
      }
    });
  }

  double rope_base_;
  attention_kernel kernel_;
  std::optional<rope_table<T>> rope_;
  std::vector<detail::scratch<T>> scratch_;
};

// Defined outside the class so that they are not inline: under MEGAMOE_SEPARATE_COMPILATION the
// fp32 and fp64 kernels are compiled once, in megamoe/compiled_once.cpp (flash_attention.ipp).
template <class T, class Operands>
void flash_attention<T, Operands>::forward(thread_pool& pool, attention_shape const& shape,
                                           token_view<T const> q, token_view<T const> k,
                                           token_view<T const> v, token_view<T> out, T* lse) {
  prepare(pool, shape);
#if MEGAMOE_VECTOR_MATH_AVX512
  if constexpr (std::is_same_v<T, float>)
    if (kernel_ == attention_kernel::avx512)
      return forward_with<detail::avx512_tiles>(pool, shape, q, k, v, out, lse);
#endif
  forward_with<detail::portable_tiles<T>>(pool, shape, q, k, v, out, lse);
}

template <class T, class Operands>
void flash_attention<T, Operands>::backward(thread_pool& pool, attention_shape const& shape,
                                            token_view<T const> q, token_view<T const> k,
                                            token_view<T const> v, token_view<T const> out,
                                            token_view<T const> dout, T const* lse,
                                            token_view<T> dq, token_view<T> dk, token_view<T> dv) {
  prepare(pool, shape);
#if MEGAMOE_VECTOR_MATH_AVX512
  if constexpr (std::is_same_v<T, float>)
    if (kernel_ == attention_kernel::avx512)
      return backward_with<detail::avx512_tiles>(pool, shape, q, k, v, out, dout, lse, dq, dk, dv);
#endif
  backward_with<detail::portable_tiles<T>>(pool, shape, q, k, v, out, dout, lse, dq, dk, dv);
}

/// Context parallelism's merge of partial results: `out` and `lse` hold attention over some keys,
/// `part` and `part_lse` the same queries' attention over other keys; afterwards `out` and `lse`
/// hold it over both: lse = log(e^lse + e^part_lse), out = (out e^lse + part e^part_lse) / e^lse'.
/// A row that saw no key on one side (lse -inf, out 0) takes the other side's.
template <class T>
void merge_partial(thread_pool& pool, attention_shape const& s, token_view<T> out, T* lse,
                   token_view<T const> part, T const* part_lse) {
  int const S = s.seq, B = s.batch, dv = s.value_head();
  parallel_rows(pool, B * s.heads, [&](int begin, int end) {
    for (int pair = begin; pair < end; ++pair) {
      int const b = pair / s.heads, h = pair % s.heads;
      for (int r = 0; r < S; ++r) {
        auto const i = (std::int64_t(b) * s.heads + h) * S + r;
        T const top = std::max(lse[i], part_lse[i]);
        if (top == -std::numeric_limits<T>::infinity()) continue;  // no key on either side
        T const mine = std::exp(lse[i] - top), theirs = std::exp(part_lse[i] - top);
        T const total = mine + theirs;
        auto const row = std::int64_t(r) * B + b;
        T* o = out.head(row, h, dv);
        T const* p = part.head(row, h, dv);
        for (int c = 0; c < dv; ++c) o[c] = (o[c] * mine + p[c] * theirs) / total;
        lse[i] = top + std::log(total);
      }
    }
  });
}

#if !MEGAMOE_HEADER_ONLY
extern template class flash_attention<float>;
extern template class flash_attention<double>;
#endif

}  // namespace megamoe::attention

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/flash_attention.ipp>
#endif
