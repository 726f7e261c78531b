// SPDX-License-Identifier: Apache-2.0
// megamoe/core/parameter.hpp — what kind of parameter a weight is, which decides the group its
// gradient is reduced over.
#pragma once

namespace megamoe {

/// dense: replicated over the attention grid (TP x CP x DP); its gradient is summed over all of
/// it (TP ranks hold different sequence-parallel tokens) and scaled by 1/(DP*CP).
/// expert: an expert weight (or its ETP shard); summed over the expert data-parallel group and
/// scaled by 1/(DP*CP), as the reference does.
/// quantized_expert: an expert weight whose primary copy is a precision recipe's codes
/// (memory::quantized_weights); reduced as `expert`. Its value is the fp32 master while the layer
/// holds it (after initialize); once an optimizer took its shard of the master the layer keeps
/// only codes and the value is an empty map (0 rows).
enum class parameter_kind { dense, expert, quantized_expert };

}  // namespace megamoe
