// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/collectives.hpp — the collectives the data path uses, on Boost.MPI
// communicators.
//
// Boost.MPI 1.74 has no all-to-all-v, all-gather-v or reduce-scatter, and serializes non-native
// types, so these call MPI on the communicator with native datatypes (float, double, ints, bytes):
// no copy, no serialization. Counts are in rows of `width` elements, which is how the dispatchers
// think (a row is one token's hidden vector, or one prob).
//
// Before a variable-count collective the sizes are validated collectively: each rank checks what it
// can see, the ranks exchange what the others need to check, and a failure anywhere becomes the
// same `agreed_input_error` on every rank (`agree_on_failure`) instead of a hang or a truncated
// message. The `*_checked` forms do that themselves; the dispatchers validate once per plan (their
// count exchange carries the error flags) and then call the unchecked forms, whose counts all come
// from that validated table.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/traffic.hpp>
#include <megamoe/parallel/watchdog.hpp>

#include <mpi.h>
#include <boost/mpi/communicator.hpp>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe::parallel {

/// Sums numbers in place over a communicator (every rank gets the total). Pointer and count over a
/// native type, in place: the fast path of MPI_Allreduce (docs/PLATFORM.md).
class communicator_sum {
 public:
  /// The group of this rank alone.
  communicator_sum() = default;
  explicit communicator_sum(boost::mpi::communicator const& comm) : comm_(&comm) {}

  [[nodiscard]] int size() const { return comm_ == nullptr ? 1 : comm_->size(); }

  void sum(std::span<double> values) const;

 private:
  boost::mpi::communicator const* comm_ = nullptr;
};

/// The largest value of each entry over a group, in place (the amax reduction of per-tensor
/// scaling: every rank of a sequence-parallel group quantizes with one scale). One rank alone by
/// default.
class communicator_max {
 public:
  communicator_max() = default;
  explicit communicator_max(boost::mpi::communicator const& comm) : comm_(&comm) {}

  void operator()(std::span<float> values) const;

 private:
  boost::mpi::communicator const* comm_ = nullptr;
};

/// The MPI datatype of a native element type.
template <class T>
MPI_Datatype mpi_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<U, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<U, int>)
    return MPI_INT;
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return MPI_INT64_T;
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return MPI_UINT8_T;
  else
    static_assert(sizeof(U) == 0, "megamoe: no native MPI datatype for this element type");
}

/// Counts and displacements in elements, as MPI takes them, from counts in rows. Kept alive with a
/// non-blocking request, since MPI reads them until it completes.
struct element_layout {
  std::vector<int> counts, displs;

  /// Throws `input_error` when a count is negative or an element count does not fit an int.
  void assign(std::span<std::int64_t const> rows, int width);
  [[nodiscard]] std::int64_t total() const {
    return counts.empty() ? 0 : std::int64_t{displs.back()} + counts.back();
  }
};

/// An MPI request with the layouts it reads; `wait()` completes it (the destructor waits too, so a
/// request never outlives its counts).
class request {
 public:
  request() = default;
  request(request&& other) noexcept { *this = std::move(other); }
  request& operator=(request&& other) noexcept;
  request(request const&) = delete;
  request& operator=(request const&) = delete;
  ~request() { wait(); }

  void wait();
  [[nodiscard]] bool done();
  /// Hands the watchdog's record of the collective to this request (ended when it completes).
  void watch(watched_collective&& record) noexcept { watched_ = record.release(); }

  MPI_Request handle_ = MPI_REQUEST_NULL;
  std::uint64_t watched_ = 0;
  element_layout send_, recv_;
};

