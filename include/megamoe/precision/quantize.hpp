// SPDX-License-Identifier: Apache-2.0
// megamoe/precision/quantize.hpp — quantizers: codes + scales, bit-exact to docs/spec/precision.md.
//
//   per-tensor FP8      one fp32 scale (current scaling, or delayed scaling from an amax history)
//   blockwise FP8       1x128 blocks (activations, gradients) or 128x128 tiles (weights), fp32
//                       scale_inv, power-of-2 by default
//   MXFP8               1x32 blocks, one E8M0 scale each (TE's round-up rule)
//   NVFP4               E2M1 codes (two per byte), E4M3 scale per 1x16 block or 16x16 tile, one
//   fp32
//                       global amax; RNE or seeded stochastic rounding; 16-point random Hadamard
//                       transform for the wgrad copies
//
// Every quantizer reads a row-major [rows, cols] fp32 matrix and blocks along its last dimension; a
// columnwise copy (blocks along the first dimension) is the same quantizer applied to the
// transpose, from the high-precision values, as the reference does. Scale arithmetic is fp32 with
// one rounding per operation in the reference's order, and uses only multiplications and divisions
// (nothing a compiler may contract into an FMA); element codes come from the integer encoders of
// formats.hpp.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/precision/formats.hpp>
#include <megamoe/precision/tags.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace megamoe::precision {

inline constexpr float float_max = std::numeric_limits<float>::max();

/// max |x| over `values` (NaN propagates as in the reference's amax kernels).
inline float amax_of(std::span<float const> values) {
  float amax = 0.0F;
  for (float x : values) {
    float const a = std::fabs(x);
    if (std::isnan(a)) return a;
    amax = std::max(amax, a);
  }
  return amax;
}

/// TE's compute_scale_from_amax: scale = fp8_max / max(amax, eps); 1 for amax 0, Inf or NaN; an
/// infinite quotient becomes `value_for_inf`; with `power_of_2` the mantissa bits are cleared
/// (rounded down to a power of two).
inline float scale_from_amax(float amax, float fp8_max, bool power_of_2 = false,
                             float epsilon = 0.0F, float value_for_inf = float_max) {
  if (amax < epsilon) amax = epsilon;
  if (std::isinf(amax) || amax == 0.0F || std::isnan(amax)) return 1.0F;
  float scale = fp8_max / amax;
  if (std::isinf(scale)) scale = value_for_inf;
  if (power_of_2) scale = std::bit_cast<float>(std::bit_cast<std::uint32_t>(scale) & 0xFF800000u);
  return scale;
}

// --- Per-tensor FP8 ----------------------------------------------------------------------------

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

/// Delayed scaling: quantize with the stored scale, record this step's amax in slot 0, and at the
/// end of the step derive the next scale from the history (TE's amax_and_scale_update).
struct delayed_scaling_state {
  using algorithm = amax_compute;  // max, most_recent (the recipe tag's enum)

  std::vector<float> amax_history;  // [L], slot 0 = the current step's amax
  float scale = 1.0F;
  algorithm algo = algorithm::most_recent;  // Megatron's default (TE's is max over 1024)
  int margin = 0;
  bool power_of_2 = false;  // round each new scale down to a power of two

  explicit delayed_scaling_state(int history_length = 1, algorithm a = algorithm::most_recent,
                                 int m = 0)
      : amax_history(static_cast<std::size_t>(std::max(1, history_length)), 0.0F),
        algo(a),
        margin(m) {}

  /// The state a delayed-scaling recipe asks for (history length, algorithm, margin).
  static delayed_scaling_state of(settings const& recipe) {
    return delayed_scaling_state(recipe.amax_history_len, recipe.amax_algo, recipe.margin);
  }

  /// Records an observed amax of the unscaled input (the largest seen this step wins).
  void record(float amax) { amax_history[0] = std::max(amax_history[0], amax); }

  /// End of step: amax from the history, roll it (new[i] = old[i+1], new[L-1] = old[0], new[0] =
  /// 0), scale = (fp8_max * 2^-margin) / amax, or the previous scale when amax is 0 or not finite.
  /// Returns the amax used.
  float update(float fp8_max) {
    std::size_t const n = amax_history.size();
    float const last = amax_history[0];
    float amax_max = 0.0F;
    std::vector<float> rolled(n, 0.0F);
    for (std::size_t i = 0; i < n; ++i) {
      float const a = i + 1 < n ? amax_history[i + 1] : last;
      amax_max = std::max(amax_max, a);
      if (i > 0) rolled[i] = a;
    }
    float const amax = algo == algorithm::most_recent ? last : amax_max;
    float const scaled_max = fp8_max * std::ldexp(1.0F, -margin);
    if (std::isfinite(amax) && amax > 0.0F) {
      scale = scaled_max / amax;
      if (std::isinf(scale)) scale = float_max;
      if (power_of_2)
        scale = std::bit_cast<float>(std::bit_cast<std::uint32_t>(scale) & 0xFF800000u);
    }
    amax_history = std::move(rolled);
    return amax;
  }
};

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

