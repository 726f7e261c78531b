// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/all_to_all.hpp — the reference's all-to-all dispatcher. Interface:
// dispatch/local.hpp.
//
// plan: permutation 1 groups this rank's tokens by global expert; the per-expert counts are
// all-gathered over tp_ep (the count exchange, which also carries an error flag), giving
// N[i][j][e], the rows rank (ETP i, EP j) sends to expert e. From that table alone every rank
// derives the same splits, so the variable-count collectives that follow cannot disagree. dispatch:
// all-to-all over EP (send splits = rows per destination EP rank; receive splits = N[my i][j][my
// experts]); with ETP > 1 an all-gather-v over ETP (every ETP shard of an expert sees all its
// rows); then permutation 2 re-orders chunks from (ETP i, EP j, local expert l) to (l, i, j): each
// expert's rows by source rank, then token. Tokens and probs travel together. combine: the exact
// inverse; the ETP shards' partial outputs are summed by a reduce-scatter-v. Drop-and-pad (capacity
// > 0): every expert has exactly C rows on every rank, so the splits are known without the count
// exchange; the ranks only check that they agree on C.
#pragma once

#include <megamoe/core/buffer.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/exchange.hpp>
#include <megamoe/dispatch/groups.hpp>
#include <megamoe/dispatch/token_rows.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/progress.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <exception>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace megamoe::dispatch {

/// T: the layer's scalar; P: the router's probs type.
template <class T, class P, bool Overlapped = false>
class all_to_all_dispatcher {
 public:
  /// `overlap_pieces` > 1: the exchanges of `dispatch_compute_combine` and
  /// `dispatch_compute_combine_grad` run in that many pieces of local experts (at most one per
  /// expert, and fewer when a piece would carry less than `min_piece_bytes` of token rows per
  /// rank), each overlapping the expert compute of another.
  all_to_all_dispatcher(expert_groups const& groups, int hidden, int overlap_pieces = 1,
                        std::size_t min_piece_bytes = 0)
      : groups_(groups),
        hidden_(hidden),
        send_splits_(static_cast<std::size_t>(groups.ep_size())),
        recv_splits_(static_cast<std::size_t>(groups.ep_size())),
        etp_rows_(static_cast<std::size_t>(groups.etp_size())),
        local_counts_(static_cast<std::size_t>(groups.local_experts())) {
    overlap_ = overlap_pieces;
    min_piece_bytes_ = min_piece_bytes;
  }

