// SPDX-License-Identifier: Apache-2.0
// megamoe/core/stage_times.hpp — where an MoE layer's step spends its time, stage by stage.
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

/// Seconds per stage, summed over forward, recomputation and backward since the last clear().
struct stage_times {
  std::array<double, static_cast<std::size_t>(layer_stage::count)> seconds{};
  void clear() { seconds.fill(0.0); }
  [[nodiscard]] double operator[](layer_stage s) const {
    return seconds[static_cast<std::size_t>(s)];
  }
  /// Runs f() and adds its wall time to stage s (steady_clock: no allocation, no system call on
  /// Linux).
  template <class F>
  void time(layer_stage s, F&& f) {
    auto const start = std::chrono::steady_clock::now();
    f();
    seconds[static_cast<std::size_t>(s)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

}  // namespace megamoe
