// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/shared_window.hpp — one MPI-3 shared-memory window over a communicator whose
// ranks share memory. Each rank owns a segment and reads or writes every other rank's with plain
// loads and stores, ordered by the window's fence. A dispatcher can then copy each token row once,
// straight to its final place, where an all-to-all copies it into MPI's buffers and out again.
//
// Boost.MPI 1.74 has no windows, so this calls MPI's C API on the communicator. Three failures
// would otherwise hang or kill a job instead of ending it with an error on every rank:
// - Open MPI creates the window's backing file on rank 0 only (in
// OMPI_MCA_osc_sm_backing_directory,
//   by default /dev/shm). When that fails the other ranks wait for it forever, and a file system
//   that fills up later kills a rank with SIGBUS when it first touches its pages. So rank 0 checks
//   the free space before asking, and the verdict is agreed over the communicator.
// - A window over ranks that do not share memory fails inside MPI, on some ranks only: the
//   communicator is checked with MPI_Comm_split_type first.
// - Freeing is collective: a rank that is unwinding from an error of its own does not free (it
//   would wait in MPI_Win_free for ranks that never come); the process's exit releases the memory.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/watchdog.hpp>

#include <mpi.h>
#include <boost/mpi/communicator.hpp>

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace megamoe::parallel {

/// Where Open MPI keeps a shared window's backing file, and the bytes free there.
struct shared_memory_space {
  std::string directory;
  std::uint64_t free_bytes = 0;
};

/// The backing directory of this process's shared windows and its free bytes: the directory
/// OMPI_MCA_osc_sm_backing_directory names (an error when it is not a writable directory, since
/// Open MPI would then fail on rank 0 alone), else /dev/shm when writable. Empty when neither
/// (Open MPI then uses its session directory, whose space is not checked here).
[[nodiscard]] MEGAMOE_DECL std::optional<shared_memory_space> shared_memory_space_for_windows();

/// Throws when `space` cannot hold `bytes` of windows and a margin of 1 MiB (Open MPI's own
/// bookkeeping lives in the same file system).
MEGAMOE_DECL void require_shared_memory_space(shared_memory_space const& space,
                                              std::uint64_t bytes);

/// Collective: whether every rank of `comm` shares memory with every other
/// (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) keeps the communicator whole).
[[nodiscard]] MEGAMOE_DECL bool ranks_share_memory(boost::mpi::communicator const& comm);

/// One shared-memory window over `comm`: a segment per rank, every segment addressable by every
/// rank. Move-only; allocation, fence and free are collective over `comm`.
class shared_window {
 public:
  shared_window() = default;

  /// Collective: allocates this rank's segment of `bytes` (each rank its own size, 0 allowed).
  /// Every rank throws the same agreed error, and nothing is allocated, when the ranks do not
  /// share memory or the backing directory lacks the space for all segments.
  shared_window(boost::mpi::communicator const& comm, std::size_t bytes);

  shared_window(shared_window&& other) noexcept;
  shared_window& operator=(shared_window&& other) noexcept;
  shared_window(shared_window const&) = delete;
  shared_window& operator=(shared_window const&) = delete;

  /// Frees the window (collective), unless an exception that began after it was allocated is
  /// unwinding: then only this rank is leaving, and it must not wait for the others.
  ~shared_window();

  [[nodiscard]] bool allocated() const noexcept { return window_ != MPI_WIN_NULL; }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(segments_.size()); }
  /// Rank `rank`'s segment as this rank addresses it, and the bytes its owner asked for (null and 0
  /// for an empty one).
  [[nodiscard]] std::byte* segment(int rank) const {
    return segments_[static_cast<std::size_t>(rank)].base;
  }
  [[nodiscard]] std::size_t segment_bytes(int rank) const {
    return segments_[static_cast<std::size_t>(rank)].bytes;
  }

  /// Collective: every store any rank made to the window before its fence is visible to every
  /// rank's loads after it (a memory barrier and a barrier over the window's ranks).
  void fence();

  /// Collective: frees the window now.
  void free();

 private:
  struct segment_view {
    std::byte* base = nullptr;
    std::size_t bytes = 0;
  };

  void release() noexcept;

  boost::mpi::communicator comm_;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<segment_view> segments_;
  int uncaught_ = 0;
};

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/shared_window.ipp>
#endif
