// SPDX-License-Identifier: Apache-2.0
// megamoe/model/flash_attention.ipp — the definitions behind flash_attention.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/model/flash_attention.hpp>

namespace megamoe::attention {

MEGAMOE_DECL void attention_shape::check(bool rope) const {
  auto fail = [](std::string const& what) { throw input_error("flash attention: " + what); };
  if (seq < 1 || keys() < 1 || batch < 1 || heads < 1 || qk_head < 1 || value_head() < 1)
    fail("sizes must be positive");
  if (groups() < 1 || heads % groups() != 0)
    fail(std::to_string(groups()) + " query groups do not divide " + std::to_string(heads) +
         " heads");
  if (rope && qk_head % 2 != 0) fail("RoPE needs an even query/key head size");
  if (query_offset < 0 || key_offset < 0) fail("negative position offset");
}

#if !MEGAMOE_HEADER_ONLY
template class flash_attention<float>;
template class flash_attention<double>;
#endif

}  // namespace megamoe::attention
