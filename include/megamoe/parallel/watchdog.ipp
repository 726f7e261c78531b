// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/watchdog.ipp — the definitions behind watchdog.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/wait_clock.hpp>
#include <megamoe/parallel/watchdog.hpp>

namespace megamoe::parallel {

MEGAMOE_DECL watchdog& watchdog::instance() {
  static watchdog dog;
  return dog;
}

MEGAMOE_DECL void watchdog::start(double seconds, int rank, int size) {
  stop();
  std::lock_guard lock(mutex_);
  limit_ = std::chrono::duration<double>(seconds);
  rank_ = rank;
  size_ = size;
  stopping_ = false;
  on_.store(true, std::memory_order_relaxed);
  thread_ = std::thread([this] { watch(); });
}

MEGAMOE_DECL void watchdog::stop() {
  {
    std::lock_guard lock(mutex_);
    if (!thread_.joinable()) return;
    stopping_ = true;
    on_.store(false, std::memory_order_relaxed);
  }
  wake_.notify_all();
  thread_.join();
}

MEGAMOE_DECL void watchdog::set_step(int step) {
  if (!on()) return;
  std::lock_guard lock(mutex_);
  step_ = step;
  micro_batch_ = stage_ = -1;
}

MEGAMOE_DECL void watchdog::set_pass(int micro_batch, int stage) {
  if (!on()) return;
  std::lock_guard lock(mutex_);
  micro_batch_ = micro_batch;
  stage_ = stage;
}

MEGAMOE_DECL std::uint64_t watchdog::begin(MPI_Comm comm, char const* operation,
                                           std::int64_t elements) {
  if (!on()) return wait_clock::open(0);
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
  return wait_clock::open(sequence);
}

MEGAMOE_DECL void watchdog::end(std::uint64_t sequence) {
  if (sequence == 0) return;
  wait_clock::close(sequence, true);
  if (!on()) return;
  std::lock_guard lock(mutex_);
  auto& r = ring_[sequence % ring_size];
  if (r.sequence == sequence) r.running = false;
}

MEGAMOE_DECL std::string watchdog::ring_text() const {
  std::lock_guard lock(mutex_);
  return ring_text_locked(std::chrono::steady_clock::now());
}

MEGAMOE_DECL std::string watchdog::where(collective_record const& r) {
  std::string text;
  if (r.step > 0) text += ", step " + std::to_string(r.step);
  if (r.micro_batch >= 0)
    text += ", micro-batch " + std::to_string(r.micro_batch) + ", virtual stage " +
            std::to_string(r.stage);
  return text;
}

MEGAMOE_DECL std::string watchdog::ring_text_locked(
    std::chrono::steady_clock::time_point now) const {
  std::string text;
  for (std::size_t i = 1; i <= ring_size; ++i) {
    auto const& r = ring_[(issued_ + i) % ring_size];
    if (r.sequence == 0) continue;
    char line[240];
    double const age = std::chrono::duration<double>(now - r.started).count();
    std::snprintf(
        line, sizeof line, "  #%llu %s on %s (%d ranks), %lld elements%s, %s, %.3f s ago\n",
        static_cast<unsigned long long>(r.sequence), r.operation, r.group, r.group_size,
        static_cast<long long>(r.elements), where(r).c_str(), r.running ? "WAITING" : "done", age);
    text += line;
  }
  return text;
}

MEGAMOE_DECL void watchdog::watch() {
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

MEGAMOE_DECL void watchdog::fire(collective_record const& stuck,
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

MEGAMOE_DECL double parse_watchdog_seconds(std::string const& text) {
  char* end = nullptr;
  double const seconds = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(seconds >= 0.0) || seconds > 1e7)
    throw config_error(rules::id::watchdog_seconds_valid, "got '" + text + "'");
  return seconds;
}

}  // namespace megamoe::parallel
