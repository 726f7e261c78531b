// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/threads.ipp — the definitions behind threads.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/threads.hpp>

namespace megamoe {

MEGAMOE_DECL int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1U, std::thread::hardware_concurrency());
}

MEGAMOE_DECL int parse_num_threads(std::string const& text) {
  char* end = nullptr;
  errno = 0;
  long const n = std::strtol(text.c_str(), &end, 10);
  bool const digits_only =
      !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits_only || end != text.c_str() + text.size() || errno == ERANGE || n < 1 || n > 4096)
    throw config_error(rules::id::num_threads_positive, "got '" + text + "'");
  return static_cast<int>(n);
}

MEGAMOE_DECL int num_threads_from_environment(int ranks_on_node) {
  if (char const* text = std::getenv("MEGAMOE_NUM_THREADS")) return parse_num_threads(text);
  return std::max(1, available_cores() / std::max(1, ranks_on_node));
}

}  // namespace megamoe
