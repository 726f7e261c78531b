// SPDX-License-Identifier: Apache-2.0
// megamoe/core/random.hpp — counter-based random numbers: a value is a pure function of (seed,
// index), so results do not depend on thread count, call order or platform.
#pragma once

#include <cmath>
#include <cstdint>

namespace megamoe {

/// The splitmix64 finaliser: a bijective mix of 64 bits.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A uniform double in (0, 1) from 53 bits of splitmix64(key).
constexpr double uniform_open01(std::uint64_t key) {
  return (static_cast<double>(splitmix64(key) >> 11) + 0.5) * 0x1.0p-53;
}

/// A standard normal value as a function of (seed, index) (Box-Muller on two uniforms).
inline double standard_normal(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t const base = splitmix64(seed) ^ (index * 0xd1b54a32d192ed03ULL);
  double const u1 = uniform_open01(base), u2 = uniform_open01(base ^ 0x6a09e667f3bcc909ULL);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace megamoe
