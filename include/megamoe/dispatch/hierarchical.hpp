// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/hierarchical.hpp — the node-aware dispatcher: a token crosses each node boundary
// at most once. Interface: dispatch/local.hpp. Needs ETP = 1 (R032).
//
// The EP ranks form M nodes of R ranks each (dispatch/nodes.hpp); rank (node m, index q) holds the
// L experts of its EP rank. Dispatch runs in two exchanges:
//   A, between nodes: a token goes once to every node that holds one of its experts, to the rank
//      with the sender's own index there (over `peers()`), with its routing-map entries and probs
//      for that node's R*L experts;
//   B, inside the node: each row goes once to every rank of the node that holds one of its
//      experts (over `node()`), with the entries for that rank's L experts.
// Each rank then groups what it received by local expert (rows by arrival order). Combine is the
// reverse, summing as early as possible: a rank first adds the rows of each received row, the
// node's ranks send those partial sums back, the receiving rank adds them per token copy, and only
// those sums cross the node boundary back to the token's rank, which adds one per node.
// Drop-and-pad (capacity > 0) sends the same rows as routing: each rank's C rows per expert
// (routed tokens first, then padding) become its routing map.
//
// With SharedNode (dispatch::hierarchical<shared_memory>), exchange B goes through an MPI-3
// shared-memory window over the node (parallel/shared_window.hpp), HybridEP's shape: exchange A
// receives straight into this rank's segment, each rank publishes which received row each of its
// stage-B rows is, and after one fence every rank copies its expert rows (and their probs) from
// the node's segments to their final places: the stage-B gather, exchange B and the expert-major
// gather become one copy. Combine: each rank sums its expert rows per received row into its
// segment, and after one fence each rank sums, while reading them, the node's partial sums of each
// of its stage-A rows, in stage B's order. Every sum is the one the MPI exchange B makes, in the
// same order, so results are bit for bit the same. The segment has a dispatch and a combine
// region, so that alternating exchanges need one fence each (dispatch/exchange_window.hpp); the
// window grows to the largest plan seen on the node (agreed by an all-reduce of the needs).
#pragma once

#include <megamoe/core/buffer.hpp>
#include <megamoe/core/by_need.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/exchange.hpp>
#include <megamoe/dispatch/exchange_window.hpp>
#include <megamoe/dispatch/groups.hpp>
#include <megamoe/dispatch/nodes.hpp>
#include <megamoe/dispatch/token_rows.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/policy/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace megamoe::dispatch {

/// What one dispatch (or one combine: the same rows travel back) sends from this rank.
struct node_traffic {
  std::int64_t inter_node_rows = 0;  // token rows to other nodes
  std::int64_t intra_node_rows = 0;  // token rows to other ranks of this node
  std::int64_t row_bytes = 0;        // bytes of one token row
  std::int64_t inter_node_meta_bytes = 0, intra_node_meta_bytes = 0;  // probs riding along
  [[nodiscard]] std::int64_t inter_node_bytes() const {
    return inter_node_rows * row_bytes + inter_node_meta_bytes;
  }
  [[nodiscard]] std::int64_t intra_node_bytes() const {
    return intra_node_rows * row_bytes + intra_node_meta_bytes;
  }
};

