// SPDX-License-Identifier: Apache-2.0
// megamoe/model/parameter_layout.ipp — the definitions behind parameter_layout.hpp that depend on
// no configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/model/parameter_layout.hpp>

namespace megamoe {

MEGAMOE_DECL std::string layer_prefix(int layer, int decoder_layers) {
  if (decoder_layers > 0 && layer >= decoder_layers)
    return "mtp.layers." + std::to_string(layer - decoder_layers) + ".transformer_layer";
  return "decoder.layers." + std::to_string(layer);
}

MEGAMOE_DECL std::string moe_parameter_prefix(int layer, int decoder_layers) {
  return layer_prefix(layer, decoder_layers) + ".mlp.";
}

}  // namespace megamoe