  void plan(thread_pool&, mask_matrix const& map, int capacity,
            std::exception_ptr earlier = nullptr) {
    int const E = groups_.num_experts(), L = groups_.local_experts();
    int const EP = groups_.ep_size(), ETP = groups_.etp_size();
    std::exception_ptr problem = earlier;
    if (!problem) try {
        if (map.cols() != E)
          throw input_error("all_to_all dispatcher: the routing map has " +
                            std::to_string(map.cols()) + " experts, the layer " +
                            std::to_string(E));
        send_rows_.assign(map, capacity);
      } catch (...) {
        problem = std::current_exception();
      }
    counts_.assign(static_cast<std::size_t>(ETP) * EP * E, 0);
    if (capacity > 0)
      agree_on_capacity(problem, capacity);
    else
      exchange_counts(problem);
    // Splits, ETP row counts, rows per local expert and the chunk table, all from counts_.
    auto const count = [&](int i, int j, int e) {
      return counts_[(static_cast<std::size_t>(i) * EP + j) * E + e];
    };
    int const me_i = groups_.etp_rank(), first = groups_.first_expert();
    auto const& mine = send_rows_.permutation().tokens_per_expert;
    std::fill(send_splits_.begin(), send_splits_.end(), 0);
    for (int e = 0; e < E; ++e) send_splits_[static_cast<std::size_t>(e / L)] += mine[e];
    std::fill(recv_splits_.begin(), recv_splits_.end(), 0);
    std::fill(etp_rows_.begin(), etp_rows_.end(), 0);
    std::fill(local_counts_.begin(), local_counts_.end(), 0);
    chunk_size_.resize(static_cast<std::size_t>(ETP) * EP * L);
    for (int i = 0; i < ETP; ++i)
      for (int j = 0; j < EP; ++j)
        for (int l = 0; l < L; ++l) {
          std::int64_t const n = count(i, j, first + l);
          if (i == me_i) recv_splits_[static_cast<std::size_t>(j)] += n;
          etp_rows_[static_cast<std::size_t>(i)] += n;
          local_counts_[static_cast<std::size_t>(l)] += n;
          chunk_size_[(static_cast<std::size_t>(i) * EP + j) * L + l] = n;
        }
    // Chunk c = (i, j, l) sits at source_start_[c] in (i, j, l) order and at target_start_[c] in
    // (l, i, j) order.
    chunk_order_.resize(chunk_size_.size());
    for (int l = 0, p = 0; l < L; ++l)
      for (int i = 0; i < ETP; ++i)
        for (int j = 0; j < EP; ++j, ++p)
          chunk_order_[static_cast<std::size_t>(p)] = (i * EP + j) * L + l;
    source_start_.resize(chunk_size_.size());
    target_start_.resize(chunk_size_.size());
    std::int64_t at = 0;
    for (std::size_t c = 0; c < chunk_size_.size(); ++c) {
      source_start_[c] = at;
      at += chunk_size_[c];
    }
    rows_ = at;
    at = 0;
    for (int c : chunk_order_) {
      target_start_[static_cast<std::size_t>(c)] = at;
      at += chunk_size_[static_cast<std::size_t>(c)];
    }
    received_ = etp_rows_[static_cast<std::size_t>(me_i)];  // what EP sends this ETP index
    build_datatypes();
  }

  /// Sets micro-batch `key`'s plan aside (core/stash.hpp), or brings it back; the exchange
  /// buffers are the next pass's scratch.
  void park(std::uint64_t key) {
    stash_.park(key, send_rows_, counts_, send_splits_, recv_splits_, etp_rows_, local_counts_,
                chunk_size_, source_start_, target_start_, chunk_order_, direct_, expert_start_,
                pieces_, rows_, received_);
  }
  void restore(std::uint64_t key) {
    stash_.restore(key, send_rows_, counts_, send_splits_, recv_splits_, etp_rows_, local_counts_,
                   chunk_size_, source_start_, target_start_, chunk_order_, direct_, expert_start_,
                   pieces_, rows_, received_);
  }

  [[nodiscard]] int expert_rows() const noexcept { return static_cast<int>(rows_); }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_local_expert() const noexcept {
    return local_counts_;
  }

  // Bookkeeping, for tests and logs.
  /// Permutation 1: this rank's rows in global expert order (what it sends).
  [[nodiscard]] token_rows const& send_rows() const noexcept { return send_rows_; }
  [[nodiscard]] std::span<std::int64_t const> send_splits() const noexcept { return send_splits_; }
  [[nodiscard]] std::span<std::int64_t const> recv_splits() const noexcept { return recv_splits_; }
  /// Permutation 2: position p of the expert-major order holds chunk chunk_order()[p] of the
  /// received order, chunk (i, j, l) being number (i * EP + j) * L + l (the reference's
  /// sort_input_by_local_experts).
  [[nodiscard]] std::span<int const> chunk_order() const noexcept { return chunk_order_; }
  /// N[i][j][e], flattened: rows that the rank with ETP index i and EP index j routes to expert e.
  [[nodiscard]] std::span<std::int64_t const> global_counts() const noexcept { return counts_; }
  /// The rows this rank receives from EP, in the order they arrive (by source EP rank, then local
  /// expert, then token), as indices into the expert rows that hold them after permutation 2.
  [[nodiscard]] std::vector<std::int64_t> received_rows_in_expert_order() const {
    int const EP = groups_.ep_size(), L = groups_.local_experts();
    std::vector<std::int64_t> out;
    for (int j = 0; j < EP; ++j)
      for (int l = 0; l < L; ++l) {
        std::size_t const c = (static_cast<std::size_t>(groups_.etp_rank()) * EP + j) * L + l;
        for (std::int64_t i = 0; i < chunk_size_[c]; ++i) out.push_back(target_start_[c] + i);
      }
    return out;
  }
  /// True when the exchanges read and write rows in place through MPI datatypes (ETP = 1), false
  /// when they go through staging buffers (ETP > 1, or buffers beyond 2 GiB).
  [[nodiscard]] bool in_place() const noexcept { return direct_; }

