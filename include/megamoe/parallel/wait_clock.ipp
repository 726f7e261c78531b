// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/wait_clock.ipp — the definitions behind wait_clock.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/wait_clock.hpp>

#include <array>
#include <atomic>
#include <chrono>

namespace megamoe::parallel::wait_clock {

namespace detail {

/// The clock's state: collectives run on the thread that drives MPI (funneled), so only `on` is
/// read elsewhere.
struct state {
  struct open_collective {
    std::uint64_t token = 0;  // 0: a free slot
    std::chrono::steady_clock::time_point start;
  };
  std::atomic<bool> on{false};
  std::uint64_t issued = 0;
  double seconds = 0.0;
  // The collectives in flight (non-blocking ones overlap), by token modulo the size.
  std::array<open_collective, 64> open{};
};

inline state& instance() {
  static state s;
  return s;
}

}  // namespace detail

MEGAMOE_DECL void start() {
  detail::instance().on.store(true, std::memory_order_relaxed);
}

MEGAMOE_DECL bool on() noexcept {
  return detail::instance().on.load(std::memory_order_relaxed);
}

MEGAMOE_DECL double seconds() noexcept {
  return detail::instance().seconds;
}

MEGAMOE_DECL std::uint64_t open(std::uint64_t token) noexcept {
  auto& s = detail::instance();
  if (!s.on.load(std::memory_order_relaxed)) return token;
  if (token == 0) token = ++s.issued;
  s.open[token % s.open.size()] = {token, std::chrono::steady_clock::now()};
  return token;
}

MEGAMOE_DECL void close(std::uint64_t token, bool blocked) noexcept {
  auto& s = detail::instance();
  if (token == 0 || !s.on.load(std::memory_order_relaxed)) return;
  auto& slot = s.open[token % s.open.size()];
  if (slot.token != token) return;
  if (blocked)
    s.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - slot.start).count();
  slot.token = 0;
}

MEGAMOE_DECL void add(double seconds) noexcept {
  detail::instance().seconds += seconds;
}

}  // namespace megamoe::parallel::wait_clock
