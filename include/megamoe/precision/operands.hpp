// SPDX-License-Identifier: Apache-2.0
// megamoe/precision/operands.hpp — a recipe's GEMM operands for grouped experts: each expert's
// slice quantized on its own (its own per-tensor scale or NVFP4 amax, blocks that never straddle
// two experts), the codes kept, and the values the GEMMs read dequantized into shared workspaces.
//
//   grouped_operands<Recipe>    the hooks expert::grouped_mlp calls before each of its six GEMMs
//                               (each matrix through precision::quantize<F>, quantize.hpp), over
//                               grouped_operand_state: what is kept (operand_state.hpp)
//
// Why dequantize: the fp32 kernels multiply fp32 values, and every dequantized value (code times
// scale, one fp32 multiply) is exactly what the reference's GEMM multiplies; so "dequantize, then
// an fp32 GEMM with fp32 accumulation" is the recipe's GEMM up to summation order. Scales applied
// per K-block inside the product pay off only on a unit that multiplies the codes themselves (the
// AMX tile backend).
//
// What backward needs is kept as codes: the wgrad copies of both GEMM inputs (X of fc1 and the
// weighted activation of fc2) and the fc1 output in BF16. The weights' copies are quantized once
// per forward from the fp32 master weights.
#pragma once

#include <megamoe/core/buffer.hpp>
#include <megamoe/core/by_need.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/expert/tags.hpp>
#include <megamoe/precision/formats.hpp>
#include <megamoe/precision/operand_state.hpp>
#include <megamoe/precision/quantize.hpp>
#include <megamoe/precision/recipe.hpp>
#include <megamoe/precision/scaling.hpp>
#include <megamoe/precision/tags.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace megamoe::precision {

/// A recipe's operands for E grouped experts (rows grouped by expert, weights [E, out, in]). The
/// hooks are the ones expert::grouped_mlp calls; each returns what its GEMM reads. Per-tensor
/// scales come from each expert's amax after `AmaxReduction` (called on the calling thread with
/// one amax per expert) took the largest over the ranks that quantize parts of one tensor, as the
/// reference reduces amaxes over a sequence-parallel group. With `QuantizedActivations` fc1's
/// output (the activation's input, kept for backward) is kept in the recipe's rowwise input format
/// instead of BF16, as DeepSeek-V3 caches the SwiGLU input in FP8 (memory::quantized_activations).
/// With `QuantizedWeights` the weights' codes are the primary weights (memory::quantized_weights):
/// store_weights() quantizes them once per optimizer step and forward only dequantizes them.
/// With `CodesOnWire` fc1's input arrives as codes (dispatch::fp8_wire): the senders quantized each
/// row, with the expert's per-tensor scale or in the row's own blocks, and arrive_codes() hands
/// over the codes (and, per-tensor, each expert's amax).
template <class Recipe, class AmaxReduction = no_amax_reduction, bool QuantizedActivations = false,
          bool QuantizedWeights = false, bool CodesOnWire = false>
class grouped_operands : public grouped_operand_state<Recipe, QuantizedActivations> {
  using kept = grouped_operand_state<Recipe, QuantizedActivations>;

