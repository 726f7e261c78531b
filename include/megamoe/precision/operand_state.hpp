// SPDX-License-Identifier: Apache-2.0
// megamoe/precision/operand_state.hpp — what a recipe's grouped operands keep across calls and
// steps: each expert's kept codes, fc1's output kept for backward, delayed scaling's states, the
// steps taken and stochastic rounding's numbering; their accessors and what a checkpoint saves.
#pragma once

#include <megamoe/core/random.hpp>
#include <megamoe/expert/tags.hpp>
#include <megamoe/precision/quantize.hpp>
#include <megamoe/precision/recipe.hpp>
#include <megamoe/precision/scaling.hpp>
#include <megamoe/precision/tags.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

namespace megamoe::precision {

/// The amax reduction of a rank alone (see grouped_operands).
struct no_amax_reduction {
  void operator()(std::span<float>) const noexcept {}
};

/// What grouped_operands (precision/operands.hpp, its only derived class) keeps for E grouped
/// experts: the codes of the copies its hooks keep ([linear][role][usage][expert]), fc1's output as
/// kept for backward (BF16 bits, or with `QuantizedActivations` codes), delayed scaling's state of
/// each tensor quantized per tensor, the training steps ended (end_of_step) and the seed and expert
/// numbering stochastic rounding draws from.
template <class Recipe, bool QuantizedActivations>
class grouped_operand_state {
 public:
  static constexpr settings recipe = Recipe::value;
  using role = operand_role;
  using usage = operand_usage;

  /// Whether forwards record their amaxes for delayed scaling (on by default): an evaluation's
  /// forward quantizes with the current scales and records nothing, so that evaluating does not
  /// change training.
  void record_amaxes(bool on) noexcept { recording_ = on; }

  /// Numbers the experts from `first` (the global number of local expert 0), so that stochastic
  /// rounding draws the same numbers for an expert on whichever rank holds it.
  void number_experts_from(int first) noexcept { first_expert_ = first; }

  /// End of a training step (after backward): delayed scaling derives the next scales from the
  /// recorded amaxes, after `replicas` (called with every recorded amax) took the largest over
  /// the ranks holding replicas of these experts, so that every replica keeps the same history,
  /// as one rank seeing all their tokens would; stochastic rounding moves to fresh random numbers.
  template <class ReplicaReduction = no_amax_reduction>
  void end_of_step(ReplicaReduction const& replicas = {}) {
    ++step_;
    if constexpr (recipe.recipe == recipe_id::fp8_delayed) {
      replica_amax_.clear();
      for (auto const& per_slot : delayed_)
        for (auto const& per_role : per_slot)
          for (auto const& state : per_role) replica_amax_.push_back(state.amax_history[0]);
      replicas(std::span<float>(replica_amax_));
      std::size_t at = 0;
      for (auto& per_slot : delayed_)
        for (auto& per_role : per_slot)
          for (auto& state : per_role) state.amax_history[0] = replica_amax_[at++];
      for (std::size_t l = 0; l < delayed_.size(); ++l)
        for (auto r : {role::input, role::weight, role::grad}) {
          float const fp8_max = max_of(format_of(recipe, r, usage::rowwise).element);
          for (auto& state : delayed_[static_cast<std::size_t>(l)][static_cast<std::size_t>(r)])
            state.update(fp8_max);
        }
    }
  }

  /// Start of a global batch that may run again (a recomputed step): keeps the state its passes
  /// change (the steps taken, delayed scaling's histories and scales) for discard_global_batch.
  /// Copies into buffers kept from the last call: nothing is allocated after the first.
  void begin_global_batch() {
    step_at_batch_ = step_;
    delayed_at_batch_ = delayed_;
    batch_kept_ = true;
  }
  /// The global batch runs again: back to the state begin_global_batch() kept, so that the second
  /// pass quantizes with the first's scales and stochastic rounding's draws.
  void discard_global_batch() {
    if (!batch_kept_)
      throw std::logic_error("grouped_operands: discard_global_batch without begin_global_batch");
    step_ = step_at_batch_;
    delayed_ = delayed_at_batch_;
  }

