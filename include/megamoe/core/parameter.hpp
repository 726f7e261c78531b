// SPDX-License-Identifier: Apache-2.0
// megamoe/core/parameter.hpp — what kind of parameter a weight is, which decides the group its
// gradient is reduced over, and where a rank's copy or shard of a parameter lies in the whole
// parameter (for initialisation and checkpoints).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace megamoe {

/// dense: replicated over the attention grid (TP x CP x DP); its gradient is summed over all of
/// it (TP ranks hold different sequence-parallel tokens) and scaled by 1/(DP*CP).
/// expert: an expert weight (or its ETP shard); summed over the expert data-parallel group and
/// scaled by 1/(DP*CP), as the reference does.
/// quantized_expert: an expert weight whose primary copy is a precision recipe's codes
/// (memory::quantized_weights); reduced as `expert`. Its value is the fp32 master while the layer
/// holds it (after initialize); once an optimizer took its shard of the master the layer keeps
/// only codes and the value is an empty map (0 rows).
/// tensor_parallel: a TP shard of an attention, dense-FFN, embedding or output-layer weight (TP
/// above 1): each TP rank holds different elements, so its gradient is summed over DP x CP only
/// and scaled by 1/(DP*CP).
/// quantized_dense, quantized_tensor_parallel: attention's or a dense FFN's linear weight (whole,
/// or its TP shard) whose primary copy is the recipe's codes; reduced as `dense` and
/// `tensor_parallel`, with values as for quantized_expert.
enum class parameter_kind {
  dense,
  expert,
  quantized_expert,
  tensor_parallel,
  quantized_dense,
  quantized_tensor_parallel
};
inline constexpr std::size_t parameter_kinds = 6;

/// Whether a parameter of kind k is held as a recipe's codes (its fp32 master in an optimizer).
constexpr bool holds_codes(parameter_kind k) noexcept {
  return k == parameter_kind::quantized_expert || k == parameter_kind::quantized_dense ||
         k == parameter_kind::quantized_tensor_parallel;
}
/// The kind whose group a parameter of kind k is reduced and sharded over: k itself, or for a
/// quantized kind the kind of the same weight held in fp32.
constexpr parameter_kind reduced_as(parameter_kind k) noexcept {
  switch (k) {
    case parameter_kind::quantized_expert: return parameter_kind::expert;
    case parameter_kind::quantized_dense: return parameter_kind::dense;
    case parameter_kind::quantized_tensor_parallel: return parameter_kind::tensor_parallel;
    default: return k;
  }
}
/// The quantized kind of a weight of kind k held as codes (k itself where it already is one).
constexpr parameter_kind quantized_kind_of(parameter_kind k) noexcept {
  switch (k) {
    case parameter_kind::expert: return parameter_kind::quantized_expert;
    case parameter_kind::dense: return parameter_kind::quantized_dense;
    case parameter_kind::tensor_parallel: return parameter_kind::quantized_tensor_parallel;
    default: return k;
  }
}

/// How element (r, c) of this rank's [rows, cols] copy or shard of a parameter is numbered in the
/// whole parameter (row-major): ETP shards are row and column offsets; a SwiGLU fc1 shard holds
/// rows of the gate half and of the linear half.
struct element_numbering {
  std::int64_t global_cols = 0;
  std::int64_t col_offset = 0;
  std::int64_t half_rows = 0;  // > 0: local rows [0, half_rows) are the gate's, the rest linear
  std::int64_t first_row = 0, second_row = 0;
  std::int64_t global_rows = 0;  // 0: as many as the local copy has

  [[nodiscard]] std::int64_t row(std::int64_t r) const noexcept {
    return half_rows == 0 || r < half_rows ? first_row + r : second_row + (r - half_rows);
  }
  [[nodiscard]] std::uint64_t global(std::int64_t r, std::int64_t c) const noexcept {
    return static_cast<std::uint64_t>(row(r) * global_cols + col_offset + c);
  }
  /// The whole parameter's rows, given the local copy's.
  [[nodiscard]] std::int64_t whole_rows(std::int64_t local_rows) const noexcept {
    return global_rows > 0 ? global_rows : local_rows;
  }
};

/// Local elements [local_first, local_first + rows * cols) of a copy, contiguous in it, that are
/// rows [row, row + rows) x columns [col, col + cols) of the whole parameter.
struct global_rectangle {
  std::int64_t local_first = 0;
  std::int64_t row = 0, col = 0, rows = 0, cols = 0;
};

/// Calls f(global_rectangle) for the local elements [first, first + count) of a copy with
/// `local_cols` columns numbered by `n`, in order: a partial row, whole rows (split where the
/// SwiGLU halves meet), a partial row.
template <class F>
void for_each_rectangle(element_numbering const& n, std::int64_t local_cols, std::int64_t first,
                        std::int64_t count, F&& f) {
  std::int64_t const end = first + count;
  std::int64_t at = first;
  while (at < end) {
    std::int64_t const r = at / local_cols, c = at % local_cols;
    if (c != 0 || end - at < local_cols) {
      std::int64_t const length = std::min(local_cols - c, end - at);
      f(global_rectangle{at, n.row(r), n.col_offset + c, 1, length});
      at += length;
      continue;
    }
    std::int64_t rows = (end - at) / local_cols;
    if (n.half_rows > 0 && r < n.half_rows) rows = std::min(rows, n.half_rows - r);
    f(global_rectangle{at, n.row(r), n.col_offset, rows, local_cols});
    at += rows * local_cols;
  }
}

/// Which rank writes a replicated piece of state into a checkpoint: the first rank of the
/// attention grid (TP x DP x CP rank 0), or the first replica of an expert (expert-TP rank 0 of
/// expert-DP rank 0).
enum class state_owner { attention_grid_first, expert_replica_first };

/// State other than parameters that lives across steps (the router's expert bias, delayed
/// scaling's amax histories): rows [first_row, first_row + values.size() / cols) of a whole
/// [rows, cols] tensor, float.
struct persistent_state {
  std::string_view name;
  std::int64_t rows = 0, cols = 0, first_row = 0;
  std::span<float> values;
  state_owner owner = state_owner::attention_grid_first;
};

}  // namespace megamoe
