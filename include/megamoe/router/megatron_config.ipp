// SPDX-License-Identifier: Apache-2.0
// megamoe/router/megatron_config.ipp — the definitions behind megatron_config.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/router/megatron_config.hpp>

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

namespace megamoe::router::detail {

MEGAMOE_DECL std::string field_error(std::string const& field, std::string const& what) {
  return "router config field '" + field + "' " + what;
}

MEGAMOE_DECL std::optional<double> optional_number(nlohmann::json const& j, char const* field) {
  if (!j.contains(field) || j.at(field).is_null()) return std::nullopt;
  if (!j.at(field).is_number()) throw input_error(field_error(field, "must be a number or null"));
  return j.at(field).get<double>();
}

MEGAMOE_DECL std::optional<int> optional_int(nlohmann::json const& j, char const* field) {
  if (!j.contains(field) || j.at(field).is_null()) return std::nullopt;
  if (!j.at(field).is_number_integer())
    throw input_error(field_error(field, "must be an integer or null"));
  return j.at(field).get<int>();
}

MEGAMOE_DECL std::optional<bool> optional_bool(nlohmann::json const& j, char const* field) {
  if (!j.contains(field) || j.at(field).is_null()) return std::nullopt;
  if (!j.at(field).is_boolean()) throw input_error(field_error(field, "must be true or false"));
  return j.at(field).get<bool>();
}

MEGAMOE_DECL std::optional<std::string> optional_string(nlohmann::json const& j,
                                                        char const* field) {
  if (!j.contains(field) || j.at(field).is_null()) return std::nullopt;
  if (!j.at(field).is_string()) throw input_error(field_error(field, "must be a string or null"));
  return j.at(field).get<std::string>();
}

MEGAMOE_DECL void read_balancing(nlohmann::json const& j, settings& s) {
  nlohmann::json types = j.value("moe_router_load_balancing_type", nlohmann::json("aux_loss"));
  nlohmann::json coeffs = j.contains("moe_aux_loss_coeff") && !j.at("moe_aux_loss_coeff").is_null()
                              ? j.at("moe_aux_loss_coeff")
                              : nlohmann::json(0.0);
  std::vector<std::string> type_list;
  std::vector<double> coeff_list;
  if (types.is_string()) {
    if (!coeffs.is_number())
      throw input_error(field_error("moe_aux_loss_coeff",
                                    "must be one number when moe_router_load_balancing_type is "
                                    "one string"));
    type_list.push_back(types.get<std::string>());
    coeff_list.push_back(coeffs.get<double>());
  } else if (types.is_array()) {
    if (!coeffs.is_array() || coeffs.size() != types.size())
      throw input_error(field_error("moe_aux_loss_coeff",
                                    "must be a list as long as moe_router_load_balancing_type"));
    for (std::size_t i = 0; i < types.size(); ++i) {
      if (!types[i].is_string() || !coeffs[i].is_number())
        throw input_error(field_error("moe_router_load_balancing_type",
                                      "lists must hold strings with numeric coefficients"));
      type_list.push_back(types[i].get<std::string>());
      coeff_list.push_back(coeffs[i].get<double>());
    }
  } else {
    throw input_error(
        field_error("moe_router_load_balancing_type", "must be a string or a list of strings"));
  }
  std::set<std::string> seen;
  for (std::size_t i = 0; i < type_list.size(); ++i) {
    std::string const& type = type_list[i];
    double const coeff = coeff_list[i];
    if (!seen.insert(type).second)
      throw input_error(
          field_error("moe_router_load_balancing_type", "names '" + type + "' twice"));
    if (type == "aux_loss") {
      s.aux_loss_coeff = coeff;
    } else if (type == "seq_aux_loss") {
      s.seq_aux_loss_coeff = coeff;
    } else if (type == "global_aux_loss") {
      s.global_aux_loss_coeff = coeff;
    } else if (type == "sinkhorn" && type_list.size() == 1) {
      if (coeff != 0.0)
        throw config_error(rules::id::sinkhorn_without_aux_losses,
                           "moe_aux_loss_coeff is " + std::to_string(coeff));
      s.sinkhorn = true;
    } else if (type == "none" && type_list.size() == 1) {
      // no balancing loss
    } else if (type == "quantile_balancing") {
      throw input_error(field_error("moe_router_load_balancing_type",
                                    "'quantile_balancing' is not supported by megamoe"));
    } else {
      throw input_error(field_error("moe_router_load_balancing_type",
                                    "has '" + type +
                                        "'; expected aux_loss, seq_aux_loss, global_aux_loss, "
                                        "sinkhorn or none (only the aux types may form a list)"));
    }
  }
}
}  // namespace megamoe::router::detail