 public:
  static constexpr settings recipe = Recipe::value;
  static_assert(rounds_operands(recipe), "grouped_operands: fp32 and fp64 keep their operands");
  using role = operand_role;
  using usage = operand_usage;
  static constexpr operand_format input_row = format_of(recipe, role::input, usage::rowwise);
  static constexpr operand_format input_col = format_of(recipe, role::input, usage::columnwise);
  static constexpr operand_format weight_row = format_of(recipe, role::weight, usage::rowwise);
  static constexpr operand_format weight_col = format_of(recipe, role::weight, usage::columnwise);
  static constexpr operand_format grad_row = format_of(recipe, role::grad, usage::rowwise);
  static constexpr operand_format grad_col = format_of(recipe, role::grad, usage::columnwise);
  /// wgrad copies through the Hadamard transform span whole 16-token chunks: their GEMM runs over
  /// the padded rows of each expert (zero rows before the transform).
  static constexpr bool padded_wgrad = input_col.hadamard;
  static_assert(input_col.hadamard == grad_col.hadamard,
                "both wgrad operands go through the same transform or neither");
  static constexpr int padding = recipe.padding_multiple > 1 ? recipe.padding_multiple : 1;
  /// Whether codes made before the dispatch equal the ones input() makes: one per-tensor FP8 copy
  /// serves fprop and wgrad (fp8_delayed, fp8_current), or the rowwise copy's blocks lie within a
  /// row and the wgrad copy is made from it (wgrad_from_rowwise<mxfp8 or fp8_blockwise>).
  static constexpr bool per_tensor_codes_travel =
      input_row.scale == scale_kind::per_tensor && same_copies(recipe, role::input) &&
      (input_row.element == element_kind::e4m3 || input_row.element == element_kind::e5m2);
  static constexpr bool row_codes_travel = row_local_blocks<input_row> && recipe.wgrad_from_rowwise;
  static constexpr bool codes_travel = per_tensor_codes_travel || row_codes_travel;
  static_assert(!CodesOnWire || codes_travel,
                "megamoe[R055]: dispatch::fp8_wire needs a per-tensor FP8 recipe "
                "(precision::fp8_tensorwise<delayed or current>) or "
                "precision::wgrad_from_rowwise<mxfp8 or fp8_blockwise>");
  static_assert(!recipe.wgrad_from_rowwise || row_local_blocks<input_row>,
                "megamoe[R056]: precision::wgrad_from_rowwise applies to precision::mxfp8 and "
                "precision::fp8_blockwise");
  /// Bytes of one row of fc1's input as it crosses the wire: its codes, and under block scales
  /// the row's scales after them.
  static constexpr std::size_t wire_row_bytes(int cols) {
    if constexpr (row_codes_travel)
      return row_bytes<input_row>(cols);
    else
      return static_cast<std::size_t>(cols);
  }

  /// `experts` experts; `seed` drives stochastic rounding.
  explicit grouped_operands(int experts, std::uint64_t seed = 0,
                            AmaxReduction reduction = AmaxReduction{})
      : kept(experts, seed),
        reduction_(reduction),
        scales_(static_cast<std::size_t>(experts), 1.0F),
        amax_(static_cast<std::size_t>(experts), 0.0F),
        padded_offsets_(static_cast<std::size_t>(experts) + 1, 0) {
    for (auto& u : units_) u.assign(static_cast<std::size_t>(experts), 1.0F);
  }

  /// The workspaces the dequantized operands go to (shared by the layers of a model): two of
  /// rows x columns, one of weights. Call before every forward and backward.
  void bind(thread_pool& pool, buffer<float>& rows_a, buffer<float>& rows_b,
            buffer<float>& weights) {
    pool_ = &pool;
    rows_a_ = &rows_a;
    rows_b_ = &rows_b;
    weights_ = &weights;
  }

  // --- fc1's input as codes from the wire (CodesOnWire) -----------------------------------------

  /// Current scaling's scale of fc1's input for an expert whose input has amax `amax`, as input()
  /// computes it.
  static float current_input_scale(float amax) {
    return scale_from_amax(amax, max_of(input_row.element));
  }
  /// Delayed scaling's scale of local expert e's fc1 input this step (fixed until end_of_step).
  [[nodiscard]] float delayed_input_scale(int e) const {
    return delayed_[index(expert::linear::fc1)][static_cast<std::size_t>(role::input)]
                   [static_cast<std::size_t>(e)]
                       .scale;
  }
  /// fc1's input codes of the coming forward, [N, wire_row_bytes(cols)] grouped by local expert as
  /// its rows: per-tensor codes, each expert's with the scale its amax (over every sender's rows,
  /// `amax` [local experts]) gives; or each row's block codes and scales (`amax` empty). Both must
  /// stay until the forward has run.
  void arrive_codes(std::uint8_t const* code_rows,
                    std::span<float const> amax) requires CodesOnWire {
    wire_codes_ = code_rows;  // null when no row arrives
    wire_amax_ = amax;
    codes_arrived_ = true;
  }

  // --- Hooks of expert::grouped_mlp -------------------------------------------------------------

