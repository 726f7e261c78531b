// SPDX-License-Identifier: Apache-2.0
// megamoe/train/signals.ipp — the definitions behind signals.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/signals.hpp>

namespace megamoe::train {

MEGAMOE_DECL void request_termination(int) {
  terminate_requested = 1;
}

MEGAMOE_DECL void handle_termination_signal() {
  std::signal(SIGTERM, request_termination);
}

MEGAMOE_DECL bool termination_requested(boost::mpi::communicator const& world) {
  return boost::mpi::all_reduce(world, static_cast<int>(terminate_requested),
                                boost::mpi::maximum<int>()) != 0;
}

}  // namespace megamoe::train
