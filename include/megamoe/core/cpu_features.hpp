// SPDX-License-Identifier: Apache-2.0
// megamoe/core/cpu_features.hpp — what this CPU can run, asked once per process.
//
// megamoe adds no ISA flags to its users' builds: kernels for AVX-512, AVX512-BF16 and AMX are
// compiled with function-level target attributes, and the code that calls them asks here first,
// once, at start-up. The answer is cached, so a training step never asks again.
#pragma once

#include <megamoe/core/compiled_once.hpp>

#include <string>

namespace megamoe {

struct cpu_features {
  /// AVX-512 Foundation, with the OS saving the ZMM registers (libgcc's check reads XCR0 too).
  bool avx512f = false;
  /// `MEGAMOE_DISABLE_AVX512=1` was set: the portable kernels run even where AVX-512 exists.
  bool avx512_disabled_by_environment = false;
  /// AVX512-BF16: VDPBF16PS, pairs of BF16 products added into fp32 lanes (CPUID).
  bool avx512_bf16 = false;

  /// AMX: the tile unit and its BF16 products (CPUID), and the OS's permission to use tile data
  /// (Linux enables the 8 KB tile state per process on request: arch_prctl ARCH_REQ_XCOMP_PERM).
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_permitted = false;
  /// `MEGAMOE_DISABLE_AMX=1` was set: AMX is not used even where it exists.
  bool amx_disabled_by_environment = false;

  /// Whether megamoe's AVX-512 kernels are used.
  [[nodiscard]] bool use_avx512() const noexcept {
    return avx512f && !avx512_disabled_by_environment;
  }
  /// Whether megamoe's AVX512-BF16 kernels may run (MEGAMOE_DISABLE_AVX512 turns them off too).
  [[nodiscard]] bool use_avx512_bf16() const noexcept { return use_avx512() && avx512_bf16; }
  /// Why they may not (empty when they may), naming what to use instead.
  [[nodiscard]] std::string avx512_bf16_unavailable_reason() const;
  /// Whether megamoe's AMX tile kernels may run.
  [[nodiscard]] bool use_amx() const noexcept {
    return amx_tile && amx_bf16 && amx_permitted && !amx_disabled_by_environment;
  }
  /// Why they may not (empty when they may), naming what to use instead.
  [[nodiscard]] std::string amx_unavailable_reason() const;

 private:
  /// A reason a BF16 unit cannot run, with what runs instead.
  static std::string with_fallback(std::string const& why);
};

namespace detail {
MEGAMOE_DECL cpu_features detect_cpu_features();
}  // namespace detail

/// This process's CPU features; detected on the first call (thread-safe), the same ever after.
inline cpu_features const& cpu() {
  static cpu_features const features = detail::detect_cpu_features();
  return features;
}

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/core/cpu_features.ipp>
#endif
