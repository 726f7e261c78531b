// SPDX-License-Identifier: Apache-2.0
// Test helper of the tile GEMM tests (tile_gemm_test, backends_test): BF16 test values, and why
// the AMX and AVX512-BF16 units cannot run here. Where /proc/cpuinfo lists the unit's flag and it
// is not turned off on purpose, not running is a failure (the OS refused, or megamoe's detection
// is wrong), not a skip.
#pragma once

#include <megamoe/core/bf16.hpp>
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/random.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace megamoe::testing {

/// A BF16 value drawn from N(0, 1): both the kernel and the reference read exactly this.
inline float bf16_normal(std::uint64_t seed, std::uint64_t i) {
  return round_to_bf16(static_cast<float>(standard_normal(seed, i)));
}

/// Whether /proc/cpuinfo's flags name `flag` (" amx_tile", " avx512_bf16").
inline bool cpuinfo_lists(std::string_view flag) {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  return text.str().find(flag) != std::string::npos;
}
inline bool cpuinfo_lists_amx() {
  return cpuinfo_lists(" amx_tile");
}

/// Why the AMX tests cannot run here (empty: they can). Where /proc/cpuinfo lists amx_tile and AMX
/// is not disabled on purpose, not running is a failure.
inline std::string amx_skip_reason() {
  auto const& unit = cpu();
  if (unit.use_amx()) return {};
  if (cpuinfo_lists_amx() && !unit.amx_disabled_by_environment)
    ADD_FAILURE() << "/proc/cpuinfo lists amx_tile, but: " << unit.amx_unavailable_reason();
  return unit.amx_unavailable_reason();
}

/// The same for the AVX512-BF16 vector unit.
inline std::string avx512_bf16_skip_reason() {
  auto const& unit = cpu();
  if (unit.use_avx512_bf16()) return {};
  if (cpuinfo_lists(" avx512_bf16") && !unit.avx512_disabled_by_environment)
    ADD_FAILURE() << "/proc/cpuinfo lists avx512_bf16, but: "
                  << unit.avx512_bf16_unavailable_reason();
  return unit.avx512_bf16_unavailable_reason();
}

}  // namespace megamoe::testing
