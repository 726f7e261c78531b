// SPDX-License-Identifier: Apache-2.0
// megamoe/data/numpy_random.hpp — numpy's legacy RandomState, as far as Megatron's data pipeline
// draws from it: seeding, raw 32- and 64-bit draws, bounded integers and shuffle, bit for bit.
//
// RandomState(seed) for an integer seed is MT19937 seeded by Knuth's init_genrand, which is what
// std::mt19937(seed) does; numpy's stream is frozen by its compatibility policy. A bounded draw
// is rejection sampling under a bit mask (no modulo, no Lemire reduction), and shuffle walks the
// array from its end, drawing even where the swap is with itself.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace megamoe::data {

class numpy_random_state {
 public:
  explicit numpy_random_state(std::uint32_t seed) : mt_(seed) {}

  std::uint32_t next32() { return static_cast<std::uint32_t>(mt_()); }
  /// Two draws, the first the high word.
  std::uint64_t next64() {
    std::uint64_t const high = next32();
    return (high << 32) | next32();
  }

  /// A uniform integer in [0, max] (numpy's random_interval); max == 0 draws nothing.
  std::uint64_t random_interval(std::uint64_t max) {
    if (max == 0) return 0;
    std::uint64_t mask = max;
    for (int shift : {1, 2, 4, 8, 16, 32}) mask |= mask >> shift;
    std::uint64_t v = 0;
    if (max <= 0xffffffffULL) {
      do {
        v = next32() & mask;
      } while (v > max);
    } else {
      do {
        v = next64() & mask;
      } while (v > max);
    }
    return v;
  }

  /// numpy's shuffle of a 1-D array (any element type: the draws do not depend on it).
  template <class T>
  void shuffle(std::span<T> a) {
    for (std::size_t i = a.size(); i > 1; --i) {
      auto const j = static_cast<std::size_t>(random_interval(i - 1));
      std::swap(a[i - 1], a[j]);
    }
  }

 private:
  std::mt19937 mt_;
};

}  // namespace megamoe::data
