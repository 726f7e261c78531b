// SPDX-License-Identifier: Apache-2.0
// megamoe/model/model_values.ipp — the definitions behind model_values.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/model/model_values.hpp>

namespace megamoe {

MEGAMOE_DECL startup_values startup_on_one_rank(startup_values given) {
  given.world_size = 1;
  for (auto* d : {&given.tp, &given.cp, &given.pp, &given.etp, &given.ep})
    if (!*d) *d = 1;
  return given;
}

MEGAMOE_DECL startup_values startup_on_job(parallel::process_groups const& groups,
                                           startup_values const& given) {
  return parallel::with_layout(given, groups.layout());
}

MEGAMOE_DECL void check_sequence_cut(config_values const& v, int seq) {
  int const cp = v.parallel.cp, tp = v.parallel.tp;
  if (cp > 1 && seq % (2 * cp) != 0)
    throw config_error(rules::id::context_chunks_divide_sequence,
                       "sequence length " + std::to_string(seq) + ", CP " + std::to_string(cp));
  if (tp > 1 && (seq / cp) % tp != 0)
    throw config_error(rules::id::tp_divides_sequence_shard,
                       "sequence length " + std::to_string(seq) + ", CP " + std::to_string(cp) +
                           ", TP " + std::to_string(tp));
}

MEGAMOE_DECL parallel::pipeline_layout model_pipeline(config_values const& v,
                                                      startup_values const& given) {
  return parallel::pipeline_layout::of(v.model.layers, v.parallel.pp, given.pipeline_layout,
                                       given.vpp, given.first_stage_layers,
                                       given.last_stage_layers);
}

}  // namespace megamoe
