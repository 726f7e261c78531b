// SPDX-License-Identifier: Apache-2.0
// megamoe/core/resident_memory.hpp — this process's memory resident in RAM, as the kernel counts
// it (what a job's memory limit and the out-of-memory killer see).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace megamoe {

/// Bytes of this process resident in RAM (Linux: /proc/self/statm's second field, in pages); 0
/// where that cannot be read.
inline std::int64_t resident_bytes() {
  std::FILE* const file = std::fopen("/proc/self/statm", "r");
  if (file == nullptr) return 0;
  long long size = 0, resident = 0;
  int const read = std::fscanf(file, "%lld %lld", &size, &resident);
  std::fclose(file);
  return read == 2 ? static_cast<std::int64_t>(resident) * sysconf(_SC_PAGESIZE) : 0;
}

}  // namespace megamoe
