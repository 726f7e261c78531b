// SPDX-License-Identifier: Apache-2.0
// Counts every heap allocation of the program: operator new and Eigen's aligned allocations both
// end in malloc, which allocation_counter.cpp replaces (forwarding to glibc's own allocator). Link
// that file into a program to count; the numbers cover all threads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megamoe::testing {

struct allocation_totals {
  std::uint64_t calls = 0;     // malloc, calloc, realloc, memalign family
  std::uint64_t bytes = 0;     // bytes asked for by those calls
  std::size_t live_bytes = 0;  // usable bytes held now
  std::size_t peak_bytes = 0;  // highest live_bytes since the last reset_peak()
};

/// Totals since the program started.
allocation_totals allocations();
/// Starts a new peak from the bytes held now.
void reset_peak();

}  // namespace megamoe::testing
