// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/layout.hpp — parallel folding: one world cut into the attention grid
// (TP x CP x DP x PP) and the expert grid (ETP x EP x EDP x PP), with the reference's group types.
// No MPI needed; parallel/process_groups.hpp turns a layout into communicators.
#pragma once

#include <megamoe/config/resolve.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/core/compiled_once.hpp>
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
  static layout resolve(int world_size, degrees const& d);

  /// The attention grid: ep = 1.
  [[nodiscard]] rank_generator decoder_grid() const { return {tp, cp, 1, dp, pp}; }
  /// The expert grid: ETP on the tp axis, EDP on the dp axis, cp = 1.
  [[nodiscard]] rank_generator expert_grid() const { return {etp, 1, ep, edp, pp}; }

  friend constexpr bool operator==(layout const&, layout const&) = default;

 private:
  static std::string describe(degrees const& d, int world_size);
};

/// `given` with the world size and every degree of the layout `l`: what a layer or model built on
/// a job's process groups completes its configuration with.
MEGAMOE_DECL startup_values with_layout(startup_values given, layout const& l);

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/layout.ipp>
#endif
