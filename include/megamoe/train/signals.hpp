// SPDX-License-Identifier: Apache-2.0
// megamoe/train/signals.hpp — a termination request (SIGTERM) noted by a handler and agreed over
// the job after a step, so every rank saves and stops at the same step (the reference's
// --exit-signal-handler).
#pragma once

#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/operations.hpp>

#include <csignal>

namespace megamoe::train {

inline volatile std::sig_atomic_t terminate_requested = 0;
inline void request_termination(int) {
  terminate_requested = 1;
}

/// From now on SIGTERM asks the job to stop after its current step.
inline void handle_termination_signal() {
  std::signal(SIGTERM, request_termination);
}

/// Whether any rank of `world` was asked to terminate (a collective: every rank calls it).
inline bool termination_requested(boost::mpi::communicator const& world) {
  return boost::mpi::all_reduce(world, static_cast<int>(terminate_requested),
                                boost::mpi::maximum<int>()) != 0;
}

}  // namespace megamoe::train
