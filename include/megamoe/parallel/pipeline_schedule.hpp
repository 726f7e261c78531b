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
                               std::optional<int> last = {}) {
    int const stages = pp * vpp;
    auto broken = [&](std::string const& why) {
      return config_error(rules::id::pipeline_stages_divide_layers,
                          std::to_string(layers) + " layers, PP " + std::to_string(pp) + " x V " +
                              std::to_string(vpp) + ": " + why);
    };
    if (pp < 1 || vpp < 1) throw broken("PP and V must be at least 1");
    if (vpp > 1 && pp == 1) throw broken("virtual stages need PP above 1");
    if ((first && *first < 0) || (last && *last < 0)) throw broken("negative stage layer count");
    if ((first || last) && stages == 1) throw broken("first / last stage counts need PP above 1");
    pipeline_layout out;
    out.pp_ = pp;
    out.vpp_ = vpp;
    out.layers_.assign(static_cast<std::size_t>(stages), 0);
    int rest = layers, others = stages;
    if (first) {
      out.layers_.front() = *first;
      rest -= *first;
      --others;
    }
    if (last) {
      out.layers_.back() = *last;
      rest -= *last;
      --others;
    }
    if (rest < 0) throw broken("the first and last stages take more layers than there are");
    if (others == 0 ? rest != 0 : rest % others != 0)
      throw broken(std::to_string(rest) + " layers do not split evenly over " +
                   std::to_string(others) + " stages");
    for (int j = first ? 1 : 0; j < stages - (last ? 1 : 0); ++j)
      out.layers_[static_cast<std::size_t>(j)] = rest / others;
    return out;
  }

  /// The reference's --pipeline-model-parallel-layout: virtual stages separated by '|', holding
  /// 'E' (the embedding: opens virtual stage 0), 't' (a decoder layer) and 'L' (the loss with the
  /// output layer: closes the last virtual stage); "Xn" repeats: "t*3", "(tt|)*29"; commas and
  /// spaces are cosmetic. PP x V stages (V = stages / PP) holding the model's layers, else R036.
  static pipeline_layout parse(std::string_view text, int layers, int pp) {
    auto broken = [&](std::string const& why) {
      return config_error(rules::id::pipeline_stages_divide_layers,
                          "--pipeline-model-parallel-layout \"" + std::string(text) + "\" (" +
                              std::to_string(layers) + " layers, PP " + std::to_string(pp) +
                              "): " + why);
    };
    std::size_t at = 0;
    // A sequence of items up to `close` (')' or the end), each repeated by a following "*n".
    auto sequence = [&](auto&& self, char close) -> std::string {
      std::string out;
      while (at < text.size() && text[at] != close) {
        char const c = text[at++];
        std::string item;
        if (c == ',' || c == ' ') continue;
        if (c == '(') {
          item = self(self, ')');
          if (at >= text.size()) throw broken("an unclosed '('");
          ++at;
        } else if (c == 'E' || c == 't' || c == 'L' || c == '|') {
          item = std::string(1, c);
        } else if (c == 'm') {
          throw broken("'m' (multi-token prediction) is not part of this model");
        } else {
          throw broken(std::string("unexpected '") + c + "'");
        }
        int times = 1;
        if (at < text.size() && text[at] == '*') {
          std::size_t digits = ++at;
          while (at < text.size() && text[at] >= '0' && text[at] <= '9') ++at;
          if (at == digits || at - digits > 6) throw broken("'*' needs a count");
          times = std::stoi(std::string(text.substr(digits, at - digits)));
        }
        for (int i = 0; i < times; ++i) out += item;
      }
      return out;
    };
    std::string const flat = sequence(sequence, '\0');
    if (at < text.size()) throw broken("an unmatched ')'");
    std::vector<std::string> stages(1);
    for (char c : flat) {
      if (c == '|')
        stages.emplace_back();
      else
        stages.back() += c;
    }
    int const count = static_cast<int>(stages.size());
    if (pp < 1 || count % pp != 0)
      throw broken(std::to_string(count) + " stages are not a multiple of PP");
    pipeline_layout out;
    out.pp_ = pp;
    out.vpp_ = count / pp;
    out.layers_.clear();
    int total = 0;
    for (int j = 0; j < count; ++j) {
      auto const& stage = stages[static_cast<std::size_t>(j)];
      auto const e = stage.find('E'), l = stage.find('L');
      if ((j == 0) != (e == 0) ||
          stage.find('E', e == std::string::npos ? 0 : e + 1) != std::string::npos)
        throw broken("'E' must open the first stage, once");
      if ((j == count - 1) != (l != std::string::npos && l + 1 == stage.size()) ||
          stage.find('L') != stage.rfind('L'))
        throw broken("'L' must close the last stage, once");
      int const t = static_cast<int>(std::count(stage.begin(), stage.end(), 't'));
      out.layers_.push_back(t);
      total += t;
    }
    if (total != layers)
      throw broken("the stages hold " + std::to_string(total) + " layers, the model has " +
                   std::to_string(layers));
    return out;
  }

  /// The layout start-up asks for: the text layout if given (V must agree with a given V; no
  /// first or last counts beside it), else split().
  static pipeline_layout of(int layers, int pp, std::string_view text, std::optional<int> vpp,
                            std::optional<int> first, std::optional<int> last) {
    if (text.empty()) return split(layers, pp, vpp.value_or(1), first, last);
    if (first || last)
      throw config_error(rules::id::pipeline_stages_divide_layers,
                         "--pipeline-model-parallel-layout goes without the first and last "
                         "stages' layer counts");
    auto out = parse(text, layers, pp);
    if (vpp && *vpp != out.vpp())
      throw config_error(rules::id::pipeline_stages_divide_layers,
                         "V " + std::to_string(*vpp) + " but the layout has " +
                             std::to_string(out.vpp()) + " stages per pipeline rank");
    return out;
  }

  [[nodiscard]] int pp() const noexcept { return pp_; }
  [[nodiscard]] int vpp() const noexcept { return vpp_; }
  [[nodiscard]] int stages() const noexcept { return pp_ * vpp_; }
  /// Virtual stage of chunk v on pipeline rank p.
  [[nodiscard]] int stage(int rank, int chunk) const noexcept { return chunk * pp_ + rank; }
  [[nodiscard]] int layers(int stage) const { return layers_.at(static_cast<std::size_t>(stage)); }
  [[nodiscard]] int first_layer(int stage) const {
    int first = 0;
    for (int j = 0; j < stage; ++j) first += layers_[static_cast<std::size_t>(j)];
    return first;
  }
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
inline void check_micro_batches(pipeline_shape const& s) {
  if (s.pp == 1) return;
  if (s.micro_batches < s.pp || (s.vpp > 1 && s.micro_batches % s.pp != 0))
    throw config_error(rules::id::pipeline_micro_batches,
                       std::to_string(s.micro_batches) + " micro-batches per step, PP " +
                           std::to_string(s.pp) + ", V " + std::to_string(s.vpp));
}

