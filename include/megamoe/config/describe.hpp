// SPDX-License-Identifier: Apache-2.0
// megamoe/config/describe.hpp — every choice of a configuration, defaults included, as JSON and
// text.
//
// Fields use the reference's names where one exists (`moe_router_topk`,
// `moe_token_dispatcher_type`,
// ...), and megamoe's own otherwise (`expert_backend`). `defaults` lists every field left at its
// default. Static and start-up configurations go through the same function, `describe(values)`.
#pragma once

#include <megamoe/config/concepts.hpp>
#include <megamoe/config/values.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/parallel/tags.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace megamoe {

/// A configuration described: `json` (an object per slot, plus `defaults`), `flat` (every slot's
/// fields at the top level, as the reference's flat TransformerConfig has them, with the policies
/// under `policies` and `defaults`) and `text` (one `slot.field = value` line per field, defaults
/// marked).
struct config_description {
  nlohmann::ordered_json json;
  nlohmann::ordered_json flat;
  std::string text;
};

namespace detail {

MEGAMOE_DECL nlohmann::ordered_json size_or_dynamic(int value);

template <class T>
nlohmann::ordered_json optional_json(std::optional<T> const& value) {
  if (value) return *value;
  return nullptr;
}

MEGAMOE_DECL std::string_view score_name(router::score_function f);

MEGAMOE_DECL std::string_view reference_dispatcher_name(dispatch::dispatcher d);

MEGAMOE_DECL nlohmann::ordered_json shape_json(shape_sizes const& s);

MEGAMOE_DECL nlohmann::ordered_json router_json(std::string_view policy,
                                                std::optional<router::settings> const& maybe);

MEGAMOE_DECL nlohmann::ordered_json dispatch_json(std::string_view policy,
                                                  dispatch::dispatcher chosen, int overlap_chunks,
                                                  bool intra_node_shared, bool fp8_wire,
                                                  parallel::degrees const& d);

MEGAMOE_DECL nlohmann::ordered_json expert_json(std::string_view policy, expert::settings const& e);

MEGAMOE_DECL nlohmann::ordered_json precision_json(std::string_view policy,
                                                   precision::settings const& p);

MEGAMOE_DECL nlohmann::ordered_json parallel_json(std::string_view policy,
                                                  parallel::degrees const& d,
                                                  parallel::cp_comm_type cp_comm,
                                                  std::optional<int> world_size);

MEGAMOE_DECL nlohmann::ordered_json memory_json(std::string_view policy, memory::settings const& m);

MEGAMOE_DECL nlohmann::ordered_json model_json(std::string_view policy, model::settings const& m,
                                               int hidden);

MEGAMOE_DECL std::string value_text(nlohmann::ordered_json const& v);

}  // namespace detail

/// Describes configuration values; what is left to start-up says so.
MEGAMOE_DECL config_description describe(config_values const& v);

/// Describes a configuration type: `describe<my_config>().text`.
template <training_config C>
config_description describe() {
  return describe(values_of<C>());
}

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/config/describe.ipp>
#endif
