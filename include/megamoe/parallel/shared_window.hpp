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
[[nodiscard]] inline std::optional<shared_memory_space> shared_memory_space_for_windows() {
  auto free_in = [](std::string const& dir) -> std::optional<std::uint64_t> {
    struct statvfs info {};
    if (::access(dir.c_str(), W_OK) != 0 || ::statvfs(dir.c_str(), &info) != 0) return {};
    return static_cast<std::uint64_t>(info.f_bavail) * info.f_frsize;
  };
  if (char const* named = std::getenv("OMPI_MCA_osc_sm_backing_directory")) {
    auto const bytes = free_in(named);
    if (!bytes)
      throw input_error(std::string("shared window: OMPI_MCA_osc_sm_backing_directory=") + named +
                        " is not a writable directory");
    return shared_memory_space{named, *bytes};
  }
  if (auto const bytes = free_in("/dev/shm")) return shared_memory_space{"/dev/shm", *bytes};
  return {};
}

/// Throws when `space` cannot hold `bytes` of windows and a margin of 1 MiB (Open MPI's own
/// bookkeeping lives in the same file system).
inline void require_shared_memory_space(shared_memory_space const& space, std::uint64_t bytes) {
  constexpr std::uint64_t margin = std::uint64_t{1} << 20;
  if (bytes + margin <= space.free_bytes) return;
  auto mib = [](std::uint64_t b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", static_cast<double>(b) / (1 << 20));
    return std::string(text);
  };
  throw input_error("shared window: " + mib(bytes) +
                    " MiB of shared memory asked for (and 1 MiB for Open MPI), " +
                    mib(space.free_bytes) + " MiB free in " + space.directory +
                    " (give it more space, or OMPI_MCA_osc_sm_backing_directory another "
                    "directory)");
}

/// Collective: whether every rank of `comm` shares memory with every other
/// (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) keeps the communicator whole).
[[nodiscard]] inline bool ranks_share_memory(boost::mpi::communicator const& comm) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_Comm(comm), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  int whole = node_size == comm.size() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &whole, 1, MPI_INT, MPI_MIN, MPI_Comm(comm));
  return whole == 1;
}

/// One shared-memory window over `comm`: a segment per rank, every segment addressable by every
/// rank. Move-only; allocation, fence and free are collective over `comm`.
class shared_window {
 public:
  shared_window() = default;

  /// Collective: allocates this rank's segment of `bytes` (each rank its own size, 0 allowed).
  /// Every rank throws the same agreed error, and nothing is allocated, when the ranks do not
  /// share memory or the backing directory lacks the space for all segments.
  shared_window(boost::mpi::communicator const& comm, std::size_t bytes) : comm_(comm) {
    bool const shared = ranks_share_memory(comm);
    // Every rank's size: the segments' own (Open MPI reports them rounded up to pages) and the sum.
    std::vector<std::uint64_t> asked(static_cast<std::size_t>(comm.size()));
    std::uint64_t const mine = bytes;
    MPI_Allgather(&mine, 1, MPI_UINT64_T, asked.data(), 1, MPI_UINT64_T, MPI_Comm(comm));
    std::uint64_t total = 0;
    for (std::uint64_t b : asked) total += b;
    check_on_every_rank(comm, [&] {
      if (!shared)
        throw input_error("shared window: the " + std::to_string(comm.size()) +
                          " ranks do not all share memory (they span more than one node)");
      if (comm.rank() != 0) return;
      if (auto const space = shared_memory_space_for_windows())
        require_shared_memory_space(*space, total);
    });
    // Segments placed by their owners (page-aligned, first touched by the rank that uses them
    // most) rather than one contiguous block.
    MPI_Info info = MPI_INFO_NULL;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void* base = nullptr;
    {
      watched_collective const watch(MPI_Comm(comm), "shared_window_allocate",
                                     static_cast<std::int64_t>(bytes));
      MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 1, info, MPI_Comm(comm), &base,
                              &window_);
    }
    MPI_Info_free(&info);
    uncaught_ = std::uncaught_exceptions();
    segments_.resize(static_cast<std::size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) {
      MPI_Aint size = 0;
      int unit = 1;
      void* segment = nullptr;
      MPI_Win_shared_query(window_, r, &size, &unit, &segment);
      auto const wanted = asked[static_cast<std::size_t>(r)];
      segments_[static_cast<std::size_t>(r)] = {
          wanted > 0 ? static_cast<std::byte*>(segment) : nullptr,
          static_cast<std::size_t>(wanted)};
    }
  }

  shared_window(shared_window&& other) noexcept
      : comm_(std::move(other.comm_)),
        window_(std::exchange(other.window_, MPI_WIN_NULL)),
        segments_(std::move(other.segments_)),
        uncaught_(other.uncaught_) {}
  shared_window& operator=(shared_window&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::move(other.comm_);
      window_ = std::exchange(other.window_, MPI_WIN_NULL);
      segments_ = std::move(other.segments_);
      uncaught_ = other.uncaught_;
    }
    return *this;
  }
  shared_window(shared_window const&) = delete;
  shared_window& operator=(shared_window const&) = delete;

  /// Frees the window (collective), unless an exception that began after it was allocated is
  /// unwinding: then only this rank is leaving, and it must not wait for the others.
  ~shared_window() { release(); }

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
  void fence() {
    watched_collective const watch(MPI_Comm(comm_), "shared_window_fence", 0);
    MPI_Win_fence(0, window_);
  }

  /// Collective: frees the window now.
  void free() {
    if (!allocated()) return;
    watched_collective const watch(MPI_Comm(comm_), "shared_window_free", 0);
    MPI_Win_free(&window_);
    segments_.clear();
  }

 private:
  struct segment_view {
    std::byte* base = nullptr;
    std::size_t bytes = 0;
  };

  void release() noexcept {
    if (!allocated()) return;
    if (std::uncaught_exceptions() > uncaught_) return;
    watched_collective const watch(MPI_Comm(comm_), "shared_window_free", 0);
    MPI_Win_free(&window_);
  }

  boost::mpi::communicator comm_;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<segment_view> segments_;
  int uncaught_ = 0;
};

}  // namespace megamoe::parallel