/// 1F1B (the reference's non-interleaved schedule): rank p runs PP - p - 1 warm-up forwards, then
/// alternates one forward and one backward, then runs the remaining backwards; at most PP - p
/// micro-batches are in flight on it. One chunk per rank.
struct one_f_one_b {
  static constexpr char const* name = "1f1b";
  [[nodiscard]] static std::vector<pipeline_op> ops(pipeline_shape const& s) {
    int const M = s.micro_batches, warmup = std::min(s.pp - s.rank - 1, M);
    std::vector<pipeline_op> out;
    out.reserve(2 * static_cast<std::size_t>(M));
    int f = 0, b = 0;
    for (; f < warmup; ++f) out.push_back({pipeline_op::forward, f, 0});
    while (f < M) {
      out.push_back({pipeline_op::forward, f++, 0});
      out.push_back({pipeline_op::backward, b++, 0});
    }
    while (b < M) out.push_back({pipeline_op::backward, b++, 0});
    return out;
  }
};

namespace detail {
/// Interleaved 1F1B's passes for rank s.rank with `extra` more warm-up forwards; `merge` marks each
/// steady-state forward as merged with the backward after it.
inline std::vector<pipeline_op> interleaved_ops(pipeline_shape const& s, int extra, bool merge) {
  int const P = s.pp, V = s.vpp, total = s.micro_batches * V;
  auto micro_batch = [&](int k) { return (k / (P * V)) * P + k % P; };
  auto chunk = [&](int k) { return (k / P) % V; };
  int const warmup =
      s.micro_batches == P ? total : std::min(2 * (P - s.rank - 1) + (V - 1) * P + extra, total);
  std::vector<pipeline_op> out;
  out.reserve(2 * static_cast<std::size_t>(total));
  int f = 0, b = 0;
  auto forward = [&](bool merged) {
    out.push_back({pipeline_op::forward, micro_batch(f), chunk(f), merged});
    ++f;
  };
  auto backward = [&] {
    out.push_back({pipeline_op::backward, micro_batch(b), V - 1 - chunk(b)});
    ++b;
  };
  while (f < warmup) forward(false);
  while (f < total) {
    forward(merge);
    backward();
  }
  while (b < total) backward();
  return out;
}
}  // namespace detail

/// Interleaved 1F1B with V chunks per rank (the reference's interleaved schedule): the k-th
/// forward is chunk (k / PP) mod V of micro-batch (k / (PP V)) PP + k mod PP, the k-th backward
/// the same micro-batch in chunk V - 1 - (k / PP) mod V; rank p runs 2 (PP - p - 1) + (V - 1) PP
/// warm-up forwards (all of them when M = PP), then alternates, then drains. M must be a multiple
/// of PP (R050).
struct interleaved_one_f_one_b {
  static constexpr char const* name = "interleaved_1f1b";
  [[nodiscard]] static std::vector<pipeline_op> ops(pipeline_shape const& s) {
    return detail::interleaved_ops(s, 0, false);
  }
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
  [[nodiscard]] static std::vector<pipeline_op> ops(pipeline_shape const& s) {
    if (s.pp > 1 && s.vpp == 1)
      throw config_error(rules::id::merged_schedule_needs_interleaving,
                         "PP " + std::to_string(s.pp) + ", V 1");
    return detail::interleaved_ops(s, 1, true);
  }
};

/// Which of `ops`' backwards repeat their forward first: a chunk's modules keep what backward
/// needs for one micro-batch, the one of its last forward (the runner's recompute).
inline void repeated_forwards(std::span<pipeline_op const> ops, int vpp, std::vector<char>& out) {
  std::vector<int> last(static_cast<std::size_t>(vpp), -1);
  out.assign(ops.size(), 0);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    int& held = last[static_cast<std::size_t>(ops[i].chunk)];
    if (ops[i].kind == pipeline_op::backward && held != ops[i].micro_batch) out[i] = 1;
    held = ops[i].micro_batch;
  }
}

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