  /// fprop input [N, cols] of `layer`: quantizes the rowwise copy and keeps the wgrad copy;
  /// returns the dequantized rowwise copy. With CodesOnWire fc1's copy is the codes that arrived.
  float const* input(expert::linear layer, float const* x, int cols,
                     std::span<std::int64_t const> offsets, int first, int last) {
    auto const l = index(layer);
    float* out = rows_a_->reserve(rows_of(offsets, last) * static_cast<std::size_t>(cols));
    if constexpr (CodesOnWire)
      if (layer == expert::linear::fc1) return input_from_wire(l, cols, offsets, first, last, out);
    prepare_scales<input_row>(l, role::input, first, last, rows_of_expert(x, cols, offsets));
    for_experts(first, last, [&](int e) {
      auto [off, n] = slice(offsets, e);
      float const scale = scales_[static_cast<std::size_t>(e)];
      auto& row = held(l, role::input, usage::rowwise, e);
      quantize<input_row>(x + off * cols, static_cast<int>(n), cols, scale, 0, row);
      dequantize_rows_into<input_row>(slot::rows_a, e, row, out + off * cols);
      if constexpr (!same_copies(recipe, role::input))
        quantize_columnwise<input_col>(
            recipe.wgrad_from_rowwise ? out + off * cols : x + off * cols, static_cast<int>(n),
            cols, scale, 0, codes(l, role::input, usage::columnwise, e));
    });
    return out;
  }

  /// The weights [E, rows, cols] of `layer` for fprop (rowwise) or dgrad (columnwise), dequantized
  /// into the weight workspace. The rowwise call (forward) quantizes both copies from the master
  /// weights `w` (with QuantizedWeights: dequantizes the stored codes, `w` unused); the columnwise
  /// call (backward) dequantizes the copy kept since.
  float const* weight(expert::linear layer, usage u, float const* w, int rows, int cols, int first,
                      int last) {
    auto const l = index(layer);
    auto const size = static_cast<std::ptrdiff_t>(rows) * cols;
    float* out =
        weights_->reserve(static_cast<std::size_t>(experts_) * static_cast<std::size_t>(size));
    if constexpr (!QuantizedWeights) {
      if (u == usage::rowwise) {
        store_weights_into(layer, w + first * size, rows, cols, first, last, out);
        return out;
      }
    }
    for_experts(first, last, [&](int e) {
      float* oe = out + e * size;
      if (u == usage::rowwise || same_copies(recipe, role::weight)) {
        dequantize_rows_into<weight_row>(slot::weights, e,
                                         codes(l, role::weight, usage::rowwise, e), oe);
      } else {
        dequantize_columnwise_into<weight_col>(
            slot::weights, e, codes(l, role::weight, usage::columnwise, e), rows, oe);
      }
    });
    return out;
  }

  /// Quantizes both copies of experts [first, last)'s weights of `layer` from their fp32 values
  /// `w` (expert `first`'s [rows, cols], the others following); with `out`, also writes the
  /// rowwise copy's values there, expert e at e * rows * cols. Per-tensor scales are reduced over
  /// AmaxReduction's group, so with one that communicates every rank of it calls this together.
  /// Runs on the calling thread (an optimizer's step may come after the bound pool is gone).
  void store_weights(expert::linear layer, float const* w, int rows, int cols, int first,
                     int last) {
    // Unbound for the call, bound again however it ends (an amax reduction may throw).
    struct rebind {
      thread_pool*& slot;
      thread_pool* pool;
      ~rebind() { slot = pool; }
    } const unbound{pool_, std::exchange(pool_, nullptr)};
    store_weights_into(layer, w, rows, cols, first, last, nullptr);
  }

  /// The per-tensor factor (tensor_factor) of expert e's values in workspace `b` as the last hook
  /// that wrote them left them (expert::gemm_problem::a_unit, b_unit).
  [[nodiscard]] float unit(expert::operand_buffer b, int e) const {
    return units_[static_cast<std::size_t>(b)][static_cast<std::size_t>(e)];
  }

