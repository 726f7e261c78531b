// SPDX-License-Identifier: Apache-2.0
// megamoe/core/random.hpp — counter-based random numbers: a value is a pure function of (seed,
// index), so results do not depend on thread count, call order or platform.
#pragma once

#include <cstdint>

namespace megamoe {

/// The splitmix64 finaliser: a bijective mix of 64 bits.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace megamoe
