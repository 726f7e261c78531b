// SPDX-License-Identifier: Apache-2.0
// megamoe/core/parameter.hpp — what kind of parameter a weight is, which decides the group its
// gradient is reduced over.
#pragma once

namespace megamoe {

/// dense: replicated over the attention grid (TP x CP x DP); its gradient is summed over all of
/// it (TP ranks hold different sequence-parallel tokens) and scaled by 1/(DP*CP).
/// expert: an expert weight (or its ETP shard); summed over the expert data-parallel group and
/// scaled by 1/(DP*CP), as the reference does.
enum class parameter_kind { dense, expert };

}  // namespace megamoe
