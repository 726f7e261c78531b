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
  static watchdog& instance() {
    static watchdog dog;
    return dog;
  }

  watchdog(watchdog const&) = delete;
  watchdog& operator=(watchdog const&) = delete;
  ~watchdog() { stop(); }

  /// Starts watching: a collective still running after `seconds` ends the job. `rank` and `size`
  /// name this rank in what it prints.
  void start(double seconds, int rank, int size) {
    stop();
    std::lock_guard lock(mutex_);
    limit_ = std::chrono::duration<double>(seconds);
    rank_ = rank;
    size_ = size;
    stopping_ = false;
    on_.store(true, std::memory_order_relaxed);
    thread_ = std::thread([this] { watch(); });
  }

  /// Stops the thread (collectives are no longer recorded).
  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (!thread_.joinable()) return;
      stopping_ = true;
      on_.store(false, std::memory_order_relaxed);
    }
    wake_.notify_all();
    thread_.join();
  }

  [[nodiscard]] bool on() const noexcept { return on_.load(std::memory_order_relaxed); }
  [[nodiscard]] double limit_seconds() const { return limit_.count(); }

  /// Where the training is: the collectives that start from now on are printed with it.
  void set_step(int step) {
    if (!on()) return;
    std::lock_guard lock(mutex_);
    step_ = step;
    micro_batch_ = stage_ = -1;
  }
  void set_pass(int micro_batch, int stage) {
    if (!on()) return;
    std::lock_guard lock(mutex_);
    micro_batch_ = micro_batch;
    stage_ = stage;
  }

  /// Records a collective on `comm` that starts now; returns its sequence number (0 when off).
  std::uint64_t begin(MPI_Comm comm, char const* operation, std::int64_t elements) {
    if (!on()) return 0;
    char name[MPI_MAX_OBJECT_NAME] = {};
    int length = 0, size = 0;
    MPI_Comm_get_name(comm, name, &length);
    MPI_Comm_size(comm, &size);
    std::lock_guard lock(mutex_);
    std::uint64_t const sequence = ++issued_;
    auto& r = ring_[sequence % ring_size];
    r.sequence = sequence;
    copy_text(r.operation, operation);
    copy_text(r.group, length > 0 ? name : "unnamed");
    r.group_size = size;
    r.elements = elements;
    r.step = step_;
    r.micro_batch = micro_batch_;
    r.stage = stage_;
    r.started = std::chrono::steady_clock::now();
    r.running = true;
    return sequence;
  }

  /// Marks collective `sequence` complete.
  void end(std::uint64_t sequence) {
    if (sequence == 0) return;
    std::lock_guard lock(mutex_);
    auto& r = ring_[sequence % ring_size];
    if (r.sequence == sequence) r.running = false;
  }

  /// The ring, oldest first, one line per collective.
  [[nodiscard]] std::string ring_text() const {
    std::lock_guard lock(mutex_);
    return ring_text_locked(std::chrono::steady_clock::now());
  }

 private:
  watchdog() = default;

  template <std::size_t N>
  static void copy_text(char (&to)[N], char const* from) {
    std::size_t i = 0;
    for (; i + 1 < N && from[i] != '\0'; ++i) to[i] = from[i];
    to[i] = '\0';
  }

  /// ", step k" and ", micro-batch m, virtual stage j" where the record has them.
  static std::string where(collective_record const& r) {
    std::string text;
    if (r.step > 0) text += ", step " + std::to_string(r.step);
    if (r.micro_batch >= 0)
      text += ", micro-batch " + std::to_string(r.micro_batch) + ", virtual stage " +
              std::to_string(r.stage);
    return text;
  }

  std::string ring_text_locked(std::chrono::steady_clock::time_point now) const {
    std::string text;
    for (std::size_t i = 1; i <= ring_size; ++i) {
      auto const& r = ring_[(issued_ + i) % ring_size];
      if (r.sequence == 0) continue;
      char line[240];
      double const age = std::chrono::duration<double>(now - r.started).count();
      std::snprintf(line, sizeof line,
                    "  #%llu %s on %s (%d ranks), %lld elements%s, %s, %.3f s ago\n",
                    static_cast<unsigned long long>(r.sequence), r.operation, r.group, r.group_size,
                    static_cast<long long>(r.elements), where(r).c_str(),
                    r.running ? "WAITING" : "done", age);
      text += line;
    }
    return text;
  }

  void watch() {
    auto const poll = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::min(limit_ / 4.0, std::chrono::duration<double>(0.25)));
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, poll, [this] { return stopping_; });
      if (stopping_) return;
      auto const now = std::chrono::steady_clock::now();
      for (auto const& r : ring_)
        if (r.running && now - r.started > limit_) return fire(r, now);
    }
  }

  /// Prints the ring and ends the process. Runs on the watchdog thread (the main thread is stuck
  /// in MPI), so it does not call MPI.
  [[noreturn]] void fire(collective_record const& stuck,
                         std::chrono::steady_clock::time_point now) {
    char head[320];
    std::snprintf(head, sizeof head,
                  "megamoe: rank %d of %d: watchdog: collective #%llu %s on %s (%d ranks)%s has "
                  "not completed after %.3g s; this rank's last collectives, oldest first:\n",
                  rank_, size_, static_cast<unsigned long long>(stuck.sequence), stuck.operation,
                  stuck.group, stuck.group_size, where(stuck).c_str(), limit_.count());
    std::string const text = head + ring_text_locked(now);
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
    // The other ranks' watchdogs fire at about the same time; give them a moment to print before
    // this exit makes mpiexec stop the job.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::_Exit(exit_status);
  }

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
inline double parse_watchdog_seconds(std::string const& text) {
  char* end = nullptr;
  double const seconds = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(seconds >= 0.0) || seconds > 1e7)
    throw config_error(rules::id::watchdog_seconds_valid, "got '" + text + "'");
  return seconds;
}

}  // namespace megamoe::parallel
