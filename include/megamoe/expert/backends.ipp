// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/backends.ipp — the definitions behind backends.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/expert/backends.hpp>

namespace megamoe::expert {

MEGAMOE_DECL std::string unavailable_reason(gemm_backend b) {
  if (b == gemm_backend::amx) return cpu().amx_unavailable_reason();
  if (b == gemm_backend::avx512_bf16) return cpu().avx512_bf16_unavailable_reason();
  return {};
}

}  // namespace megamoe::expert
