// SPDX-License-Identifier: Apache-2.0
// An independent re-implementation of megamoe's quantizers, kept to check them: each recipe's
// format applied to a whole tensor with its own block grid and element loop (codes unpacked per
// tensor type), sharing only the scale arithmetic of precision/scaling.hpp, which the precision
// vectors check on their own. megamoe's one quantizer is precision/quantize.hpp (quantize<F>);
// tests compare the two bit for bit and check both against the vectors.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/precision/formats.hpp>
#include <megamoe/precision/scaling.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace megamoe::reference {

using namespace megamoe::precision;

/// A per-tensor FP8 tensor: one code per element (row-major) and one scale. Its columnwise copy is
/// the transpose of the codes with the same scale_inv.
struct per_tensor_fp8 {
  int rows = 0, cols = 0;
  std::vector<std::uint8_t> codes;
  float scale = 1.0F;
  float scale_inv = 1.0F;
};

template <element_format F>
per_tensor_fp8 quantize_per_tensor(std::span<float const> values, int rows, int cols, float scale) {
  if (static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) != values.size())
    throw input_error("quantize_per_tensor: " + std::to_string(values.size()) + " values for a [" +
                      std::to_string(rows) + ", " + std::to_string(cols) + "] tensor");
  per_tensor_fp8 q{rows, cols, std::vector<std::uint8_t>(values.size()), scale, 1.0F / scale};
  encode_scaled<F>(values, scale, q.codes);
  return q;
}

/// The columnwise copy of a per-tensor tensor: the transposed codes, same scale (exact).
inline per_tensor_fp8 transposed(per_tensor_fp8 const& q) {
  per_tensor_fp8 t{q.cols, q.rows, std::vector<std::uint8_t>(q.codes.size()), q.scale, q.scale_inv};
  for (int r = 0; r < q.rows; ++r)
    for (int c = 0; c < q.cols; ++c)
      t.codes[static_cast<std::size_t>(c) * q.rows + r] =
          q.codes[static_cast<std::size_t>(r) * q.cols + c];
  return t;
}

template <element_format F>
std::vector<float> dequantize(per_tensor_fp8 const& q) {
  std::vector<float> out(q.codes.size());
  decode_scaled<F>(q.codes, q.scale_inv, out);
  return out;
}

// --- Block-scaled FP8 and MXFP8 ------------------------------------------------------------------

/// Blocks of `block_rows` x `block_cols` elements, one scale per block, codes row-major [rows,
/// cols]. Partial blocks at the edges are zero-padded (zeros change no amax).
struct block_grid {
  int rows = 0, cols = 0, block_rows = 1, block_cols = 1;
  [[nodiscard]] int row_blocks() const { return (rows + block_rows - 1) / block_rows; }
  [[nodiscard]] int col_blocks() const { return (cols + block_cols - 1) / block_cols; }
  [[nodiscard]] int block_of(int r, int c) const {
    return (r / block_rows) * col_blocks() + c / block_cols;
  }
};

/// Blockwise FP8 (DeepSeek-V3 style): fp32 scale_inv per block.
struct blockwise_fp8 {
  block_grid grid;
  std::vector<std::uint8_t> codes;  // row-major [rows, cols]
  std::vector<float> scale_inv;     // row-major [row_blocks, col_blocks]
};

/// MXFP8: E8M0 scale per block.
struct mxfp8_tensor {
  block_grid grid;
  std::vector<std::uint8_t> codes;   // row-major [rows, cols]
  std::vector<std::uint8_t> scales;  // E8M0, row-major [row_blocks, col_blocks]
};

namespace detail {
inline void check_matrix(std::span<float const> values, int rows, int cols, char const* who) {
  if (rows < 0 || cols < 0 ||
      static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) != values.size())
    throw input_error(std::string(who) + ": " + std::to_string(values.size()) + " values for a [" +
                      std::to_string(rows) + ", " + std::to_string(cols) + "] matrix");
}

/// Calls fn(element index, block index) for every element of the grid, row-major.
template <class Fn>
void for_each_element(block_grid const& g, Fn&& fn) {
  for (int r = 0; r < g.rows; ++r)
    for (int c = 0; c < g.cols; ++c)
      fn(static_cast<std::size_t>(r) * g.cols + c, static_cast<std::size_t>(g.block_of(r, c)));
}

