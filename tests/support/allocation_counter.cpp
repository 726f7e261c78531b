// SPDX-License-Identifier: Apache-2.0
// malloc and friends replaced by counting wrappers around glibc's __libc_* entry points. Sizes at
// free come from malloc_usable_size, so live and peak bytes are the allocator's usable sizes.
#include "support/allocation_counter.hpp"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void __libc_free(void*);
}

namespace {
std::atomic<std::uint64_t> calls{0}, requested{0};
std::atomic<std::size_t> live{0}, peak{0};

void* counted(void* p, std::size_t asked) {
  if (p == nullptr) return p;
  calls.fetch_add(1, std::memory_order_relaxed);
  requested.fetch_add(asked, std::memory_order_relaxed);
  std::size_t const now =
      live.fetch_add(malloc_usable_size(p), std::memory_order_relaxed) + malloc_usable_size(p);
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
  return p;
}
void released(void* p) {
  if (p != nullptr) live.fetch_sub(malloc_usable_size(p), std::memory_order_relaxed);
}
}  // namespace

extern "C" {
void* malloc(std::size_t n) {
  return counted(__libc_malloc(n), n);
}
void* calloc(std::size_t count, std::size_t n) {
  return counted(__libc_calloc(count, n), count * n);
}
void free(void* p) {
  released(p);
  __libc_free(p);
}
void* realloc(void* p, std::size_t n) {
  released(p);
  return counted(__libc_realloc(p, n), n);
}
void* memalign(std::size_t alignment, std::size_t n) {
  return counted(__libc_memalign(alignment, n), n);
}
void* aligned_alloc(std::size_t alignment, std::size_t n) {
  return memalign(alignment, n);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t n) {
  void* p = memalign(alignment, n);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
}

namespace megamoe::testing {
allocation_totals allocations() {
  return {calls.load(), requested.load(), live.load(), peak.load()};
}
void reset_peak() {
  peak.store(live.load());
}
}  // namespace megamoe::testing
