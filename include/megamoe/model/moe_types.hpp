// SPDX-License-Identifier: Apache-2.0
// megamoe/model/moe_types.hpp — the builder: every type an MoE layer's stages run, assembled from
// the configuration (scalar types, router, dispatcher, expert FFN and GEMM backends, the recipe's
// operands, the memory policy's choices). Nothing here runs; the stages and the layer read it.
#pragma once

#include <megamoe/config/concepts.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/dispatch/dispatcher.hpp>
#include <megamoe/dispatch/tags.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/mlp.hpp>
#include <megamoe/memory/saved.hpp>
#include <megamoe/model/linear.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/precision/recipe.hpp>
#include <megamoe/router/router.hpp>

#include <type_traits>

namespace megamoe {

template <training_config Config>
struct moe_types {
  using config = Config;
  /// The layer's values and weights: the recipe's master type (fp32, or fp64 for checks).
  using scalar = typename Config::precision::master_type;

  /// The router's logits type: double for the fp64 recipe, else the router policy's dtype (fp32
  /// for a run-time router); scores in double only for the fp64 recipe.
  static consteval bool router_in_double() {
    if constexpr (std::is_same_v<scalar, double>) {
      return true;
    } else if constexpr (static_router_policy<typename Config::router>) {
      return Config::router::value.dtype == router::logits_dtype::fp64;
    } else {
      return false;
    }
  }
  using logit = std::conditional_t<router_in_double(), double, float>;
  using score = std::conditional_t<std::is_same_v<scalar, double>, double, float>;
  /// A static policy's plan is in the router's type; router::runtime picks it per call.
  using router_type = router::router_class_t<typename Config::router, logit, score>;

  static constexpr expert::settings expert_settings = Config::expert::value;
  static constexpr memory::settings memory_settings = Config::memory::value;
  static constexpr expert::activation_function activation = expert_settings.activation;
  using backend = expert::backend_t<expert_settings.backend>;
  using mlp_type = expert::grouped_mlp<activation, backend, scalar>;
  /// The router's GEMMs multiply fp32 values: on a BF16 expert backend they take the grouped one.
  using router_backend =
      std::conditional_t<expert::multiplies_bf16<backend>, expert::grouped_gemm, backend>;

  /// `auto_` is `local` when the type fixes EP = ETP = 1, else `all_to_all` (which also works on
  /// one rank).
  static consteval dispatch::dispatcher resolved_dispatcher() {
    constexpr auto chosen = Config::dispatch::value;
    if constexpr (chosen != dispatch::dispatcher::auto_) {
      return chosen;
    } else {
      constexpr auto d = Config::parallel::value;
      return d.ep == 1 && d.etp == 1 ? dispatch::dispatcher::local
                                     : dispatch::dispatcher::all_to_all;
    }
  }
  static constexpr dispatch::dispatcher dispatcher_kind = resolved_dispatcher();
  static constexpr bool distributed = dispatch::communicates(dispatcher_kind);
  using dispatcher_type =
      dispatch::dispatcher_of<typename Config::dispatch, dispatcher_kind, scalar, logit>;
  static_assert(dispatch::token_dispatcher<dispatcher_type, scalar, logit>);
  /// Pieces the overlapped exchange runs in (dispatch::all_to_all_overlap,
  /// dispatch::shared_memory_overlap); 1: not overlapped.
  static constexpr int overlap_pieces = dispatch::overlap_chunks_of<typename Config::dispatch>();

  /// The precision recipe: fp32 and fp64 GEMMs read the values themselves; every other recipe's
  /// expert GEMMs (routed and shared) read its quantized operands, and backward keeps codes. A
  /// recipe's per-tensor amaxes are reduced over the ranks holding parts of one tensor.
  static constexpr precision::settings recipe = Config::precision::value;
  static constexpr bool rounds_operands = precision::rounds_operands(recipe);
  static constexpr bool quantized_weights = memory_settings.quantized_weights;
  /// The forward dispatch carries fc1's FP8 input codes (dispatch::fp8_wire): the routed experts'
  /// operands take them as they arrive.
  static constexpr bool fp8_wire = dispatch::fp8_wire_of<typename Config::dispatch>();
  template <bool QuantizedWeights, bool CodesOnWire>
  using operands_for =
      std::conditional_t<rounds_operands,
                         precision::grouped_operands<
                             typename Config::precision, parallel::communicator_max,
                             memory_settings.quantized_activations, QuantizedWeights, CodesOnWire>,
                         expert::exact_operands>;
  static_assert(recipe_operands_included<typename Config::precision>());
  using routed_operands = operands_for<quantized_weights, fp8_wire>;
  using shared_operands = operands_for<false, false>;
  static_assert(!rounds_operands || std::is_same_v<scalar, float>,
                "megamoe: the bf16, FP8 and FP4 recipes keep fp32 master weights");

  /// Whether the layer keeps buffer `b` from forward to backward (memory/saved.hpp).
  static constexpr bool keeps(memory::layer_buffer b) {
    return memory::keeps(memory_settings, rounds_operands, expert_settings.shared_expert_gate, b);
  }
};

}  // namespace megamoe
