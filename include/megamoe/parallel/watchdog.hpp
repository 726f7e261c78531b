// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/watchdog.hpp — a per-rank record of the collectives megamoe issues, and a
// thread that ends the job when one of them does not complete in time.
//
// A job whose ranks issue collectives in different orders or sizes waits forever. With the
// watchdog on (MEGAMOE_WATCHDOG_SECONDS, or `watchdog::instance().start`), every collective
// megamoe issues is written to a small ring on its rank (sequence number, operation, group,
// elements); if one has not completed after the limit, the rank prints its ring (one write, so
// ranks do not interleave), waits a moment so that the other stuck ranks print theirs, and exits
// with status 124: mpiexec then stops the job. Comparing the rings shows the mismatch.
// Off, recording costs one relaxed atomic load per collective; on, a lock and a clock read.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/policy/error.hpp>

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace megamoe::parallel {

/// One collective as the ring keeps it.
struct collective_record {
  std::uint64_t sequence = 0;  // 1, 2, ... on each rank; 0: an empty slot
  char operation[24] = {};
  char group[32] = {};
  int group_size = 0;
  std::int64_t elements = 0;  // elements this rank sends (or reduces)
  // Where the training was when it started: the step (0: outside one), and the pipeline pass's
  // micro-batch and virtual stage (-1: outside one).
  int step = 0, micro_batch = -1, stage = -1;
  std::chrono::steady_clock::time_point started;
  bool running = false;
};

class watchdog {
 public:
  static constexpr std::size_t ring_size = 16;
  static constexpr int exit_status = 124;

  /// The process's watchdog (one per rank).
  static watchdog& instance();

  watchdog(watchdog const&) = delete;
  watchdog& operator=(watchdog const&) = delete;
  ~watchdog() { stop(); }

  /// Starts watching: a collective still running after `seconds` ends the job. `rank` and `size`
  /// name this rank in what it prints.
  void start(double seconds, int rank, int size);

  /// Stops the thread (collectives are no longer recorded).
  void stop();

  [[nodiscard]] bool on() const noexcept { return on_.load(std::memory_order_relaxed); }
  [[nodiscard]] double limit_seconds() const { return limit_.count(); }

  /// Where the training is: the collectives that start from now on are printed with it.
  void set_step(int step);
  void set_pass(int micro_batch, int stage);

  /// Records a collective on `comm` that starts now; returns its sequence number (0 when off).
  std::uint64_t begin(MPI_Comm comm, char const* operation, std::int64_t elements);

  /// Marks collective `sequence` complete.
  void end(std::uint64_t sequence);

  /// The ring, oldest first, one line per collective.
  [[nodiscard]] std::string ring_text() const;

 private:
  watchdog() = default;

  template <std::size_t N>
  static void copy_text(char (&to)[N], char const* from) {
    std::size_t i = 0;
    for (; i + 1 < N && from[i] != '\0'; ++i) to[i] = from[i];
    to[i] = '\0';
  }

  /// ", step k" and ", micro-batch m, virtual stage j" where the record has them.
  static std::string where(collective_record const& r);

  std::string ring_text_locked(std::chrono::steady_clock::time_point now) const;

  void watch();

  /// Prints the ring and ends the process. Runs on the watchdog thread (the main thread is stuck
  /// in MPI), so it does not call MPI.
  [[noreturn]] void fire(collective_record const& stuck, std::chrono::steady_clock::time_point now);

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  std::atomic<bool> on_{false};
  bool stopping_ = false;
  std::chrono::duration<double> limit_{0.0};
  int rank_ = 0, size_ = 1;
  int step_ = 0, micro_batch_ = -1, stage_ = -1;
  std::uint64_t issued_ = 0;
  std::array<collective_record, ring_size> ring_{};
};

/// Records one blocking collective for as long as it lives; `release()` hands the record to a
/// non-blocking request, which ends it when it completes.
class watched_collective {
 public:
  watched_collective(MPI_Comm comm, char const* operation, std::int64_t elements)
      : sequence_(watchdog::instance().begin(comm, operation, elements)) {}
  ~watched_collective() { watchdog::instance().end(sequence_); }
  watched_collective(watched_collective const&) = delete;
  watched_collective& operator=(watched_collective const&) = delete;
  [[nodiscard]] std::uint64_t release() noexcept { return std::exchange(sequence_, 0); }

 private:
  std::uint64_t sequence_;
};

/// Parses a MEGAMOE_WATCHDOG_SECONDS value: seconds > 0, or 0 for off; anything else is R035.
MEGAMOE_DECL double parse_watchdog_seconds(std::string const& text);

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/watchdog.ipp>
#endif
