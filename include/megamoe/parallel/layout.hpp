// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/layout.hpp — parallel folding: one world cut into the attention grid
// (TP x CP x DP x PP) and the expert grid (ETP x EP x EDP x PP), with the reference's group types.
// No MPI needed; parallel/process_groups.hpp turns a layout into communicators.
#pragma once

#include <megamoe/config/resolve.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/parallel/rank_generator.hpp>
#include <megamoe/parallel/tags.hpp>
#include <megamoe/policy/error.hpp>

#include <array>
#include <string>
#include <string_view>

namespace megamoe::parallel {

/// Group types of the attention (decoder) grid, in the reference's order.
inline constexpr std::array<std::string_view, 9> decoder_group_types{
    "tp", "cp", "dp", "dp-cp", "tp-cp", "tp-dp", "tp-dp-cp", "pp", "tp-pp"};

/// Group types of the expert grid, in the reference's order. In this grid "tp" is ETP, "dp" is EDP.
inline constexpr std::array<std::string_view, 6> expert_group_types{"tp", "ep",       "tp-ep",
                                                                    "dp", "tp-ep-pp", "pp"};

/// What an expert-grid group type is called in megamoe's names (and what it is for).
struct expert_group_role {
  std::string_view type;
  std::string_view degree;
  std::string_view purpose;
};
inline constexpr std::array<expert_group_role, 6> expert_group_roles{{
    {"tp", "ETP", "expert tensor parallel: shards of each local expert"},
    {"ep", "EP", "expert parallel: the all-to-all group"},
    {"tp-ep", "ETPxEP", "the dispatcher's tp_ep group"},
    {"dp", "EDP", "expert data parallel: expert gradient reduction"},
    {"tp-ep-pp", "ETPxEPxPP", "expert model parallel"},
    {"pp", "PP", "pipeline parallel (identical in both grids)"},
}};

/// A world size and every degree of both grids, checked.
struct layout {
  int world_size = 1;
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int etp = 1, ep = 1, edp = 1;

  /// Checks the degrees against the world size (R016, R027, R017, R018) and derives DP and EDP.
  /// Every rank computes the same answer from the same values, so on an error each rank throws the
  /// same `config_error` and none waits on another.
  static layout resolve(int world_size, degrees const& d) {
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

  /// The attention grid: ep = 1.
  [[nodiscard]] rank_generator decoder_grid() const { return {tp, cp, 1, dp, pp}; }
  /// The expert grid: ETP on the tp axis, EDP on the dp axis, cp = 1.
  [[nodiscard]] rank_generator expert_grid() const { return {etp, 1, ep, edp, pp}; }

  friend constexpr bool operator==(layout const&, layout const&) = default;

 private:
  static std::string describe(degrees const& d, int world_size) {
    return "world size " + std::to_string(world_size) + ", tp " + std::to_string(d.tp) + ", cp " +
           std::to_string(d.cp) + ", pp " + std::to_string(d.pp) + ", etp " +
           std::to_string(d.etp) + ", ep " + std::to_string(d.ep);
  }
};

/// `given` with the world size and every degree of the layout `l`: what a layer or model built on
/// a job's process groups completes its configuration with.
inline startup_values with_layout(startup_values given, layout const& l) {
  given.world_size = l.world_size;
  given.tp = l.tp;
  given.cp = l.cp;
  given.pp = l.pp;
  given.etp = l.etp;
  given.ep = l.ep;
  return given;
}

}  // namespace megamoe::parallel
