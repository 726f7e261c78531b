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

}  // namespace megamoe