  /// fc1's output [N, cols] after its bias: rounded to BF16 in place (what the reference's BF16
  /// GEMM output holds) and kept for backward, as BF16 or (QuantizedActivations) as codes.
  void fc1_output(float* h, int cols, std::span<std::int64_t const> offsets, int first, int last) {
    if constexpr (!QuantizedActivations)
      fc1_bf16_.resize(std::max(fc1_bf16_.size(), rows_of(offsets, last) * cols));
    for_elements_of_rows(offsets, cols, first, last, [&](std::size_t i) {
      std::uint16_t const bits = to_bf16_bits(h[i]);
      if constexpr (!QuantizedActivations) fc1_bf16_[i] = bits;
      h[i] = from_bf16_bits(bits);
    });
    if constexpr (QuantizedActivations) {
      prepare_scales<input_row>(fc1_output_slot, role::input, first, last,
                                rows_of_expert(h, cols, offsets));
      for_experts(first, last, [&](int e) {
        auto [off, n] = slice(offsets, e);
        quantize<input_row>(h + off * cols, static_cast<int>(n), cols,
                            scales_[static_cast<std::size_t>(e)], 0,
                            fc1_output_codes_[static_cast<std::size_t>(e)]);
      });
    }
  }

  /// The kept fc1 output, restored into `h` [N, cols].
  float* saved_fc1_output(float* h, int cols, std::span<std::int64_t const> offsets, int first,
                          int last) {
    if constexpr (QuantizedActivations) {
      for_experts(first, last, [&](int e) {
        dequantize_rows<input_row>(fc1_output_codes_[static_cast<std::size_t>(e)],
                                   h + slice(offsets, e).first * cols);
      });
    } else {
      for_elements_of_rows(offsets, cols, first, last,
                           [&](std::size_t i) { h[i] = from_bf16_bits(fc1_bf16_[i]); });
    }
    return h;
  }

  /// dgrad's output gradient [N, cols] of `layer`: the dequantized rowwise copy (stochastic
  /// rounding where the recipe says).
  float const* grad(expert::linear layer, float const* g, int cols,
                    std::span<std::int64_t const> offsets, int first, int last) {
    auto const l = index(layer);
    float* out = rows_a_->reserve(rows_of(offsets, last) * static_cast<std::size_t>(cols));
    prepare_scales<grad_row>(l, role::grad, first, last, rows_of_expert(g, cols, offsets));
    grad_scales_[l] = scales_;  // wgrad's copy of this gradient takes the same scales
    for_experts(first, last, [&](int e) {
      auto [off, n] = slice(offsets, e);
      float const scale = scales_[static_cast<std::size_t>(e)];
      auto& row = held(l, role::grad, usage::rowwise, e);
      quantize<grad_row>(g + off * cols, static_cast<int>(n), cols, scale, seed_of(l, e, 0), row);
      dequantize_rows_into<grad_row>(slot::rows_a, e, row, out + off * cols);
    });
    return out;
  }

  /// wgrad's two operands of `layer`, called after its grad() with only weight() between: the
  /// gradient's wgrad copy (where the recipe's copies are the same, the values grad() left in the
  /// first workspace; else quantized from `g` [N, grad_cols] with grad()'s scales) and the input's
  /// copy kept since forward; each grouped by expert with the returned offsets (padded where the
  /// transform needs whole chunks).
  struct wgrad_operands {
    float const* grad;
    float const* input;
    std::span<std::int64_t const> offsets;
  };
  wgrad_operands wgrad(expert::linear layer, float const* g, int grad_cols,
                       float const* /*kept as codes*/, int input_cols,
                       std::span<std::int64_t const> offsets, int first, int last) {
    auto const l = index(layer);
    std::span<std::int64_t const> rows = offsets;
    if constexpr (padded_wgrad) {
      for (std::size_t e = 0; e < static_cast<std::size_t>(experts_); ++e)
        padded_offsets_[e + 1] =
            padded_offsets_[e] + pad_rows(offsets[e + 1] - offsets[e], padding);
      rows = padded_offsets_;
    }
    // Same copies: grad() already left the dequantized gradient here, in this layout.
    float* grad_out = rows_a_->reserve(rows_of(rows, last) * static_cast<std::size_t>(grad_cols));
    float* input_out = rows_b_->reserve(rows_of(rows, last) * static_cast<std::size_t>(input_cols));
    for_experts(first, last, [&](int e) {
      auto const off = rows[static_cast<std::size_t>(e)];
      auto const n = static_cast<int>(rows[static_cast<std::size_t>(e) + 1] - off);
      if constexpr (!same_copies(recipe, role::grad)) {
        auto [source_off, source_n] = slice(offsets, e);
        float const* ge = g + source_off * grad_cols;
        float const scale = grad_scales_[l][static_cast<std::size_t>(e)];
        auto& q = held(l, role::grad, usage::columnwise, e);
        quantize_columnwise<grad_col>(ge, static_cast<int>(source_n), grad_cols, scale,
                                      seed_of(l, e, 1), q);
        dequantize_columnwise_into<grad_col>(slot::rows_a, e, q, n, grad_out + off * grad_cols);
      }
      if constexpr (same_copies(recipe, role::input)) {
        dequantize_rows_into<input_row>(slot::rows_b, e, codes(l, role::input, usage::rowwise, e),
                                        input_out + off * input_cols);
      } else {
        dequantize_columnwise_into<input_col>(slot::rows_b, e,
                                              codes(l, role::input, usage::columnwise, e), n,
                                              input_out + off * input_cols);
      }
    });
    return {grad_out, input_out, rows};
  }

