// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/shared_window.ipp — the definitions behind shared_window.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/shared_window.hpp>

namespace megamoe::parallel {

MEGAMOE_DECL std::optional<shared_memory_space> shared_memory_space_for_windows() {
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

MEGAMOE_DECL void require_shared_memory_space(shared_memory_space const& space,
                                              std::uint64_t bytes) {
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

MEGAMOE_DECL bool ranks_share_memory(boost::mpi::communicator const& comm) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_Comm(comm), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  int whole = node_size == comm.size() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &whole, 1, MPI_INT, MPI_MIN, MPI_Comm(comm));
  return whole == 1;
}

MEGAMOE_DECL shared_window::shared_window(boost::mpi::communicator const& comm, std::size_t bytes)
    : comm_(comm) {
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
    MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 1, info, MPI_Comm(comm), &base, &window_);
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
        wanted > 0 ? static_cast<std::byte*>(segment) : nullptr, static_cast<std::size_t>(wanted)};
  }
}

MEGAMOE_DECL shared_window::shared_window(shared_window&& other) noexcept
    : comm_(std::move(other.comm_)),
      window_(std::exchange(other.window_, MPI_WIN_NULL)),
      segments_(std::move(other.segments_)),
      uncaught_(other.uncaught_) {}

MEGAMOE_DECL shared_window& shared_window::operator=(shared_window&& other) noexcept {
  if (this != &other) {
    release();
    comm_ = std::move(other.comm_);
    window_ = std::exchange(other.window_, MPI_WIN_NULL);
    segments_ = std::move(other.segments_);
    uncaught_ = other.uncaught_;
  }
  return *this;
}

MEGAMOE_DECL shared_window::~shared_window() {
  release();
}

MEGAMOE_DECL void shared_window::fence() {
  watched_collective const watch(MPI_Comm(comm_), "shared_window_fence", 0);
  MPI_Win_fence(0, window_);
}

MEGAMOE_DECL void shared_window::free() {
  if (!allocated()) return;
  watched_collective const watch(MPI_Comm(comm_), "shared_window_free", 0);
  MPI_Win_free(&window_);
  segments_.clear();
}

MEGAMOE_DECL void shared_window::release() noexcept {
  if (!allocated()) return;
  if (std::uncaught_exceptions() > uncaught_) return;
  watched_collective const watch(MPI_Comm(comm_), "shared_window_free", 0);
  MPI_Win_free(&window_);
}

}  // namespace megamoe::parallel
