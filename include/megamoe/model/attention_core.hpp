// SPDX-License-Identifier: Apache-2.0
// megamoe/model/attention_core.hpp — the attention between the projections: causal softmax
// attention of given query, key and value heads (flash_attention), on one rank or with context
// parallelism, forward to the context rows and each row's log-sum-exp, backward to the queries',
// keys' and values' gradients. causal_attention (model/attention.hpp) and latent_attention
// (model/mla.hpp) project into it and out of it.
//
// Context parallelism over `cp`: each sequence is cut into 2 CP chunks and this rank's rows are
// chunks r and 2 CP - 1 - r (r its rank in `cp`), in that order, each S / 2 positions of the B
// sequences (t = s B + b within the rank's S positions). The keys and values travel as packed
// rows: per key/value head, its key (qk_head elements) then its value (v_head). They go around
// the CP ring (`CpComm` p2p) or are all-gathered (all_gather), and their gradients come back the
// same way; RoPE and the causal mask see global positions (position()).
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/model/flash_attention.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/tags.hpp>

#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace megamoe {

template <class T, parallel::cp_comm_type CpComm = parallel::cp_comm_type::p2p>
class attention_core {
 public:
  /// `rope_base` > 0: the kernel rotates the whole query and key heads (RoPE of that base); 0:
  /// the caller rotates what it rotates before forward.
  explicit attention_core(double rope_base) : kernel_(rope_base) {}

  /// Context parallelism over `cp` (kept by reference; size 1: none).
  void set_context_parallel(boost::mpi::communicator const& cp) {
    cp_ = &cp;
    cp_size_ = cp.size();
    cp_rank_ = cp.rank();
  }
  [[nodiscard]] int cp_size() const noexcept { return cp_size_; }

  /// The sequence position of this rank's local position s < S (its S positions are its two
  /// chunks under CP).
  [[nodiscard]] int position(int s, int seq) const noexcept {
    if (cp_size_ == 1) return s;
    int const L = seq / 2;
    return chunk_of(cp_rank_, s / L) * L + s % L;
  }

  /// out = causal softmax attention of q over k and v, for `shape` (this rank's S positions;
  /// even under CP); keeps the log-sum-exp (and under CP the keys and values) for backward.
  void forward(thread_pool& pool, attention::attention_shape const& shape,
               attention::token_view<T const> q, attention::token_view<T const> k,
               attention::token_view<T const> v, attention::token_view<T> out);

  /// dq, dk and dv (overwritten) from dout, given the last forward's q, k, v and out.
  void backward(thread_pool& pool, attention::token_view<T const> q,
                attention::token_view<T const> k, attention::token_view<T const> v,
                attention::token_view<T const> out, attention::token_view<T const> dout,
                attention::token_view<T> dq, attention::token_view<T> dk,
                attention::token_view<T> dv);

  /// Sets micro-batch `key`'s kept values aside (core/stash.hpp), or brings them back.
  void park(std::uint64_t key);
  void restore(std::uint64_t key);

