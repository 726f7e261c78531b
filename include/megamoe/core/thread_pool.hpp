// SPDX-License-Identifier: Apache-2.0
// megamoe/core/thread_pool.hpp — megamoe's one thread pool, and how many threads it gets.
//
// No OpenMP: megamoe owns one pool per process; Eigen products and Tensor expressions run on it
// through its ThreadPoolDevice, or single-threaded inside its tasks. Only the main thread calls
// MPI: while it waits for the pool's tasks it can keep non-blocking exchanges moving (Open MPI has
// no progress thread), by testing the requests registered in `progress()`.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
    throw config_error(28, "got '" + text + "'");
  return static_cast<int>(n);
}

/// Threads for this process: MEGAMOE_NUM_THREADS when set, otherwise the cores divided by the ranks
/// that share this machine, at least 1.
inline int num_threads_from_environment(int ranks_on_node = 1) {
  if (char const* text = std::getenv("MEGAMOE_NUM_THREADS")) return parse_num_threads(text);
  return std::max(1, available_cores() / std::max(1, ranks_on_node));
}

/// MPI requests in flight that the thread waiting in `thread_pool::run` tests every `interval`,
/// so that they progress while the pool computes. The requests must stay where they are while
/// registered; a completed one reads MPI_REQUEST_NULL afterwards, as after MPI_Wait.
class exchange_progress {
 public:
  void watch(MPI_Request* request) { requests_.push_back(request); }
  void clear() noexcept { requests_.clear(); }
  [[nodiscard]] bool empty() const noexcept { return requests_.empty(); }
  [[nodiscard]] std::chrono::microseconds interval() const noexcept { return interval_; }
  void set_interval(std::chrono::microseconds every) noexcept { interval_ = every; }
  /// Tests every pending request once (main thread only); counts the rounds. Returns whether any
  /// is still pending.
  bool poll() {
    ++polls_;
    bool pending = false;
    for (MPI_Request* r : requests_)
      if (*r != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        pending = pending || flag == 0;
      }
    return pending;
  }
  /// Rounds of tests so far (for tests and benchmarks).
  [[nodiscard]] std::uint64_t polls() const noexcept { return polls_; }

 private:
  std::vector<MPI_Request*> requests_;
  std::chrono::microseconds interval_{200};
  std::uint64_t polls_ = 0;
};

/// A fixed set of worker threads with an Eigen device for Tensor expressions.
class thread_pool {
 public:
  explicit thread_pool(int num_threads)
      : pool_(std::max(1, num_threads)), device_(&pool_, std::max(1, num_threads)) {}

  thread_pool(thread_pool const&) = delete;
  thread_pool& operator=(thread_pool const&) = delete;

  [[nodiscard]] int size() const noexcept { return pool_.NumThreads(); }

  /// For `tensor.device(pool.device()) = expression;`.
  [[nodiscard]] Eigen::ThreadPoolDevice const& device() const noexcept { return device_; }

  /// Runs `task(i)` for i in [0, count) on the pool's threads and waits for all of them. The caller
  /// must not be one of the pool's own threads. Allocation-free: each scheduled closure is one
  /// pointer and an index, small enough for std::function's in-place storage.
  template <class Task>
  void run(int count, Task const& task) {
    if (count <= 0) return;
    if (!progress_.empty()) return run_testing(count, task);
    Eigen::Barrier done(static_cast<unsigned>(count));
    struct job {
      Task const* task;
      Eigen::Barrier* done;
    } const shared{&task, &done};
    job const* const j = &shared;
    for (int i = 0; i < count; ++i)
      pool_.Schedule([j, i] {
        (*j->task)(i);
        j->done->Notify();
      });
    done.Wait();
  }

  /// The index in [0, size()) of the pool thread running the caller, or -1 outside the pool.
  [[nodiscard]] int current_thread() const noexcept { return pool_.CurrentThreadId(); }

  /// Requests the waiting thread tests during `run` (none: it just sleeps until the tasks end).
  [[nodiscard]] exchange_progress& progress() noexcept { return progress_; }

 private:
  /// `run` while requests are registered: the caller wakes every interval to test them.
  template <class Task>
  void run_testing(int count, Task const& task) {
    struct job {
      Task const* task;
      std::mutex lock;
      std::condition_variable finished;
      int remaining;
    } shared{&task, {}, {}, count};
    job* const j = &shared;
    for (int i = 0; i < count; ++i)
      pool_.Schedule([j, i] {
        (*j->task)(i);
        std::lock_guard const hold(j->lock);  // decrement and notify under the lock: the waiter
        if (--j->remaining == 0) j->finished.notify_one();  // may return as soon as it sees 0
      });
    std::unique_lock hold(shared.lock);
    auto const done = [&] { return shared.remaining == 0; };
    bool pending = true;
    while (pending && !shared.finished.wait_for(hold, progress_.interval(), done)) {
      hold.unlock();
      pending = progress_.poll();
      hold.lock();
    }
    shared.finished.wait(hold, done);  // every exchange complete: no more wake-ups
  }

  Eigen::ThreadPool pool_;
  Eigen::ThreadPoolDevice device_;
  exchange_progress progress_;
};

/// Runs `body(begin, end)` over [0, count) cut into one contiguous range per pool thread (at most
/// `count` ranges).
template <class Body>
void parallel_rows(thread_pool& pool, int count, Body const& body) {
  if (count <= 0) return;
  int const tasks = std::max(1, std::min(pool.size(), count));
  pool.run(tasks, [&](int i) {
    int const begin = static_cast<int>(static_cast<long long>(count) * i / tasks);
    int const end = static_cast<int>(static_cast<long long>(count) * (i + 1) / tasks);
    body(begin, end);
  });
}

}  // namespace megamoe
