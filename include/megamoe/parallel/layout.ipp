// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/layout.ipp — the definitions behind layout.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/layout.hpp>

namespace megamoe::parallel {

MEGAMOE_DECL layout layout::resolve(int world_size, degrees const& d) {
  if (!rules::degrees_positive(d))
    throw config_error(rules::id::degrees_positive, describe(d, world_size));
  if (!rules::degrees_resolved(d))
    throw config_error(rules::id::values_resolved, describe(d, world_size));
  if (!rules::world_fits_attention_grid(d, world_size))
    throw config_error(rules::id::world_fits_attention_grid,
                       "world size " + std::to_string(world_size) +
                           ", tp*cp*pp = " + std::to_string(d.tp * d.cp * d.pp));
  if (!rules::world_fits_expert_grid(d, world_size))
    throw config_error(rules::id::world_fits_expert_grid,
                       "world size " + std::to_string(world_size) +
                           ", etp*ep*pp = " + std::to_string(d.etp * d.ep * d.pp));
  layout l;
  l.world_size = world_size;
  l.tp = d.tp;
  l.cp = d.cp;
  l.pp = d.pp;
  l.dp = world_size / (d.tp * d.cp * d.pp);
  l.etp = d.etp;
  l.ep = d.ep;
  l.edp = world_size / (d.etp * d.ep * d.pp);
  return l;
}

MEGAMOE_DECL std::string layout::describe(degrees const& d, int world_size) {
  return "world size " + std::to_string(world_size) + ", tp " + std::to_string(d.tp) + ", cp " +
         std::to_string(d.cp) + ", pp " + std::to_string(d.pp) + ", etp " + std::to_string(d.etp) +
         ", ep " + std::to_string(d.ep);
}

MEGAMOE_DECL startup_values with_layout(startup_values given, layout const& l) {
  given.world_size = l.world_size;
  given.tp = l.tp;
  given.cp = l.cp;
  given.pp = l.pp;
  given.etp = l.etp;
  given.ep = l.ep;
  return given;
}

}  // namespace megamoe::parallel
