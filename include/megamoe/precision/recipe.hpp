// SPDX-License-Identifier: Apache-2.0
// megamoe/precision/recipe.hpp — what a recipe does to each GEMM operand: element format, block
// shape, scale kind and rounding, per tensor (input X, weight W, gradient G) and copy (rowwise for
// fprop X / W and dgrad G, columnwise for wgrad X / G and dgrad W). The table of
// docs/spec/precision.md §8:
//
//   recipe          X (rowwise / columnwise)   W (rowwise / columnwise)   G (rowwise / columnwise)
//   bf16            BF16                       BF16                       BF16
//   fp8_tensorwise  E4M3 per tensor            E4M3 per tensor            E5M2 (HYBRID) per tensor
//   fp8_blockwise   E4M3 1x128 / 128x1         E4M3 128x128               E4M3 1x128 / 128x1
//   mxfp8           E4M3 1x32 / 32x1           E4M3 1x32 / 32x1           E4M3 1x32 / 32x1
//   nvfp4           E2M1 1x16 / 16x1 + RHT     E2M1 16x16                 E2M1 1x16 SR / + RHT + SR
//
// Blocks are given along the GEMM's reduction dimension (block_cols) and across it (block_rows),
// so a columnwise copy is the same format applied to the transposed tensor. Where the columnwise
// copy is the exact transpose of the rowwise codes (per-tensor scales, BF16, square 2D blocks),
// `same_copies` says so and one copy serves both GEMMs.
#pragma once

#include <megamoe/precision/tags.hpp>

#include <string_view>

namespace megamoe::precision {

// A quantizing recipe's operands, defined (with its defaults) in precision/operands.hpp, which a
// configuration under such a recipe includes (core/by_need.hpp).
template <class Recipe, class AmaxReduction, bool QuantizedActivations, bool QuantizedWeights,
          bool CodesOnWire>
class grouped_operands;

/// The element format of a GEMM operand.
enum class element_kind { fp32, bf16, e4m3, e5m2, e2m1 };
/// How an operand is scaled: not at all, one fp32 scale per tensor, fp32 scale_inv per block
/// (blockwise FP8), one E8M0 per block (MXFP8), or an E4M3 per block under an fp32 tensor amax
/// (NVFP4).
enum class scale_kind { none, per_tensor, fp32_blocks, e8m0_blocks, nvfp4_blocks };

/// One operand copy's format. A structural type, so a recipe's formats are template arguments.
struct operand_format {
  element_kind element = element_kind::fp32;
  scale_kind scale = scale_kind::none;
  int block_rows = 1;  // across the reduction dimension
  int block_cols = 1;  // along the reduction dimension
  bool power_of_2 = false;
  bool stochastic = false;  // NVFP4 gradients
  bool hadamard = false;    // NVFP4 wgrad copies: 16-point RHT along the reduction dimension
  friend constexpr bool operator==(operand_format const&, operand_format const&) = default;
};

constexpr std::string_view name_of(element_kind e) {
  switch (e) {
    case element_kind::fp32: return "fp32";
    case element_kind::bf16: return "bf16";
    case element_kind::e4m3: return "e4m3";
    case element_kind::e5m2: return "e5m2";
    case element_kind::e2m1: return "e2m1";
  }
  return "?";
}

/// The format a recipe gives `role`'s `usage` copy.
constexpr operand_format format_of(settings const& s, operand_role role, operand_usage usage) {
  bool const grad = role == operand_role::grad;
  bool const columnwise = usage == operand_usage::columnwise;
  element_kind const fp8 =
      grad && s.format == fp8_format::hybrid ? element_kind::e5m2 : element_kind::e4m3;
  switch (s.recipe) {
    case recipe_id::fp64:
    case recipe_id::fp32: return {};
    case recipe_id::bf16: return {element_kind::bf16};
    case recipe_id::fp8_delayed:
    case recipe_id::fp8_current: return {fp8, scale_kind::per_tensor};
    case recipe_id::fp8_blockwise:
      if (role == operand_role::weight) return {fp8, scale_kind::fp32_blocks, 128, 128, true};
      return {fp8, scale_kind::fp32_blocks, 1, 128, true};
    case recipe_id::mxfp8: return {fp8, scale_kind::e8m0_blocks, 1, 32};
    case recipe_id::nvfp4:
      if (role == operand_role::weight)
        return {element_kind::e2m1, scale_kind::nvfp4_blocks, 16, 16};
      return {element_kind::e2m1,
              scale_kind::nvfp4_blocks,
              1,
              16,
              false,
              grad,
              columnwise && role != operand_role::weight};
  }
  return {};
}

/// True where the columnwise copy is the exact transpose of the rowwise one (same codes, same
/// scales): per-tensor scaling, BF16, and square 2D blocks.
constexpr bool same_copies(settings const& s, operand_role role) {
  auto const row = format_of(s, role, operand_usage::rowwise);
  auto const col = format_of(s, role, operand_usage::columnwise);
  if (row != col) return false;
  return row.scale == scale_kind::none || row.scale == scale_kind::per_tensor ||
         row.block_rows == row.block_cols;
}

/// True where a recipe changes GEMM operands at all (every recipe but fp32 and fp64).
constexpr bool rounds_operands(settings const& s) {
  return s.recipe != recipe_id::fp32 && s.recipe != recipe_id::fp64;
}

}  // namespace megamoe::precision
