// SPDX-License-Identifier: Apache-2.0
// megamoe/model/embedding.ipp — the token embedding for float and double, compiled once under
// MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp).
#pragma once

#include <megamoe/model/embedding.hpp>

namespace megamoe {

#if !MEGAMOE_HEADER_ONLY
template class token_embedding<float>;
template class token_embedding<double>;
#endif

}  // namespace megamoe
