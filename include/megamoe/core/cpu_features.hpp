// SPDX-License-Identifier: Apache-2.0
// megamoe/core/cpu_features.hpp — what this CPU can run, asked once per process.
//
// megamoe adds no ISA flags to its users' builds: kernels for AVX-512 (and later AMX) are compiled
// with function-level target attributes, and the code that calls them asks here first, once, at
// start-up. The answer is cached, so a training step never asks again.
#pragma once

#include <cstdlib>
#include <string_view>

namespace megamoe {

struct cpu_features {
  /// AVX-512 Foundation, with the OS saving the ZMM registers (libgcc's check reads XCR0 too).
  bool avx512f = false;
  /// `MEGAMOE_DISABLE_AVX512=1` was set: the portable kernels run even where AVX-512 exists.
  bool avx512_disabled_by_environment = false;

  /// Whether megamoe's AVX-512 kernels are used.
  [[nodiscard]] bool use_avx512() const noexcept {
    return avx512f && !avx512_disabled_by_environment;
  }
};

namespace detail {
inline cpu_features detect_cpu_features() {
  cpu_features f;
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  f.avx512f = __builtin_cpu_supports("avx512f") != 0;
#endif
  char const* disable = std::getenv("MEGAMOE_DISABLE_AVX512");
  f.avx512_disabled_by_environment =
      disable != nullptr && std::string_view(disable) != "" && std::string_view(disable) != "0";
  return f;
}
}  // namespace detail

/// This process's CPU features; detected on the first call (thread-safe), the same ever after.
inline cpu_features const& cpu() {
  static cpu_features const features = detail::detect_cpu_features();
  return features;
}

}  // namespace megamoe