namespace detail {
/// Counts for the step profile (parallel/traffic.hpp) what this rank sends on `comm`.
inline void count_traffic(boost::mpi::communicator const& comm, std::int64_t bytes) {
  if (bytes > 0) traffic::instance().add(MPI_Comm(comm), bytes);
}
/// An all-reduce of `bytes` over `ranks`: a reduce-scatter, then an all-gather.
inline std::int64_t all_reduce_bytes(std::int64_t bytes, int ranks) {
  return 2 * bytes * (ranks - 1) / ranks;
}
/// The elements of `layout` that go to ranks other than `me`.
inline std::int64_t to_others(element_layout const& layout, int me) {
  return layout.total() - layout.counts[static_cast<std::size_t>(me)];
}

inline MPI_Comm raw(boost::mpi::communicator const& comm) {
  return MPI_Comm(comm);
}

MEGAMOE_DECL void require_size(std::size_t have, std::int64_t need, char const* what);

}  // namespace detail

// ---- variable-count all-to-all -----------------------------------------------------------------

/// Sends send_rows[j] rows to rank j and receives recv_rows[j] rows from rank j, each row `width`
/// elements, packed in rank order on both sides. The counts must agree pairwise (see the checked
/// form).
template <class T>
request all_to_all_v_start(boost::mpi::communicator const& comm, T const* send,
                           std::span<std::int64_t const> send_rows, T* recv,
                           std::span<std::int64_t const> recv_rows, int width) {
  request r;
  r.send_.assign(send_rows, width);
  r.recv_.assign(recv_rows, width);
  watched_collective record(detail::raw(comm), "all_to_all_v", r.send_.total());
  detail::count_traffic(comm, detail::to_others(r.send_, comm.rank()) * std::int64_t(sizeof(T)));
  MPI_Ialltoallv(send, r.send_.counts.data(), r.send_.displs.data(), mpi_type<T>(), recv,
                 r.recv_.counts.data(), r.recv_.displs.data(), mpi_type<T>(), detail::raw(comm),
                 &r.handle_);
  r.watch(std::move(record));
  return r;
}

template <class T>
void all_to_all_v(boost::mpi::communicator const& comm, T const* send,
                  std::span<std::int64_t const> send_rows, T* recv,
                  std::span<std::int64_t const> recv_rows, int width) {
  element_layout s, q;
  s.assign(send_rows, width);
  q.assign(recv_rows, width);
  watched_collective const watch(detail::raw(comm), "all_to_all_v", s.total());
  detail::count_traffic(comm, detail::to_others(s, comm.rank()) * std::int64_t(sizeof(T)));
  MPI_Alltoallv(send, s.counts.data(), s.displs.data(), mpi_type<T>(), recv, q.counts.data(),
                q.displs.data(), mpi_type<T>(), detail::raw(comm));
}

/// Validates, then runs `all_to_all_v`: one count per rank on each side, the buffers large enough,
/// and what rank i sends to rank j equal to what j expects from i (an all-to-all of the counts).
template <class T>
void all_to_all_v_checked(boost::mpi::communicator const& comm, std::span<T const> send,
                          std::span<std::int64_t const> send_rows, std::span<T> recv,
                          std::span<std::int64_t const> recv_rows, int width) {
  int const n = comm.size();
  bool const shaped = static_cast<int>(send_rows.size()) == n &&
                      static_cast<int>(recv_rows.size()) == n && width > 0;
  // Every rank takes part in the count exchange, even one whose own counts are malformed (it
  // offers -1), so that the agreement below is reached by all.
  std::vector<std::int64_t> offered(static_cast<std::size_t>(n), -1);
  std::vector<std::int64_t> announced(static_cast<std::size_t>(n), -1);
  if (shaped) offered.assign(send_rows.begin(), send_rows.end());
  {
    watched_collective const watch(detail::raw(comm), "all_to_all_counts", n);
    MPI_Alltoall(offered.data(), 1, MPI_INT64_T, announced.data(), 1, MPI_INT64_T,
                 detail::raw(comm));
  }
  check_on_every_rank(comm, [&] {
    if (!shaped)
      throw input_error("all_to_all_v: " + std::to_string(send_rows.size()) + " send and " +
                        std::to_string(recv_rows.size()) + " receive counts for " +
                        std::to_string(n) + " ranks, width " + std::to_string(width));
    element_layout s, q;
    s.assign(send_rows, width);
    q.assign(recv_rows, width);
    detail::require_size(send.size(), s.total(), "the send buffer");
    detail::require_size(recv.size(), q.total(), "the receive buffer");
    for (int j = 0; j < n; ++j)
      if (announced[static_cast<std::size_t>(j)] != recv_rows[static_cast<std::size_t>(j)])
        throw input_error("all_to_all_v: rank " + std::to_string(j) + " sends " +
                          std::to_string(announced[static_cast<std::size_t>(j)]) +
                          " rows, this rank expects " +
                          std::to_string(recv_rows[static_cast<std::size_t>(j)]));
  });
  all_to_all_v(comm, send.data(), send_rows, recv.data(), recv_rows, width);
}

