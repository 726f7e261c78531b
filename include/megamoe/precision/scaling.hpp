// SPDX-License-Identifier: Apache-2.0
// megamoe/precision/scaling.hpp — the scale arithmetic of every recipe, bit-exact to
// docs/spec/precision.md: amax, the per-tensor FP8 scale (current, and delayed from an amax
// history), the MXFP8 E8M0 block scale, NVFP4's global and block scales, E2M1 stochastic rounding,
// the 16-point random Hadamard transform, and the padding of rows per expert.
//
// Scale arithmetic is fp32 with one rounding per operation in the reference's order and uses only
// multiplications and divisions (nothing a compiler may contract into an FMA). The quantizers that
// apply these scales to whole matrices are precision/quantize.hpp.
#pragma once

#include <megamoe/core/random.hpp>
#include <megamoe/precision/formats.hpp>
#include <megamoe/precision/tags.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
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

// --- Block scales ------------------------------------------------------------------------------

/// The MXFP8 scale of a block (TE): e8m0_ceil(amax * fp32(1/fp8_max)).
template <element_format F>
std::uint8_t mxfp8_scale(float amax) {
  constexpr float reciprocal = static_cast<float>(1.0 / static_cast<double>(max_finite<F>));
  return e8m0_ceil(amax * reciprocal);
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

/// Applies rht16 to every 16 consecutive values of `values` (a multiple of 16 long) in place and
/// rounds each result to BF16, as TE's BF16-only RHT does (the NVFP4 wgrad copies, along tokens).
inline void rht16_bf16(std::span<float> values) {
  for (std::size_t start = 0; start + 16 <= values.size(); start += 16) {
    auto const y = rht16(std::span<float const, 16>(values.data() + start, 16));
    for (std::size_t j = 0; j < 16; ++j) values[start + j] = round_to_bf16(y[j]);
  }
}

// --- Padding of tokens per expert ---------------------------------------------------------------

/// Rows per expert rounded up to the recipe's alignment (16 FP8, 32 MXFP8, 128 NVFP4); 0 stays 0.
constexpr std::int64_t pad_rows(std::int64_t rows, std::int64_t alignment) {
  return (rows + alignment - 1) / alignment * alignment;
}

}  // namespace megamoe::precision
