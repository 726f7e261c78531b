// SPDX-License-Identifier: Apache-2.0
// megamoe/config/describe.ipp — the definitions behind describe.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/config/describe.hpp>

namespace megamoe::detail {

MEGAMOE_DECL nlohmann::ordered_json size_or_dynamic(int value) {
  if (value == dynamic) return "dynamic";
  return value;
}

MEGAMOE_DECL std::string_view score_name(router::score_function f) {
  switch (f) {
    case router::score_function::softmax_after_topk:
    case router::score_function::softmax_before_topk: return "softmax";
    case router::score_function::sigmoid: return "sigmoid";
    case router::score_function::sqrtsoftplus: return "sqrtsoftplus";
  }
  return "?";
}

MEGAMOE_DECL std::string_view reference_dispatcher_name(dispatch::dispatcher d) {
  switch (d) {
    case dispatch::dispatcher::all_gather: return "allgather";
    case dispatch::dispatcher::all_to_all: return "alltoall";
    default: return dispatch::name_of(d);
  }
}

MEGAMOE_DECL nlohmann::ordered_json shape_json(shape_sizes const& s) {
  nlohmann::ordered_json j;
  j["policy"] = "shape";
  j["hidden_size"] = size_or_dynamic(s.hidden);
  j["moe_ffn_hidden_size"] = size_or_dynamic(s.ffn);
  j["num_moe_experts"] = size_or_dynamic(s.experts);
  j["moe_shared_expert_intermediate_size"] =
      s.shared_ffn == 0 ? nlohmann::ordered_json(nullptr) : size_or_dynamic(s.shared_ffn);
  return j;
}

MEGAMOE_DECL nlohmann::ordered_json router_json(std::string_view policy,
                                                std::optional<router::settings> const& maybe) {
  nlohmann::ordered_json j;
  j["policy"] = policy;
  if (!maybe) {
    j["settings"] = "read at start-up";
    return j;
  }
  auto const& r = *maybe;
  j["moe_router_topk"] = r.top_k;
  j["moe_router_score_function"] = score_name(r.score);
  j["moe_router_pre_softmax"] = r.score == router::score_function::softmax_before_topk;
  j["moe_router_topk_scaling_factor"] = optional_json(r.topk_scaling_factor);
  bool const groups = r.num_groups != 0 || r.group_top_k != 0;
  j["moe_router_num_groups"] = groups ? nlohmann::ordered_json(r.num_groups) : nullptr;
  j["moe_router_group_topk"] = groups ? nlohmann::ordered_json(r.group_top_k) : nullptr;

  std::vector<std::string> types;
  std::vector<double> coeffs;
  auto add = [&](char const* type, std::optional<double> const& coeff) {
    if (!coeff) return;
    types.emplace_back(type);
    coeffs.push_back(*coeff);
  };
  add("aux_loss", r.aux_loss_coeff);
  add("seq_aux_loss", r.seq_aux_loss_coeff);
  add("global_aux_loss", r.global_aux_loss_coeff);
  if (r.sinkhorn) {
    j["moe_router_load_balancing_type"] = "sinkhorn";
    j["moe_aux_loss_coeff"] = 0.0;
  } else if (types.empty()) {
    j["moe_router_load_balancing_type"] = "none";
    j["moe_aux_loss_coeff"] = 0.0;
  } else if (types.size() == 1) {
    j["moe_router_load_balancing_type"] = types.front();
    j["moe_aux_loss_coeff"] = coeffs.front();
  } else {
    j["moe_router_load_balancing_type"] = types;
    j["moe_aux_loss_coeff"] = coeffs;
  }
  j["moe_z_loss_coeff"] = optional_json(r.z_loss_coeff);
  j["moe_router_enable_expert_bias"] = r.expert_bias;
  j["moe_router_bias_update_rate"] = r.bias_update_rate;
  j["moe_expert_capacity_factor"] = optional_json(r.capacity_factor);
  j["moe_token_drop_policy"] =
      r.token_drop_policy == router::drop_policy::probs ? "probs" : "position";
  j["moe_pad_expert_input_to_capacity"] = r.pad_to_capacity;
  j["moe_router_padding_for_quantization"] = r.pad_for_quantization;
  j["moe_router_padding_multiple"] = r.quantization_multiple == 0
                                         ? nlohmann::ordered_json("recipe")
                                         : nlohmann::ordered_json(r.quantization_multiple);
  j["moe_router_dtype"] = r.dtype == router::logits_dtype::fp64 ? "fp64" : "fp32";
  j["moe_input_jitter_eps"] = optional_json(r.input_jitter_eps);
  return j;
}

MEGAMOE_DECL nlohmann::ordered_json dispatch_json(std::string_view policy,
                                                  dispatch::dispatcher chosen, int overlap_chunks,
                                                  bool intra_node_shared, bool fp8_wire,
                                                  parallel::degrees const& d) {
  nlohmann::ordered_json j;
  j["policy"] = policy;
  bool const degrees_known = d.ep != dynamic && d.etp != dynamic;
  if (chosen == dispatch::dispatcher::auto_ && !degrees_known) {
    j["moe_token_dispatcher_type"] = "decided at start-up";
  } else {
    j["moe_token_dispatcher_type"] =
        reference_dispatcher_name(dispatch::resolve(chosen, d.ep, d.etp));
  }
  if (overlap_chunks > 1) j["overlap_chunks"] = overlap_chunks;
  if (intra_node_shared) j["intra_node"] = "shared_memory";
  if (fp8_wire) j["moe_dispatch_fwd_dtype"] = "fp8";
  return j;
}

MEGAMOE_DECL nlohmann::ordered_json expert_json(std::string_view policy,
                                                expert::settings const& e) {
  nlohmann::ordered_json j;
  j["policy"] = policy;
  j["activation"] = expert::name_of(e.activation);
  j["gated_linear_unit"] = e.activation == expert::activation_function::swiglu;
  j["expert_backend"] = expert::name_of(e.backend);
  j["add_bias_linear"] = e.bias;
  j["moe_shared_expert_gate"] = e.shared_expert_gate;
  return j;
}

MEGAMOE_DECL nlohmann::ordered_json precision_json(std::string_view policy,
                                                   precision::settings const& p) {
  using precision::recipe_id;
  nlohmann::ordered_json j;
  j["policy"] = policy;
  j["recipe"] = precision::name_of(p.recipe);
  j["params_dtype"] = p.recipe == recipe_id::fp64 ? "fp64" : "fp32";
  j["bf16"] = p.recipe == recipe_id::bf16;
  bool const fp8 = precision::is_quantized(p.recipe) && p.recipe != recipe_id::nvfp4;
  j["fp8"] =
      fp8 ? nlohmann::ordered_json(p.format == precision::fp8_format::hybrid ? "hybrid" : "e4m3")
          : nullptr;
  nlohmann::ordered_json fp8_recipe = nullptr;
  if (p.recipe == recipe_id::fp8_delayed) fp8_recipe = "delayed";
  if (p.recipe == recipe_id::fp8_current) fp8_recipe = "tensorwise";
  if (p.recipe == recipe_id::fp8_blockwise) fp8_recipe = "blockwise";
  if (p.recipe == recipe_id::mxfp8) fp8_recipe = "mxfp8";
  j["fp8_recipe"] = fp8_recipe;
  bool const delayed = p.recipe == recipe_id::fp8_delayed;
  j["fp8_amax_history_len"] = delayed ? nlohmann::ordered_json(p.amax_history_len) : nullptr;
  j["fp8_amax_compute_algo"] =
      delayed ? nlohmann::ordered_json(p.amax_algo == precision::amax_compute::max ? "max"
                                                                                   : "most_recent")
              : nullptr;
  j["fp8_margin"] = delayed ? nlohmann::ordered_json(p.margin) : nullptr;
  j["fp4"] = p.recipe == recipe_id::nvfp4 ? nlohmann::ordered_json("e2m1") : nullptr;
  j["fp4_recipe"] = p.recipe == recipe_id::nvfp4 ? nlohmann::ordered_json("nvfp4") : nullptr;
  j["quantization_padding_multiple"] = p.padding_multiple;
  if (p.wgrad_from_rowwise) j["wgrad_from_rowwise"] = true;  // absent otherwise: older checkpoints
  return j;
}

MEGAMOE_DECL nlohmann::ordered_json parallel_json(std::string_view policy,
                                                  parallel::degrees const& d,
                                                  parallel::cp_comm_type cp_comm,
                                                  std::optional<int> world_size) {
  nlohmann::ordered_json j;
  j["policy"] = policy;
  j["order"] = "tp-cp-ep-dp-pp";
  j["tensor_model_parallel_size"] = size_or_dynamic(d.tp);
  j["context_parallel_size"] = size_or_dynamic(d.cp);
  j["pipeline_model_parallel_size"] = size_or_dynamic(d.pp);
  j["expert_tensor_parallel_size"] = size_or_dynamic(d.etp);
  j["expert_model_parallel_size"] = size_or_dynamic(d.ep);
  j["cp_comm_type"] = parallel::name_of(cp_comm);
  auto derived = [&](int a, int b, int c) -> nlohmann::ordered_json {
    if (!world_size || a == dynamic || b == dynamic || c == dynamic || a * b * c <= 0 ||
        *world_size % (a * b * c) != 0)
      return "from the world size";
    return *world_size / (a * b * c);
  };
  j["world_size"] = world_size ? nlohmann::ordered_json(*world_size) : "at start-up";
  j["data_parallel_size"] = derived(d.tp, d.cp, d.pp);
  j["expert_data_parallel_size"] = derived(d.etp, d.ep, d.pp);
  return j;
}

MEGAMOE_DECL nlohmann::ordered_json memory_json(std::string_view policy,
                                                memory::settings const& m) {
  nlohmann::ordered_json j;
  j["policy"] = policy;
  j["recompute_granularity"] = m.recomputes() ? nlohmann::ordered_json("selective") : nullptr;
  auto modules = nlohmann::ordered_json::array();
  if (m.moe_layer) modules.push_back("moe");
  if (m.moe_act) modules.push_back("moe_act");
  if (m.shared_experts) modules.push_back("shared_experts");
  j["recompute_modules"] = modules;
  j["quantized_activations"] = m.quantized_activations;
  j["quantized_weights"] = m.quantized_weights;
  return j;
}

MEGAMOE_DECL nlohmann::ordered_json model_json(std::string_view policy, model::settings const& m,
                                               int hidden) {
  nlohmann::ordered_json j;
  j["policy"] = policy;
  j["num_layers"] = size_or_dynamic(m.layers);
  j["num_attention_heads"] = size_or_dynamic(m.heads);
  j["num_query_groups"] = size_or_dynamic(m.query_groups);
  bool const head_known =
      m.heads != dynamic && m.heads > 0 && hidden != dynamic && hidden > 0 && hidden % m.heads == 0;
  j["kv_channels"] = head_known ? nlohmann::ordered_json(hidden / m.heads)
                                : nlohmann::ordered_json("from hidden_size / num_attention_heads");
  j["ffn_hidden_size"] = size_or_dynamic(m.dense_ffn);
  if (m.moe_layers.is_list()) {
    auto list = nlohmann::ordered_json::array();
    for (int i = 0; i < m.moe_layers.length && i < model::max_pattern_layers; ++i)
      list.push_back(m.moe_layers.moe[static_cast<std::size_t>(i)]);
    j["moe_layer_freq"] = list;
  } else {
    j["moe_layer_freq"] = size_or_dynamic(m.moe_layers.every);
  }
  j["vocab_size"] = size_or_dynamic(m.vocabulary);
  j["make_vocab_size_divisible_by"] = m.vocab_multiple;
  j["normalization"] = "RMSNorm";
  j["qk_layernorm"] = m.qk_layernorm;
  j["layernorm_epsilon"] = m.norm_epsilon;
  j["position_embedding_type"] = "rope";
  j["rotary_base"] = m.rope_base;
  if (m.mla.enabled()) {  // only when set: configurations without MLA describe as before
    j["multi_latent_attention"] = true;
    j["q_lora_rank"] = m.mla.q_lora_rank;
    j["kv_lora_rank"] = m.mla.kv_lora_rank;
    j["qk_head_dim"] = m.mla.qk_head_dim;
    j["qk_pos_emb_head_dim"] = m.mla.qk_pos_emb_head_dim;
    j["v_head_dim"] = m.mla.v_head_dim;
  }
  if (m.mtp_num_layers != 0) {  // likewise only when set
    j["mtp_num_layers"] = m.mtp_num_layers;
    j["mtp_loss_scaling_factor"] = m.mtp_loss_scaling_factor;
  }
  return j;
}

MEGAMOE_DECL std::string value_text(nlohmann::ordered_json const& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}
}  // namespace megamoe::detail

