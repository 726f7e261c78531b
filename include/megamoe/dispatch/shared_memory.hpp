// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/shared_memory.hpp — the shared-memory dispatcher (the DeepEP analog for one
// node). Interface: dispatch/local.hpp. Needs the tp_ep group on one node (R054).
//
// The plan is all_to_all's (dispatch/expert_chunks.hpp): the same rows in the same expert-major
// order. The exchanges go through one MPI-3 shared-memory window over tp_ep, a segment per rank:
// - dispatch: each rank publishes the token of each row it sends (permutation 1), those rows'
//   probs and its tokens as they are, unpermuted: in place when they already wait in the window
//   (token_rows(), where the MoE layer keeps its input), else as a copy; one fence; then each rank
//   copies every row of its local experts from the sender's tokens straight to its expert-major
//   place. Permutation 1, the exchange and permutation 2 are one copy.
// - combine: each rank publishes its experts' output rows (in place when the experts wrote them
//   into expert_output_rows(), as the layer has them do); one fence; then each rank reads the k
//   rows of each of its tokens from the experts' segments and sums them while reading, in
//   all_to_all's order (rows ascending, from +0; the ETP shards' partial sums first, by ETP index,
//   which equals all_to_all's reduce-scatter bit for bit for ETP <= 2, where the sum of two
//   commutes).
// Overlapped (dispatch::shared_memory_overlap): after the dispatch's fence the pulls go piece by
// piece of local experts; while piece g computes, the thread waiting for the pool pulls piece g+1
// a slice per wake-up (core/thread_pool.hpp's wait hook), and the pool pulls what is left before
// g+1 computes. Combines stay whole: a token's rows come from every rank's experts.
// Published copies of 4 MiB or more (a rank's tokens or expert rows) bypass the caches
// (core/stream_copy.hpp).
// Each segment has a dispatch and a combine region, so that alternating exchanges need one fence
// each (dispatch/exchange_window.hpp; a recomputed dispatch fences once more). The window grows,
// never shrinks, to the largest plan seen (decided from the count table, so every rank decides
// alike); running out of shared memory is an agreed error.
#pragma once

#include <megamoe/core/by_need.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/stream_copy.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/exchange.hpp>
#include <megamoe/dispatch/exchange_window.hpp>
#include <megamoe/dispatch/expert_chunks.hpp>
#include <megamoe/dispatch/groups.hpp>
#include <megamoe/dispatch/nodes.hpp>
#include <megamoe/dispatch/token_rows.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/policy/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace megamoe::dispatch {

/// T: the layer's scalar; P: the router's probs type; Overlapped: the dispatches' pulls in pieces
/// of local experts, overlapped with their compute.
template <class T, class P, bool Overlapped = false>
class shared_memory_dispatcher {
 public:
  static constexpr bool overlapped = Overlapped;

  /// Collective over the stage: every rank checks R054 (its tp_ep group on one node).
  /// `overlap_pieces`: the pieces of local experts an overlapped dispatch pulls in (at most one
  /// per local expert).
  shared_memory_dispatcher(expert_groups const& groups, int hidden, int overlap_pieces = 1)
      : groups_(groups), hidden_(hidden), overlap_(Overlapped ? std::max(1, overlap_pieces) : 1) {
    bool const one_node = group_on_one_node(groups.tp_ep(), groups.stage());
    parallel::check_on_every_rank(groups.stage(), [&] {
      if (!one_node)
        throw config_error(rules::id::shared_memory_needs_one_node,
                           "the " + std::to_string(groups.tp_ep().size()) +
                               " ranks of the tp_ep group span more than one node");
    });
    // The tp_ep rank of (ETP i, EP j).
    int const me[2] = {groups.etp_rank(), groups.ep_rank()};
    std::vector<int> all(2 * static_cast<std::size_t>(groups.tp_ep().size()));
    MPI_Allgather(me, 2, MPI_INT, all.data(), 2, MPI_INT, MPI_Comm(groups.tp_ep()));
    rank_of_.resize(static_cast<std::size_t>(groups.tp_ep().size()));
    for (int r = 0; r < groups.tp_ep().size(); ++r)
      rank_of_[static_cast<std::size_t>(all[2 * r] * groups.ep_size() + all[2 * r + 1])] = r;
  }

