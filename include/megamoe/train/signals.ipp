// SPDX-License-Identifier: Apache-2.0
// megamoe/train/signals.ipp — the definitions behind signals.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/signals.hpp>

namespace megamoe::train {

MEGAMOE_DECL void request_termination(int signal) {
  terminate_requested = signal;
}

MEGAMOE_DECL void handle_termination_signal() {
  std::signal(SIGTERM, request_termination);
  std::signal(SIGUSR1, request_termination);
}

MEGAMOE_DECL int termination_requested(boost::mpi::communicator const& world) {
  return boost::mpi::all_reduce(world, static_cast<int>(terminate_requested),
                                boost::mpi::maximum<int>());
}

MEGAMOE_DECL char const* termination_signal_name(int signal) {
  return signal == SIGUSR1 ? "SIGUSR1" : "SIGTERM";
}

}  // namespace megamoe::train
