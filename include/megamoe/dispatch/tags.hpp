// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/tags.hpp — dispatcher policies (tags only): how tokens reach their experts.
//
//   dispatch::local                       EP = ETP = 1: permutation only
//   dispatch::all_gather                  gather over ETPxEP, keep local experts, reduce-scatter
//                                         back
//   dispatch::all_to_all                  count exchange, then variable all-to-all over EP
//   dispatch::all_to_all_overlap<Chunks>  all_to_all in chunks of local experts, each exchange
//                                         overlapped with the previous chunk's expert compute
//   dispatch::shared_memory               one node: rows copied straight between the ranks'
//                                         memories through an MPI-3 shared window
//   dispatch::shared_memory_overlap<Chunks>
//                                         shared_memory, each piece of local experts' rows pulled
//                                         while the previous piece computes
//   dispatch::hierarchical<IntraNode>     node-aware: each token crosses a node boundary once;
//                                         inside the node all_to_all or shared_memory
//   dispatch::fp8_wire<Base>              all_to_all (or all_to_all_overlap) with the forward
//                                         dispatch's tokens as the experts' FP8 input codes
//   dispatch::auto_                       local when EP*ETP = 1, otherwise all_to_all (the
//                                         default)
#pragma once

#include <megamoe/policy/policy.hpp>

#include <concepts>
#include <string_view>

