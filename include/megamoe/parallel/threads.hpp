// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/threads.hpp — how many threads a rank's pool gets: MEGAMOE_NUM_THREADS (R028),
// or the cores this process may run on divided by the ranks sharing the machine.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/policy/error.hpp>

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

namespace megamoe {

/// Cores this process may run on (its CPU affinity), at least 1.
MEGAMOE_DECL int available_cores();

/// Parses a MEGAMOE_NUM_THREADS value: a positive integer, or R028.
MEGAMOE_DECL int parse_num_threads(std::string const& text);

/// Threads for this process: MEGAMOE_NUM_THREADS when set, otherwise the cores divided by the ranks
/// that share this machine, at least 1.
MEGAMOE_DECL int num_threads_from_environment(int ranks_on_node = 1);

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/threads.ipp>
#endif
