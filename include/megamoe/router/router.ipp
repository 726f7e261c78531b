// SPDX-License-Identifier: Apache-2.0
// megamoe/router/router.ipp — the routers' stashes for the recipes' element types, compiled once
// under MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp).
#pragma once

#include <megamoe/router/router.hpp>

namespace megamoe {

#if !MEGAMOE_HEADER_ONLY
template class MEGAMOE_ROUTER_STASH(float, float);
template class MEGAMOE_ROUTER_STASH(double, float);
template class MEGAMOE_ROUTER_STASH(double, double);
#endif

}  // namespace megamoe