  /// Sizes the window for the most rows the configuration lets a plan bring: each of the most
  /// tokens any rank routes reaching at most `experts` experts (the layer's top-k, or every expert
  /// where its router pads), so that a plan whose routing piles onto one rank does not grow it.
  /// The same on every rank of tp_ep; without it the window grows to the largest plan seen.
  void bound_experts_per_token(int experts) noexcept { experts_per_token_ = experts; }

  void plan(thread_pool&, mask_matrix const& map, int capacity,
            std::exception_ptr earlier = nullptr) {
    chunks_.assign(groups_, map, capacity, earlier, "shared_memory dispatcher");
    trace_rows();
    fit_window();
  }

  /// Sets micro-batch `key`'s plan aside (core/stash.hpp), or brings it back.
  void park(std::uint64_t key) { stash_.park(key, chunks_, pull_, push_); }
  void restore(std::uint64_t key) { stash_.restore(key, chunks_, pull_, push_); }

  [[nodiscard]] int expert_rows() const noexcept { return static_cast<int>(chunks_.rows()); }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_local_expert() const noexcept {
    return chunks_.tokens_per_local_expert();
  }
  /// The plan (for tests and logs).
  [[nodiscard]] expert_chunks const& chunks() const noexcept { return chunks_; }
  /// Bytes of this rank's segment of the window (0 before the first plan).
  [[nodiscard]] std::size_t window_bytes() const noexcept { return window_.segment_bytes(); }
  /// Times the window was allocated (it grows to the largest plan seen, or the bound's).
  [[nodiscard]] int window_allocations() const noexcept { return window_.allocations(); }
  /// Expert rows this rank's segment holds (0 before the first plan).
  [[nodiscard]] std::int64_t window_expert_rows() const noexcept { return expert_rows_cap_; }

  /// Where this rank's tokens [T, H] of the planned micro-batch may wait in the window: a dispatch
  /// of tokens read from here publishes no copy (the MoE layer keeps its input here). Valid until
  /// a plan grows the window (window_allocations() counts up; a plan of a table seen before never
  /// does), and kept by every exchange. Called by every rank of tp_ep at the same point, after a
  /// plan (a fence when the last exchange was a dispatch, whose readers may still read it).
  [[nodiscard]] T* token_rows() {
    window_.settle(region::dispatch);
    return in_segment<T>(my_coordinates(), tokens_at_);
  }

