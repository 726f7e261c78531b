// SPDX-License-Identifier: Apache-2.0
// megamoe/config/resolve.hpp — completing a configuration at start-up.
//
// A type may leave sizes and degrees `dynamic` and may use `router::runtime`. At start-up the
// program supplies those values (from a checkpoint, a command line, a reference-vector file, the
// world size); `resolve<C>` fills them in and runs every rule once, with the same ids as the
// compile-time check.
//
//   auto values = megamoe::resolve<my_config>({.ep = ep, .world_size = world.size()});
#pragma once

#include <megamoe/config/rules.hpp>
#include <megamoe/config/values.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/policy/error.hpp>

#include <optional>
#include <string>
#include <utility>

namespace megamoe {

/// What start-up supplies. A value the type fixes may be given too, but then it must agree.
struct startup_values {
  std::optional<int> hidden{}, ffn{}, experts{}, shared_ffn{};  // shape sizes
  std::optional<int> tp{}, cp{}, pp{}, etp{}, ep{};             // parallel degrees
  std::optional<router::settings> router{};                     // for router::runtime
  std::optional<int> world_size{};
  std::optional<int> layers{}, heads{}, query_groups{}, vocabulary{}, dense_ffn{};  // model sizes
  std::optional<int> moe_layer_freq{};  // for a model slot that leaves moe_layer_freq dynamic
  // The pipeline's chunks per rank (V) and the first and last virtual stages' layer counts (the
  // rest split evenly; evenly over all without them).
  std::optional<int> vpp{}, first_stage_layers{}, last_stage_layers{};
  std::string pipeline_layout{};  // the reference's --pipeline-model-parallel-layout, or empty
  // The layers kept in BF16 at the model's start and end under an FP8 or FP4 recipe (the
  // reference's num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16; none where not given):
  // the transformer's, R053.
  std::optional<int> bf16_layers_at_start{}, bf16_layers_at_end{};
};

namespace detail {
/// Takes `given` where the type left `dynamic`; elsewhere the type's value stays, and a different
/// given value is a mismatch between the program's type and its inputs.
inline void fill(int& fixed, std::optional<int> given, char const* field) {
  if (!given) return;
  if (fixed == dynamic) {
    fixed = *given;
  } else if (*given != fixed) {
    throw input_error(std::string("start-up value for ") + field + " is " + std::to_string(*given) +
                      " but the configuration type fixes " + std::to_string(fixed));
  }
}
}  // namespace detail

/// Fills the start-up values into `v` and checks every rule (`config_error` with its id on
/// failure).
inline config_values resolve(config_values v, startup_values const& given) {
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

/// The configuration type C completed with the start-up values and checked.
template <training_config C>
config_values resolve(startup_values const& given) {
  return resolve(values_of<C>(), given);
}

}  // namespace megamoe
