// SPDX-License-Identifier: Apache-2.0
// megamoe/model/attention.ipp — causal attention for float and double with exact operands, P2P
// context parallelism and the grouped GEMM, compiled once under MEGAMOE_SEPARATE_COMPILATION
// (core/compiled_once.hpp).
#pragma once

#include <megamoe/model/attention.hpp>

namespace megamoe {

#if !MEGAMOE_HEADER_ONLY
template class causal_attention<float, false>;
template class causal_attention<float, true>;
template class causal_attention<double, false>;
#endif

}  // namespace megamoe