/// T: the layer's scalar; P: the router's probs type; SharedNode: exchange B through a shared
/// window (dispatch::hierarchical<shared_memory>) rather than MPI's all-to-all.
template <class T, class P, bool SharedNode = false>
class hierarchical_dispatcher
    : public sequential_exchange<hierarchical_dispatcher<T, P, SharedNode>, T, P> {
 public:
  hierarchical_dispatcher(expert_groups const& groups, int hidden)
      : groups_(groups), nodes_(whole_experts(groups), groups.stage()), hidden_(hidden) {
    int const M = nodes_.nodes(), R = nodes_.ranks_per_node(), L = groups.local_experts();
    width_ = R * L;
    node_experts_.resize(static_cast<std::size_t>(M) * width_);
    for (int m = 0; m < M; ++m)
      for (int q = 0; q < R; ++q)
        for (int l = 0; l < L; ++l)
          node_experts_[static_cast<std::size_t>(m * width_ + q * L + l)] =
              nodes_.rank_at(m, q) * L + l;
    for (auto* counts : {&send_a_, &recv_a_}) counts->resize(static_cast<std::size_t>(M));
    for (auto* counts : {&send_b_, &recv_b_}) counts->resize(static_cast<std::size_t>(R));
  }

  void plan(thread_pool&, mask_matrix const& map, int capacity,
            std::exception_ptr earlier = nullptr) {
    int const E = groups_.num_experts(), M = nodes_.nodes(), R = nodes_.ranks_per_node();
    int const L = groups_.local_experts(), W = width_;
    std::exception_ptr problem = earlier;
    if (!problem) try {
        if (map.cols() != E)
          throw input_error("hierarchical dispatcher: the routing map has " +
                            std::to_string(map.cols()) + " experts, the layer " +
                            std::to_string(E));
        source_.assign(map, capacity);
      } catch (...) {
        problem = std::current_exception();
      }
    parallel::agree_on_failure(groups_.ep(), problem);
    // The rows to send, as a map (drop-and-pad's padding rows included).
    int const tokens = source_.tokens();
    reserve_receives(tokens);
    sent_map_.assign(static_cast<std::size_t>(tokens) * E, 0);
    for (int j = 0; j < source_.rows(); ++j)
      sent_map_[static_cast<std::size_t>(source_.source_token(j)) * E + source_.row_expert(j)] = 1;
    // A: each token once to each node that holds one of its experts.
    need_.assign(static_cast<std::size_t>(tokens) * M, 0);
    for (int t = 0; t < tokens; ++t)
      for (int m = 0; m < M; ++m)
        for (int c = 0; c < W && need_[static_cast<std::size_t>(t) * M + m] == 0; ++c)
          need_[static_cast<std::size_t>(t) * M + m] = sent(t, expert_at(m, c));
    stage_a_.assign(mask_map(need_.data(), tokens, M), 0);
    exchange_counts(nodes_.peers(), stage_a_, send_a_, recv_a_);
    auto* mask_out = masks_[0].reserve(std::size_t(stage_a_.rows()) * W);
    for (int r = 0; r < stage_a_.rows(); ++r)
      for (int c = 0; c < W; ++c)
        mask_out[std::ptrdiff_t{r} * W + c] =
            sent(stage_a_.source_token(r), expert_at(stage_a_.row_expert(r), c));
    rows_a_ = total(recv_a_);
    mask_a_.resize(static_cast<std::size_t>(rows_a_) * W);
    parallel::all_to_all_v(nodes_.peers(), mask_out, send_a_, mask_a_.data(), recv_a_, W);
    // B: each received row once to each rank of the node that holds one of its experts.
    need_.assign(static_cast<std::size_t>(rows_a_) * R, 0);
    for (std::int64_t a = 0; a < rows_a_; ++a)
      for (int q = 0; q < R; ++q)
        for (int l = 0; l < L; ++l)
          need_[static_cast<std::size_t>(a * R + q)] |=
              mask_a_[static_cast<std::size_t>(a * W + q * L + l)];
    stage_b_.assign(mask_map(need_.data(), static_cast<int>(rows_a_), R), 0);
    exchange_counts(nodes_.node(), stage_b_, send_b_, recv_b_);
    mask_out = masks_[1].reserve(std::size_t(stage_b_.rows()) * L);
    for (int r = 0; r < stage_b_.rows(); ++r)
      std::copy_n(mask_a_.data() + std::ptrdiff_t{stage_b_.source_token(r)} * W +
                      stage_b_.row_expert(r) * L,
                  L, mask_out + std::ptrdiff_t{r} * L);
    rows_b_ = total(recv_b_);
    mask_b_.resize(static_cast<std::size_t>(rows_b_) * L);
    parallel::all_to_all_v(nodes_.node(), mask_out, send_b_, mask_b_.data(), recv_b_, L);
    // The local experts' rows, by expert, in arrival order.
    expert_rows_.assign(mask_map(mask_b_.data(), static_cast<int>(rows_b_), L), 0);
    count_traffic();
    if constexpr (SharedNode) fit_window();
  }

  /// Sets micro-batch `key`'s plan aside (core/stash.hpp), or brings it back.
  void park(std::uint64_t key) {
    stash_.park(key, source_, sent_map_, stage_a_, stage_b_, expert_rows_, send_a_, recv_a_,
                send_b_, recv_b_, rows_a_, rows_b_, mask_a_, mask_b_);
  }
  void restore(std::uint64_t key) {
    stash_.restore(key, source_, sent_map_, stage_a_, stage_b_, expert_rows_, send_a_, recv_a_,
                   send_b_, recv_b_, rows_a_, rows_b_, mask_a_, mask_b_);
  }

  [[nodiscard]] int expert_rows() const noexcept { return expert_rows_.rows(); }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_local_expert() const noexcept {
    return expert_rows_.permutation().tokens_per_expert;
  }

  // Bookkeeping, for tests, benchmarks and logs.
  [[nodiscard]] node_layout const& nodes() const noexcept { return nodes_; }
  /// Rows and bytes this rank sends in one dispatch of the last plan (combine sends as many back).
  [[nodiscard]] node_traffic const& traffic() const noexcept { return traffic_; }
  /// Rows this rank sends to each node (exchange A) and to each rank of its node (exchange B).
  [[nodiscard]] std::span<std::int64_t const> rows_to_nodes() const noexcept { return send_a_; }
  [[nodiscard]] std::span<std::int64_t const> rows_in_node() const noexcept { return send_b_; }

  /// Bytes of this rank's segment of the node's window (SharedNode; 0 before the first plan).
  [[nodiscard]] std::size_t window_bytes() const noexcept { return window_.segment_bytes(); }
  /// Times the node's window was allocated (SharedNode; it grows to the largest plan seen).
  [[nodiscard]] int window_allocations() const noexcept { return window_.allocations(); }

  void dispatch(thread_pool& pool, T const* tokens, T* rows, row_matrix<P> const& probs,
                T* row_probs) {
    int const W = width_, L = groups_.local_experts();
    T* probs_out = probs_[0].reserve(std::size_t(stage_a_.rows()) * W);
    for (int r = 0; r < stage_a_.rows(); ++r)
      for (int c = 0; c < W; ++c)
        probs_out[std::ptrdiff_t{r} * W + c] =
            static_cast<T>(probs(stage_a_.source_token(r), expert_at(stage_a_.row_expert(r), c)));
    if constexpr (SharedNode) {
      forward_through_window(pool, tokens, rows, true, probs_out, row_probs);
      return;
    }
    T const* received = forward_hops(pool, tokens, rows, true, probs_out);
    for (int j = 0; j < expert_rows_.rows(); ++j)
      row_probs[j] =
          received[std::ptrdiff_t{expert_rows_.source_token(j)} * L + expert_rows_.row_expert(j)];
  }
  void dispatch(thread_pool& pool, T const* tokens, T* rows) {
    if constexpr (SharedNode)
      forward_through_window(pool, tokens, rows, false, nullptr, nullptr);
    else
      forward_hops(pool, tokens, rows, false, nullptr);
  }
  void combine(thread_pool& pool, T const* rows, T* out) {
    if constexpr (SharedNode)
      backward_through_window(pool, rows, out, false, false, nullptr);
    else
      backward_hops(pool, rows, out, false, false, nullptr);
  }
  void combine_grad(thread_pool& pool, T const* grad_rows, T const* grad_row_probs, T* dx,
                    row_matrix<P>& grad_probs) {
    int const W = width_, L = groups_.local_experts();
    T const* at_a = nullptr;
    if constexpr (SharedNode) {
      at_a = backward_through_window(pool, grad_rows, dx, true, true, grad_row_probs);
    } else {
      T* at_b = probs_[2].reserve(std::size_t(rows_b_) * L);
      scatter_row_probs(grad_row_probs, at_b);
      at_a = backward_hops(pool, grad_rows, dx, true, true, at_b);
    }
    for (int r = 0; r < stage_a_.rows(); ++r) {
      int const t = stage_a_.source_token(r);
      for (int c = 0; c < W; ++c) {
        int const e = expert_at(stage_a_.row_expert(r), c);
        if (sent(t, e)) grad_probs(t, e) = static_cast<P>(at_a[std::ptrdiff_t{r} * W + c]);
      }
    }
  }

  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return source_.bytes() + stage_a_.bytes() + stage_b_.bytes() + expert_rows_.bytes() +
           sent_map_.size() + mask_a_.size() + mask_b_.size() +
           (send_a_.size() + recv_a_.size() + send_b_.size() + recv_b_.size()) *
               sizeof(std::int64_t);
  }

 private:
  using mask_view = Eigen::Map<mask_matrix const>;
  static mask_view mask_map(std::uint8_t const* data, int rows, int cols) {
    return {data, rows, cols};
  }
  static std::int64_t total(std::vector<std::int64_t> const& counts) {
    return std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  }
  static boost::mpi::communicator const& whole_experts(expert_groups const& groups) {
    if (groups.etp_size() != 1)
      throw parallel::agreed_config_error(
          rules::id::hierarchical_needs_etp_one,
          config_error(rules::id::hierarchical_needs_etp_one,
                       "ETP is " + std::to_string(groups.etp_size()))
              .what());
    return groups.ep();
  }

  [[nodiscard]] int expert_at(int node, int column) const {
    return node_experts_[static_cast<std::size_t>(node * width_ + column)];
  }
  [[nodiscard]] std::uint8_t sent(int token, int expert) const {
    return sent_map_[static_cast<std::size_t>(token) * groups_.num_experts() + expert];
  }

  /// at_b[rows of B, L]: each expert row's value at its received row and local expert, 0 elsewhere.
  void scatter_row_probs(T const* row_values, T* at_b) const {
    int const L = groups_.local_experts();
    std::fill_n(at_b, rows_b_ * L, T(0));
    for (int j = 0; j < expert_rows_.rows(); ++j)
      at_b[std::ptrdiff_t{expert_rows_.source_token(j)} * L + expert_rows_.row_expert(j)] =
          row_values[j];
  }

  /// Rows per destination from `rows`' permutation; rows per source by an all-to-all of counts.
  static void exchange_counts(boost::mpi::communicator const& comm, token_rows const& rows,
                              std::vector<std::int64_t>& send, std::vector<std::int64_t>& recv) {
    auto const& per = rows.permutation().tokens_per_expert;
    std::copy(per.begin(), per.end(), send.begin());
    parallel::watched_collective const watch(MPI_Comm(comm), "exchange_counts", 1);
    MPI_Alltoall(send.data(), 1, MPI_INT64_T, recv.data(), 1, MPI_INT64_T, MPI_Comm(comm));
  }

  void count_traffic() {
    int const me_node = nodes_.node_of(groups_.ep_rank());
    int const me_index = nodes_.index_of(groups_.ep_rank());
    traffic_ = {};
    traffic_.row_bytes = std::int64_t{hidden_} * std::int64_t{sizeof(T)};
    for (std::size_t m = 0; m < send_a_.size(); ++m)
      if (static_cast<int>(m) != me_node) traffic_.inter_node_rows += send_a_[m];
    for (std::size_t q = 0; q < send_b_.size(); ++q)
      if (static_cast<int>(q) != me_index) traffic_.intra_node_rows += send_b_[q];
    traffic_.inter_node_meta_bytes = traffic_.inter_node_rows * width_ * std::int64_t{sizeof(T)};
    traffic_.intra_node_meta_bytes =
        traffic_.intra_node_rows * groups_.local_experts() * std::int64_t{sizeof(T)};
  }

  /// Rows (width H) over `comm` and, `with_probs`, their probs (width `width`) in flight with them.
  /// Every rank of `comm` passes the same `with_probs`: a rank without rows may have null buffers,
  /// and must still take part in the probs' exchange.
  void exchange(boost::mpi::communicator const& comm, T const* rows,
                std::span<std::int64_t const> send, T* rows_out, std::span<std::int64_t const> recv,
                bool with_probs, T const* probs, T* probs_out, int width) {
    std::array<parallel::request, 2> pending;
    pending[0] = parallel::all_to_all_v_start(comm, rows, send, rows_out, recv, hidden_);
    if (with_probs)
      pending[1] = parallel::all_to_all_v_start(comm, probs, send, probs_out, recv, width);
  }

  /// Token rows (and, `with_probs`, their probs `probs_a` [rows of A, R*L]) through both
  /// exchanges into the expert rows; returns the probs received by B [rows of B, L].
  T const* forward_hops(thread_pool& pool, T const* tokens, T* rows, bool with_probs,
                        T const* probs_a) {
    int const H = hidden_, W = width_, L = groups_.local_experts();
    T* out_a = rows_[0].reserve(std::size_t(stage_a_.rows()) * H);
    stage_a_.gather(pool, tokens, H, out_a);
    T* in_a = rows_[1].reserve(std::size_t(rows_a_) * H);
    T* probs_in_a = probs_[1].reserve(std::size_t(rows_a_) * W);
    exchange(nodes_.peers(), out_a, send_a_, in_a, recv_a_, with_probs, probs_a, probs_in_a, W);
    T* out_b = rows_[2].reserve(std::size_t(stage_b_.rows()) * H);
    stage_b_.gather(pool, in_a, H, out_b);
    T* probs_b = probs_[2].reserve(std::size_t(stage_b_.rows()) * L);
    if (with_probs)
      for (int r = 0; r < stage_b_.rows(); ++r)
        std::copy_n(
            probs_in_a + std::ptrdiff_t{stage_b_.source_token(r)} * W + stage_b_.row_expert(r) * L,
            L, probs_b + std::ptrdiff_t{r} * L);
    T* in_b = rows_[3].reserve(std::size_t(rows_b_) * H);
    T* probs_in_b = probs_[3].reserve(std::size_t(rows_b_) * L);
    exchange(nodes_.node(), out_b, send_b_, in_b, recv_b_, with_probs, probs_b, probs_in_b, L);
    expert_rows_.gather(pool, in_b, H, rows);
    return probs_in_b;
  }

  /// Expert rows back to the tokens, each hop adding what it can (out: set, or added to with
  /// `add`); `with_probs`, `probs_b` [rows of B, L] travels back too, and the probs arriving at
  /// exchange A's send side [rows of A, R*L] are returned.
  T const* backward_hops(thread_pool& pool, T const* rows, T* out, bool add, bool with_probs,
                         T const* probs_b) {
    int const H = hidden_, W = width_, L = groups_.local_experts();
    T* sums_b = rows_[3].reserve(std::size_t(rows_b_) * H);
    expert_rows_.combine(pool, rows, H, sums_b, false);
    T* back_b = rows_[2].reserve(std::size_t(stage_b_.rows()) * H);
    T* probs_back_b = probs_[1].reserve(std::size_t(stage_b_.rows()) * L);
    exchange(nodes_.node(), sums_b, recv_b_, back_b, send_b_, with_probs, probs_b, probs_back_b, L);
    T* sums_a = rows_[1].reserve(std::size_t(rows_a_) * H);
    stage_b_.combine(pool, back_b, H, sums_a, false);
    T* probs_a = probs_[3].reserve(std::size_t(rows_a_) * W);
    if (with_probs) {
      std::fill_n(probs_a, rows_a_ * W, T(0));
      for (int r = 0; r < stage_b_.rows(); ++r)
        std::copy_n(
            probs_back_b + std::ptrdiff_t{r} * L, L,
            probs_a + std::ptrdiff_t{stage_b_.source_token(r)} * W + stage_b_.row_expert(r) * L);
    }
    T* back_a = rows_[0].reserve(std::size_t(stage_a_.rows()) * H);
    T* probs_back_a = probs_[0].reserve(std::size_t(stage_a_.rows()) * W);
    exchange(nodes_.peers(), sums_a, recv_a_, back_a, send_a_, with_probs, probs_a, probs_back_a,
             W);
    stage_a_.combine(pool, back_a, H, out, add);
    return probs_back_a;
  }

  // Exchange B through the node's window (SharedNode).
  using region = exchange_window::region;
  static constexpr auto aligned = exchange_window::aligned;

  /// Grows the node's window when this plan needs more than it holds: every rank's need (rows
  /// received by A, stage-B rows sent, rows received by B) is all-reduced to the node's largest,
  /// so every rank decides alike. Equal segments, laid out as
  ///   dispatch region: where each destination's stage-B rows start (R int64), the received row of
  ///     each stage-B row (int), the rows received by A, their probs [rows of A, R*L];
  ///   combine region: where each sender's rows start among those received by B (R int64), the
  ///     sums of the expert rows per received row, their probs' gradients [rows of B, L].
  void fit_window() {
    // At least the bounds (receive_bounds; each row of A sent to each rank of the node at most
    // once), so that a plan within them never grows the window.
    auto const bound = receive_bounds(source_.tokens());
    std::int64_t need[3] = {std::max(rows_a_, bound[0]),
                            std::max<std::int64_t>(stage_b_.rows(), bound[1]),
                            std::max(rows_b_, bound[1])};
    {
      parallel::watched_collective const watch(MPI_Comm(nodes_.node()), "window_needs", 3);
      MPI_Allreduce(MPI_IN_PLACE, need, 3, MPI_INT64_T, MPI_MAX, MPI_Comm(nodes_.node()));
    }
    if (window_.allocated() && need[0] <= cap_[0] && need[1] <= cap_[1] && need[2] <= cap_[2])
      return;
    std::int64_t cap[3];
    for (int i = 0; i < 3; ++i) cap[i] = std::max<std::int64_t>({cap_[i], need[i], 16});
    auto const H = static_cast<std::size_t>(hidden_),
               L = static_cast<std::size_t>(groups_.local_experts());
    auto const R = static_cast<std::size_t>(nodes_.ranks_per_node());
    auto const a = static_cast<std::size_t>(cap[0]), sent = static_cast<std::size_t>(cap[1]),
               b = static_cast<std::size_t>(cap[2]);
    std::size_t const starts = aligned(R * sizeof(std::int64_t));
    std::size_t const index_at = starts;
    std::size_t const rows_a_at = index_at + aligned(sent * sizeof(int));
    std::size_t const probs_a_at = rows_a_at + aligned(a * H * sizeof(T));
    std::size_t const combine_at =
        probs_a_at + aligned(a * static_cast<std::size_t>(width_) * sizeof(T));
    std::size_t const sums_at = combine_at + starts;
    std::size_t const probs_b_at = sums_at + aligned(b * H * sizeof(T));
    std::size_t const bytes = probs_b_at + aligned(b * L * sizeof(T));
    window_.allocate(nodes_.node(), bytes);
    std::copy_n(cap, 3, cap_);
    index_at_ = index_at;
    rows_a_at_ = rows_a_at;
    probs_a_at_ = probs_a_at;
    combine_at_ = combine_at;
    sums_at_ = sums_at;
    probs_b_at_ = probs_b_at;
  }

  [[nodiscard]] int my_index() const { return nodes_.node().rank(); }

  /// The most rows each exchange can bring when every rank routes `tokens` tokens, as megamoe's
  /// ranks do: A, each of the M nodes' peers' tokens once; B, each of the node's R ranks' rows of
  /// A once. The buffers they arrive in (and their sums go back from) are reserved for that, so
  /// that a step whose routing piles onto this node or rank takes no new memory.
  [[nodiscard]] std::array<std::int64_t, 2> receive_bounds(int tokens) const {
    std::int64_t const a = std::int64_t{nodes_.nodes()} * tokens;
    return {a, a * nodes_.ranks_per_node()};
  }
  void reserve_receives(int tokens) {
    if (tokens <= reserved_tokens_) return;
    reserved_tokens_ = tokens;
    auto const [a, b] = receive_bounds(tokens);
    auto const H = static_cast<std::size_t>(hidden_), W = static_cast<std::size_t>(width_),
               L = static_cast<std::size_t>(groups_.local_experts());
    auto const rows_a = static_cast<std::size_t>(a), rows_b = static_cast<std::size_t>(b);
    mask_a_.reserve(rows_a * W);
    mask_b_.reserve(rows_b * L);
    rows_[1].reserve(rows_a * H);
    probs_[3].reserve(rows_b * L);  // rows of B x L, and rows of A x R*L: the same
    if constexpr (!SharedNode) {    // the node's window holds exchange B's
      rows_[3].reserve(rows_b * H);
      probs_[1].reserve(rows_b * L);
    }
  }

  /// Where each rank's rows start: the exclusive prefix sums of `counts`.
  static void starts_of(std::vector<std::int64_t> const& counts, std::int64_t* starts) {
    std::exclusive_scan(counts.begin(), counts.end(), starts, std::int64_t{0});
  }

  /// Exchange A into this rank's segment (`with_probs`, the probs `probs_a` too), then every expert
  /// row (and its prob) copied from the node's segments to its place.
  void forward_through_window(thread_pool& pool, T const* tokens, T* rows, bool with_probs,
                              T const* probs_a, T* row_probs) {
    int const H = hidden_, W = width_, L = groups_.local_experts(), R = nodes_.ranks_per_node();
    int const me = my_index();
    T* out_a = rows_[0].reserve(std::size_t(stage_a_.rows()) * H);
    stage_a_.gather(pool, tokens, H, out_a);
    window_.enter(region::dispatch);
    exchange(nodes_.peers(), out_a, send_a_, window_.at<T>(me, rows_a_at_), recv_a_, with_probs,
             probs_a, window_.at<T>(me, probs_a_at_), W);
    starts_of(send_b_, window_.at<std::int64_t>(me, 0));
    int* index = window_.at<int>(me, index_at_);
    for (int r = 0; r < stage_b_.rows(); ++r) index[r] = stage_b_.source_token(r);
    window_.fence();
    // Received row b of B came from node rank sender_[b], the k-th of its rows for this rank,
    // k = b - (where that sender's rows start).
    recv_starts_.resize(static_cast<std::size_t>(R) + 1);
    std::int64_t* const from = recv_starts_.data();
    starts_of(recv_b_, from);
    from[R] = rows_b_;
    sender_.resize(static_cast<std::size_t>(rows_b_));
    for (int q = 0; q < R; ++q)
      std::fill(sender_.begin() + from[q], sender_.begin() + from[q + 1], q);
    segment_rows_.resize(static_cast<std::size_t>(R));
    segment_index_.resize(static_cast<std::size_t>(R));
    segment_probs_.resize(static_cast<std::size_t>(R));
    for (int q = 0; q < R; ++q) {
      auto const u = static_cast<std::size_t>(q);
      segment_rows_[u] = window_.at<T const>(q, rows_a_at_);
      segment_probs_[u] = window_.at<T const>(q, probs_a_at_);
      // q's stage-B rows for this rank
      segment_index_[u] =
          window_.at<int const>(q, index_at_) + window_.at<std::int64_t const>(q, 0)[me];
    }
    auto const row_bytes = static_cast<std::size_t>(H) * sizeof(T);
    parallel_rows(pool, expert_rows_.rows(), [&](int begin, int end) {
      for (int j = begin; j < end; ++j) {
        int const b = expert_rows_.source_token(j);
        auto const q = static_cast<std::size_t>(sender_[static_cast<std::size_t>(b)]);
        std::ptrdiff_t const a = segment_index_[q][b - from[q]];
        std::memcpy(rows + std::ptrdiff_t{j} * H, segment_rows_[q] + a * H, row_bytes);
        if (with_probs)
          row_probs[j] =
              segment_probs_[q][a * W + std::ptrdiff_t{me} * L + expert_rows_.row_expert(j)];
      }
    });
  }

  /// The expert rows summed per received row into this rank's segment (and, `with_probs`,
  /// `grad_row_probs` scattered beside them); after one fence each received row of A sums the
  /// node's partial sums of it, in stage B's order, while reading them; then exchange A back and
  /// the sum per token. Returns, `with_probs`, the values arriving at exchange A's send side
  /// [rows of A, R*L].
  T const* backward_through_window(thread_pool& pool, T const* rows, T* out, bool add,
                                   bool with_probs, T const* grad_row_probs) {
    int const H = hidden_, W = width_, L = groups_.local_experts(), R = nodes_.ranks_per_node();
    int const me = my_index();
    window_.enter(region::combine);
    expert_rows_.combine(pool, rows, H, window_.at<T>(me, sums_at_), false);
    starts_of(recv_b_, window_.at<std::int64_t>(me, combine_at_));
    if (with_probs) scatter_row_probs(grad_row_probs, window_.at<T>(me, probs_b_at_));
    window_.fence();
    // Stage-B row r (to node rank q) is the (r - where my rows for q start)-th of q's rows from me.
    send_starts_.resize(static_cast<std::size_t>(R));
    starts_of(send_b_, send_starts_.data());
    segment_rows_.resize(static_cast<std::size_t>(R));
    segment_probs_.resize(static_cast<std::size_t>(R));
    first_row_.resize(static_cast<std::size_t>(R));
    for (int q = 0; q < R; ++q) {
      auto const u = static_cast<std::size_t>(q);
      first_row_[u] = window_.at<std::int64_t const>(q, combine_at_)[me] - send_starts_[u];
      segment_rows_[u] = window_.at<T const>(q, sums_at_);
      segment_probs_[u] = window_.at<T const>(q, probs_b_at_);
    }
    T* sums_a = rows_[1].reserve(std::size_t(rows_a_) * H);
    parallel_rows(pool, static_cast<int>(rows_a_), [&](int begin, int end) {
      for (int a = begin; a < end; ++a) {
        row_matrix_map<T> o(sums_a + std::ptrdiff_t{a} * H, 1, H);
        o.setZero();
        for (int r : stage_b_.rows_of(a)) {
          auto const q = static_cast<std::size_t>(stage_b_.row_expert(r));
          o += const_row_matrix_map<T>(segment_rows_[q] + (first_row_[q] + r) * H, 1, H);
        }
      }
    });
    T* probs_a = nullptr;
    if (with_probs) {
      probs_a = probs_[3].reserve(std::size_t(rows_a_) * W);
      std::fill_n(probs_a, rows_a_ * W, T(0));
      for (int r = 0; r < stage_b_.rows(); ++r) {
        auto const q = static_cast<std::size_t>(stage_b_.row_expert(r));
        std::copy_n(segment_probs_[q] + (first_row_[q] + r) * L, L,
                    probs_a + std::ptrdiff_t{stage_b_.source_token(r)} * W + q * L);
      }
    }
    T* back_a = rows_[0].reserve(std::size_t(stage_a_.rows()) * H);
    T* probs_back_a = probs_[0].reserve(std::size_t(stage_a_.rows()) * W);
    exchange(nodes_.peers(), sums_a, recv_a_, back_a, send_a_, with_probs, probs_a, probs_back_a,
             W);
    stage_a_.combine(pool, back_a, H, out, add);
    return probs_back_a;
  }

  expert_groups groups_;
  node_layout nodes_;
  int hidden_;
  int width_ = 1;                  // R*L: the experts of one node
  std::vector<int> node_experts_;  // [M][R*L]: global expert of each column of a node
  token_rows source_;              // this rank's rows by global expert (padding included)
  std::vector<std::uint8_t> sent_map_, need_, mask_a_, mask_b_;
  token_rows stage_a_, stage_b_, expert_rows_;
  std::vector<std::int64_t> send_a_, recv_a_, send_b_, recv_b_;
  std::int64_t rows_a_ = 0, rows_b_ = 0;
  int reserved_tokens_ = 0;  // reserve_receives
  std::array<buffer<std::uint8_t>, 2> masks_;
  std::array<buffer<T>, 4> rows_, probs_;
  node_traffic traffic_;
  // The node's window (SharedNode): rows each region holds, region offsets, and scratch.
  exchange_window window_;
  std::int64_t cap_[3] = {0, 0, 0};  // rows received by A, stage-B rows, rows received by B
  std::size_t index_at_ = 0, rows_a_at_ = 0, probs_a_at_ = 0, combine_at_ = 0, sums_at_ = 0,
              probs_b_at_ = 0;
  std::vector<int> sender_;
  std::vector<std::int64_t> recv_starts_, send_starts_, first_row_;
  std::vector<T const*> segment_rows_, segment_probs_;
  std::vector<int const*> segment_index_;
  using counts = std::vector<std::int64_t>;
  using mask = std::vector<std::uint8_t>;
  activation_stash<token_rows, mask, token_rows, token_rows, token_rows, counts, counts, counts,
                   counts, std::int64_t, std::int64_t, mask, mask>
      stash_;
};

}  // namespace megamoe::dispatch

namespace megamoe::by_need {
/// This header is included.
template <class Dependent>
inline constexpr bool included<module::hierarchical_dispatcher, Dependent> = true;
}  // namespace megamoe::by_need
