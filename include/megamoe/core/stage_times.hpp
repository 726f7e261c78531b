// SPDX-License-Identifier: Apache-2.0
// megamoe/core/stage_times.hpp — where a training step spends its time: an MoE layer's stages, and
// the rest of the step around the MoE layers. The clock is read around each stage (steady_clock:
// no allocation, no system call on Linux), a few dozen times per layer and step, so the times are
// always kept; programs print them on request (megamoe-train --profile).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>

namespace megamoe {

/// The stages of an MoE layer, for the time spent in each.
enum class layer_stage : int {
  router,         // gating, routing, losses; their backward
  permute,        // planning and gathering rows; in backward, adding rows' gradients to tokens
  experts,        // the expert FFNs (GEMMs and activations), forward, recomputation and backward
  unpermute,      // adding expert rows to tokens; in backward, gathering the output gradient
  shared_expert,  // the shared expert and its gate
  count
};

/// The parts of a training step outside the MoE layers.
enum class step_stage : int {
  batches,                // drawing the micro-batches' tokens and targets
  embedding_output_loss,  // token embedding, output layer and cross-entropy, forward and backward
  attention,              // self-attention with RoPE, forward and backward
  norms_residuals,        // RMSNorms and residual additions, forward and backward
  dense_ffn,              // the dense layers' FFNs, forward and backward
  gradient_reduction,     // all-reduces of the gradients over their groups
  optimizer,              // gradient zeroing, clipping, AdamW and the parameters' all-gathers
  count
};

/// Seconds per stage, summed over forward, recomputation and backward since the last clear().
template <class Stage>
struct stage_times_of {
  std::array<double, static_cast<std::size_t>(Stage::count)> seconds{};
  void clear() { seconds.fill(0.0); }
  [[nodiscard]] double operator[](Stage s) const { return seconds[static_cast<std::size_t>(s)]; }
  [[nodiscard]] double total() const {
    double sum = 0.0;
    for (double s : seconds) sum += s;
    return sum;
  }
  /// Runs f() and adds its wall time to stage s; returns what f returns.
  template <class F>
  decltype(auto) time(Stage s, F&& f) {
    struct add_on_exit {
      double& to;
      std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
      ~add_on_exit() {
        to += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
    } const timer{seconds[static_cast<std::size_t>(s)]};
    return f();
  }
};

using stage_times = stage_times_of<layer_stage>;
using step_times = stage_times_of<step_stage>;

/// Names of the stages, as megamoe-train's profile prints them.
inline constexpr std::array<char const*, static_cast<std::size_t>(layer_stage::count)>
    layer_stage_names{"moe_router", "moe_permute", "moe_experts", "moe_unpermute",
                      "moe_shared_expert"};
inline constexpr std::array<char const*, static_cast<std::size_t>(step_stage::count)>
    step_stage_names{"batches",   "embedding_output_loss", "attention", "norms_residuals",
                     "dense_ffn", "gradient_reduction",    "optimizer"};

}  // namespace megamoe
