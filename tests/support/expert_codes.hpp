// SPDX-License-Identifier: Apache-2.0
// An MoE layer's expert operands as it used them in its last step (its own codes, dequantized),
// for the double reference on those codes (reference/recipe_reference.hpp).
#pragma once

#include "reference/recipe_reference.hpp"

#include <megamoe/expert/tags.hpp>
#include <megamoe/precision/operands.hpp>

#include <cstddef>
#include <cstdint>

namespace megamoe::testing {

namespace detail_codes {
namespace ref = megamoe::reference;
namespace pr = megamoe::precision;
/// The dequantized values of q, [q.rows][q.cols] or transposed.
template <pr::operand_format F>
ref::mat dequantized_mat(pr::quantized_matrix const& q, bool transpose = false) {
  auto const v = pr::dequantized<F>(q);
  auto const rows = static_cast<std::size_t>(q.rows), cols = static_cast<std::size_t>(q.cols);
  ref::mat out = transpose ? ref::zeros(cols, rows) : ref::zeros(rows, cols);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) (transpose ? out[c][r] : out[r][c]) = v[r * cols + c];
  return out;
}

/// Expert e's operands as the layer used them in its last step.
template <class Layer>
ref::expert_operands operands_of_impl(Layer const& layer, int e, std::int64_t first_row) {
  using ops_type = typename Layer::operands_type;
  constexpr auto recipe = Layer::recipe;
  using role = pr::operand_role;
  using usage = pr::operand_usage;
  using megamoe::expert::linear;
  auto const& ops = layer.routed_operands();
  auto weight_col = [&](linear l) {
    if constexpr (pr::same_copies(recipe, role::weight)) {
      return dequantized_mat<ops_type::weight_row>(
          ops.codes_of(l, role::weight, usage::rowwise, e));
    } else {
      return dequantized_mat<ops_type::weight_col>(
          ops.codes_of(l, role::weight, usage::columnwise, e), true);
    }
  };
  // wgrad copies with the token dimension last.
  auto input_col = [&](linear l) {
    if constexpr (pr::same_copies(recipe, role::input)) {
      return dequantized_mat<ops_type::input_row>(ops.codes_of(l, role::input, usage::rowwise, e),
                                                  true);
    } else {
      return dequantized_mat<ops_type::input_col>(
          ops.codes_of(l, role::input, usage::columnwise, e));
    }
  };
  auto grad_col = [&](linear l) {
    if constexpr (pr::same_copies(recipe, role::grad)) {
      return dequantized_mat<ops_type::grad_row>(ops.codes_of(l, role::grad, usage::rowwise, e),
                                                 true);
    } else {
      return dequantized_mat<ops_type::grad_col>(ops.codes_of(l, role::grad, usage::columnwise, e));
    }
  };
  ref::expert_operands o;
  o.x_row = dequantized_mat<ops_type::input_row>(
      ops.codes_of(linear::fc1, role::input, usage::rowwise, e));
  o.w1_row = dequantized_mat<ops_type::weight_row>(
      ops.codes_of(linear::fc1, role::weight, usage::rowwise, e));
  o.w1_col = weight_col(linear::fc1);
  o.ap_row = dequantized_mat<ops_type::input_row>(
      ops.codes_of(linear::fc2, role::input, usage::rowwise, e));
  o.w2_row = dequantized_mat<ops_type::weight_row>(
      ops.codes_of(linear::fc2, role::weight, usage::rowwise, e));
  o.w2_col = weight_col(linear::fc2);
  o.g2_row =
      dequantized_mat<ops_type::grad_row>(ops.codes_of(linear::fc2, role::grad, usage::rowwise, e));
  o.g1_row =
      dequantized_mat<ops_type::grad_row>(ops.codes_of(linear::fc1, role::grad, usage::rowwise, e));
  o.g2_col_t = grad_col(linear::fc2);
  o.ap_col_t = input_col(linear::fc2);
  o.g1_col_t = grad_col(linear::fc1);
  o.x_col_t = input_col(linear::fc1);
  if constexpr (Layer::memory_settings.quantized_activations) {
    o.h = dequantized_mat<ops_type::input_row>(ops.fc1_output_codes(e));
  } else {
    auto const kept = ops.fc1_output_kept();
    auto const W1 = o.w1_row.size();
    for (std::size_t i = 0; i < o.x_row.size(); ++i) {
      ref::vec row(W1);
      for (std::size_t c = 0; c < W1; ++c)
        row[c] = pr::from_bf16_bits(kept[(static_cast<std::size_t>(first_row) + i) * W1 + c]);
      o.h.push_back(row);
    }
  }
  return o;
}

}  // namespace detail_codes

/// Expert e's operands as `layer` used them in its last step (its rows start at `first_row` of
/// the layer's permutation).
template <class Layer>
megamoe::reference::expert_operands operands_of(Layer const& layer, int e, std::int64_t first_row) {
  return detail_codes::operands_of_impl(layer, e, first_row);
}

}  // namespace megamoe::testing
