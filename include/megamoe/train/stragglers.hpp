// SPDX-License-Identifier: Apache-2.0
// megamoe/train/stragglers.hpp — the ranks that hold a job up (the reference's straggler
// detector). Every `interval` steps each rank's compute time over those steps — its steps' time
// less what it spent blocked in communication (parallel/wait_clock.hpp) — is gathered, and a rank
// whose compute exceeds the median over the ranks by more than the threshold is named. A slow
// rank shows as compute on itself and as waiting on the others, so it alone is named.
#pragma once

#include <megamoe/core/compiled_once.hpp>

#include <boost/mpi/communicator.hpp>

#include <optional>
#include <span>
#include <vector>

namespace megamoe::train {

inline constexpr double default_straggler_threshold = 0.15;  // 15 % over the median

struct straggler {
  int rank = 0;
  double relative = 1.0;  // its compute over the median's
};

/// What one check found (on rank 0; the other ranks get an empty report).
struct straggler_report {
  double median_seconds = 0.0;  // the median rank's compute over the interval
  std::vector<double> compute;  // each rank's, seconds
  std::vector<straggler> slow;  // over the threshold, slowest first
};

/// The ranks whose compute exceeds the median of `compute` by more than `threshold`.
MEGAMOE_DECL straggler_report find_stragglers(std::vector<double> compute, double threshold);

class straggler_detector {
 public:
  /// Checks every `interval` steps (0: never; the wait clock is turned on otherwise).
  straggler_detector(int interval, double threshold);

  [[nodiscard]] bool on() const noexcept { return interval_ > 0; }

  /// After each step (every rank, `step_seconds` its own, an injected delay included); at every
  /// interval-th step gathers the ranks' compute to rank 0 (collective over `world`) and returns
  /// the report there.
  std::optional<straggler_report> after_step(boost::mpi::communicator const& world, int step,
                                             double step_seconds);

 private:
  int interval_;
  double threshold_;
  double step_seconds_ = 0.0, waited_at_start_ = 0.0;
};

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/stragglers.ipp>
#endif
