// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/all_to_all.ipp — the all-to-all dispatcher for float and double, neither
// overlapped nor moving codes, compiled once under MEGAMOE_SEPARATE_COMPILATION
// (core/compiled_once.hpp).
#pragma once

#include <megamoe/dispatch/all_to_all.hpp>

namespace megamoe::dispatch {

#if !MEGAMOE_HEADER_ONLY
template class all_to_all_dispatcher<float, float, false, false>;
template class all_to_all_dispatcher<double, double, false, false>;
#endif

}  // namespace megamoe::dispatch
