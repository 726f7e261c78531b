// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/all_to_all.hpp — the reference's all-to-all dispatcher. Interface:
// dispatch/local.hpp.
//
// plan: the count exchange and the expert-major chunk table (dispatch/expert_chunks.hpp). dispatch:
// all-to-all over EP (send splits = rows per destination EP rank; receive splits = N[my i][j][my
// experts]); with ETP > 1 an all-gather-v over ETP (every ETP shard of an expert sees all its
// rows); then permutation 2 re-orders chunks from (ETP i, EP j, local expert l) to (l, i, j): each
// expert's rows by source rank, then token. Tokens and probs travel together. combine: the exact
// inverse; the ETP shards' partial outputs are summed by a reduce-scatter-v. With ETP = 1 (and
// buffers MPI can address in bytes, under 2 GiB) the permutations ride in MPI datatypes (no staging
// copies; dispatch/all_to_all_pieces.hpp). With CodesOnWire (dispatch::fp8_wire) the forward
// dispatch can move rows of bytes instead: the senders' FP8 codes (and block scales) in
// permutation-1 order, into the expert-major code rows.
#pragma once

#include <megamoe/core/buffer.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/all_to_all_pieces.hpp>
#include <megamoe/dispatch/exchange.hpp>
#include <megamoe/dispatch/expert_chunks.hpp>
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

/// T: the layer's scalar; P: the router's probs type; CodesOnWire: dispatch_codes() and
/// forward_codes() move rows of code_row_bytes() bytes (dispatch::fp8_wire).
template <class T, class P, bool Overlapped = false, bool CodesOnWire = false>
class all_to_all_dispatcher {
 public:
  /// `overlap_pieces` > 1: the exchanges of `dispatch_compute_combine` and
  /// `dispatch_compute_combine_grad` run in that many pieces of local experts (at most one per
  /// expert, and fewer when a piece would carry less than `min_piece_bytes` of token rows per
  /// rank), each overlapping the expert compute of another.
  all_to_all_dispatcher(expert_groups const& groups, int hidden, int overlap_pieces = 1,
                        std::size_t min_piece_bytes = 0)
      : groups_(groups), hidden_(hidden) {
    overlap_ = overlap_pieces;
    min_piece_bytes_ = min_piece_bytes;
  }

  void plan(thread_pool&, mask_matrix const& map, int capacity,
            std::exception_ptr earlier = nullptr);

  /// Sets micro-batch `key`'s plan aside (core/stash.hpp), or brings it back; the exchange
  /// buffers are the next pass's scratch.
  void park(std::uint64_t key);
  void restore(std::uint64_t key);

  [[nodiscard]] int expert_rows() const noexcept { return static_cast<int>(chunks_.rows()); }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_local_expert() const noexcept {
    return chunks_.tokens_per_local_expert();
  }

  // Bookkeeping, for tests and logs.
  /// Permutation 1: this rank's rows in global expert order (what it sends).
  [[nodiscard]] token_rows const& send_rows() const noexcept { return chunks_.send_rows(); }
  [[nodiscard]] std::span<std::int64_t const> send_splits() const noexcept {
    return chunks_.send_splits();
  }
  [[nodiscard]] std::span<std::int64_t const> recv_splits() const noexcept {
    return chunks_.recv_splits();
  }
  /// Permutation 2: position p of the expert-major order holds chunk chunk_order()[p] of the
  /// received order, chunk (i, j, l) being number (i * EP + j) * L + l (the reference's
  /// sort_input_by_local_experts).
  [[nodiscard]] std::span<int const> chunk_order() const noexcept { return chunks_.chunk_order(); }
  /// N[i][j][e], flattened: rows that the rank with ETP index i and EP index j routes to expert e.
  [[nodiscard]] std::span<std::int64_t const> global_counts() const noexcept {
    return chunks_.counts();
  }
  /// The rows this rank receives from EP, in the order they arrive (by source EP rank, then local
  /// expert, then token), as indices into the expert rows that hold them after permutation 2.
  [[nodiscard]] std::vector<std::int64_t> received_rows_in_expert_order() const {
    int const EP = groups_.ep_size(), L = groups_.local_experts();
    std::vector<std::int64_t> out;
    for (int j = 0; j < EP; ++j)
      for (int l = 0; l < L; ++l) {
        std::size_t const c = (static_cast<std::size_t>(groups_.etp_rank()) * EP + j) * L + l;
        for (std::int64_t i = 0; i < chunks_.chunk_size()[c]; ++i)
          out.push_back(chunks_.target_start()[c] + i);
      }
    return out;
  }
  /// True when the exchanges read and write rows in place through MPI datatypes (ETP = 1), false
  /// when they go through staging buffers (ETP > 1, or buffers beyond 2 GiB).
  [[nodiscard]] bool in_place() const noexcept { return direct_; }

