// SPDX-License-Identifier: Apache-2.0
// megamoe/train/upcycle.hpp — an MoE model started from a dense one (the reference's
// upcycling_utils.py), on any layout.
//
// The dense model's weights come from a safetensors file under the reference's names
// (megamoe-train's model.safetensors of a dense model): every parameter the MoE model shares with
// it is copied; at each MoE layer, expert e takes the dense FFN's shard (e mod g) for granularity g
// = dense FFN width / expert width: fc1's rows split in g (for SwiGLU the gate and linear halves
// separately, then paired), fc2's columns split in g, both multiplied by w = a^(1/3) for SwiGLU and
// squared ReLU, a^(1/2) otherwise, with a = E g / k under softmax before top-k and a = g otherwise.
// The router keeps its fresh initialisation but expert e uses row floor(e / g) of it. With g = 1
// every expert is the dense FFN, so where the top-k probabilities sum to one the upcycled model's
// first forward is the dense model's.
//
// A dense model here is one whose FFN at each MoE position is a plain SwiGLU FFN: a decoder without
// MoE layers there, or (megamoe-train's `dense` preset) one expert with top-1 routing, whose
// probability is exactly 1; dense_parameter_name() gives such an expert's weights their dense
// names.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/parameter_list.hpp>
#include <megamoe/io/safetensors.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/parallel/environment.hpp>

#include <boost/mpi/communicator.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace megamoe::train {

/// The reference's dense name of a one-expert MoE layer's parameter (`...mlp.experts.linear_fc1.
/// weight0` -> `...mlp.linear_fc1.weight`); nullopt for its router weight, which a dense model
/// has not; the name itself otherwise.
MEGAMOE_DECL std::optional<std::string> dense_parameter_name(std::string const& name);

/// The reference's upcycling scale of fc1 and fc2 (see above).
MEGAMOE_DECL double upcycling_weight_scale(config_values const& v, int granularity);

namespace detail {
/// upcycle()'s work on the model's parameters, given its values and its first MoE layer (-1:
/// none); returns the granularity.
MEGAMOE_DECL int upcycle_parameters(parameter_list<float>& parameters, config_values const& v,
                                    int first_moe_layer, boost::mpi::communicator const& world,
                                    std::filesystem::path const& file);
MEGAMOE_DECL int upcycle_parameters(parameter_list<double>& parameters, config_values const& v,
                                    int first_moe_layer, boost::mpi::communicator const& world,
                                    std::filesystem::path const& file);
}  // namespace detail

/// Makes `model` (initialised, no optimizer built yet) the upcycled MoE of the dense model in
/// `file`, collectively over `world` (every rank reads the file). Returns the granularity g.
template <class Config>
int upcycle(transformer<Config>& model, boost::mpi::communicator const& world,
            std::filesystem::path const& file) {
  int first_moe_layer = -1;
  for (int i = model.layers() - 1; i >= 0; --i)
    if (model.is_moe(i)) first_moe_layer = i;
  auto parameters = model.numbered_parameters();
  int const granularity =
      detail::upcycle_parameters(parameters, model.values(), first_moe_layer, world, file);
  if constexpr (transformer<Config>::quantized_weights) model.refresh_weight_codes();
  return granularity;
}

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/upcycle.ipp>
#endif