  /// Bytes kept from forward to backward: the log-sum-exp per row and head, and under CP the
  /// gathered keys and values.
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    std::size_t const gathered = cp_size_ > 1 ? static_cast<std::size_t>(kv_sequence_.size()) : 0;
    return (lse_.size() + gathered) * sizeof(T);
  }

 private:
  [[nodiscard]] int rows() const noexcept { return shape_.seq * shape_.batch; }
  [[nodiscard]] int key_size() const noexcept { return shape_.qk_head; }
  [[nodiscard]] int kv_block() const noexcept { return shape_.qk_head + shape_.value_head(); }
  [[nodiscard]] int kv_width() const noexcept { return shape_.groups() * kv_block(); }

  /// Copies the key and value heads of every row into packed rows, or (`ToViews`) back.
  template <bool ToViews, class U, class V>
  void move_kv(thread_pool& pool, U* packed, attention::token_view<V> k,
               attention::token_view<V> v) const {
    int const G = shape_.groups(), dk = key_size(), dv = shape_.value_head(), KV = kv_width();
    parallel_rows(pool, rows(), [&](int begin, int end) {
      for (int t = begin; t < end; ++t)
        for (int g = 0; g < G; ++g) {
          U* const row = packed + std::int64_t(t) * KV + std::int64_t(g) * (dk + dv);
          V* const key = k.head(t, g, dk);
          V* const value = v.head(t, g, dv);
          if constexpr (ToViews) {
            std::copy(row, row + dk, key);
            std::copy(row + dk, row + dk + dv, value);
          } else {
            std::copy(key, key + dk, row);
            std::copy(value, value + dv, row + dk);
          }
        }
    });
  }

  /// The sequence chunk of local chunk i (0 or 1) of CP rank r.
  [[nodiscard]] int chunk_of(int r, int i) const noexcept {
    return i == 0 ? r : 2 * cp_size_ - 1 - r;
  }
  /// Where sequence chunk j (of 2 CP) lies among gathered rows: rank-major, each rank's two.
  [[nodiscard]] int gathered_block(int chunk) const noexcept {
    return chunk < cp_size_ ? 2 * chunk : 2 * (2 * cp_size_ - 1 - chunk) + 1;
  }
  /// Copies whole chunks between the rank-major gathered order and sequence order.
  template <bool ToSequence>
  void reorder_chunks(thread_pool& pool, T* gathered, T* sequence, int chunk_rows) const {
    std::int64_t const run = std::int64_t(chunk_rows) * kv_width();
    parallel_rows(pool, 2 * cp_size_, [&](int begin, int end) {
      for (int j = begin; j < end; ++j) {
        T* const g = gathered + gathered_block(j) * run;
        T* const q = sequence + j * run;
        if constexpr (ToSequence)
          std::copy(g, g + run, q);
        else
          std::copy(q, q + run, g);
      }
    });
  }
  /// Local query chunk i against `keys` key rows starting at sequence chunk `key_chunk`.
  [[nodiscard]] attention::attention_shape chunk_shape(int i, int key_chunk,
                                                       int keys) const noexcept {
    int const L = shape_.seq / 2;
    attention::attention_shape s = shape_;
    s.seq = L;
    s.key_seq = keys;
    s.query_offset = chunk_of(cp_rank_, i) * L;
    s.key_offset = key_chunk * L;
    return s;
  }
  template <class U>
  [[nodiscard]] attention::token_view<U> kv_view(U* data, bool value) const noexcept {
    return {data + (value ? key_size() : 0), kv_width(), 1, kv_block()};
  }
  /// Local query chunk i's rows of a view (queries, context rows, their gradients).
  template <class U>
  [[nodiscard]] attention::token_view<U> chunk(attention::token_view<U> rows,
                                               int i) const noexcept {
    rows.data += std::int64_t(i) * (this->rows() / 2) * rows.ld;
    return rows;
  }
  [[nodiscard]] T* chunk_lse(int i) noexcept { return lse_.data() + i * (lse_.size() / 2); }
  [[nodiscard]] int context_width() const noexcept { return shape_.heads * shape_.value_head(); }

  // all_gather: every rank's keys and values in sequence order; each local query chunk against
  // the keys up to its end; backward sums the two chunks' key gradients and reduce-scatters.
  void gathered_forward(thread_pool& pool, attention::token_view<T const> q,
                        attention::token_view<T> out) {
    int const N = rows(), KV = kv_width(), chunk_rows = N / 2;
    kv_gathered_.resize(std::int64_t(N) * cp_size_, KV);
    rows_per_rank_.assign(static_cast<std::size_t>(cp_size_), N);
    parallel::all_gather_v(*cp_, kv_local_.data(), kv_gathered_.data(),
                           std::span<std::int64_t const>(rows_per_rank_), KV);
    kv_sequence_.resize(kv_gathered_.rows(), KV);
    reorder_chunks<true>(pool, kv_gathered_.data(), kv_sequence_.data(), chunk_rows);
    for (int i = 0; i < 2; ++i) {
      int const keys = (chunk_of(cp_rank_, i) + 1) * (shape_.seq / 2);
      kernel_.forward(pool, chunk_shape(i, 0, keys), chunk(q, i),
                      kv_view<T const>(kv_sequence_.data(), false),
                      kv_view<T const>(kv_sequence_.data(), true), chunk(out, i), chunk_lse(i));
    }
  }
  void gathered_backward(thread_pool& pool, attention::token_view<T const> q,
                         attention::token_view<T const> out, attention::token_view<T const> dout,
                         attention::token_view<T> dq) {
    int const N = rows(), KV = kv_width(), chunk_rows = N / 2;
    // Chunk 1 (the later one) sees keys up to its end, which covers chunk 0's; chunk 0's key
    // gradients go to their own rows and are added.
    grad_kv_sequence_.resize(kv_sequence_.rows(), KV);
    grad_kv_chunk_.resize(std::int64_t(chunk_of(cp_rank_, 0) + 1) * chunk_rows, KV);
    for (int i = 1; i >= 0; --i) {
      int const keys = (chunk_of(cp_rank_, i) + 1) * (shape_.seq / 2);
      T* const dkv = i == 1 ? grad_kv_sequence_.data() : grad_kv_chunk_.data();
      kernel_.backward(pool, chunk_shape(i, 0, keys), chunk(q, i),
                       kv_view<T const>(kv_sequence_.data(), false),
                       kv_view<T const>(kv_sequence_.data(), true), chunk(out, i), chunk(dout, i),
                       chunk_lse(i), chunk(dq, i), kv_view(dkv, false), kv_view(dkv, true));
    }
    auto const covered = std::int64_t(chunk_of(cp_rank_, 1) + 1) * chunk_rows;
    grad_kv_sequence_.bottomRows(grad_kv_sequence_.rows() - covered).setZero();
    grad_kv_sequence_.topRows(grad_kv_chunk_.rows()) += grad_kv_chunk_;
    kv_gathered_.resize(kv_sequence_.rows(), KV);
    reorder_chunks<false>(pool, kv_gathered_.data(), grad_kv_sequence_.data(), chunk_rows);
    parallel::reduce_scatter_v(*cp_, kv_gathered_.data(), kv_local_.data(),
                               std::span<std::int64_t const>(rows_per_rank_), KV);
  }

  // p2p: CP steps around the ring; at step i this rank holds the keys and values of rank
  // s = r - i (its chunks s and 2 CP - 1 - s) and runs each local query chunk against each key
  // chunk it may see, merging by log-sum-exp; then passes them to rank r + 1. Backward goes
  // around again, each block's key and value gradients travelling with it and arriving home
  // after one more pass.
  template <class Pair>
  void for_each_visible_pair(int step, Pair&& pair) const {
    int const source = (cp_rank_ - step + cp_size_) % cp_size_;
    for (int i = 0; i < 2; ++i)
      for (int half = 0; half < 2; ++half) {
        int const key_chunk = chunk_of(source, half);
        if (key_chunk <= chunk_of(cp_rank_, i)) pair(i, half, key_chunk);
      }
  }
  void pass_on(T const* send, T* recv, std::int64_t elements) const {
    parallel::ring_exchange(*cp_, send, recv, elements, (cp_rank_ + 1) % cp_size_,
                            (cp_rank_ - 1 + cp_size_) % cp_size_);
  }
  void ring_forward(thread_pool& pool, attention::token_view<T const> q,
                    attention::token_view<T> out) {
    int const N = rows(), KV = kv_width(), chunk_rows = N / 2, L = shape_.seq / 2;
    int const C = context_width();
    ring_[0] = kv_local_;
    ring_[1].resize(N, KV);
    part_out_.resize(chunk_rows, C);
    part_lse_.resize(lse_.size() / 2);
    bool started[2] = {false, false};
    for (int step = 0; step < cp_size_; ++step) {
      T const* const kv = ring_[step % 2].data();
      for_each_visible_pair(step, [&](int i, int half, int key_chunk) {
        auto const s = chunk_shape(i, key_chunk, L);
        T const* const keys = kv + std::int64_t(half) * chunk_rows * KV;
        auto const k = kv_view<T const>(keys, false), v = kv_view<T const>(keys, true);
        if (!started[i]) {
          kernel_.forward(pool, s, chunk(q, i), k, v, chunk(out, i), chunk_lse(i));
          started[i] = true;
          return;
        }
        kernel_.forward(pool, s, chunk(q, i), k, v, {part_out_.data(), C}, part_lse_.data());
        attention::merge_partial(pool, s, chunk(out, i), chunk_lse(i), {part_out_.data(), C},
                                 part_lse_.data());
      });
      if (step + 1 < cp_size_) pass_on(kv, ring_[(step + 1) % 2].data(), std::int64_t(N) * KV);
    }
  }
  void ring_backward(thread_pool& pool, attention::token_view<T const> q,
                     attention::token_view<T const> out, attention::token_view<T const> dout,
                     attention::token_view<T> dq) {
    int const N = rows(), KV = kv_width(), chunk_rows = N / 2, L = shape_.seq / 2;
    int const QW = shape_.heads * key_size();
    ring_[0] = kv_local_;
    ring_[1].resize(N, KV);
    grad_ring_[0].setZero(N, KV);
    grad_ring_[1].resize(N, KV);
    grad_queries_.setZero(N, QW);
    part_dq_.resize(chunk_rows, QW);
    part_dkv_.resize(chunk_rows, KV);
    for (int step = 0; step < cp_size_; ++step) {
      T const* const kv = ring_[step % 2].data();
      auto& dkv = grad_ring_[step % 2];
      for_each_visible_pair(step, [&](int i, int half, int key_chunk) {
        T const* const keys = kv + std::int64_t(half) * chunk_rows * KV;
        kernel_.backward(pool, chunk_shape(i, key_chunk, L), chunk(q, i),
                         kv_view<T const>(keys, false), kv_view<T const>(keys, true), chunk(out, i),
                         chunk(dout, i), chunk_lse(i), {part_dq_.data(), QW},
                         kv_view(part_dkv_.data(), false), kv_view(part_dkv_.data(), true));
        grad_queries_.middleRows(std::int64_t(i) * chunk_rows, chunk_rows) += part_dq_;
        dkv.middleRows(std::int64_t(half) * chunk_rows, chunk_rows) += part_dkv_;
      });
      if (step + 1 < cp_size_) pass_on(kv, ring_[(step + 1) % 2].data(), std::int64_t(N) * KV);
      // The gradients follow their block; after the last step each block's arrive home.
      pass_on(dkv.data(), grad_ring_[(step + 1) % 2].data(), std::int64_t(N) * KV);
    }
    kv_local_ = grad_ring_[cp_size_ % 2];
    int const heads = shape_.heads, dk = key_size();
    parallel_rows(pool, N, [&](int begin, int end) {
      for (int t = begin; t < end; ++t)
        for (int h = 0; h < heads; ++h) {
          T const* const from = grad_queries_.data() + std::int64_t(t) * QW + std::int64_t(h) * dk;
          std::copy(from, from + dk, dq.head(t, h, dk));
        }
    });
  }

  attention::flash_attention<T> kernel_;
  attention::attention_shape shape_;
  std::vector<T> lse_;
  boost::mpi::communicator const* cp_ = nullptr;
  int cp_size_ = 1, cp_rank_ = 0;
  // Context parallelism: this rank's keys and values (their gradients after backward); with
  // all_gather every rank's (rank-major), in sequence order, and their gradients; with p2p the
  // blocks in flight, their gradients, a partial result, and the queries' gradients.
  row_matrix<T> kv_local_, kv_gathered_, kv_sequence_, grad_kv_sequence_, grad_kv_chunk_;
  std::vector<std::int64_t> rows_per_rank_;
  row_matrix<T> ring_[2], grad_ring_[2], part_out_, part_dq_, part_dkv_, grad_queries_;
  std::vector<T> part_lse_;
  activation_stash<attention::attention_shape, std::vector<T>, row_matrix<T>, row_matrix<T>> stash_;
};

