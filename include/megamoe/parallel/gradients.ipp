// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/gradients.ipp — the gradient reduction for float and double, compiled once under
// MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/gradients.hpp>

namespace megamoe::parallel {

#if !MEGAMOE_HEADER_ONLY
template class gradient_reduction<float>;
template class gradient_reduction<double>;
#endif

}  // namespace megamoe::parallel