  /// This rank's expert rows [expert_rows(), H] in the window, valid from `plan` to the next plan.
  /// Rows written here between a dispatch and the combine (or combine_grad) that follows it are
  /// read by the other ranks in place: the combine publishes no copy. A dispatch may pull into it.
  /// Written at any other time (after a combine, before the next dispatch), they would race with
  /// the other ranks' reads of the last combine.
  [[nodiscard]] T* expert_output_rows() const {
    return in_segment<T>(my_coordinates(), expert_rows_at_);
  }

  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return chunks_.bytes() + (pull_.size() + push_.size()) * sizeof(row_ref);
  }

  /// Pieces of local experts the overlapped dispatches pull in (1: not overlapped).
  [[nodiscard]] int overlap_pieces() const noexcept {
    return std::clamp(overlap_, 1, std::max(1, groups_.local_experts()));
  }
  /// Rows the waiting thread pulled while experts computed, over every overlapped dispatch so far
  /// (the rest the pool pulled between pieces), and the rows of those dispatches.
  [[nodiscard]] std::int64_t rows_pulled_while_computing() const noexcept {
    return pulled_while_computing_;
  }
  [[nodiscard]] std::int64_t rows_pulled_overlapped() const noexcept { return pulled_overlapped_; }

  void dispatch(thread_pool& pool, T const* tokens, T* rows, row_matrix<P> const& probs,
                T* row_probs) {
    chunks_.send_rows().gather_probs(probs, 0, publish_dispatch(pool, tokens));
    window_.fence();
    find_senders();
    pull_rows(pool, rows, row_probs, 0, chunks_.rows());
  }
  void dispatch(thread_pool& pool, T const* tokens, T* rows) {
    publish_dispatch(pool, tokens);
    window_.fence();
    find_senders();
    pull_rows(pool, rows, nullptr, 0, chunks_.rows());
  }

  /// The layer's exchange (dispatch/exchange.hpp). Overlapped: the dispatch and every piece's
  /// compute timed as experts, the combine as unpermute (forward) or permute (backward).
  template <expert_computation Compute>
  void forward(thread_pool& pool, stage_times& times, T const* tokens, T* rows,
               row_matrix<P> const& probs, T* row_probs, T const* expert_out, T* out,
               Compute&& compute) {
    if constexpr (Overlapped) {
      times.time(layer_stage::experts, [&] {
        chunks_.send_rows().gather_probs(probs, 0, publish_dispatch(pool, tokens));
        window_.fence();
        pull_while_computing(pool, rows, row_probs, compute);
      });
      times.time(layer_stage::unpermute, [&] { combine(pool, expert_out, out); });
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
        publish_dispatch(pool, dy);
        window_.fence();
        pull_while_computing(pool, grad_rows, nullptr, compute);
      });
      times.time(layer_stage::permute,
                 [&] { combine_grad(pool, grad_rows, grad_row_probs, dx, grad_probs); });
    } else {
      sequential_backward(*this, pool, times, dy, grad_rows, grad_row_probs, dx, grad_probs,
                          compute);
    }
  }
  void combine(thread_pool& pool, T const* rows, T* out) {
    publish_combine(pool, rows, nullptr);
    window_.fence();
    sum_rows(pool, out, false);
  }
  void combine_grad(thread_pool& pool, T const* grad_rows, T const* grad_row_probs, T* dx,
                    row_matrix<P>& grad_probs) {
    publish_combine(pool, grad_rows, grad_row_probs);
    window_.fence();
    sum_rows(pool, dx, true);
    // The probs' gradients: each row's ETP partials summed, by ETP index.
    auto const& sent = chunks_.send_rows();
    int const ETP = groups_.etp_size();
    for (int r = 0; r < sent.rows(); ++r) {
      row_ref const at = push_[static_cast<std::size_t>(r)];
      T g = in_segment<T const>(at.rank, combine_at_)[at.row];
      for (int i = 1; i < ETP; ++i)
        g += in_segment<T const>(at.rank + i * groups_.ep_size(), combine_at_)[at.row];
      grad_probs(sent.source_token(r), sent.row_expert(r)) = static_cast<P>(g);
    }
  }

 private:
  /// A row in a rank's segment: the tp_ep coordinates as (ETP i) * EP + (EP j), and its index.
  struct row_ref {
    int rank = 0;
    int row = 0;
  };
  using region = exchange_window::region;
  static constexpr auto aligned = exchange_window::aligned;

  /// Whether publishing `rows` rows bypasses the caches (core/stream_copy.hpp): from 4 MiB on,
  /// where the rows leave the caches before the other ranks read them. (The rows each rank pulls
  /// are copied plainly: their experts read them next, and streamed stores measured no faster
  /// there.)
  bool streams(std::size_t rows) const {
    return rows * static_cast<std::size_t>(hidden_) * sizeof(T) >= (std::size_t{4} << 20);
  }

  /// Where each expert row comes from (pull_: the sender and its row in permutation-1 order) and
  /// where each sent row lands (push_: the EP rank of its expert, ETP index 0, and its place in
  /// that rank's expert-major rows), both from the count table alone.
  void trace_rows() {
    int const E = groups_.num_experts(), L = groups_.local_experts();
    int const EP = groups_.ep_size(), ETP = groups_.etp_size();
    // row_start_[(i * EP + j) * E + e]: where expert e's rows start in rank (i, j)'s send order.
    row_start_.resize(static_cast<std::size_t>(ETP) * EP * E);
    for (int s = 0; s < ETP * EP; ++s) {
      int at = 0;
      for (int e = 0; e < E; ++e) {
        row_start_[static_cast<std::size_t>(s) * E + e] = {s, at};
        at += static_cast<int>(chunks_.count(s / EP, s % EP, e));
      }
    }
    auto const size = chunks_.chunk_size();
    auto const target = chunks_.target_start();
    int const first = groups_.first_expert();
    pull_.resize(static_cast<std::size_t>(chunks_.rows()));
    for (int i = 0; i < ETP; ++i)
      for (int j = 0; j < EP; ++j)
        for (int l = 0; l < L; ++l) {
          std::size_t const c = (static_cast<std::size_t>(i) * EP + j) * L + l;
          row_ref const from = row_start_[static_cast<std::size_t>(i * EP + j) * E + first + l];
          for (std::int64_t p = 0; p < size[c]; ++p)
            pull_[static_cast<std::size_t>(target[c] + p)] = {from.rank,
                                                              from.row + static_cast<int>(p)};
        }
    // A sent row of expert e = j' L + l sits, on EP rank j', at its chunk's start in (l, i, j)
    // order there plus its place among this rank's rows of e.
    auto const& sent = chunks_.send_rows();
    int const me = groups_.etp_rank() * EP + groups_.ep_rank();
    push_.resize(static_cast<std::size_t>(sent.rows()));
    for (int e = 0, r = 0; e < E; ++e) {
      int const j2 = e / L, l = e % L;
      std::int64_t start = 0;  // chunk (my i, my j, l)'s start on EP rank j2
      for (int ll = 0; ll < l; ++ll)
        for (int s = 0; s < ETP * EP; ++s) start += chunks_.count(s / EP, s % EP, j2 * L + ll);
      for (int s = 0; s < me; ++s) start += chunks_.count(s / EP, s % EP, e);
      auto const n = static_cast<int>(chunks_.count(me / EP, me % EP, e));
      for (int p = 0; p < n; ++p, ++r)
        push_[static_cast<std::size_t>(r)] = {j2, static_cast<int>(start) + p};
    }
  }

  /// Grows the window when this plan needs more than it has; every rank reads the same table, so
  /// every rank decides alike. Segments are equal, sized for the largest rank, and laid out as
  ///   dispatch region: where this dispatch's tokens are (0: token_rows(), 1: copies), the token of
  ///     each sent row (int), the sent rows' probs, token_rows(), the tokens' copies;
  ///   combine region: the expert rows' probs (or their gradients), the expert rows.
  void fit_window() {
    int const E = groups_.num_experts(), L = groups_.local_experts();
    int const EP = groups_.ep_size(), ETP = groups_.etp_size();
    std::int64_t most_sent = 0, most_expert_rows = 0;
    for (int s = 0; s < ETP * EP; ++s) {
      std::int64_t sent = 0;
      for (int e = 0; e < E; ++e) sent += chunks_.count(s / EP, s % EP, e);
      most_sent = std::max(most_sent, sent);
    }
    for (int j = 0; j < EP; ++j) {
      std::int64_t rows = 0;
      for (int s = 0; s < ETP * EP; ++s)
        for (int l = 0; l < L; ++l) rows += chunks_.count(s / EP, s % EP, j * L + l);
      most_expert_rows = std::max(most_expert_rows, rows);
    }
    if (window_.allocated() && most_sent <= sent_cap_ && most_expert_rows <= expert_rows_cap_ &&
        chunks_.most_tokens() <= tokens_cap_)
      return;
    // The configuration's bound (bound_experts_per_token), the same on every rank: what a plan
    // of as many tokens may need. Past it (or without one), a quarter more than asked, so that
    // growing micro-batches do not reallocate every step.
    std::int64_t const tokens = chunks_.most_tokens();
    std::int64_t const sent_bound = tokens * std::min(experts_per_token_, E);
    std::int64_t const expert_rows_bound =
        std::int64_t{ETP} * EP * tokens * std::min(experts_per_token_, L);
    auto const grown = [](std::int64_t cap, std::int64_t need, std::int64_t bound) {
      if (need <= bound) return std::max<std::int64_t>({cap, bound, 16});
      return std::max<std::int64_t>({cap, need + need / 4, 16});
    };
    std::int64_t const sent_cap = grown(sent_cap_, most_sent, sent_bound);
    std::int64_t const expert_rows_cap =
        grown(expert_rows_cap_, most_expert_rows, expert_rows_bound);
    std::int64_t const tokens_cap = grown(tokens_cap_, tokens, experts_per_token_ > 0 ? tokens : 0);
    auto const H = static_cast<std::size_t>(hidden_);
    auto const sent = static_cast<std::size_t>(sent_cap);
    auto const expert = static_cast<std::size_t>(expert_rows_cap);
    std::size_t const token_bytes = aligned(static_cast<std::size_t>(tokens_cap) * H * sizeof(T));
    std::size_t const sent_probs_at = index_at + aligned(sent * sizeof(int));
    std::size_t const tokens_at = sent_probs_at + aligned(sent * sizeof(T));
    std::size_t const copies_at = tokens_at + token_bytes;
    std::size_t const combine_at = copies_at + token_bytes;
    std::size_t const expert_rows_at = combine_at + aligned(expert * sizeof(T));
    std::size_t const bytes = expert_rows_at + aligned(expert * H * sizeof(T));
    window_.allocate(groups_.tp_ep(), bytes);
    sent_cap_ = sent_cap;
    expert_rows_cap_ = expert_rows_cap;
    tokens_cap_ = tokens_cap;
    sent_probs_at_ = sent_probs_at;
    tokens_at_ = tokens_at;
    copies_at_ = copies_at;
    combine_at_ = combine_at;
    expert_rows_at_ = expert_rows_at;
  }

  /// Rank (ETP i, EP j)'s segment, at `offset`, as Elem.
  template <class Elem>
  Elem* in_segment(int coordinates, std::size_t offset) const {
    return window_.at<Elem>(rank_of_[static_cast<std::size_t>(coordinates)], offset);
  }
  int my_coordinates() const { return groups_.etp_rank() * groups_.ep_size() + groups_.ep_rank(); }

  /// Publishes this rank's tokens (unless they wait in token_rows()) and the token of each row it
  /// sends; returns where the rows' probs go.
  T* publish_dispatch(thread_pool& pool, T const* tokens) {
    window_.enter(region::dispatch);
    auto const& sent = chunks_.send_rows();
    int const me = my_coordinates();
    auto* index = in_segment<int>(me, index_at);
    for (int r = 0; r < sent.rows(); ++r) index[r] = sent.source_token(r);
    bool const waiting = tokens == in_segment<T>(me, tokens_at_);
    *in_segment<int>(me, 0) = waiting ? 0 : 1;
    if (waiting) return in_segment<T>(me, sent_probs_at_);
    T* to = in_segment<T>(me, copies_at_);
    auto const H = static_cast<std::size_t>(hidden_);
    bool const streamed = streams(static_cast<std::size_t>(sent.tokens()));
    parallel_rows(pool, sent.tokens(), [&](int begin, int end) {
      copy_bytes(to + static_cast<std::size_t>(begin) * H,
                 tokens + static_cast<std::size_t>(begin) * H,
                 static_cast<std::size_t>(end - begin) * H * sizeof(T), streamed);
      stream_fence();
    });
    return in_segment<T>(me, sent_probs_at_);
  }

  /// Copies expert rows [begin, end) from their senders' tokens (and their probs, when asked),
  /// from the senders find_senders() found.
  void pull_rows(thread_pool& pool, T* rows, T* row_probs, std::int64_t begin,
                 std::int64_t end) const {
    parallel_rows(pool, static_cast<int>(end - begin), [&](int first, int last) {
      pull_range(rows, row_probs, begin + first, begin + last);
    });
  }

  /// Each sender's segment pointers for the pulls that follow: its sent rows' tokens, their probs
  /// and its tokens (as published or waiting).
  void find_senders() const {
    int const senders = groups_.etp_size() * groups_.ep_size();
    sent_tokens_at_.resize(static_cast<std::size_t>(senders));
    sent_probs_of_.resize(sent_tokens_at_.size());
    rows_of_.resize(sent_tokens_at_.size());
    for (int s = 0; s < senders; ++s) {
      auto const at = static_cast<std::size_t>(s);
      sent_tokens_at_[at] = in_segment<int const>(s, index_at);
      sent_probs_of_[at] = in_segment<T const>(s, sent_probs_at_);
      bool const copied = *in_segment<int const>(s, 0) != 0;
      rows_of_[at] = in_segment<T const>(s, copied ? copies_at_ : tokens_at_);
    }
  }

  /// Expert rows [begin, end) from the senders find_senders() found, on the calling thread.
  void pull_range(T* rows, T* row_probs, std::int64_t begin, std::int64_t end) const {
    auto const H = static_cast<std::size_t>(hidden_);
    for (std::int64_t d = begin; d < end; ++d) {
      row_ref const from = pull_[static_cast<std::size_t>(d)];
      auto const s = static_cast<std::size_t>(from.rank);
      auto const token = static_cast<std::size_t>(sent_tokens_at_[s][from.row]);
      std::memcpy(rows + static_cast<std::size_t>(d) * H, rows_of_[s] + token * H, H * sizeof(T));
      if (row_probs != nullptr) row_probs[d] = sent_probs_of_[s][from.row];
    }
  }

  /// The rows a piece's compute waits for, pulled ahead by the pool's waiting thread, and the hook
  /// that was installed before (a pipeline's exchanges in flight), which keeps being called.
  struct pull_ahead {
    shared_memory_dispatcher const* from = nullptr;
    T* rows = nullptr;
    T* row_probs = nullptr;
    std::int64_t next = 0, end = 0, slice = 1;
    wait_hook outer{};

    /// The wait hook: one slice and the outer hook; whether either has work left.
    static bool poll(void* state) {
      auto& a = *static_cast<pull_ahead*>(state);
      std::int64_t const stop = std::min(a.end, a.next + a.slice);
      a.from->pull_range(a.rows, a.row_probs, a.next, stop);
      a.next = stop;
      bool const outer_pending = a.outer.poll != nullptr && a.outer.poll(a.outer.state);
      return a.next < a.end || outer_pending;
    }
  };

  /// After the dispatch's fence: the senders found once, piece 0's rows pulled by the pool; then
  /// for each piece g, its experts compute while the waiting thread pulls piece g+1's rows, and the
  /// pool pulls the rest of them. A piece's rows are one range of the expert-major rows (local
  /// experts ascending).
  template <class Compute>
  void pull_while_computing(thread_pool& pool, T* rows, T* row_probs, Compute& compute) {
    int const L = groups_.local_experts(), count = overlap_pieces();
    auto const local = chunks_.tokens_per_local_expert();
    auto const first_expert = [&](int g) { return g * L / count; };
    auto const first_row = [&](int g) {
      return std::accumulate(local.begin(), local.begin() + first_expert(g), std::int64_t{0});
    };
    // A slice the waiting thread copies in a fraction of the pool's wake-up interval.
    std::int64_t const slice = std::max<std::int64_t>(
        1, (std::int64_t{256} << 10) / (std::int64_t{hidden_} * std::int64_t{sizeof(T)}));
    pulled_overlapped_ += chunks_.rows();
    find_senders();
    pull_rows(pool, rows, row_probs, 0, first_row(1));
    for (int g = 0; g < count; ++g) {
      std::int64_t const begin = first_row(g + 1);
      std::int64_t const end = g + 1 < count ? first_row(g + 2) : begin;
      ahead_ = {this, rows, row_probs, begin, end, slice, pool.hook()};
      {
        scoped_wait_hook const pulling(pool, {&pull_ahead::poll, &ahead_});
        compute(first_expert(g), first_expert(g + 1));
      }
      pulled_while_computing_ += ahead_.next - begin;
      pull_rows(pool, rows, row_probs, ahead_.next, end);
    }
  }

  /// Publishes this rank's expert rows (unless they are in the window already) and their probs'
  /// gradients.
  void publish_combine(thread_pool& pool, T const* rows, T const* row_probs) {
    int const me = my_coordinates();
    T* to = in_segment<T>(me, expert_rows_at_);
    window_.enter(region::combine);
    if (rows == to) {
      if (row_probs != nullptr)
        std::memcpy(in_segment<T>(me, combine_at_), row_probs,
                    static_cast<std::size_t>(chunks_.rows()) * sizeof(T));
      return;
    }
    auto const H = static_cast<std::size_t>(hidden_);
    bool const streamed = streams(static_cast<std::size_t>(chunks_.rows()));
    parallel_rows(pool, static_cast<int>(chunks_.rows()), [&](int begin, int end) {
      copy_bytes(to + static_cast<std::size_t>(begin) * H,
                 rows + static_cast<std::size_t>(begin) * H,
                 static_cast<std::size_t>(end - begin) * H * sizeof(T), streamed);
      stream_fence();
    });
    if (row_probs != nullptr)
      std::memcpy(in_segment<T>(me, combine_at_), row_probs,
                  static_cast<std::size_t>(chunks_.rows()) * sizeof(T));
  }

  /// out[t] (+)= the sum of token t's rows, read from the experts' segments: rows ascending, each
  /// the sum of its ETP partials by ETP index.
  void sum_rows(thread_pool& pool, T* out, bool add) const {
    auto const& sent = chunks_.send_rows();
    int const ETP = groups_.etp_size(), EP = groups_.ep_size();
    int const H = hidden_;
    std::vector<T const*>& base = rows_of_;
    base.resize(static_cast<std::size_t>(ETP * EP));
    for (int s = 0; s < ETP * EP; ++s)
      base[static_cast<std::size_t>(s)] = in_segment<T const>(s, expert_rows_at_);
    parallel_rows(pool, sent.tokens(), [&](int begin, int end) {
      row_matrix<T> partial(1, H);
      for (int t = begin; t < end; ++t) {
        row_matrix_map<T> o(out + std::ptrdiff_t{t} * H, 1, H);
        if (!add) o.setZero();
        for (int r : sent.rows_of(t)) {
          row_ref const at = push_[static_cast<std::size_t>(r)];
          auto row = [&](int i) {
            return const_row_matrix_map<T>(
                base[static_cast<std::size_t>(at.rank + i * EP)] + std::ptrdiff_t{at.row} * H, 1,
                H);
          };
          if (ETP == 1) {
            o += row(0);
          } else {
            partial = row(0);
            for (int i = 1; i < ETP; ++i) partial += row(i);
            o += partial;
          }
        }
      }
    });
  }

  expert_groups groups_;
  int hidden_;
  std::vector<int> rank_of_;  // tp_ep rank of coordinates (ETP i) * EP + (EP j)
  expert_chunks chunks_;
  std::vector<row_ref> pull_, push_;
  std::vector<row_ref> row_start_;  // trace_rows()'s scratch
  exchange_window window_;
  std::int64_t sent_cap_ = 0, expert_rows_cap_ = 0, tokens_cap_ = 0;  // rows the window holds
  int experts_per_token_ = 0;  // bound_experts_per_token (0: no bound)
  static constexpr std::size_t index_at = 64;                         // after the dispatch's flag
  std::size_t sent_probs_at_ = 0, tokens_at_ = 0, copies_at_ = 0, combine_at_ = 0,
              expert_rows_at_ = 0;
  // Each rank's segment pointers for one pull: its sent rows' tokens and probs, and its token (or
  // expert) rows.
  mutable std::vector<int const*> sent_tokens_at_;
  mutable std::vector<T const*> sent_probs_of_, rows_of_;
  int overlap_ = 1;  // pieces of local experts an overlapped dispatch pulls in (at most)
  pull_ahead ahead_;
  std::int64_t pulled_while_computing_ = 0, pulled_overlapped_ = 0;
  activation_stash<expert_chunks, std::vector<row_ref>, std::vector<row_ref>> stash_;
};

}  // namespace megamoe::dispatch

namespace megamoe::by_need {
/// This header is included.
template <class Dependent>
inline constexpr bool included<module::shared_memory_dispatcher, Dependent> = true;
}  // namespace megamoe::by_need
