// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/threads.hpp — how many threads a rank's pool gets: MEGAMOE_NUM_THREADS (R028),
// or the cores this process may run on divided by the ranks sharing the machine.
#pragma once

#include <megamoe/policy/error.hpp>

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

namespace megamoe {

/// Cores this process may run on (its CPU affinity), at least 1.
inline int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1U, std::thread::hardware_concurrency());
}

/// Parses a MEGAMOE_NUM_THREADS value: a positive integer, or R028.
inline int parse_num_threads(std::string const& text) {
  char* end = nullptr;
  errno = 0;
  long const n = std::strtol(text.c_str(), &end, 10);
  bool const digits_only =
      !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits_only || end != text.c_str() + text.size() || errno == ERANGE || n < 1 || n > 4096)
    throw config_error(rules::id::num_threads_positive, "got '" + text + "'");
  return static_cast<int>(n);
}

/// Threads for this process: MEGAMOE_NUM_THREADS when set, otherwise the cores divided by the ranks
/// that share this machine, at least 1.
inline int num_threads_from_environment(int ranks_on_node = 1) {
  if (char const* text = std::getenv("MEGAMOE_NUM_THREADS")) return parse_num_threads(text);
  return std::max(1, available_cores() / std::max(1, ranks_on_node));
}

}  // namespace megamoe
