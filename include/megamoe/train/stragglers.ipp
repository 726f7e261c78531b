// SPDX-License-Identifier: Apache-2.0
// megamoe/train/stragglers.ipp — the definitions behind stragglers.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/wait_clock.hpp>
#include <megamoe/train/stragglers.hpp>

#include <boost/mpi/collectives/gather.hpp>

#include <algorithm>

namespace megamoe::train {

MEGAMOE_DECL straggler_report find_stragglers(std::vector<double> compute, double threshold) {
  straggler_report out;
  out.compute = compute;
  if (compute.empty()) return out;
  std::sort(compute.begin(), compute.end());
  std::size_t const n = compute.size();
  out.median_seconds = n % 2 == 1 ? compute[n / 2] : (compute[n / 2 - 1] + compute[n / 2]) / 2;
  if (!(out.median_seconds > 0)) return out;
  for (std::size_t r = 0; r < n; ++r) {
    double const relative = out.compute[r] / out.median_seconds;
    if (relative > 1.0 + threshold) out.slow.push_back({static_cast<int>(r), relative});
  }
  std::sort(out.slow.begin(), out.slow.end(),
            [](straggler const& a, straggler const& b) { return a.relative > b.relative; });
  return out;
}

MEGAMOE_DECL straggler_detector::straggler_detector(int interval, double threshold)
    : interval_(interval), threshold_(threshold) {
  if (interval_ > 0) {
    parallel::wait_clock::start();
    waited_at_start_ = parallel::wait_clock::seconds();
  }
}

MEGAMOE_DECL std::optional<straggler_report> straggler_detector::after_step(
    boost::mpi::communicator const& world, int step, double step_seconds) {
  if (interval_ <= 0) return std::nullopt;
  step_seconds_ += step_seconds;
  if (step % interval_ != 0) return std::nullopt;
  double const waited = parallel::wait_clock::seconds();
  double const mine = std::max(0.0, step_seconds_ - (waited - waited_at_start_));
  step_seconds_ = 0.0;
  waited_at_start_ = waited;
  std::vector<double> all;
  boost::mpi::gather(world, mine, all, 0);
  if (world.rank() != 0) return straggler_report{};
  return find_stragglers(std::move(all), threshold_);
}

}  // namespace megamoe::train
