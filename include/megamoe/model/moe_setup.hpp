// SPDX-License-Identifier: Apache-2.0
// megamoe/model/moe_setup.hpp — an MoE layer's start-up: its configuration completed with what
// start-up supplies and the layout's degrees, every rule checked (agreed on every rank of the
// stage on a job), and the sizes of this rank's experts.
#pragma once

#include <megamoe/config/resolve.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/dispatch/groups.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/mlp.hpp>
#include <megamoe/model/moe_types.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/policy/error.hpp>

#include <algorithm>
#include <string>

namespace megamoe {

template <training_config Config>
struct moe_setup {
  using types = moe_types<Config>;

  /// The configuration completed and checked; on a job every rank of the stage checks, and a
  /// broken rule is the same agreed error on all.
  static config_values values(parallel::process_groups const* groups, startup_values const& given) {
    if (groups == nullptr) return checked(nullptr, given);
    config_values v;
    parallel::check_on_every_rank(groups->tp_dp_cp(), [&] { v = checked(groups, given); });
    return v;
  }

  /// This rank's experts: E/EP of them, each 1/ETP of the FFN width.
  static expert::mlp_sizes routed_sizes(config_values const& v) {
    return {v.shape.experts / v.parallel.ep, v.shape.hidden, v.shape.ffn / v.parallel.etp,
            types::activation, types::expert_settings.bias};
  }
  /// The shared expert (without one these sizes are a placeholder that is never run).
  static expert::mlp_sizes shared_sizes(config_values const& v) {
    return {1, v.shape.hidden, std::max(1, v.shape.shared_ffn), types::activation, false};
  }

  /// The layer's dispatcher over the job's expert groups (one rank: dispatch::local).
  static typename types::dispatcher_type dispatcher(parallel::process_groups const* groups,
                                                    config_values const& v) {
    using dispatcher_type = typename types::dispatcher_type;
    if constexpr (types::overlap_pieces > 1 &&
                  Config::dispatch::value == dispatch::dispatcher::shared_memory) {
      return dispatcher_type(dispatch::expert_groups(*groups, v.shape.experts), v.shape.hidden,
                             types::overlap_pieces);
    } else if constexpr (types::overlap_pieces > 1) {
      return dispatcher_type(
          dispatch::expert_groups(*groups, v.shape.experts), v.shape.hidden, types::overlap_pieces,
          std::size_t{1024} * dispatch::overlap_min_piece_kib_of<typename Config::dispatch>());
    } else if constexpr (types::distributed) {
      return dispatcher_type(dispatch::expert_groups(*groups, v.shape.experts), v.shape.hidden);
    } else {
      return dispatcher_type(v.shape.hidden);
    }
  }

  /// The router's settings: the fp64 recipe runs the router in double too.
  static router::settings router_settings(config_values const& v) {
    router::settings s = *v.router;
    if constexpr (std::is_same_v<typename types::logit, double>) {
      s.dtype = router::logits_dtype::fp64;
    } else if (s.dtype == router::logits_dtype::fp64) {
      throw input_error(
          "moe_layer: a run-time router with router dtype fp64 needs precision::fp64 or a static "
          "router policy with router_dtype<fp64>");
    }
    return s;
  }

 private:
  static config_values checked(parallel::process_groups const* groups, startup_values given) {
    if (groups != nullptr) given = parallel::with_layout(given, groups->layout());
    config_values v = resolve<Config>(given);
    if (!v.router)
      throw config_error(rules::id::values_resolved,
                         "moe_layer: give the run-time router's settings");
    constexpr auto backend = types::expert_settings.backend;
    if (auto const why = expert::unavailable_reason(backend); !why.empty())
      throw input_error("moe_layer: expert::" + std::string(expert::name_of(backend)) +
                        " cannot run here: " + why);
    if (types::dispatcher_kind == dispatch::dispatcher::local &&
        (v.parallel.ep != 1 || v.parallel.etp != 1))
      throw config_error(rules::id::local_dispatch_needs_one_expert_rank,
                         "moe_layer with dispatch::local runs its experts on one rank: EP and "
                         "ETP must be 1 (EP " +
                             std::to_string(v.parallel.ep) + ", ETP " +
                             std::to_string(v.parallel.etp) + ")");
    return v;
  }
};

}  // namespace megamoe