namespace megamoe::dispatch {

/// The kind of the `dispatch` slot.
struct kind {};

enum class dispatcher { auto_, local, all_gather, all_to_all, hierarchical, shared_memory };

/// Permutation only; needs EP = ETP = 1 (R019).
struct local {
  using policy_kind = kind;
  static constexpr std::string_view name = "local";
  static constexpr dispatcher value = dispatcher::local;
};

/// Megatron's `allgather` dispatcher.
struct all_gather {
  using policy_kind = kind;
  static constexpr std::string_view name = "all_gather";
  static constexpr dispatcher value = dispatcher::all_gather;
};

/// Megatron's `alltoall` dispatcher.
struct all_to_all {
  using policy_kind = kind;
  static constexpr std::string_view name = "all_to_all";
  static constexpr dispatcher value = dispatcher::all_to_all;
};

/// The all-to-all cut into `Chunks` pieces by destination local expert: the exchange of piece i+1
/// is in flight (progressed by the waiting main thread) while the experts of piece i compute, and
/// piece i's outputs travel back while piece i+1 computes; backward likewise. Every expert still
/// sees all its rows in one product, so results are identical to all_to_all. Needs ETP = 1 (R033);
/// at most one piece per local expert, and fewer when a piece would carry less than
/// `MinPieceKiB` of token rows per rank (averaged over the EP group, so every rank agrees): each
/// piece costs an exchange's latency, which small exchanges cannot hide.
template <int Chunks, int MinPieceKiB = 1024>
  requires(Chunks >= 2 && MinPieceKiB >= 0)
struct all_to_all_overlap {
  using policy_kind = kind;
  static constexpr std::string_view name = "all_to_all_overlap";
  static constexpr dispatcher value = dispatcher::all_to_all;
  static constexpr int overlap_chunks = Chunks;
  static constexpr int overlap_min_piece_kib = MinPieceKiB;
};

/// Pieces of the exchange a dispatch policy overlaps with compute (1: none).
template <class D>
constexpr int overlap_chunks_of() {
  if constexpr (requires { D::overlap_chunks; })
    return D::overlap_chunks;
  else
    return 1;
}

/// The smallest piece (KiB of token rows per rank) a dispatch policy cuts its exchange into.
template <class D>
constexpr int overlap_min_piece_kib_of() {
  if constexpr (requires { D::overlap_min_piece_kib; })
    return D::overlap_min_piece_kib;
  else
    return 0;
}

/// The reference's `moe_dispatch_fwd_dtype` = fp8 on `Base` (all_to_all or all_to_all_overlap<N>):
/// the forward dispatch's token rows cross the wire as the FP8 codes the experts' fc1 would make of
/// them anyway, one byte per element instead of the scalar's four (and, under block scales, each
/// row's scales after its codes). Under per-tensor FP8 each sender quantizes its rows with the
/// destination expert's scale (one all-reduce of the experts' amaxes, and of delayed scaling's
/// scales, over EP first); under precision::wgrad_from_rowwise<mxfp8 or fp8_blockwise> each token's
/// row-local blocks are quantized once where it starts. Either way the codes, and every result,
/// equal quantizing after the dispatch bit for bit. Needs one of those recipes and ETP = 1 (R055).
/// Backward's dy and the combines stay fp32.
template <class Base = all_to_all>
  requires(Base::value == dispatcher::all_to_all)
struct fp8_wire : Base {
  static constexpr std::string_view name = "fp8_wire";
  static constexpr bool fp8_forward_wire = true;
};

/// Whether a dispatch policy sends the forward tokens as FP8 codes (dispatch::fp8_wire).
template <class D>
constexpr bool fp8_wire_of() {
  if constexpr (requires { D::fp8_forward_wire; })
    return D::fp8_forward_wire;
  else
    return false;
}

/// The DeepEP analog for one node: every rank of the tp_ep group publishes its tokens (or its
/// experts' outputs) in an MPI-3 shared-memory window, and every rank copies the rows it needs
/// straight to their final places, summing a token's rows while reading them. The same rows, in
/// the same order and summed in the same order as all_to_all. The group must lie on one node
/// (R054, checked at start-up).
struct shared_memory {
  using policy_kind = kind;
  static constexpr std::string_view name = "shared_memory";
  static constexpr dispatcher value = dispatcher::shared_memory;
};

/// shared_memory with its dispatches (forward: the tokens; backward: dy) in `Chunks` pieces of
/// local experts: while the experts of piece i compute, the thread waiting for them pulls piece
/// i+1's rows from the senders' segments, a slice each time it wakes (the pool's wait hook), and
/// the pool pulls what is left before piece i+1 computes. The combines stay whole: a token sums
/// rows from every rank's experts, in all_to_all's order, after they have all computed. The same
/// rows in the same places, so results equal shared_memory's bit for bit. A piece costs no
/// exchange (one fence serves them all), so there is no minimum piece size, and ETP may exceed 1;
/// at most one piece per local expert.
template <int Chunks>
  requires(Chunks >= 2)
struct shared_memory_overlap {
  using policy_kind = kind;
  static constexpr std::string_view name = "shared_memory_overlap";
  static constexpr dispatcher value = dispatcher::shared_memory;
  static constexpr int overlap_chunks = Chunks;
};

/// Two-level exchange: between nodes (ranks with the same local index), then inside the node, with
/// IntraNode doing the inside-node part: MPI's all-to-all, or a shared-memory window over the node
/// (HybridEP's shape). Needs EP > 1 (R013) and ETP = 1 (R032).
template <class IntraNode = all_to_all>
  requires std::same_as<IntraNode, all_to_all> || std::same_as<IntraNode, shared_memory>
struct hierarchical {
  using policy_kind = kind;
  using intra_node = IntraNode;
  static constexpr std::string_view name = "hierarchical";
  static constexpr dispatcher value = dispatcher::hierarchical;
};

/// Whether a dispatch policy's inside-node exchange goes through a shared window
/// (dispatch::hierarchical<shared_memory>).
template <class Policy>
constexpr bool intra_node_shared() {
  if constexpr (requires { typename Policy::intra_node; })
    return std::same_as<typename Policy::intra_node, shared_memory>;
  else
    return false;
}

/// Visible default: `local` when EP*ETP = 1, otherwise `all_to_all` (see `resolve`).
struct auto_ {
  using policy_kind = kind;
  static constexpr std::string_view name = "auto";
  static constexpr dispatcher value = dispatcher::auto_;
};

/// What `auto_` becomes for the given expert degrees; any other choice stays as it is.
constexpr dispatcher resolve(dispatcher chosen, int ep, int etp) {
  if (chosen != dispatcher::auto_) return chosen;
  return ep * etp == 1 ? dispatcher::local : dispatcher::all_to_all;
}

/// megamoe's own name of a dispatcher.
constexpr std::string_view name_of(dispatcher d) {
  switch (d) {
    case dispatcher::auto_: return "auto";
    case dispatcher::local: return "local";
    case dispatcher::all_gather: return "all_gather";
    case dispatcher::all_to_all: return "all_to_all";
    case dispatcher::hierarchical: return "hierarchical";
    case dispatcher::shared_memory: return "shared_memory";
  }
  return "?";
}

}  // namespace megamoe::dispatch
