// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/groups.ipp — the definitions behind groups.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/dispatch/groups.hpp>

namespace megamoe::dispatch {

MEGAMOE_DECL expert_groups::expert_groups(parallel::process_groups const& groups, int num_experts)
    : tp_ep_(&groups.tp_ep()),
      ep_(&groups.ep()),
      etp_(&groups.expert_tp()),
      stage_(&groups.tp_dp_cp()),
      experts_(num_experts) {
  if (num_experts % ep_->size() != 0)
    throw config_error(
        rules::id::ep_divides_experts,
        std::to_string(num_experts) + " experts over EP " + std::to_string(ep_->size()));
}

}  // namespace megamoe::dispatch
