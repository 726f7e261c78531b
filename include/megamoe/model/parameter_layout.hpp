// SPDX-License-Identifier: Apache-2.0
// megamoe/model/parameter_layout.hpp — how the model's parameters are named, cut and numbered:
// the reference's names (`decoder.layers.{i}`, `mtp.layers.{k}.transformer_layer`), how each
// module's parameter is cut over its tensor-parallel group (TP for attention, the dense FFN, the
// embedding and the output layer; ETP for the experts), and from the cut, the parameter's kind and
// where each element of a rank's piece lies in the whole parameter. Every module says the cut of
// each parameter it holds, so nothing here reads a name: a parallel mapping draws the same initial
// weights, saves the same rectangles and exports the same whole tensors as one rank.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/tensor.hpp>

#include <concepts>
#include <cstdint>
#include <string>
#include <utility>

namespace megamoe {

/// The rows of a [whole, H] vocabulary table one rank holds: ids [first, first + rows). With
/// tensor parallelism the padded vocabulary (`padded_vocabulary`) is cut into equal parts and a
/// rank holds the real ids of its part (fewer, or none, at the end).
struct vocabulary_shard {
  int first = 0, rows = 0, whole = 0;
  int part_rows = 0;  // the padded part every rank has (rows of real ids fill it, or fewer)

  /// All of a vocabulary of `size`.
  static constexpr vocabulary_shard all(int size) noexcept { return {0, size, size, size}; }
  /// Part `part` of `parts` of `size` ids padded to a multiple of `multiple` * `parts`.
  static constexpr vocabulary_shard part_of(int size, int multiple, int parts, int part) noexcept {
    int const step = multiple * parts, padded = (size + step - 1) / step * step;
    int const first = padded / parts * part, last = padded / parts * (part + 1);
    int const real_last = last < size ? last : size;
    return {first, real_last > first ? real_last - first : 0, size, padded / parts};
  }
  [[nodiscard]] constexpr bool holds(std::int32_t id) const noexcept {
    return id >= first && id < first + rows;
  }
};

/// How a parameter is cut over the ranks of its tensor-parallel group.
enum class parameter_cut {
  norm,             // a norm's weight: whole on every rank, never held as codes, starts at 1
  whole,            // a linear weight whole on every rank (MLA's down projections, MTP's eh_proj)
  rows,             // output rows in equal parts (column-parallel: linear_qkv, the up projections)
  columns,          // input columns in equal parts (row-parallel: linear_proj, fc2)
  swiglu_rows,      // fc1 of a SwiGLU: equal parts of the gate's rows and of the linear's rows
  vocabulary_rows,  // the embedding's and output layer's rows: vocabulary parts (vocabulary_shard)
};

/// Whether the parameter is a linear weight (what a module under memory::quantized_weights holds as
/// codes, and what initialization draws).
constexpr bool is_linear_weight(parameter_cut cut) noexcept {
  return cut != parameter_cut::norm;
}

/// A module reports each parameter as f(name, value, grad, cut); a visitor that does not take the
/// cut (a test reading values) is called as f(name, value, grad).
template <class F, class Name, class Map>
void report_parameter(F&& f, Name&& name, Map value, Map grad, parameter_cut cut) {
  if constexpr (std::invocable<F&, Name, Map, Map, parameter_cut>)
    f(std::forward<Name>(name), value, grad, cut);
  else
    f(std::forward<Name>(name), value, grad);
}

/// Where a rank stands in the group a parameter is cut over: part `part` of `parts`, and (for
/// parameter_cut::vocabulary_rows) its ids of the vocabulary.
struct cut_position {
  int parts = 1, part = 0;
  vocabulary_shard vocabulary{};
};

/// The kind of a parameter of cut `cut` over `position` (parts above 1 shard it), held as codes or
/// not; an expert's (ETP) is parameter_kind::expert whatever its cut.
constexpr parameter_kind kind_of(parameter_cut cut, cut_position const& position,
                                 bool held_as_codes) noexcept {
  bool const sharded =
      position.parts > 1 && cut != parameter_cut::norm && cut != parameter_cut::whole;
  parameter_kind const kind = sharded ? parameter_kind::tensor_parallel : parameter_kind::dense;
  return held_as_codes && is_linear_weight(cut) ? quantized_kind_of(kind) : kind;
}

/// Where the elements of a rank's [rows, cols] piece of a parameter of cut `cut` lie in the whole
/// parameter.
constexpr element_numbering numbering_of(parameter_cut cut, std::int64_t rows, std::int64_t cols,
                                         cut_position const& position) noexcept {
  std::int64_t const parts = position.parts, part = position.part;
  element_numbering n{cols};
  if (parts == 1) return n;
  switch (cut) {
    case parameter_cut::norm:
    case parameter_cut::whole: break;
    case parameter_cut::rows:
      n.first_row = part * rows;
      n.global_rows = rows * parts;
      break;
    case parameter_cut::columns:
      n.global_cols = cols * parts;
      n.col_offset = part * cols;
      break;
    case parameter_cut::swiglu_rows: {  // the gate's rows, then the linear's
      std::int64_t const half = rows / 2, whole_half = half * parts;
      n.half_rows = half;
      n.first_row = part * half;
      n.second_row = whole_half + part * half;
      n.global_rows = 2 * whole_half;
      break;
    }
    case parameter_cut::vocabulary_rows:
      n.first_row = position.vocabulary.first;
      n.global_rows = position.vocabulary.whole;
      break;
  }
  return n;
}

/// The reference's name of layer `layer`: `decoder.layers.{layer}`, or past the decoder's
/// `decoder_layers` (a model with multi-token prediction; -1: none) depth k's
/// `mtp.layers.{k}.transformer_layer` (layer decoder_layers + k).
MEGAMOE_DECL std::string layer_prefix(int layer, int decoder_layers = -1);
/// The prefix of an MoE layer's parameters: `<layer_prefix>.mlp.`.
MEGAMOE_DECL std::string moe_parameter_prefix(int layer, int decoder_layers = -1);

/// Draws `value` from N(0, std^2) as a function of (seed + the parameter's number, the element's
/// number in the whole parameter), so every mapping draws the same; a bias is 0.
template <class T>
void draw_parameter(row_matrix_map<T> value, std::uint64_t seed, std::uint64_t index,
                    element_numbering const& numbering, double std, bool bias = false) {
  for (Eigen::Index r = 0; r < value.rows(); ++r)
    for (Eigen::Index c = 0; c < value.cols(); ++c)
      value(r, c) =
          bias ? T(0) : static_cast<T>(std * standard_normal(seed + index, numbering.global(r, c)));
}

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/parameter_layout.ipp>
#endif
