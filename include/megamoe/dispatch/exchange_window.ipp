// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/exchange_window.ipp — the definitions behind exchange_window.hpp that depend on
// no configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/dispatch/exchange_window.hpp>

namespace megamoe::dispatch {

MEGAMOE_DECL void exchange_window::allocate(boost::mpi::communicator const& comm,
                                            std::size_t bytes) {
  if (window_.allocated()) {
    window_.fence();
    window_.free();
  }
  window_ = parallel::shared_window(comm, bytes);
  last_ = region::none;
  ++allocations_;
}

MEGAMOE_DECL void exchange_window::enter(region r) {
  if (last_ == r) window_.fence();
  last_ = r;
}

MEGAMOE_DECL void exchange_window::settle(region r) {
  if (last_ != r) return;
  window_.fence();
  last_ = region::none;
}

}  // namespace megamoe::dispatch
