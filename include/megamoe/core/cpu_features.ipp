// SPDX-License-Identifier: Apache-2.0
// megamoe/core/cpu_features.ipp — the definitions behind cpu_features.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/core/cpu_features.hpp>

#include <cstdlib>
#include <string_view>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace megamoe {

MEGAMOE_DECL std::string cpu_features::avx512_bf16_unavailable_reason() const {
  std::string why;
  if (avx512_disabled_by_environment)
    why = "MEGAMOE_DISABLE_AVX512 is set";
  else if (!avx512f || !avx512_bf16)
    why = "this CPU has no AVX512-BF16 dot products (CPUID lists no avx512_bf16)";
  else
    return {};
  return with_fallback(why);
}

MEGAMOE_DECL std::string cpu_features::amx_unavailable_reason() const {
  std::string why;
  if (amx_disabled_by_environment)
    why = "MEGAMOE_DISABLE_AMX is set";
  else if (!amx_tile || !amx_bf16)
    why = "this CPU has no AMX tile unit with BF16 products (CPUID lists no amx_tile/amx_bf16)";
  else if (!amx_permitted)
    why = "the OS refused the tile state (arch_prctl ARCH_REQ_XCOMP_PERM failed)";
  else
    return {};
  return with_fallback(why);
}

MEGAMOE_DECL std::string cpu_features::with_fallback(std::string const& why) {
  return why + "; the fp32 expert backends (per_expert, grouped, tensor) run everywhere";
}

namespace detail {

MEGAMOE_DECL cpu_features detect_cpu_features() {
  cpu_features f;
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  f.avx512f = __builtin_cpu_supports("avx512f") != 0;
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16") != 0;
#endif
  auto set = [](char const* name) {
    char const* value = std::getenv(name);
    return value != nullptr && std::string_view(value) != "" && std::string_view(value) != "0";
  };
  f.avx512_disabled_by_environment = set("MEGAMOE_DISABLE_AVX512");
  f.amx_disabled_by_environment = set("MEGAMOE_DISABLE_AMX");
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
  f.amx_tile = __builtin_cpu_supports("amx-tile") != 0;
  f.amx_bf16 = __builtin_cpu_supports("amx-bf16") != 0;
#if defined(__linux__)
  // 0x1023: ARCH_REQ_XCOMP_PERM; 18: XFEATURE_XTILEDATA. Asked only where the CPU has tiles and
  // AMX is not disabled, once per process.
  if (f.amx_tile && f.amx_bf16 && !f.amx_disabled_by_environment)
    f.amx_permitted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#endif
#endif
  return f;
}

}  // namespace detail

}  // namespace megamoe