  // --- What was kept -----------------------------------------------------------------------------

  /// Keeps every copy's codes of the last step for codes_of(), the transient ones too (the
  /// gradients' and, where a separate wgrad copy is kept, the inputs' rowwise copies); off by
  /// default, when those live in one per-thread scratch shared by all layers.
  void keep_all_codes(bool on) noexcept { keep_all_ = on; }

  /// The codes and scales of expert e's `usage` copy of `r` in `layer` from the last call (the
  /// rowwise copy stands for both where the recipe's copies are the same). Transient copies are
  /// there only under keep_all_codes(true).
  [[nodiscard]] quantized_matrix const& codes_of(expert::linear layer, role r, usage u,
                                                 int e) const {
    auto const use = same_copies(recipe, r) ? usage::rowwise : u;
    return codes_[index(layer)][static_cast<std::size_t>(r)][static_cast<std::size_t>(use)]
                 [static_cast<std::size_t>(e)];
  }

  /// Whether every expert's rowwise copy of both layers' weights holds codes of that shape.
  [[nodiscard]] bool holds_weights(int fc1_rows, int hidden, int ffn) const {
    for (int e = 0; e < experts_; ++e) {
      auto const& a = codes_of(expert::linear::fc1, role::weight, usage::rowwise, e);
      auto const& b = codes_of(expert::linear::fc2, role::weight, usage::rowwise, e);
      if (a.rows != fc1_rows || a.cols != hidden || b.rows != hidden || b.cols != ffn) return false;
    }
    return true;
  }

  /// fc1's output as kept for backward: BF16 bits of the last forward's rows, or (with
  /// QuantizedActivations) expert e's codes in the rowwise input format.
  [[nodiscard]] std::span<std::uint16_t const> fc1_output_kept() const noexcept
      requires(!QuantizedActivations) {
    return fc1_bf16_;
  }
  [[nodiscard]] quantized_matrix const& fc1_output_codes(int e) const requires
      QuantizedActivations {
    return fc1_output_codes_[static_cast<std::size_t>(e)];
  }
  // --- State that lives across steps (checkpoints) ----------------------------------------------

  [[nodiscard]] int experts() const noexcept { return experts_; }
  /// Training steps ended (end_of_step calls): stochastic rounding's draws follow it.
  [[nodiscard]] std::uint64_t steps_taken() const noexcept { return step_; }
  void set_steps_taken(std::uint64_t steps) noexcept { step_ = steps; }
  /// Floats of one expert's persistent state: under delayed scaling every amax history and scale
  /// ([slot][role]: history, then scale), otherwise none.
  [[nodiscard]] int persistent_floats() const noexcept {
    std::size_t n = 0;
    if (experts_ == 0) return 0;
    if constexpr (recipe.recipe == recipe_id::fp8_delayed)
      for (auto const& per_slot : delayed_)
        for (auto const& per_role : per_slot) n += per_role.front().amax_history.size() + 1;
    return static_cast<int>(n);
  }
  /// Every local expert's persistent state, [experts, persistent_floats()] row-major.
  [[nodiscard]] std::vector<float> persistent_state() const {
    std::vector<float> out;
    out.reserve(static_cast<std::size_t>(experts_) * static_cast<std::size_t>(persistent_floats()));
    for (int e = 0; e < experts_; ++e)
      for (auto const& per_slot : delayed_)
        for (auto const& per_role : per_slot) {
          auto const& s = per_role[static_cast<std::size_t>(e)];
          out.insert(out.end(), s.amax_history.begin(), s.amax_history.end());
          out.push_back(s.scale);
        }
    return out;
  }
  /// Sets the state persistent_state() gave (a checkpoint load); `state` holds as many floats.
  void set_persistent_state(std::span<float const> state) {
    auto at = state.begin();
    for (int e = 0; e < experts_; ++e)
      for (auto& per_slot : delayed_)
        for (auto& per_role : per_slot) {
          auto& s = per_role[static_cast<std::size_t>(e)];
          std::copy_n(at, s.amax_history.size(), s.amax_history.begin());
          at += static_cast<std::ptrdiff_t>(s.amax_history.size());
          s.scale = *at++;
        }
  }

