// SPDX-License-Identifier: Apache-2.0
// megamoe/precision/tags.hpp — precision recipes (tags and parameters only).
//
//   precision::fp64                              finite-difference checks run the production code
//   precision::fp32                              the default
//   precision::bf16                              fp32 master weights, bf16 GEMM operands
//   precision::fp8_tensorwise<precision::delayed>    per-tensor FP8, delayed scaling (history 1)
//   precision::fp8_tensorwise<precision::current>    per-tensor FP8, current scaling
//   precision::fp8_blockwise                     1x128 activations / 128x128 weights, pow-2 scales
//   precision::mxfp8                             1x32 blocks, E8M0 scales
//   precision::nvfp4                             E2M1 with two-level scales
//   precision::wgrad_from_rowwise<R>             R (mxfp8, fp8_blockwise) with the inputs' wgrad
//                                                copies made from their rowwise codes
//
// Bit-exact definitions: docs/spec/precision.md of the design documents.
#pragma once

#include <megamoe/policy/policy.hpp>
#include <megamoe/policy/rule_ids.hpp>

#include <string_view>

namespace megamoe::precision {

/// The kind of the `precision` slot.
struct kind {};

enum class recipe_id { fp64, fp32, bf16, fp8_delayed, fp8_current, fp8_blockwise, mxfp8, nvfp4 };
/// `fp8`: HYBRID is E4M3 forward and E5M2 for gradients; e4m3 uses E4M3 everywhere.
enum class fp8_format { none, hybrid, e4m3 };
/// `fp8_amax_compute_algo`.
enum class amax_compute { max, most_recent };

/// Every choice of a recipe, as plain values.
struct settings {
  recipe_id recipe = recipe_id::fp32;
  fp8_format format = fp8_format::none;
  int padding_multiple = 1;  // rows per expert are padded to this for quantized GEMMs
  int amax_history_len = 0;  // delayed scaling only
  amax_compute amax_algo = amax_compute::most_recent;
  int margin = 0;  // delayed scaling only
  /// The inputs' wgrad copies are quantized from the values of their rowwise codes, not from the
  /// inputs (precision::wgrad_from_rowwise).
  bool wgrad_from_rowwise = false;
  friend constexpr bool operator==(settings const&, settings const&) = default;
};

/// The tensors of a linear layer's three GEMMs (docs/spec/precision.md §3): the input X, the weight
/// W and the output gradient G.
enum class operand_role { input, weight, grad };
/// Which copy of a tensor a GEMM reads: rowwise (fprop's X and W, dgrad's G: blocks along the
/// tensor's last dimension) or columnwise (wgrad's X and G, dgrad's W: blocks along the first).
enum class operand_usage { rowwise, columnwise };

/// True for the FP8 and FP4 recipes (quantized GEMM operands with scales).
constexpr bool is_quantized(recipe_id r) {
  return r != recipe_id::fp64 && r != recipe_id::fp32 && r != recipe_id::bf16;
}

namespace detail {
/// What every recipe but fp64 shares: fp32 master weights and fp32 accumulation.
struct fp32_master {
  using policy_kind = kind;
  using master_type = float;
  using accumulate_type = float;
};
}  // namespace detail

/// Everything in double precision: the same kernels, used for finite-difference gradient checks.
struct fp64 {
  using policy_kind = kind;
  using master_type = double;
  using accumulate_type = double;
  static constexpr std::string_view name = "fp64";
  static constexpr settings value{recipe_id::fp64};
};

/// fp32 weights, activations and GEMMs.
struct fp32 : detail::fp32_master {
  static constexpr std::string_view name = "fp32";
  static constexpr settings value{recipe_id::fp32};
};

/// fp32 master weights; GEMM operands rounded to bf16, fp32 accumulation; saved activations in
/// bf16.
struct bf16 : detail::fp32_master {
  static constexpr std::string_view name = "bf16";
  static constexpr settings value{recipe_id::bf16};
};

/// Delayed scaling: the scale comes from an amax history (the reference MoE setting: 1,
/// most_recent, 0).
template <int HistoryLength = 1, amax_compute Algo = amax_compute::most_recent, int Margin = 0>
struct delayed_scaling {
  static constexpr settings apply(settings s) {
    s.recipe = recipe_id::fp8_delayed;
    s.amax_history_len = HistoryLength;
    s.amax_algo = Algo;
    s.margin = Margin;
    return s;
  }
};
/// Current scaling: the scale comes from the tensor's own amax.
struct current_scaling {
  static constexpr settings apply(settings s) {
    s.recipe = recipe_id::fp8_current;
    return s;
  }
};
using delayed = delayed_scaling<>;
using current = current_scaling;

/// Per-tensor FP8 with the given scaling, HYBRID format by default.
template <class Scaling, fp8_format Format = fp8_format::hybrid>
  requires(Format != fp8_format::none)
struct fp8_tensorwise : detail::fp32_master {
  using scaling = Scaling;
  static constexpr std::string_view name = "fp8_tensorwise";
  static constexpr settings value = Scaling::apply(settings{recipe_id::fp8_current, Format, 16});
};

/// Blockwise FP8 (1x128 activations and gradients, 128x128 weights, power-of-2 scales).
struct fp8_blockwise : detail::fp32_master {
  static constexpr std::string_view name = "fp8_blockwise";
  static constexpr settings value{recipe_id::fp8_blockwise, fp8_format::e4m3, 16};
};

/// MXFP8: E4M3 elements in 1x32 blocks with E8M0 scales.
struct mxfp8 : detail::fp32_master {
  static constexpr std::string_view name = "mxfp8";
  static constexpr settings value{recipe_id::mxfp8, fp8_format::e4m3, 32};
};

/// NVFP4: E2M1 elements, E4M3 1x16 block scales and an fp32 tensor scale; 16x16 weight blocks,
/// random Hadamard transform and stochastic rounding as the reference recipe.
struct nvfp4 : detail::fp32_master {
  static constexpr std::string_view name = "nvfp4";
  static constexpr settings value{recipe_id::nvfp4, fp8_format::none, 128};
};

/// Recipe R (mxfp8 or fp8_blockwise) with each GEMM input's wgrad copy (blocks along the tokens)
/// quantized from the dequantized rowwise copy (blocks along the features) instead of from the
/// input: DeepSeek-V3's 1x128 to 128x1 requantization. The rowwise codes then carry everything
/// backward needs, so they can be made before the dispatch and cross the wire in place of the
/// tokens (dispatch::fp8_wire); the wgrad operand is rounded twice.
template <class R>
struct wgrad_from_rowwise : R {
  static_assert(R::value.recipe == recipe_id::mxfp8 || R::value.recipe == recipe_id::fp8_blockwise,
                MEGAMOE_RULE_R056);
  static constexpr std::string_view name = R::value.recipe == recipe_id::mxfp8
                                               ? "wgrad_from_rowwise<mxfp8>"
                                               : "wgrad_from_rowwise<fp8_blockwise>";
  static constexpr settings value = [] {
    settings s = R::value;
    s.wgrad_from_rowwise = true;
    return s;
  }();
};

constexpr std::string_view name_of(recipe_id r) {
  switch (r) {
    case recipe_id::fp64: return "fp64";
    case recipe_id::fp32: return "fp32";
    case recipe_id::bf16: return "bf16";
    case recipe_id::fp8_delayed: return "fp8_tensorwise<delayed>";
    case recipe_id::fp8_current: return "fp8_tensorwise<current>";
    case recipe_id::fp8_blockwise: return "fp8_blockwise";
    case recipe_id::mxfp8: return "mxfp8";
    case recipe_id::nvfp4: return "nvfp4";
  }
  return "?";
}

}  // namespace megamoe::precision
