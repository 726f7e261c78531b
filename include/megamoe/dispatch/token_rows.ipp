// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/token_rows.ipp — the definitions behind token_rows.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/dispatch/token_rows.hpp>

namespace megamoe::dispatch {

MEGAMOE_DECL void token_rows::index() {
  int const N = rows(), T = tokens();
  start_.assign(static_cast<std::size_t>(T) + 1, 0);
  for (int j = 0; j < N; ++j) ++start_[static_cast<std::size_t>(source_token(j)) + 1];
  for (int t = 0; t < T; ++t)
    start_[static_cast<std::size_t>(t) + 1] += start_[static_cast<std::size_t>(t)];
  order_.resize(static_cast<std::size_t>(N));
  fill_.assign(start_.begin(), start_.end() - 1);
  for (int j = 0; j < N; ++j)
    order_[static_cast<std::size_t>(fill_[static_cast<std::size_t>(source_token(j))]++)] = j;
}

}  // namespace megamoe::dispatch