 private:
  using kept::codes;
  using kept::delayed_;
  using kept::experts_;
  using kept::fc1_bf16_;
  using kept::fc1_output_codes_;
  using kept::fc1_output_slot;
  using kept::index;
  using kept::keep_all_;
  using kept::recording_;
  using kept::seed_of;

  /// store_weights on the bound pool, also writing the rowwise copy's values at `out` (expert e at
  /// e * rows * cols) where given.
  void store_weights_into(expert::linear layer, float const* w, int rows, int cols, int first,
                          int last, float* out) {
    auto const l = index(layer);
    auto const size = static_cast<std::ptrdiff_t>(rows) * cols;
    prepare_scales<weight_row>(l, role::weight, first, last, [&](int e) {
      return std::span<float const>(w + (e - first) * size, static_cast<std::size_t>(size));
    });
    for_experts(first, last, [&](int e) {
      float const* we = w + (e - first) * size;
      float const scale = scales_[static_cast<std::size_t>(e)];
      auto& row = codes(l, role::weight, usage::rowwise, e);
      quantize<weight_row>(we, rows, cols, scale, 0, row);
      if (out != nullptr) dequantize_rows_into<weight_row>(slot::weights, e, row, out + e * size);
      if constexpr (!same_copies(recipe, role::weight))
        quantize_columnwise<weight_col>(we, rows, cols, scale, 0,
                                        codes(l, role::weight, usage::columnwise, e));
    });
  }

  using slot = expert::operand_buffer;
  /// Expert e's values in workspace b from q (rowwise / columnwise), and their per-tensor factor
  /// for unit(b, e): the factor always comes with the values it divides.
  template <operand_format F>
  void dequantize_rows_into(slot b, int e, quantized_matrix const& q, float* out) {
    dequantize_rows<F>(q, out);
    units_[static_cast<std::size_t>(b)][static_cast<std::size_t>(e)] = tensor_factor<F>(q);
  }
  template <operand_format F>
  void dequantize_columnwise_into(slot b, int e, quantized_matrix const& q, int rows, float* out) {
    dequantize_columnwise<F>(q, rows, out);
    units_[static_cast<std::size_t>(b)][static_cast<std::size_t>(e)] = tensor_factor<F>(q);
  }

  /// Where a copy goes: the layer's own storage for what backward needs (the weights' copies, the
  /// inputs' wgrad copies) or everything under keep_all_codes; else a per-thread scratch.
  quantized_matrix& held(std::size_t l, role r, usage u, int e) {
    bool const needed = r == role::weight ||
                        (r == role::input && (u == usage::columnwise || same_copies(recipe, r)));
    if (needed || keep_all_) return codes(l, r, u, e);
    thread_local quantized_matrix transient;
    return transient;
  }

