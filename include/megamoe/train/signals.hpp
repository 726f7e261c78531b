// SPDX-License-Identifier: Apache-2.0
// megamoe/train/signals.hpp — a termination request (SIGTERM) noted by a handler and agreed over
// the job after a step, so every rank saves and stops at the same step (the reference's
// --exit-signal-handler).
#pragma once

#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/operations.hpp>
#include <megamoe/core/compiled_once.hpp>

#include <csignal>

namespace megamoe::train {

inline volatile std::sig_atomic_t terminate_requested = 0;
MEGAMOE_DECL void request_termination(int);

/// From now on SIGTERM asks the job to stop after its current step.
MEGAMOE_DECL void handle_termination_signal();

/// Whether any rank of `world` was asked to terminate (a collective: every rank calls it).
MEGAMOE_DECL bool termination_requested(boost::mpi::communicator const& world);

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/signals.ipp>
#endif
