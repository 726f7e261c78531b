// SPDX-License-Identifier: Apache-2.0
// megamoe/config/resolve.ipp — the definitions behind resolve.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/config/resolve.hpp>

namespace megamoe::detail {

MEGAMOE_DECL void fill(int& fixed, std::optional<int> given, char const* field) {
  if (!given) return;
  if (fixed == dynamic) {
    fixed = *given;
  } else if (*given != fixed) {
    throw input_error(std::string("start-up value for ") + field + " is " + std::to_string(*given) +
                      " but the configuration type fixes " + std::to_string(fixed));
  }
}
}  // namespace megamoe::detail

namespace megamoe {

MEGAMOE_DECL config_values resolve(config_values v, startup_values const& given) {
  detail::fill(v.shape.hidden, given.hidden, "shape hidden_size");
  detail::fill(v.shape.ffn, given.ffn, "shape moe_ffn_hidden_size");
  detail::fill(v.shape.experts, given.experts, "shape num_moe_experts");
  detail::fill(v.shape.shared_ffn, given.shared_ffn, "shape moe_shared_expert_intermediate_size");
  detail::fill(v.parallel.tp, given.tp, "parallel tp");
  detail::fill(v.parallel.cp, given.cp, "parallel cp");
  detail::fill(v.parallel.pp, given.pp, "parallel pp");
  detail::fill(v.parallel.etp, given.etp, "parallel etp");
  detail::fill(v.parallel.ep, given.ep, "parallel ep");
  // As in the reference, ETP follows TP unless it is given.
  if (v.parallel.etp == dynamic) v.parallel.etp = v.parallel.tp;
  detail::fill(v.model.layers, given.layers, "model num_layers");
  detail::fill(v.model.heads, given.heads, "model num_attention_heads");
  detail::fill(v.model.query_groups, given.query_groups, "model num_query_groups");
  detail::fill(v.model.vocabulary, given.vocabulary, "model vocab_size");
  detail::fill(v.model.dense_ffn, given.dense_ffn, "model ffn_hidden_size");
  if (given.vocab_multiple) v.model.vocab_multiple = *given.vocab_multiple;
  if (given.moe_layer_freq && v.model.moe_layers.is_list())
    throw input_error("start-up value for model moe_layer_freq is " +
                      std::to_string(*given.moe_layer_freq) +
                      " but the configuration type fixes a moe_layer_pattern");
  detail::fill(v.model.moe_layers.every, given.moe_layer_freq, "model moe_layer_freq");
  // num_query_groups follows num_attention_heads unless given; the dense width is 0 once no layer
  // is dense.
  v.model = model::with_derived(v.model, false);
  if (given.router) {
    if (v.router && *v.router != *given.router)
      throw input_error("start-up router settings differ from the configuration type's router");
    v.router = given.router;
  }
  if (given.world_size) v.world_size = given.world_size;
  rules::require_valid(v);
  for (auto const& [count, name] :
       {std::pair{given.bf16_layers_at_start, "start"}, std::pair{given.bf16_layers_at_end, "end"}})
    if (count && (*count < 0 || *count > v.model.layers ||
                  (*count > 0 && !precision::is_quantized(v.precision.recipe))))
      throw config_error(rules::id::bf16_edge_layers,
                         "num_layers_at_" + std::string(name) + "_in_bf16 " +
                             std::to_string(*count) + " of " + std::to_string(v.model.layers) +
                             " layers under the " +
                             std::string(precision::name_of(v.precision.recipe)) + " recipe");
  return v;
}

}  // namespace megamoe
