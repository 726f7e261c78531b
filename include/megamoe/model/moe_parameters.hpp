// SPDX-License-Identifier: Apache-2.0
// megamoe/model/moe_parameters.hpp — how an MoE layer's parameters are named and numbered: the
// reference's names (`decoder.layers.{i}.mlp.router.weight`, `...experts.linear_fc1.weight{e}`,
// ...) and, for every element of this rank's copy or shard, its number in the whole parameter,
// so that every parallel mapping draws the same initial weights.
#pragma once

#include <megamoe/core/parameter.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/tensor.hpp>

#include <cstdint>
#include <string>

namespace megamoe {

/// The prefix of layer `layer_number`'s MoE parameters. With the decoder's `decoder_layers`
/// given (a model with multi-token prediction), the layers past them are the depths' (layer
/// decoder_layers + k is depth k's, `mtp.layers.{k}.transformer_layer.mlp.`, as the reference
/// names it).
inline std::string moe_parameter_prefix(int layer_number, int decoder_layers = -1) {
  if (decoder_layers > 0 && layer_number >= decoder_layers)
    return "mtp.layers." + std::to_string(layer_number - decoder_layers) +
           ".transformer_layer.mlp.";
  return "decoder.layers." + std::to_string(layer_number) + ".mlp.";
}

/// Draws `value` from N(0, std^2) as a function of (seed + the parameter's number, the element's
/// number in the whole parameter); a bias is 0.
template <class T>
void draw_parameter(row_matrix_map<T> value, std::uint64_t seed, std::uint64_t index,
                    element_numbering const& numbering, double std, bool bias) {
  for (Eigen::Index r = 0; r < value.rows(); ++r)
    for (Eigen::Index c = 0; c < value.cols(); ++c)
      value(r, c) =
          bias ? T(0) : static_cast<T>(std * standard_normal(seed + index, numbering.global(r, c)));
}

}  // namespace megamoe
