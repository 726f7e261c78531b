// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/pipeline_schedule.hpp — the pipeline's stages and schedules.
//
// PP ranks each hold V model chunks (virtual stages): virtual stage j = v * PP + p is chunk v of
// pipeline rank p, so a micro-batch's activations visit ranks 0, 1, ..., PP - 1, 0, 1, ... (the
// reference's interleaving). The embedding belongs to virtual stage 0, the final norm and output
// layer to the last. A schedule is a type whose `ops` lists, for one rank, the forward and
// backward passes of one step in order; the send and receive around each pass follow from its
// virtual stage (forward: receive from the previous stage unless first, send to the next unless
// last; backward the other way). Every rank of a stage runs the same list, so the collectives
// inside a stage (TP, CP, EP, DP) are entered in the same order, and the sends each list implies
// are exactly the receives its neighbours' lists imply.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/policy/error.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe::parallel {

/// Which layers each virtual stage holds.
class pipeline_layout {
 public:
  pipeline_layout() = default;

  /// `layers` over PP x V virtual stages: evenly, or with the first and/or last virtual stage
  /// holding the given counts and the rest even over the others (the reference's
  /// decoder_first_pipeline_num_layers and decoder_last_pipeline_num_layers). R036 otherwise.
  static pipeline_layout split(int layers, int pp, int vpp, std::optional<int> first = {},
                               std::optional<int> last = {});

  /// The reference's --pipeline-model-parallel-layout: virtual stages separated by '|', holding
  /// 'E' (the embedding: opens virtual stage 0), 't' (a decoder layer) and 'L' (the loss with the
  /// output layer: closes the last virtual stage); "Xn" repeats: "t*3", "(tt|)*29"; commas and
  /// spaces are cosmetic. PP x V stages (V = stages / PP) holding the model's layers, else R036.
  static pipeline_layout parse(std::string_view text, int layers, int pp);

  /// The layout start-up asks for: the text layout if given (V must agree with a given V; no
  /// first or last counts beside it), else split().
  static pipeline_layout of(int layers, int pp, std::string_view text, std::optional<int> vpp,
                            std::optional<int> first, std::optional<int> last);

  [[nodiscard]] int pp() const noexcept { return pp_; }
  [[nodiscard]] int vpp() const noexcept { return vpp_; }
  [[nodiscard]] int stages() const noexcept { return pp_ * vpp_; }
  /// Virtual stage of chunk v on pipeline rank p.
  [[nodiscard]] int stage(int rank, int chunk) const noexcept { return chunk * pp_ + rank; }
  [[nodiscard]] int layers(int stage) const { return layers_.at(static_cast<std::size_t>(stage)); }
  [[nodiscard]] int first_layer(int stage) const;
  [[nodiscard]] bool operator==(pipeline_layout const&) const = default;

 private:
  int pp_ = 1, vpp_ = 1;
  std::vector<int> layers_{0};
};

/// One pass of a schedule on one rank.
struct pipeline_op {
  enum kind_type : std::uint8_t { forward, backward } kind = forward;
  int micro_batch = 0;
  int chunk = 0;
  bool merged = false;  // a forward that runs as one pass with the backward after it
  [[nodiscard]] bool operator==(pipeline_op const&) const = default;
};

/// One rank's place: PP ranks, this one's index, V chunks, M micro-batches per step.
struct pipeline_shape {
  int pp = 1, rank = 0, vpp = 1, micro_batches = 1;
};

/// R050: at least PP micro-batches, and a multiple of PP when interleaved (the interleaved order
/// walks groups of PP micro-batches through each chunk).
MEGAMOE_DECL void check_micro_batches(pipeline_shape const& s);

/// 1F1B (the reference's non-interleaved schedule): rank p runs PP - p - 1 warm-up forwards, then
/// alternates one forward and one backward, then runs the remaining backwards; at most PP - p
/// micro-batches are in flight on it. One chunk per rank.
struct one_f_one_b {
  static constexpr char const* name = "1f1b";
  [[nodiscard]] static std::vector<pipeline_op> ops(pipeline_shape const& s);
};

namespace detail {
/// Interleaved 1F1B's passes for rank s.rank with `extra` more warm-up forwards; `merge` marks each
/// steady-state forward as merged with the backward after it.
MEGAMOE_DECL std::vector<pipeline_op> interleaved_ops(pipeline_shape const& s, int extra,
                                                      bool merge);
}  // namespace detail

/// Interleaved 1F1B with V chunks per rank (the reference's interleaved schedule): the k-th
/// forward is chunk (k / PP) mod V of micro-batch (k / (PP V)) PP + k mod PP, the k-th backward
/// the same micro-batch in chunk V - 1 - (k / PP) mod V; rank p runs 2 (PP - p - 1) + (V - 1) PP
/// warm-up forwards (all of them when M = PP), then alternates, then drains. M must be a multiple
/// of PP (R050).
struct interleaved_one_f_one_b {
  static constexpr char const* name = "interleaved_1f1b";
  [[nodiscard]] static std::vector<pipeline_op> ops(pipeline_shape const& s);
};

/// The reference's merged forward-backward schedule (combined 1F1B, its
/// `overlap_moe_expert_parallel_comm`): interleaved 1F1B (1F1B on one stage) with one more warm-up
/// forward, each steady-state forward marked `merged` with the backward after it. A merged pair
/// runs as one pass, layer by layer alternating the forward of one micro-batch with the backward
/// of another, so each one's expert exchange could hide behind the other's compute; the extra
/// forward makes the two independent (a backward never waits on its partner's forward). With PP
/// above 1 it needs V above 1 (R051), as the reference does.
struct merged_one_f_one_b {
  static constexpr char const* name = "merged_1f1b";
  [[nodiscard]] static std::vector<pipeline_op> ops(pipeline_shape const& s);
};

/// Which of `ops`' backwards repeat their forward first: a chunk's modules keep what backward
/// needs for one micro-batch, the one of its last forward (the runner's recompute).
MEGAMOE_DECL void repeated_forwards(std::span<pipeline_op const> ops, int vpp,
                                    std::vector<char>& out);

/// What one rank did in a step, in order (the pipeline's trace, for tests and the watchdog).
struct pipeline_event {
  enum kind_type : std::uint8_t {
    forward,
    backward,
    recv_activation,
    send_activation,
    recv_gradient,
    send_gradient,
    merged  // a merged pass begins: its forward's (micro-batch, chunk), then its events
  } kind = forward;
  int micro_batch = 0;
  int chunk = 0;
  [[nodiscard]] bool operator==(pipeline_event const&) const = default;
};

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/pipeline_schedule.ipp>
#endif