// ---- all-gather-v ------------------------------------------------------------------------------

/// Every rank contributes rows[me] rows; every rank receives all of them, rank-major.
template <class T>
request all_gather_v_start(boost::mpi::communicator const& comm, T const* send, T* recv,
                           std::span<std::int64_t const> rows, int width) {
  request r;
  r.recv_.assign(rows, width);
  watched_collective record(detail::raw(comm), "all_gather_v",
                            r.recv_.counts[static_cast<std::size_t>(comm.rank())]);
  detail::count_traffic(comm, std::int64_t(r.recv_.counts[static_cast<std::size_t>(comm.rank())]) *
                                  (comm.size() - 1) * std::int64_t(sizeof(T)));
  MPI_Iallgatherv(send, r.recv_.counts[static_cast<std::size_t>(comm.rank())], mpi_type<T>(), recv,
                  r.recv_.counts.data(), r.recv_.displs.data(), mpi_type<T>(), detail::raw(comm),
                  &r.handle_);
  r.watch(std::move(record));
  return r;
}

template <class T>
void all_gather_v(boost::mpi::communicator const& comm, T const* send, T* recv,
                  std::span<std::int64_t const> rows, int width) {
  element_layout q;
  q.assign(rows, width);
  watched_collective const watch(detail::raw(comm), "all_gather_v",
                                 q.counts[static_cast<std::size_t>(comm.rank())]);
  detail::count_traffic(comm, std::int64_t(q.counts[static_cast<std::size_t>(comm.rank())]) *
                                  (comm.size() - 1) * std::int64_t(sizeof(T)));
  MPI_Allgatherv(send, q.counts[static_cast<std::size_t>(comm.rank())], mpi_type<T>(), recv,
                 q.counts.data(), q.displs.data(), mpi_type<T>(), detail::raw(comm));
}

/// Gathers every rank's row count first (so nothing needs to be known in advance), validates the
/// widths and buffers, then gathers the rows. Returns the row counts per rank.
template <class T>
std::vector<std::int64_t> all_gather_v_checked(boost::mpi::communicator const& comm,
                                               std::span<T const> send, std::int64_t send_rows,
                                               std::vector<T>& recv, int width) {
  int const n = comm.size();
  std::int64_t const mine[2] = {send_rows, width};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(n));
  {
    watched_collective const watch(detail::raw(comm), "all_gather_counts", 2);
    MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, detail::raw(comm));
  }
  std::vector<std::int64_t> rows(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    rows[static_cast<std::size_t>(i)] = all[2 * static_cast<std::size_t>(i)];
  check_on_every_rank(comm, [&] {
    for (int i = 0; i < n; ++i)
      if (all[2 * static_cast<std::size_t>(i) + 1] != width)
        throw input_error("all_gather_v: rank " + std::to_string(i) + " has rows of width " +
                          std::to_string(all[2 * static_cast<std::size_t>(i) + 1]) +
                          ", this rank " + std::to_string(width));
    element_layout q;
    q.assign(rows, width);
    detail::require_size(send.size(), send_rows * width, "the send buffer");
    recv.resize(static_cast<std::size_t>(q.total()));
  });
  all_gather_v(comm, send.data(), recv.data(), rows, width);
  return rows;
}

// ---- reduce-scatter-v --------------------------------------------------------------------------

