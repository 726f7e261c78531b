// SPDX-License-Identifier: Apache-2.0
// megamoe/memory/saved.hpp — which of an MoE layer's buffers are kept from forward to backward
// under a memory policy; the others are scratch and recomputed in backward (or not needed).
#pragma once

#include <megamoe/memory/tags.hpp>

namespace megamoe::memory {

/// The buffers an MoE layer's forward fills and its backward may read.
enum class layer_buffer {
  row_probs,          // [N] probs of the permuted rows
  expert_rows,        // [N,H] the experts' input rows
  fc1_output,         // [N,W1]
  activation,         // [N,F] activation times prob
  shared_fc1_output,  // [T,W1s]
  shared_activation,  // [T,Fs]
  shared_output,      // [T,H] before the gate
};

/// True when the layer keeps `b` between forward and backward under `m`. Under a precision recipe
/// (`quantized_operands`) the experts' GEMM inputs and fc1 outputs are kept by the recipe's
/// operands, as codes, so their fp32 values are not; the shared expert's output is needed only
/// by its gate's backward.
constexpr bool keeps(settings const& m, bool quantized_operands, bool shared_gate, layer_buffer b) {
  bool const whole_layer = m.moe_layer;
  switch (b) {
    case layer_buffer::row_probs: return !whole_layer;
    case layer_buffer::expert_rows:
    case layer_buffer::fc1_output: return !whole_layer && !quantized_operands;
    case layer_buffer::activation: return !whole_layer && !m.moe_act && !quantized_operands;
    case layer_buffer::shared_fc1_output:
    case layer_buffer::shared_activation:
      return !whole_layer && !m.shared_experts && !quantized_operands;
    case layer_buffer::shared_output: return !whole_layer && !m.shared_experts && shared_gate;
  }
  return false;
}

}  // namespace megamoe::memory