  static std::size_t rows_of(std::span<std::int64_t const> offsets, int last) {
    return static_cast<std::size_t>(offsets[static_cast<std::size_t>(last)]);
  }
  static std::pair<std::ptrdiff_t, std::ptrdiff_t> slice(std::span<std::int64_t const> offsets,
                                                         int e) {
    auto const off = offsets[static_cast<std::size_t>(e)];
    return {static_cast<std::ptrdiff_t>(off),
            static_cast<std::ptrdiff_t>(offsets[static_cast<std::size_t>(e) + 1] - off)};
  }

  /// body(i) for every element i of the rows of experts [first, last) of an [N, cols] tensor,
  /// split over the pool by rows.
  template <class Body>
  void for_elements_of_rows(std::span<std::int64_t const> offsets, int cols, int first, int last,
                            Body const& body) {
    auto const from = static_cast<std::size_t>(offsets[static_cast<std::size_t>(first)]);
    auto const count = static_cast<int>(rows_of(offsets, last) - from);
    auto const width = static_cast<std::size_t>(cols);
    parallel_rows(*pool_, count, [&](int b, int e) {
      for (auto i = (from + static_cast<std::size_t>(b)) * width;
           i < (from + static_cast<std::size_t>(e)) * width; ++i)
        body(i);
    });
  }

  template <class Body>
  void for_experts(int first, int last, Body const& body) {
    if (pool_ == nullptr) {
      for (int e = first; e < last; ++e) body(e);
      return;
    }
    pool_->run(last - first, [&](int i) { body(first + i); });
  }

  /// Expert e's rows of a grouped [N, cols] tensor.
  static auto rows_of_expert(float const* v, int cols, std::span<std::int64_t const> offsets) {
    return [=](int e) {
      auto [off, n] = slice(offsets, e);
      return std::span<float const>(v + off * cols, static_cast<std::size_t>(n * cols));
    };
  }

  /// scales_[e] for experts [first, last) of a tensor in format F, `values(e)` being expert e's
  /// part: for per-tensor formats the amaxes (over the pool), reduced over the group on the calling
  /// thread, then current scaling's fp8_max / amax or delayed scaling's stored scale (recording the
  /// amax); nothing for the other formats.
  template <operand_format F, class Values>
  void prepare_scales(std::size_t l, role r, int first, int last, Values const& values) {
    if constexpr (F.scale == scale_kind::per_tensor) {
      for_experts(first, last,
                  [&](int e) { amax_[static_cast<std::size_t>(e)] = amax_of(values(e)); });
      reduction_(std::span<float>(amax_).subspan(static_cast<std::size_t>(first),
                                                 static_cast<std::size_t>(last - first)));
      scales_from_amaxes<F>(l, r, first, last);
    }
  }

  /// scales_[e] from amax_[e] for experts [first, last): current scaling's, or delayed scaling's
  /// stored one with the amax recorded.
  template <operand_format F>
  void scales_from_amaxes(std::size_t l, role r, int first, int last) {
    if constexpr (F.scale == scale_kind::per_tensor) {
      for (int e = first; e < last; ++e) {
        float const amax = amax_[static_cast<std::size_t>(e)];
        if constexpr (recipe.recipe == recipe_id::fp8_delayed) {
          auto& state = delayed_[l][static_cast<std::size_t>(r)][static_cast<std::size_t>(e)];
          if (recording_) state.record(amax);
          scales_[static_cast<std::size_t>(e)] = state.scale;
        } else {
          scales_[static_cast<std::size_t>(e)] = scale_from_amax(amax, max_of(F.element));
        }
      }
    }
  }

