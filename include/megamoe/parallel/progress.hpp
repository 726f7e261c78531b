// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/progress.hpp — keeping non-blocking MPI exchanges moving while the pool
// computes. Open MPI 4.1 has no progress thread, and only the main thread calls MPI (FUNNELED):
// the main thread, waiting for the pool's tasks, wakes every `thread_pool::wait_interval()` and
// tests the requests registered here, until they have all completed.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/thread_pool.hpp>

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace megamoe::parallel {

/// MPI requests in flight that the thread waiting in `thread_pool::run` tests. The requests must
/// stay where they are while registered; a completed one reads MPI_REQUEST_NULL afterwards, as
/// after MPI_Wait.
class exchange_progress {
 public:
  void watch(MPI_Request* request) { requests_.push_back(request); }
  void clear() noexcept { requests_.clear(); }
  [[nodiscard]] bool empty() const noexcept { return requests_.empty(); }

  /// Tests every pending request once (main thread only); counts the rounds. Returns whether any
  /// is still pending.
  bool poll();
  /// Rounds of tests so far (for tests and benchmarks).
  [[nodiscard]] std::uint64_t polls() const noexcept { return polls_; }

  /// While it lives, `pool`'s waiting thread tests these requests (and the previous hook is
  /// restored after).
  class attached : public scoped_wait_hook {
   public:
    attached(exchange_progress& progress, thread_pool& pool)
        : scoped_wait_hook(pool, {&exchange_progress::poll_of, &progress}) {}
  };
  [[nodiscard]] attached while_waiting(thread_pool& pool) { return attached(*this, pool); }

 private:
  static bool poll_of(void* state) { return static_cast<exchange_progress*>(state)->poll(); }

  std::vector<MPI_Request*> requests_;
  std::uint64_t polls_ = 0;
};

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/progress.ipp>
#endif