  void dispatch(thread_pool& pool, T const* tokens, T* rows, row_matrix<P> const& probs,
                T* row_probs) {
    T const* send = stage_tokens(pool, tokens);
    T* send_probs = send_probs_.reserve(std::size_t(send_rows_.rows()));
    send_rows_.gather_probs(probs, 0, send_probs);
    forward({{{send, hidden_, rows}, {send_probs, 1, row_probs}}}, 2, pool);
  }
  void dispatch(thread_pool& pool, T const* tokens, T* rows) {
    T const* send = stage_tokens(pool, tokens);
    forward({{{send, hidden_, rows}, {}}}, 1, pool);
  }
  void combine(thread_pool& pool, T const* rows, T* out) {
    T* back = send_.reserve(std::size_t(send_rows_.rows()) * hidden_);
    backward({{{rows, hidden_, back}, {}}}, 1, pool);
    send_rows_.combine(pool, back, hidden_, out, false);
  }
  void combine_grad(thread_pool& pool, T const* grad_rows, T const* grad_row_probs, T* dx,
                    row_matrix<P>& grad_probs) {
    T* back = send_.reserve(std::size_t(send_rows_.rows()) * hidden_);
    T* back_probs = send_probs_.reserve(std::size_t(send_rows_.rows()));
    backward({{{grad_rows, hidden_, back}, {grad_row_probs, 1, back_probs}}}, 2, pool);
    send_rows_.combine(pool, back, hidden_, dx, true);
    send_rows_.scatter_probs(back_probs, 0, grad_probs);
  }

  /// Pieces the overlapped exchanges of the last plan run in (1: not overlapped: ETP > 1, one
  /// local expert, or buffers beyond what one MPI call addresses).
  [[nodiscard]] int overlap_pieces() const noexcept {
    return direct_ ? static_cast<int>(pieces_.size()) : 1;
  }

  /// dispatch, the experts and combine, pipelined by pieces of local experts: while
  /// `compute(first, last)` runs local experts [first, last) on their rows (writing their outputs
  /// into `expert_out` [N,H]), the next piece's rows arrive and the previous piece's outputs leave,
  /// moved along by the waiting main thread (thread_pool::progress). out [T,H] gets the combined
  /// tokens. Every expert computes all its rows in one call, so the results equal dispatch +
  /// compute of all experts + combine.
  template <class Compute>
  void dispatch_compute_combine(thread_pool& pool, T const* tokens, T* rows,
                                row_matrix<P> const& probs, T* row_probs, T const* expert_out,
                                T* out, Compute&& compute) {
    if (!direct_) {
      dispatch(pool, tokens, rows, probs, row_probs);
      compute(0, groups_.local_experts());
      combine(pool, expert_out, out);
      return;
    }
    T* send_probs = send_probs_.reserve(std::size_t(send_rows_.rows()));
    send_rows_.gather_probs(probs, 0, send_probs);
    T* back = send_.reserve(std::size_t(send_rows_.rows()) * hidden_);
    pipeline(
        pool,
        [&](piece const& p, parallel::request* r) {
          r[0] = parallel::all_to_all_w_start(groups_.ep(), tokens, p.forward_send[0], rows,
                                              p.forward_recv[0]);
          r[1] = parallel::all_to_all_w_start(groups_.ep(), send_probs, p.forward_send[1],
                                              row_probs, p.forward_recv[1]);
        },
        compute,
        [&](piece const& p, parallel::request* r) {
          r[0] = parallel::all_to_all_w_start(groups_.ep(), expert_out, p.backward_send[0], back,
                                              p.backward_recv[0]);
        });
    send_rows_.combine(pool, back, hidden_, out, false);
  }