/// Sums `send` (all ranks' row blocks, rank-major, sum of rows) over the group; rank i receives the
/// sum of block i (rows[i] rows). Every rank must pass the same counts.
template <class T>
request reduce_scatter_v_start(boost::mpi::communicator const& comm, T const* send, T* recv,
                               std::span<std::int64_t const> rows, int width) {
  request r;
  r.recv_.assign(rows, width);
  watched_collective record(detail::raw(comm), "reduce_scatter_v", r.recv_.total());
  detail::count_traffic(comm, detail::to_others(r.recv_, comm.rank()) * std::int64_t(sizeof(T)));
  MPI_Ireduce_scatter(send, recv, r.recv_.counts.data(), mpi_type<T>(), MPI_SUM, detail::raw(comm),
                      &r.handle_);
  r.watch(std::move(record));
  return r;
}

template <class T>
void reduce_scatter_v(boost::mpi::communicator const& comm, T const* send, T* recv,
                      std::span<std::int64_t const> rows, int width) {
  element_layout q;
  q.assign(rows, width);
  watched_collective const watch(detail::raw(comm), "reduce_scatter_v", q.total());
  detail::count_traffic(comm, detail::to_others(q, comm.rank()) * std::int64_t(sizeof(T)));
  MPI_Reduce_scatter(send, recv, q.counts.data(), mpi_type<T>(), MPI_SUM, detail::raw(comm));
}

/// Validates (the same counts on every rank: one all-reduce of the counts and their negatives with
/// MIN; buffers large enough), then runs `reduce_scatter_v`.
template <class T>
void reduce_scatter_v_checked(boost::mpi::communicator const& comm, std::span<T const> send,
                              std::span<T> recv, std::span<std::int64_t const> rows, int width) {
  int const n = comm.size();
  bool const shaped = static_cast<int>(rows.size()) == n && width > 0;
  // [count_0..count_{n-1}, -count_0.., width, -width]: MIN gives the minimum and minus the maximum.
  std::vector<std::int64_t> range(2 * static_cast<std::size_t>(n) + 2, 0);
  if (shaped) {
    for (int i = 0; i < n; ++i) {
      range[static_cast<std::size_t>(i)] = rows[static_cast<std::size_t>(i)];
      range[static_cast<std::size_t>(n + i)] = -rows[static_cast<std::size_t>(i)];
    }
  } else {
    for (int i = 0; i < 2 * n; ++i) range[static_cast<std::size_t>(i)] = i < n ? -1 : 1;
  }
  range[2 * static_cast<std::size_t>(n)] = width;
  range[2 * static_cast<std::size_t>(n) + 1] = -width;
  {
    watched_collective const watch(detail::raw(comm), "reduce_scatter_counts", std::ssize(range));
    MPI_Allreduce(MPI_IN_PLACE, range.data(), static_cast<int>(range.size()), MPI_INT64_T, MPI_MIN,
                  detail::raw(comm));
  }
  check_on_every_rank(comm, [&] {
    if (!shaped)
      throw input_error("reduce_scatter_v: " + std::to_string(rows.size()) + " counts for " +
                        std::to_string(n) + " ranks, width " + std::to_string(width));
    for (int i = 0; i < n; ++i)
      if (range[static_cast<std::size_t>(i)] != -range[static_cast<std::size_t>(n + i)])
        throw input_error("reduce_scatter_v: the ranks disagree on the row count of block " +
                          std::to_string(i));
    if (range[2 * static_cast<std::size_t>(n)] != -range[2 * static_cast<std::size_t>(n) + 1])
      throw input_error("reduce_scatter_v: the ranks disagree on the row width");
    element_layout q;
    q.assign(rows, width);
    detail::require_size(send.size(), q.total(), "the send buffer");
    detail::require_size(recv.size(), std::int64_t{q.counts[static_cast<std::size_t>(comm.rank())]},
                         "the receive buffer");
  });
  reduce_scatter_v(comm, send.data(), recv.data(), rows, width);
}

// ---- all-to-all with datatypes -----------------------------------------------------------------

