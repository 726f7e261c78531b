// SPDX-License-Identifier: Apache-2.0
// megamoe/config/values.hpp — a configuration as plain values.
//
// The rules and describe() read this one form, so a configuration fixed in a type (values_of<C>()
// at compile time) and one completed at start-up go through the same code and give the same
// answers.
#pragma once

#include <megamoe/config/concepts.hpp>

#include <optional>
#include <string_view>

namespace megamoe {

/// The names of the policies in each slot, for describe().
struct policy_names {
  std::string_view router = "top_k";
  std::string_view dispatch = "auto";
  std::string_view expert = "mlp";
  std::string_view precision = "fp32";
  std::string_view parallel = "mapping";
  std::string_view memory = "keep_all";
  std::string_view model = "decoder";
  friend constexpr bool operator==(policy_names const&, policy_names const&) = default;
};

/// Every choice of a configuration. A size or degree may be `dynamic`, the router may be absent (a
/// run-time router before start-up), and the world size is only known at start-up.
struct config_values {
  policy_names names;
  shape_sizes shape;
  std::optional<router::settings> router = router::settings{};
  dispatch::dispatcher dispatch = dispatch::dispatcher::auto_;
  int overlap_chunks = 1;          // pieces of the exchange overlapped with compute (1: blocking)
  bool intra_node_shared = false;  // hierarchical's inside-node exchange through a shared window
  bool fp8_wire = false;  // the forward dispatch's tokens as FP8 codes (dispatch::fp8_wire)
  expert::settings expert;
  precision::settings precision;
  parallel::degrees parallel;
  parallel::cp_comm_type cp_comm = parallel::cp_comm_type::p2p;  // cp_comm_type
  memory::settings memory;
  model::settings model;
  std::optional<int> world_size;
  friend constexpr bool operator==(config_values const&, config_values const&) = default;
};

/// The values a configuration type fixes; what it leaves to start-up stays `dynamic` or empty.
template <training_config C>
constexpr config_values values_of() {
  config_values v;
  v.names = {C::router::name,   C::dispatch::name, C::expert::name, C::precision::name,
             C::parallel::name, C::memory::name,   C::model::name};
  v.shape = C::shape::value;
  if constexpr (static_router_policy<typename C::router>) {
    v.router = C::router::value;
  } else {
    v.router.reset();
  }
  v.dispatch = C::dispatch::value;
  v.overlap_chunks = dispatch::overlap_chunks_of<typename C::dispatch>();
  v.intra_node_shared = dispatch::intra_node_shared<typename C::dispatch>();
  v.fp8_wire = dispatch::fp8_wire_of<typename C::dispatch>();
  v.expert = C::expert::value;
  v.precision = C::precision::value;
  v.parallel = C::parallel::value;
  v.cp_comm = C::parallel::cp_comm;
  v.memory = C::memory::value;
  v.model = C::model::value;
  return v;
}

}  // namespace megamoe
