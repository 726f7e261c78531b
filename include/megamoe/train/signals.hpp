// SPDX-License-Identifier: Apache-2.0
// megamoe/train/signals.hpp — a termination request (SIGTERM, or SIGUSR1) noted by a handler and
// agreed over the job after a step, so every rank saves and stops at the same step (the
// reference's --exit-signal-handler). SIGUSR1 too, because Open MPI's mpiexec answers SIGTERM by
// killing the ranks but forwards SIGUSR1 to them untouched (megamoe-run passes a SIGTERM on so).
#pragma once

#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/operations.hpp>
#include <megamoe/core/compiled_once.hpp>

#include <csignal>

namespace megamoe::train {

/// The signal that asked this rank to terminate (0: none).
inline volatile std::sig_atomic_t terminate_requested = 0;
MEGAMOE_DECL void request_termination(int signal);

/// From now on SIGTERM and SIGUSR1 ask the job to stop after its current step.
MEGAMOE_DECL void handle_termination_signal();

/// The signal that asked some rank of `world` to terminate, 0 if none (a collective: every rank
/// calls it).
MEGAMOE_DECL int termination_requested(boost::mpi::communicator const& world);

/// "SIGTERM" or "SIGUSR1".
MEGAMOE_DECL char const* termination_signal_name(int signal);

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/signals.ipp>
#endif
