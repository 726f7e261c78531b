// SPDX-License-Identifier: Apache-2.0
// megamoe/model/attention_core.ipp — the attention core for float and double and either CP
// communication, compiled once under MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp).
#pragma once

#include <megamoe/model/attention_core.hpp>

namespace megamoe {

#if !MEGAMOE_HEADER_ONLY
template class attention_core<float, parallel::cp_comm_type::p2p>;
template class attention_core<float, parallel::cp_comm_type::all_gather>;
template class attention_core<double, parallel::cp_comm_type::p2p>;
template class attention_core<double, parallel::cp_comm_type::all_gather>;
#endif

}  // namespace megamoe
