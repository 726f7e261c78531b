// SPDX-License-Identifier: Apache-2.0
// megamoe/model/context.ipp — the definitions behind context.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/model/context.hpp>

namespace megamoe {

MEGAMOE_DECL context::context(int num_threads)
    : pool_(num_threads), float_exec_(pool_), double_exec_(pool_) {}

MEGAMOE_DECL std::size_t context::scratch_bytes() const noexcept {
  return float_exec_.workspace_bytes() + double_exec_.workspace_bytes() +
         float_scratch_.capacity_bytes() + double_scratch_.capacity_bytes();
}

}  // namespace megamoe
