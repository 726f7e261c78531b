// SPDX-License-Identifier: Apache-2.0
// megamoe/precision/formats.hpp — the element formats, bit-exact: E4M3, E5M2, E2M1, E8M0, BF16.
//
// Encoding works on the fp32 bit pattern with integer arithmetic only (docs/spec/precision.md §1):
// round to nearest with ties to the even code as if the exponent range were unbounded, then
// saturate (or, non-saturating, overflow to NaN / Inf as the OCP formats do). No floating-point
// addition is involved, so compiler flags such as -ffp-contract=fast or -march=native cannot change
// a code.
//
//   std::uint8_t q = megamoe::precision::encode<e4m3>(x);      // saturating (TE satfinite)
//   float v = megamoe::precision::decode<e4m3>(q);
#pragma once

#include <megamoe/core/bf16.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

namespace megamoe::precision {

/// A small floating-point element format: sign, `exponent_bits`, `mantissa_bits`, `bias`.
/// `kind` says what the top codes mean.
enum class special_values {
  fn,    // E4M3 "FN": no Inf; S.1111.111 is NaN; the rest of the top binade is finite
  ieee,  // E5M2: all-ones exponent holds Inf (mantissa 0) and NaN
  none,  // E2M1: every code is finite
};

template <int ExponentBits, int MantissaBits, int Bias, special_values Kind, std::uint8_t MaxCode,
          std::uint8_t NanCode>
struct minifloat {
  static constexpr int exponent_bits = ExponentBits;
  static constexpr int mantissa_bits = MantissaBits;
  static constexpr int bits = 1 + ExponentBits + MantissaBits;
  static constexpr int bias = Bias;
  static constexpr special_values kind = Kind;
  static constexpr std::uint8_t max_code = MaxCode;  // largest finite magnitude
  static constexpr std::uint8_t nan_code = NanCode;  // canonical NaN (when the format has one)
  static constexpr std::uint8_t sign_bit = static_cast<std::uint8_t>(1u << (bits - 1));
};

/// OCP E4M3 ("E4M3FN"): max 448, min subnormal 2^-9, NaN 0x7F, no Inf.
using e4m3 = minifloat<4, 3, 7, special_values::fn, 0x7E, 0x7F>;
/// E5M2: max 57344, min subnormal 2^-16, Inf 0x7C, NaN 0x7D..0x7F.
using e5m2 = minifloat<5, 2, 15, special_values::ieee, 0x7B, 0x7F>;
/// E2M1 (FP4), 4-bit codes: {0, 0.5, 1, 1.5, 2, 3, 4, 6}, 0x8 = -0.
using e2m1 = minifloat<2, 1, 1, special_values::none, 0x7, 0x7>;

template <class F>
concept element_format = requires {
  F::exponent_bits;
  F::mantissa_bits;
  F::max_code;
};

namespace detail {

/// The value of a code as an exact double.
template <element_format F>
constexpr double code_value(unsigned code) {
  unsigned const magnitude = code & (F::sign_bit - 1u);
  bool const negative = (code & F::sign_bit) != 0;
  unsigned const e = magnitude >> F::mantissa_bits;
  unsigned const m = magnitude & ((1u << F::mantissa_bits) - 1u);
  constexpr unsigned all_ones = (1u << F::exponent_bits) - 1u;
  double value = 0.0;
  if constexpr (F::kind == special_values::ieee) {
    if (e == all_ones)
      return m == 0 ? (negative ? -std::numeric_limits<double>::infinity()
                                : std::numeric_limits<double>::infinity())
                    : std::numeric_limits<double>::quiet_NaN();
  }
  if constexpr (F::kind == special_values::fn) {
    if (e == all_ones && m == (1u << F::mantissa_bits) - 1u)
      return std::numeric_limits<double>::quiet_NaN();
  }
  double const fraction = static_cast<double>(m) / static_cast<double>(1u << F::mantissa_bits);
  int const exponent = e == 0 ? 1 - F::bias : static_cast<int>(e) - F::bias;
  double scale = 1.0;
  for (int i = 0; i < (exponent < 0 ? -exponent : exponent); ++i) scale *= 2.0;
  if (exponent < 0) scale = 1.0 / scale;
  value = (e == 0 ? fraction : 1.0 + fraction) * scale;
  return negative ? -value : value;
}

template <element_format F>
constexpr std::array<float, (1u << F::bits)> decode_table() {
  std::array<float, (1u << F::bits)> table{};
  for (unsigned c = 0; c < table.size(); ++c) table[c] = static_cast<float>(code_value<F>(c));
  return table;
}

template <element_format F>
inline constexpr auto decode_table_v = decode_table<F>();

}  // namespace detail

/// Encodes an fp32 value: round to nearest, ties to even, then saturate to the largest finite
/// magnitude (TE's cvt.rn.satfinite); NaN gives the canonical NaN. With `saturate = false`,
/// overflow gives NaN (E4M3) or Inf (E5M2) as the OCP casts do (torch's .to(float8_*)).
template <element_format F>
constexpr std::uint8_t encode(float x, bool saturate = true) {
  std::uint32_t const u = std::bit_cast<std::uint32_t>(x);
  std::uint8_t const sign = (u >> 31) != 0 ? F::sign_bit : 0;
  std::uint32_t const magnitude = u & 0x7FFFFFFFu;
  constexpr unsigned all_ones_exponent = ((1u << F::exponent_bits) - 1u) << F::mantissa_bits;
  auto overflow = [&]() -> std::uint8_t {
    if (saturate || F::kind == special_values::none) return sign | F::max_code;
    if constexpr (F::kind == special_values::ieee) {
      return static_cast<std::uint8_t>(sign | all_ones_exponent);
    } else {
      return static_cast<std::uint8_t>(sign | F::nan_code);
    }
  };
  // Normal target values (the common case): round the fp32 significand to M bits with ties to
  // even on the bit pattern and move the exponent to the target's bias. Exact for magnitudes in
  // [min normal, max finite); the carry of a rounding up lands in the exponent by itself.
  constexpr std::uint32_t min_normal_bits = static_cast<std::uint32_t>(127 + 1 - F::bias) << 23;
  constexpr std::uint32_t max_finite_bits =
      (static_cast<std::uint32_t>(127 + (F::max_code >> F::mantissa_bits) - F::bias) << 23) |
      (static_cast<std::uint32_t>(F::max_code & ((1u << F::mantissa_bits) - 1u))
       << (23 - F::mantissa_bits));
  if (saturate && magnitude >= min_normal_bits && magnitude < max_finite_bits) {
    constexpr int shift = 23 - F::mantissa_bits;
    std::uint32_t const rounded =
        (magnitude + ((1u << (shift - 1)) - 1u) + ((magnitude >> shift) & 1u)) >> shift;
    std::uint32_t const code =
        rounded - (static_cast<std::uint32_t>(127 - F::bias) << F::mantissa_bits);
    return static_cast<std::uint8_t>(sign | (code > F::max_code ? F::max_code : code));
  }
  if (saturate && magnitude >= max_finite_bits && magnitude <= 0x7F800000u)
    return sign | F::max_code;
  // Below the smallest normal the codes are multiples of the quantum 2^(1 - bias - M): scale by
  // its inverse (a power of two: exact) and round to an integer, ties to even, by adding and
  // subtracting 2^23 (one rounding, in the default mode). A product that is exact cannot change
  // under FMA contraction.
  if (saturate && magnitude < min_normal_bits) {
    constexpr float inverse_quantum = static_cast<float>(1ull << (F::bias + F::mantissa_bits - 1));
    float const units = std::bit_cast<float>(magnitude) * inverse_quantum;
    float const rounded = (units + 0x1p23F) - 0x1p23F;
    return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(rounded));
  }
  if (magnitude > 0x7F800000u) {
    if constexpr (F::kind == special_values::none) {
      return F::max_code;  // E2M1 has no NaN; quantizers clamp their inputs before the cast
    } else {
      return F::nan_code;
    }
  }
  if (magnitude == 0x7F800000u) return overflow();
  if (magnitude == 0) return sign;
  int const biased = static_cast<int>(magnitude >> 23);
  int const exponent = biased == 0 ? -126 : biased - 127;
  std::uint64_t const significand = (magnitude & 0x7FFFFFu) | (biased != 0 ? 0x800000u : 0u);
  // value = significand * 2^(exponent - 23); the target's quantum here is 2^quantum.
  constexpr int min_exponent = 1 - F::bias;
  int const quantum = (exponent > min_exponent ? exponent : min_exponent) - F::mantissa_bits;
  int const shift = quantum - (exponent - 23);
  std::uint64_t n = 0;
  if (shift <= 0) {
    n = significand << (-shift);
  } else if (shift <= 40) {
    n = significand >> shift;
    std::uint64_t const rest = significand & ((std::uint64_t{1} << shift) - 1);
    std::uint64_t const half = std::uint64_t{1} << (shift - 1);
    if (rest > half || (rest == half && (n & 1u) != 0)) ++n;
  }
  if (n == 0) return sign;
  int exponent_field = quantum + F::mantissa_bits + F::bias;
  if (n >= (std::uint64_t{2} << F::mantissa_bits)) {  // the rounding carried into the next binade
    n >>= 1;
    ++exponent_field;
  }
  if (n < (std::uint64_t{1} << F::mantissa_bits)) exponent_field = 0;  // subnormal
  std::uint64_t const code = (static_cast<std::uint64_t>(exponent_field) << F::mantissa_bits) |
                             (n & ((std::uint64_t{1} << F::mantissa_bits) - 1));
  if (code > F::max_code) return overflow();
  return static_cast<std::uint8_t>(sign | code);
}