  /// The delayed-scaling state of expert e's `r` in `layer`.
  [[nodiscard]] delayed_scaling_state const& delayed_state(expert::linear layer, role r,
                                                           int e) const {
    return delayed_[index(layer)][static_cast<std::size_t>(r)][static_cast<std::size_t>(e)];
  }
  /// Bytes kept from forward to backward: the wgrad copies of both inputs and fc1's BF16 output.
  /// `rows` is the number of rows of the last forward.
  [[nodiscard]] std::size_t saved_bytes(std::int64_t rows, int fc1_cols) const {
    std::size_t bytes = 0;
    for (int l = 0; l < 2; ++l)
      for (int e = 0; e < experts_; ++e)
        bytes +=
            codes_of(static_cast<expert::linear>(l), role::input, usage::columnwise, e).bytes();
    if constexpr (QuantizedActivations) {
      for (auto const& q : fc1_output_codes_) bytes += q.bytes();
      return bytes;
    } else {
      return bytes + static_cast<std::size_t>(rows) * static_cast<std::size_t>(fc1_cols) *
                         sizeof(std::uint16_t);
    }
  }
  /// Bytes of the weights' quantized copies.
  [[nodiscard]] std::size_t weight_code_bytes() const {
    std::size_t bytes = 0;
    for (auto const& per_linear : codes_)
      for (auto const& q : per_linear[static_cast<std::size_t>(role::weight)][0])
        bytes += q.bytes();
    if constexpr (!same_copies(recipe, role::weight))
      for (auto const& per_linear : codes_)
        for (auto const& q : per_linear[static_cast<std::size_t>(role::weight)][1])
          bytes += q.bytes();
    return bytes;
  }

 protected:
  grouped_operand_state(int experts, std::uint64_t seed) : experts_(experts), seed_(seed) {
    for (auto& per_linear : codes_)
      for (auto& per_role : per_linear)
        for (auto& per_usage : per_role) per_usage.resize(static_cast<std::size_t>(experts));
    fc1_output_codes_.resize(static_cast<std::size_t>(experts));
    for (auto& per_linear : delayed_)
      for (auto& per_role : per_linear)
        per_role.assign(static_cast<std::size_t>(experts), delayed_scaling_state::of(recipe));
  }

  static std::size_t index(expert::linear l) { return static_cast<std::size_t>(l); }

  quantized_matrix& codes(std::size_t l, role r, usage u, int e) {
    return codes_[l][static_cast<std::size_t>(r)][static_cast<std::size_t>(u)]
                 [static_cast<std::size_t>(e)];
  }

  std::uint64_t seed_of(std::size_t l, int e, int copy) const {
    return splitmix64(
        seed_ ^
        splitmix64(step_ * 0x9e3779b97f4a7c15ULL + l * 4 + static_cast<std::uint64_t>(copy)) ^
        static_cast<std::uint64_t>(first_expert_ + e) * 0xd1b54a32d192ed03ULL);
  }

  int experts_;
  std::uint64_t seed_;
  std::uint64_t step_ = 0;
  bool keep_all_ = false;
  bool recording_ = true;
  int first_expert_ = 0;
  std::vector<float> replica_amax_;  // end_of_step: every recorded amax
  // [linear][role][usage][expert]
  std::array<std::array<std::array<std::vector<quantized_matrix>, 2>, 3>, 2> codes_;
  // [linear or fc1_output_slot][role][expert]
  static constexpr std::size_t fc1_output_slot = 2;
  std::array<std::array<std::vector<delayed_scaling_state>, 3>, 3> delayed_;
  // begin_global_batch: the state a recomputed step starts from again
  std::uint64_t step_at_batch_ = 0;
  bool batch_kept_ = false;
  std::array<std::array<std::vector<delayed_scaling_state>, 3>, 3> delayed_at_batch_;
  std::vector<quantized_matrix> fc1_output_codes_;  // [E], with QuantizedActivations
  std::vector<std::uint16_t> fc1_bf16_;
};

}  // namespace megamoe::precision
