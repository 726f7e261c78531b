// SPDX-License-Identifier: Apache-2.0
// megamoe/core/bf16.hpp — BF16 as bits: the rounding every BF16 tensor and the AMX tile kernels
// share (precision/ defines the other element formats; docs/spec/precision.md §1).
#pragma once

#include <bit>
#include <cstdint>

namespace megamoe {

/// fp32 -> BF16 bits: round to nearest even on the upper 16 bits, NaN first (sign kept, quiet),
/// not saturating (overflow gives Inf).
constexpr std::uint16_t to_bf16_bits(float x) {
  std::uint32_t const u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<std::uint16_t>(0x7FC0u | ((u >> 16) & 0x8000u));
  std::uint32_t const lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

constexpr float from_bf16_bits(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

/// x rounded to BF16 and back (the value a BF16 tensor holds).
constexpr float round_to_bf16(float x) {
  return from_bf16_bits(to_bf16_bits(x));
}

/// A BF16 number in memory (an element of a BF16 tensor: Adam's moments under the reference's
/// --exp-avg-dtype bf16): two bytes, the upper half of an fp32. From fp32 it rounds as
/// to_bf16_bits; to fp32 it is exact.
struct bfloat16 {
  std::uint16_t bits = 0;
  constexpr bfloat16() = default;
  constexpr explicit bfloat16(float x) : bits(to_bf16_bits(x)) {}
  constexpr explicit operator float() const { return from_bf16_bits(bits); }
  friend constexpr bool operator==(bfloat16, bfloat16) = default;
};
static_assert(sizeof(bfloat16) == 2);

}  // namespace megamoe
