// SPDX-License-Identifier: Apache-2.0
// megamoe/router/megatron_config.hpp — a run-time router configured from Megatron-Core fields.
//
// `router::runtime` takes its settings at start-up; this reads them from the reference's field
// names (a reference-vector `config` object, a converted Megatron argument file) and checks them
// with the configuration rules, so a bad combination gets the same `megamoe[Rnnn]` id as it would
// at compile time. Unknown fields are refused rather than ignored.
//
//   auto router_config = megamoe::router::from_megatron(json_object);
//   megamoe::router::topk_router<float> router(router_config.settings, router_config.num_experts);
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/policy/error.hpp>
#include <megamoe/router/router.hpp>
#include <megamoe/router/tags.hpp>

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>

namespace megamoe::router {

/// A router read from Megatron fields: its settings and the sizes that came with them.
struct megatron_router_config {
  settings router;
  int num_experts = 0;
  int hidden_size = 0;
  std::optional<int> seq_length, micro_batch_size, num_tokens, num_microbatches, expert_capacity;
};

namespace detail {

MEGAMOE_DECL std::string field_error(std::string const& field, std::string const& what);

MEGAMOE_DECL std::optional<double> optional_number(nlohmann::json const& j, char const* field);

MEGAMOE_DECL std::optional<int> optional_int(nlohmann::json const& j, char const* field);

MEGAMOE_DECL std::optional<bool> optional_bool(nlohmann::json const& j, char const* field);

MEGAMOE_DECL std::optional<std::string> optional_string(nlohmann::json const& j, char const* field);

/// `moe_router_load_balancing_type` with `moe_aux_loss_coeff` (a list of types takes a list of
/// coefficients of the same length).
MEGAMOE_DECL void read_balancing(nlohmann::json const& j, settings& s);

}  // namespace detail

/// Reads a router from Megatron-Core field names and checks it (`config_error` with the rule id,
/// `input_error` for malformed or unknown fields).
MEGAMOE_DECL megatron_router_config from_megatron(nlohmann::json const& j);

}  // namespace megamoe::router

#if MEGAMOE_HEADER_ONLY
#include <megamoe/router/megatron_config.ipp>
#endif