  /// fc1's input copy from the codes that arrived, as input() would have made it. Per-tensor: each
  /// expert's amax (already every sender's) and scale, its codes kept, its values dequantized.
  /// Row-local blocks: each row's codes and scales, its values dequantized, and the wgrad copy
  /// quantized from them (wgrad_from_rowwise).
  float* input_from_wire(std::size_t l, int cols, std::span<std::int64_t const> offsets, int first,
                         int last, float* out) {
    if (!codes_arrived_ ||
        (per_tensor_codes_travel && wire_amax_.size() < static_cast<std::size_t>(last)))
      throw std::logic_error("grouped_operands: fc1's input codes have not arrived");
    if constexpr (per_tensor_codes_travel) {
      for (int e = first; e < last; ++e)
        amax_[static_cast<std::size_t>(e)] = wire_amax_[static_cast<std::size_t>(e)];
      scales_from_amaxes<input_row>(l, role::input, first, last);
    }
    auto const width = static_cast<std::ptrdiff_t>(wire_row_bytes(cols));
    for_experts(first, last, [&](int e) {
      auto [off, n] = slice(offsets, e);
      auto& q = held(l, role::input, usage::rowwise, e);
      auto const* from = wire_codes_ + off * width;
      if constexpr (per_tensor_codes_travel) {
        q.rows = static_cast<int>(n);
        q.cols = cols;
        q.codes.assign(from, from + n * cols);
        q.scale_inv.assign(1, 1.0F / scales_[static_cast<std::size_t>(e)]);
        q.scale_codes.clear();
        q.global_amax = 0.0F;
        q.has_global_amax = false;
      } else {
        rows_from_bytes<input_row>(from, static_cast<int>(n), cols, q);
      }
      dequantize_rows_into<input_row>(slot::rows_a, e, q, out + off * cols);
      if constexpr (!same_copies(recipe, role::input))  // wgrad_from_rowwise: from the values
        quantize_columnwise<input_col>(out + off * cols, static_cast<int>(n), cols, 1.0F, 0,
                                       codes(l, role::input, usage::columnwise, e));
    });
    return out;
  }

  /// Writes q's values row-major [rows, cols] at out.
  template <operand_format F>
  static void dequantize_rows(quantized_matrix const& q, float* out) {
    int const cols = q.cols;
    dequantize<F>(
        q, [&](int r, int c, float v) { out[static_cast<std::ptrdiff_t>(r) * cols + c] = v; });
  }

  /// The columnwise copy of x [n, cols]: the transpose [cols, pad(n)] (zero rows appended, passed
  /// through the 16-point Hadamard transform where F says), quantized along the token dimension.
  template <operand_format F>
  void quantize_columnwise(float const* x, int n, int cols, float scale, std::uint64_t seed,
                           quantized_matrix& q) {
    int const padded = static_cast<int>(pad_rows(n, F.hadamard ? std::max(padding, 16) : 1));
    thread_local std::vector<float> source;
    source.assign(static_cast<std::size_t>(padded) * static_cast<std::size_t>(cols), 0.0F);
    detail::transpose_into(x, n, cols, cols, source.data(), padded);
    if constexpr (F.hadamard) rht16_bf16(source);
    quantize<F>(source.data(), cols, padded, scale, seed, q);
  }

  /// The columnwise copy q [cols, rows] back in the tensor's layout [rows, cols] at out (rows may
  /// be fewer than q holds where no transform mixed the padding in).
  template <operand_format F>
  static void dequantize_columnwise(quantized_matrix const& q, int rows, float* out) {
    int const cols = q.rows;
    thread_local std::vector<float> values;
    values.resize(static_cast<std::size_t>(q.rows) * static_cast<std::size_t>(q.cols));
    dequantize<F>(q, [&](int c, int r, float v) {
      values[static_cast<std::size_t>(c) * static_cast<std::size_t>(q.cols) +
             static_cast<std::size_t>(r)] = v;
    });
    detail::transpose_into(values.data(), cols, rows, q.cols, out, cols);
  }

  AmaxReduction reduction_;
  std::vector<float> scales_, amax_;               // [E]: of the tensor being quantized
  std::array<std::vector<float>, 2> grad_scales_;  // [linear][E]: from grad(), for wgrad()
  thread_pool* pool_ = nullptr;
  buffer<float>* rows_a_ = nullptr;
  buffer<float>* rows_b_ = nullptr;
  buffer<float>* weights_ = nullptr;
  std::array<std::vector<float>, 3> units_;  // [operand_buffer][E]: tensor_factor of the values
  std::vector<std::int64_t> padded_offsets_;
  std::uint8_t const* wire_codes_ = nullptr;  // CodesOnWire: fc1's input codes of the forward
  std::span<float const> wire_amax_;          // and each local expert's amax
  bool codes_arrived_ = false;
};

}  // namespace megamoe::precision

namespace megamoe::by_need {
/// This header is included.
template <class Dependent>
inline constexpr bool included<module::recipe_operands, Dependent> = true;
}  // namespace megamoe::by_need
