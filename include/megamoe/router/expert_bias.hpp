// SPDX-License-Identifier: Apache-2.0
// megamoe/router/expert_bias.hpp — router state that lives across micro-batches: the aux-loss-free
// expert bias with its token counts, and the global-aux-loss accumulator, with the update at the
// end of a global batch.
#pragma once

#include <megamoe/router/groups.hpp>

#include <algorithm>
#include <vector>

namespace megamoe::router {

/// Router state that lives across micro-batches: the aux-loss-free expert bias with its counts, and
/// the global-aux-loss accumulator.
struct router_state {
  std::vector<float> expert_bias;                // [E] (empty without expert bias)
  std::vector<double> local_tokens_per_expert;   // [E] counts since the last global batch
  std::vector<double> global_tokens_per_expert;  // [E] sum of reduced counts (global aux loss)
  int global_aux_steps = 0;                      // micro-batches in that sum
  float bias_update_rate = 1e-3F;
  bool frozen_expert_bias = false;  // keep the bias fixed (fine-tuning)

  /// End of a global batch: sums the counts over TPxDPxCP, applies
  /// bias += rate * sign(mean(c) - c) (unless frozen), and resets counts and the global-aux
  /// accumulator. Collective over the group: every rank of it must call.
  template <count_group TpCp, count_group TpDpCp>
  void finish_global_batch(reduction_groups<TpCp, TpDpCp> const& groups) {
    if (!expert_bias.empty()) {
      auto& counts = local_tokens_per_expert;  // summed in place: reset below
      groups.tp_dp_cp.sum(counts);
      if (!frozen_expert_bias) {
        // The reference works in fp32: mean of the counts, sign of the offset, rate * sign.
        float total = 0.0F;
        for (double c : counts) total += static_cast<float>(c);
        float const mean = total / static_cast<float>(counts.size());
        for (std::size_t e = 0; e < counts.size(); ++e) {
          float const offset = mean - static_cast<float>(counts[e]);
          float const sign = offset > 0.0F ? 1.0F : (offset < 0.0F ? -1.0F : 0.0F);
          expert_bias[e] += sign * bias_update_rate;
        }
      }
      std::fill(local_tokens_per_expert.begin(), local_tokens_per_expert.end(), 0.0);
    }
    std::fill(global_tokens_per_expert.begin(), global_tokens_per_expert.end(), 0.0);
    global_aux_steps = 0;
  }
  /// Forgets the global batch's counts so far, the bias unchanged: its forwards run again (a
  /// recomputed step).
  void discard_global_batch() {
    std::fill(local_tokens_per_expert.begin(), local_tokens_per_expert.end(), 0.0);
    std::fill(global_tokens_per_expert.begin(), global_tokens_per_expert.end(), 0.0);
    global_aux_steps = 0;
  }
};

}  // namespace megamoe::router
