// SPDX-License-Identifier: Apache-2.0
// megamoe/train/async_save.ipp — the definitions behind async_save.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/async_save.hpp>

#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/operations.hpp>

#include <utility>

namespace megamoe::train {

MEGAMOE_DECL async_saver::~async_saver() {
  if (thread_.joinable()) thread_.join();
}

MEGAMOE_DECL void async_saver::start(io::checkpoint_writer&& writer, nlohmann::json state) {
  if (writer_) throw input_error("checkpoint: a save is in flight; record it before the next");
  writer.prepare();  // a failure leaves nothing in flight
  writer_.emplace(std::move(writer));
  state_ = std::move(state);
  written_.store(false, std::memory_order_relaxed);
  started_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] {
    writer_->write_file();
    written_.store(true, std::memory_order_release);
  });
}

MEGAMOE_DECL std::optional<recorded_save> async_saver::poll(boost::mpi::communicator const& world) {
  if (!writer_) return std::nullopt;
  int const mine = written_.load(std::memory_order_acquire) ? 1 : 0;
  if (boost::mpi::all_reduce(world, mine, boost::mpi::minimum<int>()) == 0) return std::nullopt;
  return record();
}

MEGAMOE_DECL std::optional<recorded_save> async_saver::wait() {
  if (!writer_) return std::nullopt;
  return record();
}

MEGAMOE_DECL recorded_save async_saver::record() {
  thread_.join();
  recorded_save out{writer_->iteration(), 0, 0.0};
  // The writer is gone whatever finish() does: a failed save is not retried.
  auto writer = std::move(*writer_);
  writer_.reset();
  out.bytes = writer.finish(state_);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return out;
}

}  // namespace megamoe::train