  void dispatch(thread_pool& pool, T const* tokens, T* rows, row_matrix<P> const& probs,
                T* row_probs);

  /// dispatch::fp8_wire: the bytes of one token row as codes (H one-byte codes, and their block
  /// scales where the recipe has them); H until set. Set before the first plan.
  void set_code_row_bytes(std::size_t bytes) requires CodesOnWire {
    code_row_bytes_ = static_cast<std::int64_t>(bytes);
  }
  [[nodiscard]] std::int64_t code_row_bytes() const noexcept { return code_row_bytes_; }

  /// dispatch::fp8_wire: dispatch() with the token rows as codes. `codes` [sent, code_row_bytes()]
  /// holds one row per sent row in permutation-1 order (row r for token
  /// send_rows().source_token(r)); they land in `code_rows` [N, code_row_bytes()], expert-major as
  /// dispatch() places token rows; probs as dispatch()'s. Needs the in-place exchange (ETP = 1,
  /// under 2 GiB), which every rank decides alike from the plan's table.
  void dispatch_codes(thread_pool& /*pool*/, std::uint8_t const* codes, std::uint8_t* code_rows,
                      row_matrix<P> const& probs, T* row_probs) requires CodesOnWire;

  /// Bytes of token rows this rank sent in its last forward dispatch (its own rows included): rows
  /// times the bytes of a row (code_row_bytes() for codes).
  [[nodiscard]] std::int64_t token_bytes_sent() const noexcept { return token_bytes_sent_; }
  void dispatch(thread_pool& pool, T const* tokens, T* rows);
  void combine(thread_pool& pool, T const* rows, T* out);
  void combine_grad(thread_pool& pool, T const* grad_rows, T const* grad_row_probs, T* dx,
                    row_matrix<P>& grad_probs);

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
    overlapped_forward(
        pool,
        [&](piece const& p) {
          return parallel::all_to_all_w_start(groups_.ep(), tokens, p.forward_send[0], rows,
                                              p.forward_recv[0]);
        },
        probs, row_probs, expert_out, out, compute);
    token_bytes_sent_ = token_bytes(hidden_ * std::int64_t{sizeof(T)});
  }

  /// dispatch_compute_combine with the token rows as codes (dispatch_codes()'s arguments).
  template <class Compute>
  void dispatch_codes_compute_combine(thread_pool& pool, std::uint8_t const* codes,
                                      std::uint8_t* code_rows, row_matrix<P> const& probs,
                                      T* row_probs, T const* expert_out, T* out,
                                      Compute&& compute) requires CodesOnWire {
    require_codes_in_place();
    overlapped_forward(
        pool,
        [&](piece const& p) {
          return parallel::all_to_all_w_start(groups_.ep(), codes, p.code_send, code_rows,
                                              p.code_recv);
        },
        probs, row_probs, expert_out, out, compute);
    token_bytes_sent_ = token_bytes(code_row_bytes_);
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
    T* back = send_.reserve(std::size_t(chunks_.send_rows().rows()) * hidden_);
    T* back_probs = send_probs_.reserve(std::size_t(chunks_.send_rows().rows()));
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
    chunks_.send_rows().combine(pool, back, hidden_, dx, true);
    chunks_.send_rows().scatter_probs(back_probs, 0, grad_probs);
  }

  /// The layer's exchange with the forward's token rows as codes (dispatch::fp8_wire): forward()
  /// with dispatch_codes()'s arguments in place of the tokens and their rows.
  template <expert_computation Compute>
  void forward_codes(thread_pool& pool, stage_times& times, std::uint8_t const* codes,
                     std::uint8_t* code_rows, row_matrix<P> const& probs, T* row_probs,
                     T const* expert_out, T* out, Compute&& compute) requires CodesOnWire {
    if constexpr (Overlapped) {
      times.time(layer_stage::experts, [&] {
        dispatch_codes_compute_combine(pool, codes, code_rows, probs, row_probs, expert_out, out,
                                       compute);
      });
    } else {
      times.time(layer_stage::permute,
                 [&] { dispatch_codes(pool, codes, code_rows, probs, row_probs); });
      times.time(layer_stage::experts, [&] { compute(0, groups_.local_experts()); });
      times.time(layer_stage::unpermute, [&] { combine(pool, expert_out, out); });
    }
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

  [[nodiscard]] std::size_t saved_bytes() const noexcept { return chunks_.bytes(); }

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
  using piece = detail::all_to_all_piece;

  /// The tokens' arrival overlapped with compute and combine, piece by piece (`arrive(piece)`
  /// starts a piece's token rows; the probs travel beside them).
  template <class ArriveTokens, class Compute>
  void overlapped_forward(thread_pool& pool, ArriveTokens const& arrive_tokens,
                          row_matrix<P> const& probs, T* row_probs, T const* expert_out, T* out,
                          Compute& compute) {
    T* send_probs = send_probs_.reserve(std::size_t(chunks_.send_rows().rows()));
    chunks_.send_rows().gather_probs(probs, 0, send_probs);
    T* back = send_.reserve(std::size_t(chunks_.send_rows().rows()) * hidden_);
    pipeline(
        pool,
        [&](piece const& p, parallel::request* r) {
          r[0] = arrive_tokens(p);
          r[1] = parallel::all_to_all_w_start(groups_.ep(), send_probs, p.forward_send[1],
                                              row_probs, p.forward_recv[1]);
        },
        compute,
        [&](piece const& p, parallel::request* r) {
          r[0] = parallel::all_to_all_w_start(groups_.ep(), expert_out, p.backward_send[0], back,
                                              p.backward_recv[0]);
        });
    chunks_.send_rows().combine(pool, back, hidden_, out, false);
  }

  std::int64_t token_bytes(std::int64_t row_bytes) const {
    return std::int64_t{chunks_.send_rows().rows()} * row_bytes;
  }

  void require_codes_in_place() const {
    if (!direct_)
      throw input_error(
          "dispatch::fp8_wire: the exchange needs ETP = 1 and every rank's token rows under 2 GiB "
          "(one MPI datatype's reach); this plan has " +
          std::to_string(most_rows()) + " rows of " + std::to_string(hidden_) +
          " elements on some rank, ETP " + std::to_string(groups_.etp_size()));
  }

  /// The most rows any rank of tp_ep sends or holds in this plan, from the table every rank has:
  /// so every rank picks the same exchange.
  std::int64_t most_rows() const {
    int const ETP = groups_.etp_size(), EP = groups_.ep_size(), L = groups_.local_experts();
    int const E = EP * L;
    std::int64_t most = 0;
    std::vector<std::int64_t> held(static_cast<std::size_t>(EP), 0);
    for (int i = 0; i < ETP; ++i)
      for (int j = 0; j < EP; ++j) {
        std::int64_t sent = 0;
        for (int e = 0; e < E; ++e) {
          sent += chunks_.count(i, j, e);
          held[static_cast<std::size_t>(e / L)] += chunks_.count(i, j, e);
        }
        most = std::max(most, sent);
      }
    for (auto h : held) most = std::max(most, h);
    return most;
  }

  /// The tokens' send side: in place, the token buffer itself (the row datatypes pick the rows);
  /// staged, permutation 1 gathered into the send buffer.
  T const* stage_tokens(thread_pool& pool, T const* tokens) {
    if (direct_) return tokens;
    T* send = send_.reserve(std::size_t(chunks_.send_rows().rows()) * hidden_);
    chunks_.send_rows().gather(pool, tokens, hidden_, send);
    return send;
  }

  /// With ETP = 1, datatypes that let one all-to-all-w do permutation 1, the exchange and
  /// permutation 2 (and the reverse) without staging copies: per destination EP rank, its token
  /// rows where they lie in the token buffer; per source EP rank, its chunks where they belong in
  /// the expert-major rows (for tokens and for probs). Lane 0 carries tokens, lane 1 probs. One set
  /// per piece of local experts (one piece unless the exchange overlaps with compute), each built
  /// by detail::build_piece (dispatch/all_to_all_pieces.hpp).
  void build_datatypes() {
    int const EP = groups_.ep_size(), L = groups_.local_experts();
    direct_ = groups_.etp_size() == 1 &&
              most_rows() * std::max(hidden_ * std::int64_t{sizeof(T)}, code_row_bytes_) <= INT_MAX;
    if (!direct_) return;
    // Where each global expert's rows start in permutation-1 order.
    auto const& mine = chunks_.send_rows().permutation().tokens_per_expert;
    expert_start_.resize(mine.size() + 1);
    expert_start_[0] = 0;
    for (std::size_t e = 0; e < mine.size(); ++e) expert_start_[e + 1] = expert_start_[e] + mine[e];
    // Pieces: as asked, at most one per local expert, and none below the minimum size. Every rank
    // reads the same count table, so every rank cuts the same pieces.
    double const rows_per_rank =
        static_cast<double>(
            std::accumulate(chunks_.counts().begin(), chunks_.counts().end(), std::int64_t{0})) /
        EP;
    double const bytes_per_rank = rows_per_rank * hidden_ * static_cast<double>(sizeof(T));
    int const by_size =
        min_piece_bytes_ == 0
            ? overlap_
            : static_cast<int>(std::min<double>(
                  overlap_, std::floor(bytes_per_rank / static_cast<double>(min_piece_bytes_))));
    int const count = std::clamp(std::min(overlap_, by_size), 1, std::max(1, L));
    pieces_.resize(static_cast<std::size_t>(count));
    for (int g = 0; g < count; ++g)
      detail::build_piece<T, CodesOnWire>(pieces_[static_cast<std::size_t>(g)], g * L / count,
                                          (g + 1) * L / count, groups_, chunks_, hidden_,
                                          code_row_bytes_, expert_start_, offsets_, lengths_);
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
    parallel_rows(pool, static_cast<int>(chunks_.chunk_size().size()), [&](int begin, int end) {
      for (int c = begin; c < end; ++c) {
        auto const n = chunks_.chunk_size()[static_cast<std::size_t>(c)] * width;
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
      received[k] = lanes_[k].received.reserve(std::size_t(chunks_.received()) * x.width);
      pending[k] = parallel::all_to_all_v_start(groups_.ep(), x.in, chunks_.send_splits(),
                                                received[k], chunks_.recv_splits(), x.width);
    }
    for (int k = 0; k < lanes; ++k) pending[k].wait();
    std::array<T*, 2> gathered = received;
    if (ETP > 1) {
      for (int k = 0; k < lanes; ++k) {
        auto const& x = io[static_cast<std::size_t>(k)];
        gathered[k] = lanes_[k].gathered.reserve(std::size_t(chunks_.rows()) * x.width);
        pending[k] = parallel::all_gather_v_start(groups_.etp(), received[k], gathered[k],
                                                  chunks_.etp_rows(), x.width);
      }
      for (int k = 0; k < lanes; ++k) pending[k].wait();
    }
    for (int k = 0; k < lanes; ++k) {
      auto const& x = io[static_cast<std::size_t>(k)];
      move_chunks(pool, gathered[k], chunks_.source_start(), x.out, chunks_.target_start(),
                  x.width);
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
      unsorted[k] =
          (ETP > 1 ? b.gathered : b.received).reserve(std::size_t(chunks_.rows()) * x.width);
      move_chunks(pool, x.in, chunks_.target_start(), unsorted[k], chunks_.source_start(), x.width);
    }
    received = unsorted;
    if (ETP > 1) {
      for (int k = 0; k < lanes; ++k) {
        auto const& x = io[static_cast<std::size_t>(k)];
        received[k] = lanes_[k].received.reserve(std::size_t(chunks_.received()) * x.width);
        pending[k] = parallel::reduce_scatter_v_start(groups_.etp(), unsorted[k], received[k],
                                                      chunks_.etp_rows(), x.width);
      }
      for (int k = 0; k < lanes; ++k) pending[k].wait();
    }
    for (int k = 0; k < lanes; ++k) {
      auto const& x = io[static_cast<std::size_t>(k)];
      pending[k] = parallel::all_to_all_v_start(groups_.ep(), received[k], chunks_.recv_splits(),
                                                x.out, chunks_.send_splits(), x.width);
    }
    for (int k = 0; k < lanes; ++k) pending[k].wait();
  }

  expert_groups groups_;
  int hidden_;
  std::int64_t code_row_bytes_ = hidden_;  // CodesOnWire
  expert_chunks chunks_;
  bool direct_ = false;
  int overlap_ = 1;  // pieces of local experts the exchanges are cut into (at most)
  std::size_t min_piece_bytes_ = 0;
  std::vector<std::int64_t> expert_start_;
  std::vector<piece> pieces_;
  std::vector<parallel::request> in_flight_;
  parallel::exchange_progress progress_;  // in_flight_ tested while a piece computes
  std::vector<MPI_Aint> offsets_;
  std::vector<int> lengths_;
  buffer<T> send_, send_probs_;
  std::array<lane_buffers, 2> lanes_;
  std::int64_t token_bytes_sent_ = 0;
  activation_stash<expert_chunks, bool, std::vector<std::int64_t>, std::vector<piece>> stash_;
};

// Defined outside the class, these members are not inline: a program built with
// MEGAMOE_SEPARATE_COMPILATION compiles them once for float and double, neither overlapped nor
// moving codes (dispatch/all_to_all.ipp); other instances compile where they are used.
template <class T, class P, bool Overlapped, bool CodesOnWire>
void all_to_all_dispatcher<T, P, Overlapped, CodesOnWire>::plan(thread_pool&,
                                                                mask_matrix const& map,
                                                                int capacity,
                                                                std::exception_ptr earlier) {
  chunks_.assign(groups_, map, capacity, earlier, "all_to_all dispatcher");
  build_datatypes();
}

template <class T, class P, bool Overlapped, bool CodesOnWire>
void all_to_all_dispatcher<T, P, Overlapped, CodesOnWire>::park(std::uint64_t key) {
  stash_.park(key, chunks_, direct_, expert_start_, pieces_);
}

template <class T, class P, bool Overlapped, bool CodesOnWire>
void all_to_all_dispatcher<T, P, Overlapped, CodesOnWire>::restore(std::uint64_t key) {
  stash_.restore(key, chunks_, direct_, expert_start_, pieces_);
}

template <class T, class P, bool Overlapped, bool CodesOnWire>
void all_to_all_dispatcher<T, P, Overlapped, CodesOnWire>::dispatch(thread_pool& pool,
                                                                    T const* tokens, T* rows,
                                                                    row_matrix<P> const& probs,
                                                                    T* row_probs) {
  T const* send = stage_tokens(pool, tokens);
  T* send_probs = send_probs_.reserve(std::size_t(chunks_.send_rows().rows()));
  chunks_.send_rows().gather_probs(probs, 0, send_probs);
  forward({{{send, hidden_, rows}, {send_probs, 1, row_probs}}}, 2, pool);
  token_bytes_sent_ = token_bytes(hidden_ * std::int64_t{sizeof(T)});
}

template <class T, class P, bool Overlapped, bool CodesOnWire>
void all_to_all_dispatcher<T, P, Overlapped, CodesOnWire>::dispatch(thread_pool& pool,
                                                                    T const* tokens, T* rows) {
  T const* send = stage_tokens(pool, tokens);
  forward({{{send, hidden_, rows}, {}}}, 1, pool);
}

template <class T, class P, bool Overlapped, bool CodesOnWire>
void all_to_all_dispatcher<T, P, Overlapped, CodesOnWire>::combine(thread_pool& pool, T const* rows,
                                                                   T* out) {
  T* back = send_.reserve(std::size_t(chunks_.send_rows().rows()) * hidden_);
  backward({{{rows, hidden_, back}, {}}}, 1, pool);
  chunks_.send_rows().combine(pool, back, hidden_, out, false);
}

template <class T, class P, bool Overlapped, bool CodesOnWire>
void all_to_all_dispatcher<T, P, Overlapped, CodesOnWire>::combine_grad(thread_pool& pool,
                                                                        T const* grad_rows,
                                                                        T const* grad_row_probs,
                                                                        T* dx,
                                                                        row_matrix<P>& grad_probs) {
  T* back = send_.reserve(std::size_t(chunks_.send_rows().rows()) * hidden_);
  T* back_probs = send_probs_.reserve(std::size_t(chunks_.send_rows().rows()));
  backward({{{grad_rows, hidden_, back}, {grad_row_probs, 1, back_probs}}}, 2, pool);
  chunks_.send_rows().combine(pool, back, hidden_, dx, true);
  chunks_.send_rows().scatter_probs(back_probs, 0, grad_probs);
}

template <class T, class P, bool Overlapped, bool CodesOnWire>
void all_to_all_dispatcher<T, P, Overlapped, CodesOnWire>::dispatch_codes(
    thread_pool& /*pool*/, std::uint8_t const* codes, std::uint8_t* code_rows,
    row_matrix<P> const& probs, T* row_probs) requires CodesOnWire {
  require_codes_in_place();
  T* send_probs = send_probs_.reserve(std::size_t(chunks_.send_rows().rows()));
  chunks_.send_rows().gather_probs(probs, 0, send_probs);
  std::array<parallel::request, 2> pending;
  for (auto const& piece : pieces_) {
    pending[0] = parallel::all_to_all_w_start(groups_.ep(), codes, piece.code_send, code_rows,
                                              piece.code_recv);
    pending[1] = parallel::all_to_all_w_start(groups_.ep(), send_probs, piece.forward_send[1],
                                              row_probs, piece.forward_recv[1]);
    for (auto& r : pending) r.wait();
  }
  token_bytes_sent_ = token_bytes(code_row_bytes_);
}

#if !MEGAMOE_HEADER_ONLY
extern template class all_to_all_dispatcher<float, float, false, false>;
extern template class all_to_all_dispatcher<double, double, false, false>;
#endif

}  // namespace megamoe::dispatch

#if MEGAMOE_HEADER_ONLY
#include <megamoe/dispatch/all_to_all.ipp>
#endif
