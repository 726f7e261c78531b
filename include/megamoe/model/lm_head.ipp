// SPDX-License-Identifier: Apache-2.0
// megamoe/model/lm_head.ipp — the output layer for float and double, compiled once under
// MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp).
#pragma once

#include <megamoe/model/lm_head.hpp>

namespace megamoe {

#if !MEGAMOE_HEADER_ONLY
template struct cross_entropy_pass<float>;
template struct cross_entropy_pass<double>;
template class lm_head<float>;
template class lm_head<double>;
#endif

}  // namespace megamoe
