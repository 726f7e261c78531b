// SPDX-License-Identifier: Apache-2.0
// megamoe/router/output.hpp — what a route takes besides the logits and what it gives: the pass,
// the micro-batch's shape, the attached losses and the routing a dispatcher reads.
#pragma once

#include <megamoe/core/tensor.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace megamoe::router {

/// Which forward this is. `recompute` repeats a training forward (activation recomputation): same
/// results, but counts and running averages are not accumulated a second time. `eval` routes
/// without losses, bias counting, jitter or Sinkhorn.
enum class pass { training, recompute, eval };

/// The micro-batch: S positions of B sequences, T = S*B tokens in the order t = s*B + b.
struct batch_shape {
  int seq_length = 0;
  int micro_batch_size = 1;
};

/// Per-call inputs besides the logits.
struct route_options {
  pass mode = pass::training;
  /// [T] (1 = padding token), or empty. Padding tokens are routed but excluded from counts,
  /// losses and bias statistics.
  std::span<std::uint8_t const> padding_mask{};
  /// Makes input jitter reproducible: the noise is a function of (jitter seed, this key, element).
  /// A recompute must pass the key of the forward it repeats.
  std::uint64_t jitter_key = 0;
};

/// A loss attached to the router: `value` is coefficient-scaled (it enters the gradient),
/// `unscaled` is what is logged (value / coefficient).
struct attached_loss {
  double value = 0.0;
  double unscaled = 0.0;
};

struct loss_values {
  std::optional<attached_loss> aux_loss, seq_aux_loss, global_aux_loss, z_loss;
};

/// What a dispatcher needs from routing, as the reference gives it.
template <class L>
struct routing_output {
  row_matrix<L> probs;                          // [T,E] routing weights, 0 where not routed
  mask_matrix routing_map;                      // [T,E] selection, incl. prob-0 fillers
  std::vector<std::int64_t> tokens_per_expert;  // [E] = routing_map column sums
  row_matrix<L> topk_probs;                     // [T,k] dense view, before capacity dropping
  row_matrix<int> topk_indices;                 // [T,k] experts, by descending selection score
  int capacity = 0;                             // C, or 0 without capacity
  loss_values losses;
};

/// Which terms a backward includes (all by default); single terms give per-loss gradients.
struct gradient_terms {
  bool objective = true;  // the upstream gradient on the probs
  bool aux_loss = true, seq_aux_loss = true, global_aux_loss = true, z_loss = true;
};

/// The gradient scale a training schedule gives the attached losses: loss_scale * CP / number of
/// micro-batches (the reference's MoEAuxLossAutoScaler scale), or loss_scale alone with per-token
/// loss. Pass it as `backward_scale` to `topk_router::backward`.
constexpr double loss_backward_scale(double loss_scale, int cp, int num_microbatches,
                                     bool per_token_loss = false) {
  return per_token_loss ? loss_scale : loss_scale * cp / num_microbatches;
}

}  // namespace megamoe::router