/// An owned, committed MPI datatype (freed with it).
class datatype {
 public:
  datatype() = default;
  /// Takes a freshly created type and commits it.
  explicit datatype(MPI_Datatype created);
  datatype(datatype&& other) noexcept : type_(std::exchange(other.type_, MPI_DATATYPE_NULL)) {}
  datatype& operator=(datatype&& other) noexcept;
  datatype(datatype const&) = delete;
  datatype& operator=(datatype const&) = delete;
  ~datatype() { reset(); }

  void reset();
  [[nodiscard]] MPI_Datatype get() const noexcept { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

/// Blocks of `block_elements[b]` elements of T at byte offsets `byte_offsets[b]` (hindexed).
template <class T>
datatype blocks_type(std::span<int const> block_elements, std::span<MPI_Aint const> byte_offsets) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  MPI_Type_create_hindexed(static_cast<int>(block_elements.size()), block_elements.data(),
                           byte_offsets.data(), mpi_type<T>(), &t);
  return datatype(t);
}

/// Equal blocks of `block_elements` elements of T at byte offsets `byte_offsets[b]`.
template <class T>
datatype equal_blocks_type(int block_elements, std::span<MPI_Aint const> byte_offsets) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  MPI_Type_create_hindexed_block(static_cast<int>(byte_offsets.size()), block_elements,
                                 byte_offsets.data(), mpi_type<T>(), &t);
  return datatype(t);
}

/// One side of an all-to-all-w: per peer a count of a datatype at a byte offset. Lets MPI read
/// rows where they lie and write them where they belong, without staging copies.
struct typed_side {
  std::vector<int> counts, byte_offsets;
  std::vector<MPI_Datatype> types;

  void resize(std::size_t peers);
};

/// MPI_Ialltoallw: the buffers' layouts are entirely in the two sides' datatypes and offsets,
/// which must stay alive until the request completes.
MEGAMOE_DECL request all_to_all_w_start(boost::mpi::communicator const& comm, void const* send,
                                        typed_side const& send_side, void* recv,
                                        typed_side const& recv_side);

// ---- all-reduce --------------------------------------------------------------------------------

/// Sums `values` in place over the group.
template <class T>
void all_reduce_sum(boost::mpi::communicator const& comm, std::span<T> values) {
  if (values.empty() || comm.size() == 1) return;
  watched_collective const watch(detail::raw(comm), "all_reduce_sum", std::ssize(values));
  detail::count_traffic(
      comm, detail::all_reduce_bytes(std::ssize(values) * std::int64_t(sizeof(T)), comm.size()));
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), mpi_type<T>(),
                MPI_SUM, detail::raw(comm));
}

template <class T>
request all_reduce_sum_start(boost::mpi::communicator const& comm, std::span<T> values) {
  request r;
  watched_collective record(detail::raw(comm), "all_reduce_sum", std::ssize(values));
  detail::count_traffic(
      comm, detail::all_reduce_bytes(std::ssize(values) * std::int64_t(sizeof(T)), comm.size()));
  MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), mpi_type<T>(),
                 MPI_SUM, detail::raw(comm), &r.handle_);
  r.watch(std::move(record));
  return r;
}

// ---- ring step ----------------------------------------------------------------------------------

/// Sends `count` elements to rank `to` and receives as many from rank `from` in one step (a ring
/// pass: every rank of the group calls it with its own neighbours, so no rank waits on a message
/// nobody sends).
template <class T>
void ring_exchange(boost::mpi::communicator const& comm, T const* send, T* recv, std::int64_t count,
                   int to, int from) {
  if (count < 0 || count > INT_MAX)
    throw input_error("ring_exchange: " + std::to_string(count) +
                      " elements do not fit one MPI call");
  constexpr int tag = 25;  // a ring step's messages only (the group's other traffic is collective)
  watched_collective const watch(detail::raw(comm), "ring_exchange", count);
  if (to != comm.rank()) detail::count_traffic(comm, count * std::int64_t(sizeof(T)));
  MPI_Sendrecv(send, static_cast<int>(count), mpi_type<T>(), to, tag, recv, static_cast<int>(count),
               mpi_type<T>(), from, tag, detail::raw(comm), MPI_STATUS_IGNORE);
}

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/collectives.ipp>
#endif
