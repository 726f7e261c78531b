// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/wait_clock.hpp — the seconds this rank has spent blocked in communication:
// inside the blocking collectives megamoe issues (those parallel::watched_collective records) and
// in the waits for its non-blocking ones (their time in flight, overlapped with compute, does
// not count). A step's time less this is the rank's own work, which the straggler report compares
// across ranks. Off by default: then a collective pays one relaxed load for it.
#pragma once

#include <megamoe/core/compiled_once.hpp>

#include <cstdint>

namespace megamoe::parallel::wait_clock {

/// Turns the clock on for this process.
MEGAMOE_DECL void start();
[[nodiscard]] MEGAMOE_DECL bool on() noexcept;
/// The seconds counted since start().
[[nodiscard]] MEGAMOE_DECL double seconds() noexcept;

/// A collective begins now: `token` is the watchdog's sequence number, or 0 for a token of the
/// clock's own; returns the token (`token` itself when the clock is off).
MEGAMOE_DECL std::uint64_t open(std::uint64_t token) noexcept;
/// The collective `token` ends: its time since open() counts where `blocked` (a blocking call),
/// not for a non-blocking one, whose wait counts through add().
MEGAMOE_DECL void close(std::uint64_t token, bool blocked) noexcept;
/// Seconds blocked outside a recorded collective (a wait for a non-blocking one).
MEGAMOE_DECL void add(double seconds) noexcept;

}  // namespace megamoe::parallel::wait_clock

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/wait_clock.ipp>
#endif
