// SPDX-License-Identifier: Apache-2.0
// megamoe/train/async_save.hpp — checkpoints written while training goes on (the reference's
// --async-save). At the step boundary the training state is copied into the writer's host
// buffers (io::checkpoint_writer::add) and the checkpoint's folder made; a background thread then
// writes this rank's file, with no MPI call (the job runs MPI funneled). After each later step
// every rank asks whether all have written (one small all-reduce); when they have, the index and
// the tracker are written as a synchronous save writes them. The next save waits for the one in
// flight, and so does the job's end. Until the tracker is written, the previous checkpoint stays
// the latest: a crash mid-write loses only the save in flight.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/io/checkpoint_writer.hpp>

#include <boost/mpi/communicator.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>

namespace megamoe::train {

/// A checkpoint recorded by async_saver.
struct recorded_save {
  int iteration = 0;
  std::uint64_t bytes = 0;  // all ranks' files and the index
  double seconds = 0.0;     // from the start of the background write to the tracker
};

class async_saver {
 public:
  async_saver() = default;
  async_saver(async_saver const&) = delete;
  async_saver& operator=(async_saver const&) = delete;
  /// A save still in flight is abandoned (its folder stays temporary): call wait() first.
  ~async_saver();

  /// Starts writing `writer` (its pieces added, `state` the index's) in the background
  /// (collective: makes the folder). A save in flight must have been recorded first.
  void start(io::checkpoint_writer&& writer, nlohmann::json state);
  /// Records the save in flight if every rank of `world` has written its file (collective; every
  /// rank calls it at the same point). Throws on every rank when a rank's write failed.
  std::optional<recorded_save> poll(boost::mpi::communicator const& world);
  /// Waits for the save in flight and records it (collective).
  std::optional<recorded_save> wait();

  [[nodiscard]] bool in_flight() const noexcept { return writer_.has_value(); }

 private:
  recorded_save record();

  std::optional<io::checkpoint_writer> writer_;
  nlohmann::json state_;
  std::thread thread_;
  std::atomic<bool> written_{false};
  std::chrono::steady_clock::time_point started_;
};

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/async_save.ipp>
#endif
