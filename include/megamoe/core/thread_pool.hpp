// SPDX-License-Identifier: Apache-2.0
// megamoe/core/thread_pool.hpp — megamoe's one thread pool.
//
// No OpenMP: megamoe owns one pool per process; Eigen products run single-threaded inside its
// tasks, and Tensor expressions (where a unit includes Eigen's Tensor module) on a
// ThreadPoolDevice over it. The thread that waits for the
// pool's tasks may do other work meanwhile through a `wait_hook` (the overlapped exchanges keep
// their MPI requests moving that way: parallel/progress.hpp). How many threads a rank gets is
// parallel/threads.hpp's business.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/tensor.hpp>

#include <unsupported/Eigen/CXX11/ThreadPool>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace Eigen {
struct ThreadPoolDevice;  // Eigen's Tensor module (unsupported/Eigen/CXX11/Tensor)
}  // namespace Eigen

namespace megamoe {

/// What the thread waiting in `thread_pool::run` does besides waiting: every interval it calls
/// `poll(state)`, which says whether anything is still pending (false: it then waits quietly for
/// the tasks). Only the caller of `run` ever calls it. parallel::exchange_progress installs one
/// while non-blocking MPI exchanges are in flight, since Open MPI has no progress thread.
struct wait_hook {
  bool (*poll)(void* state) = nullptr;
  void* state = nullptr;
};

/// A fixed set of worker threads, and an Eigen device over them for Tensor expressions.
class thread_pool {
 public:
  explicit thread_pool(int num_threads);
  ~thread_pool();

  thread_pool(thread_pool const&) = delete;
  thread_pool& operator=(thread_pool const&) = delete;

  [[nodiscard]] int size() const noexcept { return pool_.NumThreads(); }

  /// For `tensor.device(pool.device()) = expression;` in a unit that includes Eigen's Tensor
  /// module (a template, so that other units need not: a device is a pointer and a count).
  template <class Device = Eigen::ThreadPoolDevice>
  [[nodiscard]] Device device() const noexcept {
    return Device(&pool_, size());
  }

  /// Runs `task(i)` for i in [0, count) on the pool's threads and waits for all of them. The caller
  /// must not be one of the pool's own threads. Allocation-free: each scheduled closure is one
  /// pointer and an index, small enough for std::function's in-place storage.
  template <class Task>
  void run(int count, Task const& task) {
    if (count <= 0) return;
    if (hook_.poll != nullptr) return run_polling(count, task);
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

  /// Installs what the waiting thread does while `run` waits (an empty hook: nothing, it sleeps).
  void set_wait_hook(wait_hook hook) noexcept { hook_ = hook; }
  [[nodiscard]] wait_hook const& hook() const noexcept { return hook_; }
  /// How often the waiting thread wakes to call the hook.
  void set_wait_interval(std::chrono::microseconds every) noexcept { interval_ = every; }
  [[nodiscard]] std::chrono::microseconds wait_interval() const noexcept { return interval_; }

 private:
  /// `run` with a hook: the caller wakes every interval to call it, until it reports nothing
  /// pending or the tasks end.
  template <class Task>
  void run_polling(int count, Task const& task) {
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
    while (pending && !shared.finished.wait_for(hold, interval_, done)) {
      hold.unlock();
      pending = hook_.poll(hook_.state);
      hold.lock();
    }
    shared.finished.wait(hold, done);  // nothing pending: no more wake-ups
  }

  mutable Eigen::ThreadPool pool_;  // a device schedules on it from const access
  wait_hook hook_{};
  std::chrono::microseconds interval_{200};
};

/// Installs a wait hook on a pool for its lifetime; the previous hook is restored after, also when
/// the work it accompanies throws.
class scoped_wait_hook {
 public:
  scoped_wait_hook(thread_pool& pool, wait_hook hook) : pool_(pool), before_(pool.hook()) {
    pool.set_wait_hook(hook);
  }
  ~scoped_wait_hook() { pool_.set_wait_hook(before_); }
  scoped_wait_hook(scoped_wait_hook const&) = delete;
  scoped_wait_hook& operator=(scoped_wait_hook const&) = delete;

 private:
  thread_pool& pool_;
  wait_hook before_;
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

#if MEGAMOE_HEADER_ONLY
#include <megamoe/core/thread_pool.ipp>
#endif