// Defined outside the class, these members are not inline: a program built with
// MEGAMOE_SEPARATE_COMPILATION compiles them once for float and double and either CP
// communication (model/attention_core.ipp).
template <class T, parallel::cp_comm_type CpComm>
void attention_core<T, CpComm>::forward(thread_pool& pool, attention::attention_shape const& shape,
                                        attention::token_view<T const> q,
                                        attention::token_view<T const> k,
                                        attention::token_view<T const> v,
                                        attention::token_view<T> out) {
  shape_ = shape;
  lse_.resize(std::size_t(shape.batch) * shape.heads * shape.seq);
  if (cp_size_ == 1) return kernel_.forward(pool, shape, q, k, v, out, lse_.data());
  int const N = rows();
  kv_local_.resize(N, kv_width());
  move_kv<false>(pool, kv_local_.data(), k, v);
  if constexpr (CpComm == parallel::cp_comm_type::all_gather)
    gathered_forward(pool, q, out);
  else
    ring_forward(pool, q, out);
}

template <class T, parallel::cp_comm_type CpComm>
void attention_core<T, CpComm>::backward(thread_pool& pool, attention::token_view<T const> q,
                                         attention::token_view<T const> k,
                                         attention::token_view<T const> v,
                                         attention::token_view<T const> out,
                                         attention::token_view<T const> dout,
                                         attention::token_view<T> dq, attention::token_view<T> dk,
                                         attention::token_view<T> dv) {
  if (cp_size_ == 1)
    return kernel_.backward(pool, shape_, q, k, v, out, dout, lse_.data(), dq, dk, dv);
  (void)k;
  (void)v;
  if constexpr (CpComm == parallel::cp_comm_type::all_gather)
    gathered_backward(pool, q, out, dout, dq);
  else
    ring_backward(pool, q, out, dout, dq);
  // kv_local_ now holds this rank's key and value gradients.
  move_kv<true>(pool, kv_local_.data(), dk, dv);
}

template <class T, parallel::cp_comm_type CpComm>
void attention_core<T, CpComm>::park(std::uint64_t key) {
  stash_.park(key, shape_, lse_, kv_local_, kv_sequence_);
}

template <class T, parallel::cp_comm_type CpComm>
void attention_core<T, CpComm>::restore(std::uint64_t key) {
  stash_.restore(key, shape_, lse_, kv_local_, kv_sequence_);
}

#if !MEGAMOE_HEADER_ONLY
extern template class attention_core<float, parallel::cp_comm_type::p2p>;
extern template class attention_core<float, parallel::cp_comm_type::all_gather>;
extern template class attention_core<double, parallel::cp_comm_type::p2p>;
extern template class attention_core<double, parallel::cp_comm_type::all_gather>;
#endif

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/attention_core.ipp>
#endif