/// The value of a code (exact in fp32).
template <element_format F>
constexpr float decode(std::uint8_t code) {
  return detail::decode_table_v<F>[code & ((1u << F::bits) - 1u)];
}

/// The largest finite value (448, 57344, 6).
template <element_format F>
inline constexpr float max_finite = decode<F>(F::max_code);

// --- BF16 --------------------------------------------------------------------------------------

// Defined in core/bf16.hpp (shared with the AMX tile kernels), named here as the other formats.
using megamoe::from_bf16_bits;
using megamoe::round_to_bf16;
using megamoe::to_bf16_bits;

// --- E8M0 (scales only) -------------------------------------------------------------------------

/// An E8M0 code c stands for 2^(c - 127); 0xFF is NaN. There is no zero and no sign.
constexpr float e8m0_value(std::uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  if (code == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127 (fp32 subnormal)
  return std::bit_cast<float>(static_cast<std::uint32_t>(code) << 23);
}

/// 2^(127 - c) as fp32: the multiplier that brings a block into element range (c = 254 gives the
/// subnormal 2^-127, c = 255 NaN).
constexpr float e8m0_reciprocal(std::uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  int const e = 127 - static_cast<int>(code);  // in [-127, 127]
  if (e >= -126) return std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23);
  return std::bit_cast<float>(0x00400000u);  // 2^-127
}