namespace megamoe {

MEGAMOE_DECL config_description describe(config_values const& v) {
  config_values const defaults_of_megamoe;
  // The defaults of each field are those of a configuration whose slots all hold their defaults.
  auto const slots = [](config_values const& c) {
    nlohmann::ordered_json j;
    j["shape"] = detail::shape_json(c.shape);
    j["router"] = detail::router_json(c.names.router, c.router);
    j["dispatch"] = detail::dispatch_json(c.names.dispatch, c.dispatch, c.overlap_chunks,
                                          c.intra_node_shared, c.fp8_wire, c.parallel);
    j["expert"] = detail::expert_json(c.names.expert, c.expert);
    j["precision"] = detail::precision_json(c.names.precision, c.precision);
    j["parallel"] = detail::parallel_json(c.names.parallel, c.parallel, c.cp_comm, c.world_size);
    j["memory"] = detail::memory_json(c.names.memory, c.memory);
    j["model"] = detail::model_json(c.names.model, c.model, c.shape.hidden);
    return j;
  };
  nlohmann::ordered_json json = slots(v);
  nlohmann::ordered_json const reference = slots(defaults_of_megamoe);

  config_description out;
  auto defaults = nlohmann::ordered_json::array();
  out.text = "megamoe configuration\n";
  for (auto const& [slot, fields] : json.items()) {
    for (auto const& [field, value] : fields.items()) {
      bool const is_default =
          slot != "shape" && reference[slot].contains(field) && reference[slot][field] == value;
      if (is_default) defaults.push_back(slot + "." + field);
      out.text += "  " + slot + "." + field + " = " + detail::value_text(value) +
                  (is_default ? "  (default)" : "") + "\n";
    }
  }
  json["defaults"] = defaults;
  // The flat form: the slots' field names are unique across slots, so they merge without loss.
  nlohmann::ordered_json flat, policies;
  for (auto const& [slot, fields] : json.items()) {
    if (slot == "defaults") continue;
    for (auto const& [field, value] : fields.items()) {
      if (field == "policy") {
        policies[slot] = value;
      } else {
        flat[field] = value;
      }
    }
  }
  flat["policies"] = std::move(policies);
  flat["defaults"] = defaults;
  out.flat = std::move(flat);
  out.json = std::move(json);
  return out;
}

}  // namespace megamoe
