// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/exchange_window.hpp — the shared window of a dispatcher that exchanges rows
// through shared memory (dispatch/shared_memory.hpp, and dispatch/hierarchical.hpp inside a node).
//
// Each segment has two regions, one for dispatch's data and one for combine's, so that the usual
// alternation needs one fence per exchange: a rank writes into a region only after every rank has
// passed the fence of the exchange that last read the other one, and so has finished reading this
// one. Two exchanges of the same kind in a row fence once more first. The window is replaced,
// never shrunk, when a plan needs more; every rank of the communicator must decide alike.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/parallel/shared_window.hpp>

#include <boost/mpi/communicator.hpp>

#include <cstddef>

namespace megamoe::dispatch {

class exchange_window {
 public:
  enum class region { none, dispatch, combine };

  /// `bytes` rounded up to a cache line, where each part of a segment starts.
  static constexpr std::size_t aligned(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

  [[nodiscard]] bool allocated() const noexcept { return window_.allocated(); }
  /// Bytes of each segment (0 before the first allocation).
  [[nodiscard]] std::size_t segment_bytes() const noexcept {
    return window_.allocated() ? window_.segment_bytes(0) : 0;
  }
  /// Times the window was allocated.
  [[nodiscard]] int allocations() const noexcept { return allocations_; }

  /// Collective over `comm`: a new window of `bytes` per segment, once nobody reads the old one.
  /// An agreed error (no shared memory, no space) leaves none.
  void allocate(boost::mpi::communicator const& comm, std::size_t bytes);

  /// Collective: every store before it is visible to every rank's loads after it.
  void fence() { window_.fence(); }

  /// Before writing into region `r`: a fence when the last exchange used it too (a rank may still
  /// read it); none when it used the other region.
  void enter(region r);
  /// Before writing into region `r` outside an exchange: a fence when the last exchange used it,
  /// and then none is needed by the next exchange.
  void settle(region r);

  /// Rank `rank`'s segment at `offset`, as Elem.
  template <class Elem>
  [[nodiscard]] Elem* at(int rank, std::size_t offset) const {
    return reinterpret_cast<Elem*>(window_.segment(rank) + offset);
  }

 private:
  parallel::shared_window window_;
  int allocations_ = 0;
  region last_ = region::none;
};

}  // namespace megamoe::dispatch

#if MEGAMOE_HEADER_ONLY
#include <megamoe/dispatch/exchange_window.ipp>
#endif