/// amax of every block of the grid.
inline std::vector<float> block_amax(std::span<float const> values, block_grid const& g) {
  std::vector<float> amax(static_cast<std::size_t>(g.row_blocks() * g.col_blocks()), 0.0F);
  for_each_element(g, [&](std::size_t i, std::size_t b) {
    float const v = std::fabs(values[i]);
    amax[b] = std::isnan(v) ? v : std::max(amax[b], v);
  });
  return amax;
}
}  // namespace detail

/// The transpose of a row-major [rows, cols] matrix (the source of a columnwise copy).
inline std::vector<float> transposed(std::span<float const> values, int rows, int cols) {
  detail::check_matrix(values, rows, cols, "transposed");
  std::vector<float> out(values.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(c) * rows + r] = values[static_cast<std::size_t>(r) * cols + c];
  return out;
}

/// Blockwise FP8: scale = scale_from_amax(block amax, fp8_max, power_of_2) per block (zero block:
/// scale 1), codes = sat_rne(x * scale), scale_inv = 1 / scale. Blocks 1x128 for activations and
/// gradients, 128x128 for weights.
template <element_format F>
blockwise_fp8 quantize_blockwise(std::span<float const> values, int rows, int cols, int block_rows,
                                 int block_cols, bool power_of_2 = true) {
  detail::check_matrix(values, rows, cols, "quantize_blockwise");
  blockwise_fp8 q{
      {rows, cols, block_rows, block_cols}, std::vector<std::uint8_t>(values.size()), {}};
  auto const amax = detail::block_amax(values, q.grid);
  std::vector<float> scale(amax.size());
  q.scale_inv.resize(amax.size());
  for (std::size_t b = 0; b < amax.size(); ++b) {
    scale[b] = scale_from_amax(amax[b], max_finite<F>, power_of_2);
    q.scale_inv[b] = 1.0F / scale[b];
  }
  detail::for_each_element(
      q.grid, [&](std::size_t i, std::size_t b) { q.codes[i] = encode<F>(values[i] * scale[b]); });
  return q;
}

template <element_format F>
std::vector<float> dequantize(blockwise_fp8 const& q) {
  std::vector<float> out(q.codes.size());
  detail::for_each_element(q.grid, [&](std::size_t i, std::size_t b) {
    out[i] = decode<F>(q.codes[i]) * q.scale_inv[b];
  });
  return out;
}

/// MXFP8 along the last dimension (1x32 blocks; the columnwise copy is this on the transpose):
/// codes = sat_rne(x * 2^(127 - e)), an exact power-of-two multiply.
template <element_format F>
mxfp8_tensor quantize_mxfp8(std::span<float const> values, int rows, int cols, int block = 32) {
  detail::check_matrix(values, rows, cols, "quantize_mxfp8");
  mxfp8_tensor q{{rows, cols, 1, block}, std::vector<std::uint8_t>(values.size()), {}};
  auto const amax = detail::block_amax(values, q.grid);
  q.scales.resize(amax.size());
  for (std::size_t b = 0; b < amax.size(); ++b) q.scales[b] = mxfp8_scale<F>(amax[b]);
  detail::for_each_element(q.grid, [&](std::size_t i, std::size_t b) {
    q.codes[i] = encode<F>(values[i] * e8m0_reciprocal(q.scales[b]));
  });
  return q;
}

template <element_format F>
std::vector<float> dequantize(mxfp8_tensor const& q) {
  std::vector<float> out(q.codes.size());
  detail::for_each_element(q.grid, [&](std::size_t i, std::size_t b) {
    out[i] = decode<F>(q.codes[i]) * e8m0_value(q.scales[b]);
  });
  return out;
}

// --- NVFP4 ---------------------------------------------------------------------------------------

/// Element rounding of an NVFP4 quantizer.
enum class fp4_rounding { nearest_even, stochastic };

/// An NVFP4 tensor: E2M1 codes two per byte (element 2i in the low nibble), one E4M3 scale per
/// block, and the global amax (what the reference stores per tensor).
struct nvfp4_tensor {
  block_grid grid;
  std::vector<std::uint8_t> packed;  // [(rows * cols + 1) / 2]
  std::vector<std::uint8_t> scales;  // E4M3, row-major [row_blocks, col_blocks]
  float global_amax = 0.0F;

