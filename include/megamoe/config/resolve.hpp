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
#include <megamoe/core/compiled_once.hpp>
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
  // The padding multiple of the vocabulary (the reference's --make-vocab-size-divisible-by): the
  // type's is a default, so a given value replaces it.
  std::optional<int> vocab_multiple{};
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
MEGAMOE_DECL void fill(int& fixed, std::optional<int> given, char const* field);
}  // namespace detail

/// Fills the start-up values into `v` and checks every rule (`config_error` with its id on
/// failure).
MEGAMOE_DECL config_values resolve(config_values v, startup_values const& given);

/// The configuration type C completed with the start-up values and checked.
template <training_config C>
config_values resolve(startup_values const& given) {
  return resolve(values_of<C>(), given);
}

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/config/resolve.ipp>
#endif