  /// The backward twin: dy [T,H] to the experts' rows `grad_rows` by pieces; `compute(first, last)`
  /// turns a piece's rows into input-gradient rows (in `grad_rows`) and prob gradients (in
  /// `grad_row_probs`), which travel back while the next piece computes; dx [T,H] is added to,
  /// grad_probs' entries set. Equal to dispatch(dy) + compute of all experts + combine_grad.
  template <class Compute>
  void dispatch_compute_combine_grad(thread_pool& pool, T const* dy, T* grad_rows,
                                     T* grad_row_probs, T* dx, row_matrix<P>& grad_probs,
                                     Compute&& compute) {
    if (!direct_) {
      dispatch(pool, dy, grad_rows);
      compute(0, groups_.local_experts());
      combine_grad(pool, grad_rows, grad_row_probs, dx, grad_probs);
      return;
    }
    T* back = send_.reserve(std::size_t(send_rows_.rows()) * hidden_);
    T* back_probs = send_probs_.reserve(std::size_t(send_rows_.rows()));
    pipeline(
        pool,
        [&](piece const& p, parallel::request* r) {
          r[0] = parallel::all_to_all_w_start(groups_.ep(), dy, p.forward_send[0], grad_rows,
                                              p.forward_recv[0]);
        },
        compute,
        [&](piece const& p, parallel::request* r) {
          r[0] = parallel::all_to_all_w_start(groups_.ep(), grad_rows, p.backward_send[0], back,
                                              p.backward_recv[0]);
          r[1] = parallel::all_to_all_w_start(groups_.ep(), grad_row_probs, p.backward_send[1],
                                              back_probs, p.backward_recv[1]);
        });
    send_rows_.combine(pool, back, hidden_, dx, true);
    send_rows_.scatter_probs(back_probs, 0, grad_probs);
  }