  [[nodiscard]] std::uint8_t code(std::size_t i) const {
    return static_cast<std::uint8_t>((packed[i / 2] >> (4 * (i % 2))) & 0xF);
  }
};

/// NVFP4 along the last dimension: 1x16 blocks (activations, gradients) or, with `tile_2d`, 16x16
/// tiles (weights: the columnwise copy is then the exact transpose). `global_amax` defaults to the
/// tensor's own. Stochastic rounding draws u from `uniform_of(seed, element index)`.
inline nvfp4_tensor quantize_nvfp4(std::span<float const> values, int rows, int cols,
                                   bool tile_2d = false,
                                   fp4_rounding rounding = fp4_rounding::nearest_even,
                                   std::uint64_t seed = 0,
                                   std::optional<float> global_amax = std::nullopt) {
  detail::check_matrix(values, rows, cols, "quantize_nvfp4");
  nvfp4_tensor q{{rows, cols, tile_2d ? 16 : 1, 16},
                 std::vector<std::uint8_t>((values.size() + 1) / 2, 0),
                 {},
                 global_amax.value_or(amax_of(values))};
  auto const g = nvfp4_global(q.global_amax);
  auto const amax = detail::block_amax(values, q.grid);
  std::vector<float> s_enc_b(amax.size());
  q.scales.resize(amax.size());
  for (std::size_t b = 0; b < amax.size(); ++b) {
    auto const scale = nvfp4_block(amax[b], g);
    q.scales[b] = scale.e4m3_code;
    s_enc_b[b] = scale.s_enc_b;
  }
  detail::for_each_element(q.grid, [&](std::size_t i, std::size_t b) {
    float const y = nvfp4_scaled(values[i], s_enc_b[b]);
    std::uint8_t const code = rounding == fp4_rounding::stochastic
                                  ? encode_e2m1_stochastic(y, uniform_of(seed, i))
                                  : encode<e2m1>(y);
    q.packed[i / 2] |= static_cast<std::uint8_t>(code << (4 * (i % 2)));
  });
  return q;
}

inline std::vector<float> dequantize(nvfp4_tensor const& q) {
  std::vector<float> out(static_cast<std::size_t>(q.grid.rows) * q.grid.cols);
  detail::for_each_element(q.grid, [&](std::size_t i, std::size_t b) {
    out[i] = decode<e2m1>(q.code(i)) * nvfp4_dequant_factor(q.scales[b], q.global_amax);
  });
  return out;
}

/// Applies rht16 to every 16-chunk of each row of a row-major [rows, cols] matrix (cols % 16 == 0)
/// and rounds the result to BF16, as TE's BF16-only RHT does.
inline std::vector<float> rht16_rows_bf16(std::span<float const> values, int rows, int cols) {
  detail::check_matrix(values, rows, cols, "rht16_rows_bf16");
  if (cols % 16 != 0)
    throw input_error("rht16: the row length " + std::to_string(cols) + " is not a multiple of 16");
  std::vector<float> out(values.size());
  for (std::size_t start = 0; start < values.size(); start += 16) {
    auto const y = rht16(std::span<float const, 16>(values.data() + start, 16));
    for (std::size_t j = 0; j < 16; ++j) out[start + j] = round_to_bf16(y[j]);
  }
  return out;
}

/// The columnwise (wgrad) NVFP4 copy of activations or gradients [rows, cols]: the transpose, each
/// 16-chunk along the token dimension passed through the RHT (rounded to BF16), then 1x16 blocks
/// with the copy's own global amax. `rows` must be a multiple of 16.
inline nvfp4_tensor quantize_nvfp4_columnwise(std::span<float const> values, int rows, int cols,
                                              bool hadamard = true,
                                              fp4_rounding rounding = fp4_rounding::nearest_even,
                                              std::uint64_t seed = 0) {
  auto source = transposed(values, rows, cols);
  if (hadamard) source = rht16_rows_bf16(source, cols, rows);
  return quantize_nvfp4(source, cols, rows, false, rounding, seed);
}

}  // namespace megamoe::reference
