// SPDX-License-Identifier: Apache-2.0
// megamoe/train/upcycle.ipp — the definitions behind upcycle.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/upcycle.hpp>

namespace megamoe::train {

MEGAMOE_DECL std::optional<std::string> dense_parameter_name(std::string const& name) {
  static std::regex const expert(
      R"(^((?:decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.mlp\.)experts\.(linear_fc[12]\.(weight|bias))0$)");
  static std::regex const router(
      R"(^(?:decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.mlp\.router\.(weight|expert_bias)$)");
  std::smatch m;
  if (std::regex_match(name, m, expert)) return m[1].str() + m[2].str();
  if (std::regex_match(name, router)) return std::nullopt;
  return name;
}

MEGAMOE_DECL double upcycling_weight_scale(config_values const& v, int granularity) {
  int const experts = v.shape.experts, top_k = v.router ? v.router->top_k : 1;
  bool const pre_softmax =
      v.router && v.router->score == router::score_function::softmax_before_topk;
  double const a = pre_softmax ? static_cast<double>(experts) * granularity / top_k : granularity;
  bool const cube_root = v.expert.activation == expert::activation_function::swiglu ||
                         v.expert.activation == expert::activation_function::squared_relu;
  return cube_root ? std::cbrt(a) : std::sqrt(a);
}

}  // namespace megamoe::train