  /// The layer's exchange (dispatch/exchange.hpp): overlapped by pieces of local experts when the
  /// type says so (dispatch::all_to_all_overlap, timed as experts), else dispatch, compute,
  /// combine.
  template <expert_computation Compute>
  void forward(thread_pool& pool, stage_times& times, T const* tokens, T* rows,
               row_matrix<P> const& probs, T* row_probs, T const* expert_out, T* out,
               Compute&& compute) {
    if constexpr (Overlapped) {
      times.time(layer_stage::experts, [&] {
        dispatch_compute_combine(pool, tokens, rows, probs, row_probs, expert_out, out, compute);
      });
    } else {
      sequential_forward(*this, pool, times, tokens, rows, probs, row_probs, expert_out, out,
                         compute);
    }
  }
  template <expert_computation Compute>
  void backward(thread_pool& pool, stage_times& times, T const* dy, T* grad_rows, T* grad_row_probs,
                T* dx, row_matrix<P>& grad_probs, Compute&& compute) {
    if constexpr (Overlapped) {
      times.time(layer_stage::experts, [&] {
        dispatch_compute_combine_grad(pool, dy, grad_rows, grad_row_probs, dx, grad_probs, compute);
      });
    } else {
      sequential_backward(*this, pool, times, dy, grad_rows, grad_row_probs, dx, grad_probs,
                          compute);
    }
  }

  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return send_rows_.bytes() +
           (counts_.size() + chunk_size_.size() * 3 + local_counts_.size()) * sizeof(std::int64_t);
  }

 private:
  /// One payload moving through the exchange: rows of `width` elements from `in` to `out`.
  struct lane_io {
    T const* in = nullptr;
    int width = 0;
    T* out = nullptr;
  };
  /// Staging per payload, so that tokens and probs are in flight together.
  struct lane_buffers {
    buffer<T> received, gathered;
  };
  /// The in-place exchange of local experts [first, last): datatypes and both directions' sides.
  struct piece {
    piece() = default;
    piece(piece&&) noexcept = default;
    piece& operator=(piece&&) noexcept = default;
    piece(piece const&) = delete;  // owns its datatypes
    piece& operator=(piece const&) = delete;
    ~piece() = default;

    int first = 0, last = 0;
    std::vector<parallel::datatype> row_types;
    std::array<std::vector<parallel::datatype>, 2> chunk_types;
    std::array<parallel::typed_side, 2> forward_send, forward_recv, backward_send, backward_recv;
  };

  /// The count exchange: [error flag, ETP index, EP index, counts of E experts] from every rank of
  /// tp_ep. A flag anywhere makes every rank throw the same agreed error.
  void exchange_counts(std::exception_ptr problem) {
    auto const& comm = groups_.tp_ep();
    int const E = groups_.num_experts(), EP = groups_.ep_size();
    std::size_t const width = 3 + static_cast<std::size_t>(E);
    header_.assign(width, 0);
    header_[0] = problem ? 1 : 0;
    header_[1] = groups_.etp_rank();
    header_[2] = groups_.ep_rank();
    if (!problem)
      std::copy(send_rows_.permutation().tokens_per_expert.begin(),
                send_rows_.permutation().tokens_per_expert.end(), header_.begin() + 3);
    table_.resize(width * static_cast<std::size_t>(comm.size()));
    {
      parallel::watched_collective const watch(MPI_Comm(comm), "exchange_counts",
                                               static_cast<std::int64_t>(width));
      MPI_Allgather(header_.data(), static_cast<int>(width), MPI_INT64_T, table_.data(),
                    static_cast<int>(width), MPI_INT64_T, MPI_Comm(comm));
    }
    bool failed = false;
    for (int r = 0; r < comm.size(); ++r) failed = failed || table_[width * r] != 0;
    if (failed) parallel::agree_on_failure(comm, problem);
    for (int r = 0; r < comm.size(); ++r) {
      std::int64_t const* row = table_.data() + width * r;
      std::copy(row + 3, row + width,
                counts_.begin() + (static_cast<std::ptrdiff_t>(row[1]) * EP + row[2]) * E);
    }
  }

  /// Drop-and-pad: every rank sends C' = min(C, T) rows to every expert. The ranks only agree on
  /// the error flag and C' (one all-reduce of three numbers), no count exchange.
  void agree_on_capacity(std::exception_ptr problem, int capacity) {
    auto const& comm = groups_.tp_ep();
    std::int64_t const rows_each =
        problem ? 0 : std::min<std::int64_t>(capacity, send_rows_.permutation().num_tokens);
    std::int64_t range[3] = {problem ? -1 : 0, rows_each, -rows_each};
    {
      parallel::watched_collective const watch(MPI_Comm(comm), "agree_on_capacity", 3);
      MPI_Allreduce(MPI_IN_PLACE, range, 3, MPI_INT64_T, MPI_MIN, MPI_Comm(comm));
    }
    if (range[0] != 0) parallel::agree_on_failure(comm, problem);
    if (range[1] != -range[2])
      parallel::agree_on_failure(
          comm, std::make_exception_ptr(input_error(
                    "all_to_all dispatcher: drop-and-pad needs the same capacity on every rank "
                    "of the tp_ep group (rows per expert range from " +
                    std::to_string(range[1]) + " to " + std::to_string(-range[2]) +
                    "): give every rank the same number of tokens")));
    std::fill(counts_.begin(), counts_.end(), rows_each);
  }

  /// The tokens' send side: in place, the token buffer itself (the row datatypes pick the rows);
  /// staged, permutation 1 gathered into the send buffer.
  T const* stage_tokens(thread_pool& pool, T const* tokens) {
    if (direct_) return tokens;
    T* send = send_.reserve(std::size_t(send_rows_.rows()) * hidden_);
    send_rows_.gather(pool, tokens, hidden_, send);
    return send;
  }

  /// With ETP = 1, datatypes that let one all-to-all-w do permutation 1, the exchange and
  /// permutation 2 (and the reverse) without staging copies: per destination EP rank, its token
  /// rows where they lie in the token buffer; per source EP rank, its chunks where they belong in
  /// the expert-major rows (for tokens and for probs). Lane 0 carries tokens, lane 1 probs. One set
  /// per piece of local experts (one piece unless the exchange overlaps with compute).
  void build_datatypes() {
    int const EP = groups_.ep_size(), L = groups_.local_experts();
    auto const peers = static_cast<std::size_t>(EP);
    std::int64_t const sent = send_rows_.rows();
    direct_ = groups_.etp_size() == 1 &&
              std::max(sent, rows_) * hidden_ * static_cast<std::int64_t>(sizeof(T)) <= INT_MAX;
    if (!direct_) return;
    // Where each global expert's rows start in permutation-1 order.
    auto const& mine = send_rows_.permutation().tokens_per_expert;
    expert_start_.resize(mine.size() + 1);
    expert_start_[0] = 0;
    for (std::size_t e = 0; e < mine.size(); ++e) expert_start_[e + 1] = expert_start_[e] + mine[e];
    // Pieces: as asked, at most one per local expert, and none below the minimum size. Every rank
    // reads the same count table, so every rank cuts the same pieces.
    double const rows_per_rank =
        static_cast<double>(std::accumulate(counts_.begin(), counts_.end(), std::int64_t{0})) / EP;
    double const bytes_per_rank = rows_per_rank * hidden_ * static_cast<double>(sizeof(T));
    int const by_size =
        min_piece_bytes_ == 0
            ? overlap_
            : static_cast<int>(std::min<double>(
                  overlap_, std::floor(bytes_per_rank / static_cast<double>(min_piece_bytes_))));
    int const count = std::clamp(std::min(overlap_, by_size), 1, std::max(1, L));
    pieces_.resize(static_cast<std::size_t>(count));
    for (int g = 0; g < count; ++g) {
      auto& piece = pieces_[static_cast<std::size_t>(g)];
      piece.first = g * L / count;
      piece.last = (g + 1) * L / count;
      piece.row_types.resize(peers);
      for (auto& t : piece.chunk_types) t.resize(peers);
      for (auto* side : {&piece.forward_send[0], &piece.forward_send[1], &piece.forward_recv[0],
                         &piece.forward_recv[1], &piece.backward_send[0], &piece.backward_send[1],
                         &piece.backward_recv[0], &piece.backward_recv[1]})
        side->resize(peers);
      for (int j = 0; j < EP; ++j) {
        auto const J = static_cast<std::size_t>(j);
        std::int64_t const begin = expert_start_[J * L + piece.first];
        std::int64_t const n = expert_start_[J * L + piece.last] - begin;
        offsets_.resize(static_cast<std::size_t>(n));
        for (std::int64_t r = 0; r < n; ++r)
          offsets_[static_cast<std::size_t>(r)] =
              static_cast<MPI_Aint>(send_rows_.source_token(static_cast<int>(begin + r))) *
              hidden_ * static_cast<MPI_Aint>(sizeof(T));
        piece.row_types[J] = parallel::equal_blocks_type<T>(hidden_, offsets_);
        std::int64_t arriving = 0;
        for (int l = piece.first; l < piece.last; ++l) arriving += chunk_size_[J * L + l];
        for (int k = 0; k < 2; ++k) {
          int const width = k == 0 ? hidden_ : 1;
          lengths_.resize(static_cast<std::size_t>(piece.last - piece.first));
          offsets_.resize(lengths_.size());
          for (int l = piece.first; l < piece.last; ++l) {
            std::size_t const c = J * L + l;
            auto const at = static_cast<std::size_t>(l - piece.first);
            lengths_[at] = static_cast<int>(chunk_size_[c] * width);
            offsets_[at] =
                static_cast<MPI_Aint>(target_start_[c] * width * std::int64_t{sizeof(T)});
          }
          piece.chunk_types[k][J] = parallel::blocks_type<T>(lengths_, offsets_);
          // Expert side: one chunk type per peer, when it has rows.
          for (auto* side : {&piece.forward_recv[k], &piece.backward_send[k]}) {
            side->counts[J] = arriving > 0 ? 1 : 0;
            side->types[J] = piece.chunk_types[k][J].get();
          }
          // Token side, contiguous in permutation-1 order (probs both ways, token rows coming
          // back).
          for (auto* side : {&piece.forward_send[k], &piece.backward_recv[k]}) {
            side->counts[J] = static_cast<int>(n * width);
            side->byte_offsets[J] = static_cast<int>(begin * width * std::int64_t{sizeof(T)});
            side->types[J] = parallel::mpi_type<T>();
          }
        }
        // Token rows leave straight from the token buffer.
        piece.forward_send[0].counts[J] = n > 0 ? 1 : 0;
        piece.forward_send[0].byte_offsets[J] = 0;
        piece.forward_send[0].types[J] = piece.row_types[J].get();
      }
    }
  }

  /// The overlapped schedule over the pieces, the same on every rank (non-blocking collectives
  /// on one communicator must start in the same order everywhere): start piece 0's arrival; then
  /// for each piece g: start g+1's arrival, wait for g's, compute g with every exchange in flight
  /// registered for testing, start g's departure. Then wait for every departure.
  template <class Arrive, class Compute, class Depart>
  void pipeline(thread_pool& pool, Arrive const& arrive, Compute& compute, Depart const& depart) {
    auto const count = pieces_.size();
    in_flight_.resize(4 * count);  // per piece: two arriving, two departing
    auto arriving = [&](std::size_t g) { return in_flight_.data() + 4 * g; };
    auto departing = [&](std::size_t g) { return in_flight_.data() + 4 * g + 2; };
    arrive(pieces_[0], arriving(0));
    for (std::size_t g = 0; g < count; ++g) {
      if (g + 1 < count) arrive(pieces_[g + 1], arriving(g + 1));
      arriving(g)[0].wait();
      arriving(g)[1].wait();
      for (auto& r : in_flight_)
        if (r.handle_ != MPI_REQUEST_NULL) progress_.watch(&r.handle_);
      try {
        auto const testing = progress_.while_waiting(pool);
        compute(pieces_[g].first, pieces_[g].last);
      } catch (...) {
        progress_.clear();
        throw;
      }
      progress_.clear();
      depart(pieces_[g], departing(g));
    }
    for (auto& r : in_flight_) r.wait();
  }

  /// Copies chunk c from `from` (at start_from[c]) to `to` (at start_to[c]), split over chunks.
  void move_chunks(thread_pool& pool, T const* from, std::span<std::int64_t const> start_from,
                   T* to, std::span<std::int64_t const> start_to, int width) const {
    parallel_rows(pool, static_cast<int>(chunk_size_.size()), [&](int begin, int end) {
      for (int c = begin; c < end; ++c) {
        auto const n = chunk_size_[static_cast<std::size_t>(c)] * width;
        std::copy_n(from + start_from[static_cast<std::size_t>(c)] * width, n,
                    to + start_to[static_cast<std::size_t>(c)] * width);
      }
    });
  }

  /// Token side -> expert rows, for `lanes` payloads at once.
  void forward(std::array<lane_io, 2> const& io, int lanes, thread_pool& pool) {
    int const ETP = groups_.etp_size();
    std::array<parallel::request, 2> pending;
    if (direct_) {
      for (auto const& piece : pieces_) {
        for (int k = 0; k < lanes; ++k)
          pending[k] = parallel::all_to_all_w_start(groups_.ep(), io[k].in, piece.forward_send[k],
                                                    io[k].out, piece.forward_recv[k]);
        for (int k = 0; k < lanes; ++k) pending[k].wait();
      }
      return;
    }
    std::array<T*, 2> received{};
    for (int k = 0; k < lanes; ++k) {
      auto const& x = io[static_cast<std::size_t>(k)];
      received[k] = lanes_[k].received.reserve(std::size_t(received_) * x.width);
      pending[k] = parallel::all_to_all_v_start(groups_.ep(), x.in, send_splits_, received[k],
                                                recv_splits_, x.width);
    }
    for (int k = 0; k < lanes; ++k) pending[k].wait();
    std::array<T*, 2> gathered = received;
    if (ETP > 1) {
      for (int k = 0; k < lanes; ++k) {
        auto const& x = io[static_cast<std::size_t>(k)];
        gathered[k] = lanes_[k].gathered.reserve(std::size_t(rows_) * x.width);
        pending[k] = parallel::all_gather_v_start(groups_.etp(), received[k], gathered[k],
                                                  etp_rows_, x.width);
      }
      for (int k = 0; k < lanes; ++k) pending[k].wait();
    }
    for (int k = 0; k < lanes; ++k) {
      auto const& x = io[static_cast<std::size_t>(k)];
      move_chunks(pool, gathered[k], source_start_, x.out, target_start_, x.width);
    }
  }

  /// Expert rows -> token side (ETP partials summed), for `lanes` payloads at once.
  void backward(std::array<lane_io, 2> const& io, int lanes, thread_pool& pool) {
    int const ETP = groups_.etp_size();
    std::array<parallel::request, 2> pending;
    if (direct_) {
      for (auto const& piece : pieces_) {
        for (int k = 0; k < lanes; ++k)
          pending[k] = parallel::all_to_all_w_start(groups_.ep(), io[k].in, piece.backward_send[k],
                                                    io[k].out, piece.backward_recv[k]);
        for (int k = 0; k < lanes; ++k) pending[k].wait();
      }
      return;
    }
    std::array<T*, 2> unsorted{}, received{};
    for (int k = 0; k < lanes; ++k) {
      auto const& x = io[static_cast<std::size_t>(k)];
      auto& b = lanes_[k];
      unsorted[k] = (ETP > 1 ? b.gathered : b.received).reserve(std::size_t(rows_) * x.width);
      move_chunks(pool, x.in, target_start_, unsorted[k], source_start_, x.width);
    }
    received = unsorted;
    if (ETP > 1) {
      for (int k = 0; k < lanes; ++k) {
        auto const& x = io[static_cast<std::size_t>(k)];
        received[k] = lanes_[k].received.reserve(std::size_t(received_) * x.width);
        pending[k] = parallel::reduce_scatter_v_start(groups_.etp(), unsorted[k], received[k],
                                                      etp_rows_, x.width);
      }
      for (int k = 0; k < lanes; ++k) pending[k].wait();
    }
    for (int k = 0; k < lanes; ++k) {
      auto const& x = io[static_cast<std::size_t>(k)];
      pending[k] = parallel::all_to_all_v_start(groups_.ep(), received[k], recv_splits_, x.out,
                                                send_splits_, x.width);
    }
    for (int k = 0; k < lanes; ++k) pending[k].wait();
  }

  expert_groups groups_;
  int hidden_;
  token_rows send_rows_;
  std::vector<std::int64_t> header_, table_, counts_;
  std::vector<std::int64_t> send_splits_, recv_splits_, etp_rows_, local_counts_;
  std::vector<std::int64_t> chunk_size_, source_start_, target_start_;
  std::vector<int> chunk_order_;
  bool direct_ = false;
  int overlap_ = 1;  // pieces of local experts the exchanges are cut into (at most)
  std::size_t min_piece_bytes_ = 0;
  std::vector<std::int64_t> expert_start_;
  std::vector<piece> pieces_;
  std::vector<parallel::request> in_flight_;
  parallel::exchange_progress progress_;  // in_flight_ tested while a piece computes
  std::vector<MPI_Aint> offsets_;
  std::vector<int> lengths_;
  std::int64_t rows_ = 0, received_ = 0;
  buffer<T> send_, send_probs_;
  std::array<lane_buffers, 2> lanes_;
  using counts = std::vector<std::int64_t>;
  activation_stash<token_rows, counts, counts, counts, counts, counts, counts, counts, counts,
                   std::vector<int>, bool, counts, std::vector<piece>, std::int64_t, std::int64_t>
      stash_;
};

}  // namespace megamoe::dispatch