namespace megamoe::router {

MEGAMOE_DECL megatron_router_config from_megatron(nlohmann::json const& j) {
  if (!j.is_object()) throw input_error("router config must be a JSON object");
  static std::set<std::string> const known{"num_moe_experts",
                                           "hidden_size",
                                           "moe_router_topk",
                                           "moe_router_load_balancing_type",
                                           "moe_aux_loss_coeff",
                                           "moe_z_loss_coeff",
                                           "moe_router_score_function",
                                           "moe_router_pre_softmax",
                                           "moe_router_num_groups",
                                           "moe_router_group_topk",
                                           "moe_router_topk_limited_devices",
                                           "moe_router_topk_scaling_factor",
                                           "moe_router_enable_expert_bias",
                                           "moe_router_bias_update_rate",
                                           "moe_router_dtype",
                                           "moe_expert_capacity_factor",
                                           "moe_token_drop_policy",
                                           "moe_pad_expert_input_to_capacity",
                                           "moe_router_padding_for_quantization",
                                           "moe_router_padding_for_fp8",
                                           "moe_input_jitter_eps",
                                           "expert_model_parallel_size",
                                           "seq_length",
                                           "micro_batch_size",
                                           "num_tokens",
                                           "num_microbatches",
                                           "expert_capacity"};
  for (auto const& [key, value] : j.items())
    if (!known.count(key)) throw input_error("router config field '" + key + "' is not known");

  megatron_router_config c;
  auto experts = detail::optional_int(j, "num_moe_experts");
  if (!experts) throw input_error("router config needs num_moe_experts");
  c.num_experts = *experts;
  c.hidden_size = detail::optional_int(j, "hidden_size").value_or(0);
  settings& s = c.router;
  s.top_k = detail::optional_int(j, "moe_router_topk").value_or(2);
  detail::read_balancing(j, s);
  s.z_loss_coeff = detail::optional_number(j, "moe_z_loss_coeff");

  std::string const score =
      detail::optional_string(j, "moe_router_score_function").value_or("softmax");
  bool const pre = detail::optional_bool(j, "moe_router_pre_softmax").value_or(false);
  if (score == "softmax") {
    s.score = pre ? score_function::softmax_before_topk : score_function::softmax_after_topk;
  } else if (score == "sigmoid") {
    s.score = score_function::sigmoid;
  } else if (score == "sqrtsoftplus") {
    s.score = score_function::sqrtsoftplus;
  } else {
    throw input_error(
        detail::field_error("moe_router_score_function", "is '" + score +
                                                             "'; expected softmax, sigmoid or "
                                                             "sqrtsoftplus"));
  }

  auto groups = detail::optional_int(j, "moe_router_num_groups");
  auto group_top_k = detail::optional_int(j, "moe_router_group_topk");
  if (auto devices = detail::optional_int(j, "moe_router_topk_limited_devices")) {
    // Deprecated form: groups = EP, group_top_k = devices.
    groups = detail::optional_int(j, "expert_model_parallel_size").value_or(1);
    group_top_k = devices;
  }
  if (groups || group_top_k) {
    s.num_groups = groups.value_or(-1);
    s.group_top_k = group_top_k.value_or(-1);
  }
  auto scaling = detail::optional_number(j, "moe_router_topk_scaling_factor");
  if (scaling && *scaling != 0.0) s.topk_scaling_factor = scaling;  // applied when truthy

  s.expert_bias = detail::optional_bool(j, "moe_router_enable_expert_bias").value_or(false);
  s.bias_update_rate = detail::optional_number(j, "moe_router_bias_update_rate").value_or(1e-3);

  std::string const dtype = detail::optional_string(j, "moe_router_dtype").value_or("fp32");
  if (dtype == "fp32") {
    s.dtype = logits_dtype::fp32;
  } else if (dtype == "fp64") {
    s.dtype = logits_dtype::fp64;
  } else {
    throw input_error(
        detail::field_error("moe_router_dtype", "is '" + dtype + "'; expected fp32 or fp64"));
  }

  auto factor = detail::optional_number(j, "moe_expert_capacity_factor");
  if (factor && *factor >= 0.0) s.capacity_factor = factor;  // negative means none
  std::string const drop = detail::optional_string(j, "moe_token_drop_policy").value_or("probs");
  if (drop == "probs") {
    s.token_drop_policy = drop_policy::probs;
  } else if (drop == "position") {
    s.token_drop_policy = drop_policy::position;
  } else {
    throw input_error(detail::field_error("moe_token_drop_policy",
                                          "is '" + drop + "'; expected probs or position"));
  }
  s.pad_to_capacity = detail::optional_bool(j, "moe_pad_expert_input_to_capacity").value_or(false);
  bool const pad_quant =
      detail::optional_bool(j, "moe_router_padding_for_quantization").value_or(false) ||
      detail::optional_bool(j, "moe_router_padding_for_fp8").value_or(false);
  s.pad_for_quantization = pad_quant;
  s.input_jitter_eps = detail::optional_number(j, "moe_input_jitter_eps");

  c.seq_length = detail::optional_int(j, "seq_length");
  c.micro_batch_size = detail::optional_int(j, "micro_batch_size");
  c.num_tokens = detail::optional_int(j, "num_tokens");
  c.num_microbatches = detail::optional_int(j, "num_microbatches");
  c.expert_capacity = detail::optional_int(j, "expert_capacity");

  require_valid_router(s, c.num_experts);
  if (c.seq_length && c.micro_batch_size && c.num_tokens &&
      *c.seq_length * *c.micro_batch_size != *c.num_tokens)
    throw input_error("router config: num_tokens " + std::to_string(*c.num_tokens) +
                      " is not seq_length * micro_batch_size");
  if (c.expert_capacity && c.num_tokens) {
    if (!s.capacity_factor)
      throw input_error("router config: expert_capacity is given but no capacity factor");
    int const expected = expert_capacity(*c.num_tokens, s.top_k, c.num_experts, *s.capacity_factor);
    if (expected != *c.expert_capacity)
      throw input_error("router config: expert_capacity " + std::to_string(*c.expert_capacity) +
                        " differs from ceil(T*k/E*factor) = " + std::to_string(expected));
  }
  return c;
}

}  // namespace megamoe::router