/// The MXFP8 scale of a block (TE): e8m0_ceil(amax * fp32(1/fp8_max)).
template <element_format F>
std::uint8_t mxfp8_scale(float amax) {
  constexpr float reciprocal = static_cast<float>(1.0 / static_cast<double>(max_finite<F>));
  return e8m0_ceil(amax * reciprocal);
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

/// NVFP4's per-tensor scales from the global amax: S_enc = (448*6) / amax (at most FLT_MAX; 1 when
/// amax or S_enc is 0), S_dec = 1 / S_enc.
struct nvfp4_global_scale {
  float s_enc = 1.0F;
  float s_dec = 1.0F;
};

inline nvfp4_global_scale nvfp4_global(float global_amax) {
  float s_enc = global_amax != 0.0F ? (448.0F * 6.0F) / global_amax : float_max;
  s_enc = std::min(s_enc, float_max);
  if (global_amax == 0.0F || s_enc == 0.0F) s_enc = 1.0F;
  return {s_enc, 1.0F / s_enc};
}

/// The scale of one NVFP4 block: the stored E4M3 code and the fp32 factor the elements are
/// multiplied by before the E2M1 cast.
struct nvfp4_block_scale {
  float s_dec_b = 0.0F;        // block_amax * (S_enc * fp32(1/6)), at most FLT_MAX
  std::uint8_t e4m3_code = 0;  // sat_rne_e4m3(s_dec_b)
  float s_enc_b = float_max;   // 1 / (e4m3 value * S_dec), at most FLT_MAX
};

inline nvfp4_block_scale nvfp4_block(float block_amax, nvfp4_global_scale const& g) {
  constexpr float sixth = static_cast<float>(1.0 / 6.0);
  nvfp4_block_scale b;
  b.s_dec_b = std::min(block_amax * (g.s_enc * sixth), float_max);
  b.e4m3_code = encode<e4m3>(b.s_dec_b);
  float const value = decode<e4m3>(b.e4m3_code);
  b.s_enc_b = value != 0.0F ? std::min(1.0F / (value * g.s_dec), float_max) : float_max;
  return b;
}

/// 1 / (E2M1 max x E4M3 max) = fp32(1/2688): NVFP4's global scale is global_amax times this.
inline constexpr float nvfp4_inverse_range = static_cast<float>(1.0 / (6.0 * 448.0));

/// The dequantization factor of a block: (e4m3 value * global amax) * fp32(1/2688).
inline float nvfp4_dequant_factor(std::uint8_t e4m3_code, float global_amax) {
  return (decode<e4m3>(e4m3_code) * global_amax) * nvfp4_inverse_range;
}

/// x * s_enc_b clamped to [-6, 6] (the value the E2M1 cast sees).
inline float nvfp4_scaled(float x, float s_enc_b) {
  return std::min(std::max(x * s_enc_b, -6.0F), 6.0F);
}

/// A reproducible uniform [0, 1) for element `index` of a call with `seed` (splitmix64); the same
/// on every platform and thread count.
inline float uniform_of(std::uint64_t seed, std::uint64_t index) {
  return static_cast<float>(splitmix64(seed * 0x9e3779b97f4a7c15ULL + index) >> 40) * 0x1.0p-24F;
}

/// E2M1 with stochastic rounding: between the neighbouring grid points lo <= |y| <= hi, round up
/// with probability (|y| - lo) / (hi - lo), using the uniform `u`. y is already clamped to [-6, 6].
inline std::uint8_t encode_e2m1_stochastic(float y, float u) {
  static constexpr std::array<float, 8> grid{0.0F, 0.5F, 1.0F, 1.5F, 2.0F, 3.0F, 4.0F, 6.0F};
  float const a = std::fabs(y);
  std::uint8_t const sign = std::signbit(y) ? 0x8 : 0x0;
  if (!(a < 6.0F)) return sign | 0x7;
  std::uint8_t lo = 0;
  while (lo + 1 < 8 && grid[lo + 1] <= a) ++lo;
  if (grid[lo] == a) return sign | lo;
  float const p_up = (a - grid[lo]) / (grid[lo + 1] - grid[lo]);
  return static_cast<std::uint8_t>(sign | (u < p_up ? lo + 1 : lo));
}

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

// --- Random Hadamard transform (NVFP4 wgrad copies) ----------------------------------------------

/// TE's fixed sign vector of the 16-point RHT.
inline constexpr std::array<int, 16> rht_signs{1,  1,  1,  -1, 1,  -1, -1, -1,
                                               -1, -1, -1, 1,  -1, 1,  -1, -1};

/// M[i][j] = signs[i] * H16[i][j] / 4 (Sylvester H16: +1 where popcount(i & j) is even).
inline constexpr auto rht_matrix = [] {
  std::array<std::array<float, 16>, 16> m{};
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      int const h = (std::popcount(static_cast<unsigned>(i & j)) % 2) == 0 ? 1 : -1;
      m[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] =
          0.25F * static_cast<float>(rht_signs[static_cast<std::size_t>(i)] * h);
    }
  return m;
}();

/// y = x M, accumulated in fp32 in i order. Each product is exact (a power-of-two multiple), so
/// fusing it into an FMA changes nothing.
inline std::array<float, 16> rht16(std::span<float const, 16> x) {
  std::array<float, 16> y{};
  for (int j = 0; j < 16; ++j) {
    float acc = 0.0F;
    for (int i = 0; i < 16; ++i)
      acc = acc + x[static_cast<std::size_t>(i)] *
                      rht_matrix[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
    y[static_cast<std::size_t>(j)] = acc;
  }
  return y;
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

// --- Padding of tokens per expert
// ------------------------------------------------------------------

/// Rows per expert rounded up to the recipe's alignment (16 FP8, 32 MXFP8, 128 NVFP4); 0 stays 0.
constexpr std::int64_t pad_rows(std::int64_t rows, std::int64_t alignment) {
  return (rows + alignment - 1) / alignment * alignment;
}

}  // namespace megamoe::precision