/// TE's float_to_e8m0: v rounded *up* to a power of two (biased exponent, plus one when any
/// mantissa bit is set), with 0 -> 0x00, NaN -> 0xFF, Inf and 0xFE -> 0xFE, and fp32 subnormals up
/// to 2^-127 -> 0x00.
constexpr std::uint8_t e8m0_ceil(float v) {
  std::uint32_t const u = std::bit_cast<std::uint32_t>(v);
  std::uint32_t const magnitude = u & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return 0xFF;
  if (magnitude == 0x7F800000u) return 0xFE;
  std::uint32_t exponent = (u >> 23) & 0xFFu;
  std::uint32_t const mantissa = u & 0x7FFFFFu;
  bool const bump = (mantissa > 0 && exponent != 0xFE) && !(exponent == 0 && mantissa <= 0x400000u);
  if (bump) ++exponent;
  return static_cast<std::uint8_t>(exponent);
}

/// The OCP MX v1.0 rule (microxcaling), for comparison: 2^(floor(log2 amax) - emax_elem), clamped
/// to [2^-127, 2^127]; NaN above; amax 0 counts as 2^-126.
constexpr std::uint8_t e8m0_ocp(float amax, int element_emax) {
  std::uint32_t const u = std::bit_cast<std::uint32_t>(amax) & 0x7FFFFFFFu;
  if (u > 0x7F800000u) return 0xFF;
  int floor_log2 = 0;
  if (u == 0) {
    floor_log2 = -126;
  } else if ((u >> 23) == 0) {
    floor_log2 = -127 - std::countl_zero(u << 9);  // subnormal: position of the top bit
  } else {
    floor_log2 = static_cast<int>(u >> 23) - 127;
  }
  int const e = floor_log2 - element_emax;
  if (e > 127) return 0xFF;
  return static_cast<std::uint8_t>((e < -127 ? -127 : e) + 127);
}

// --- Vectorized forms ---------------------------------------------------------------------------

/// codes[i] = encode<F>(values[i] * scale): the product is rounded to fp32 before the integer
/// encoder sees it, so it cannot be fused with anything.
template <element_format F>
void encode_scaled(std::span<float const> values, float scale, std::span<std::uint8_t> codes,
                   bool saturate = true) {
  for (std::size_t i = 0; i < values.size(); ++i) codes[i] = encode<F>(values[i] * scale, saturate);
}

/// out[i] = decode<F>(codes[i]) * scale_inv.
template <element_format F>
void decode_scaled(std::span<std::uint8_t const> codes, float scale_inv, std::span<float> out) {
  for (std::size_t i = 0; i < codes.size(); ++i) out[i] = decode<F>(codes[i]) * scale_inv;
}

}  // namespace megamoe::precision
