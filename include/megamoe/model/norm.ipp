// SPDX-License-Identifier: Apache-2.0
// megamoe/model/norm.ipp — RMSNorm for float and double, compiled once under
// MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp).
#pragma once

#include <megamoe/model/norm.hpp>

namespace megamoe {

#if !MEGAMOE_HEADER_ONLY
template class rms_norm<float>;
template class rms_norm<double>;
#endif

}  // namespace megamoe
