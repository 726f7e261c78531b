// SPDX-License-Identifier: Apache-2.0
// megamoe/model/moe_experts.ipp — the experts' stash for float and double, compiled once under
// MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp).
#pragma once

#include <megamoe/model/moe_experts.hpp>

namespace megamoe {

#if !MEGAMOE_HEADER_ONLY
template class activation_stash<std::array<buffer<float>, 7>, float*, float*, float*, std::vector<float>>;
template class activation_stash<std::array<buffer<double>, 7>, double*, double*, double*, std::vector<double>>;
#endif

}  // namespace megamoe
