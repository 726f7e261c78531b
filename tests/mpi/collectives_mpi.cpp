// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. The data-path collectives of parallel/collectives.hpp against what each rank
// can compute alone: every row carries (sender, receiver, row, column) in its values, so a row that
// lands in the wrong place or with the wrong width is seen. Blocking, non-blocking and checked
// forms, for float and double; and malformed counts on one rank, which every rank must report as
// the same agreed error (and then carry on: nothing is left half-sent). The shared-memory window of
// parallel/shared_window.hpp: segments of different sizes (one empty) read and written by every
// rank across fences, a larger window after the first, and the space checks as agreed errors.
//
//   mpiexec -n 4 megamoe_collectives_mpi
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/progress.hpp>
#include <megamoe/parallel/shared_window.hpp>

#include <megamoe/core/thread_pool.hpp>

#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/collectives/broadcast.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace mp = megamoe::parallel;

namespace {

int failures = 0, checks = 0;

void expect(bool ok, std::string const& what) {
  ++checks;
  if (!ok && ++failures <= 10) std::cerr << "collectives: " << what << "\n";
}

/// Rows rank `from` sends to rank `to`: 0 to 3 of them, some pairs none.
std::int64_t rows_between(int from, int to) {
  return (from * 3 + to * 5) % 4;
}

template <class T>
T value(int from, int to, std::int64_t row, int col) {
  return static_cast<T>(from * 1000 + to * 100 + row * 10 + col);
}

template <class T>
void all_to_all(boost::mpi::communicator const& comm, bool blocking) {
  int const n = comm.size(), me = comm.rank(), width = 3;
  std::vector<std::int64_t> send_rows(static_cast<std::size_t>(n)),
      recv_rows(static_cast<std::size_t>(n));
  std::vector<T> send, expected;
  for (int j = 0; j < n; ++j) {
    send_rows[static_cast<std::size_t>(j)] = rows_between(me, j);
    recv_rows[static_cast<std::size_t>(j)] = rows_between(j, me);
    for (std::int64_t r = 0; r < rows_between(me, j); ++r)
      for (int c = 0; c < width; ++c) send.push_back(value<T>(me, j, r, c));
    for (std::int64_t r = 0; r < rows_between(j, me); ++r)
      for (int c = 0; c < width; ++c) expected.push_back(value<T>(j, me, r, c));
  }
  std::vector<T> recv(expected.size(), T(-1));
  if (blocking) {
    mp::all_to_all_v_checked<T>(comm, send, send_rows, recv, recv_rows, width);
  } else {
    auto request =
        mp::all_to_all_v_start(comm, send.data(), send_rows, recv.data(), recv_rows, width);
    request.wait();
  }
  expect(recv == expected, std::string("all_to_all_v ") + (blocking ? "checked" : "started"));
}

template <class T>
void all_gather(boost::mpi::communicator const& comm, bool blocking) {
  int const n = comm.size(), me = comm.rank(), width = 2;
  std::vector<std::int64_t> rows(static_cast<std::size_t>(n));
  std::vector<T> send, expected;
  for (int i = 0; i < n; ++i) {
    rows[static_cast<std::size_t>(i)] = rows_between(i, 0);
    for (std::int64_t r = 0; r < rows_between(i, 0); ++r)
      for (int c = 0; c < width; ++c) {
        expected.push_back(value<T>(i, 0, r, c));
        if (i == me) send.push_back(value<T>(i, 0, r, c));
      }
  }
  std::vector<T> recv;
  if (blocking) {
    auto const counts = mp::all_gather_v_checked<T>(comm, send, rows_between(me, 0), recv, width);
    expect(counts == rows, "all_gather_v counts");
  } else {
    recv.assign(expected.size(), T(-1));
    mp::all_gather_v_start(comm, send.data(), recv.data(), rows, width).wait();
  }
  expect(recv == expected, std::string("all_gather_v ") + (blocking ? "checked" : "started"));
}

template <class T>
void reduce_scatter(boost::mpi::communicator const& comm, bool blocking) {
  int const n = comm.size(), me = comm.rank(), width = 2;
  std::vector<std::int64_t> rows(static_cast<std::size_t>(n));
  std::vector<T> send;
  for (int i = 0; i < n; ++i) {
    rows[static_cast<std::size_t>(i)] = rows_between(i, 1);
    for (std::int64_t r = 0; r < rows_between(i, 1); ++r)
      for (int c = 0; c < width; ++c) send.push_back(value<T>(me, i, r, c));
  }
  std::vector<T> expected, recv(static_cast<std::size_t>(rows_between(me, 1) * width), T(-1));
  for (std::int64_t r = 0; r < rows_between(me, 1); ++r)
    for (int c = 0; c < width; ++c) {
      T sum = 0;
      for (int from = 0; from < n; ++from) sum += value<T>(from, me, r, c);
      expected.push_back(sum);
    }
  if (blocking)
    mp::reduce_scatter_v_checked<T>(comm, send, recv, rows, width);
  else
    mp::reduce_scatter_v_start(comm, send.data(), recv.data(), rows, width).wait();
  expect(recv == expected, std::string("reduce_scatter_v ") + (blocking ? "checked" : "started"));
}

/// Runs `call` expecting an agreed error on every rank, whose text contains `text`.
template <class Call>
void expect_agreed_error(boost::mpi::communicator const& comm, std::string const& what,
                         std::string const& text, Call&& call) {
  bool agreed = false;
  try {
    call();
  } catch (mp::agreed_input_error const& e) {
    agreed = std::string(e.what()).find(text) != std::string::npos;
    if (!agreed) std::cerr << what << ": unexpected message: " << e.what() << "\n";
  }
  expect(agreed, what + ": no agreed error on rank " + std::to_string(comm.rank()));
}

void malformed(boost::mpi::communicator const& comm, int bad_rank) {
  int const n = comm.size(), me = comm.rank();
  std::vector<std::int64_t> rows(static_cast<std::size_t>(n), 1);
  std::vector<float> send(static_cast<std::size_t>(n) * 2, 1.0F), recv(send.size() + 2, 0.0F);
  // One rank expects a row more from rank 0 than rank 0 sends.
  std::vector<std::int64_t> expect_rows = rows;
  if (me == bad_rank) expect_rows[0] = 2;
  expect_agreed_error(comm, "all_to_all_v count mismatch", "rank 0 sends 1 rows", [&] {
    mp::all_to_all_v_checked<float>(comm, send, rows, recv, expect_rows, 2);
  });
  // One rank disagrees on the reduce-scatter blocks.
  std::vector<std::int64_t> blocks = rows;
  if (me == bad_rank) blocks[static_cast<std::size_t>(n - 1)] = 3;
  std::vector<float> big(static_cast<std::size_t>(n + 2) * 2, 1.0F);
  expect_agreed_error(comm, "reduce_scatter_v disagreement", "disagree",
                      [&] { mp::reduce_scatter_v_checked<float>(comm, big, recv, blocks, 2); });
  // One rank passes a send buffer smaller than its counts.
  std::vector<float> small(me == bad_rank ? 1 : send.size(), 1.0F);
  expect_agreed_error(comm, "all_gather_v short buffer", "send buffer", [&] {
    std::vector<float> out;
    mp::all_gather_v_checked<float>(comm, small, 1, out, 2);
  });
  // Negative counts.
  std::vector<std::int64_t> negative = rows;
  if (me == bad_rank) negative[0] = -1;
  expect_agreed_error(comm, "negative count", "", [&] {
    mp::all_to_all_v_checked<float>(comm, send, negative, recv, rows, 2);
  });
}

/// While the pool computes, the waiting main thread tests the registered requests: an all-reduce
/// started before a 100 ms pool task is complete when the task ends (no wait called), the rounds
/// of tests were counted, and once it completed the waiter stopped testing.
void progress_during_compute(boost::mpi::communicator const& comm) {
  megamoe::thread_pool pool(1);
  pool.set_wait_interval(std::chrono::microseconds(500));
  std::vector<double> values(1000, 1.0);
  auto pending = mp::all_reduce_sum_start(comm, std::span<double>(values));
  mp::exchange_progress progress;
  progress.watch(&pending.handle_);
  std::uint64_t const before = progress.polls();
  {
    auto const testing = progress.while_waiting(pool);
    pool.run(1, [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); });
  }
  std::uint64_t const rounds = progress.polls() - before;
  progress.clear();
  expect(pool.hook().poll == nullptr, "the pool's hook is removed with the guard");
  expect(pending.handle_ == MPI_REQUEST_NULL, "the exchange completed during the pool's work");
  expect(rounds >= 1 && rounds < 150, "tested in " + std::to_string(rounds) + " rounds");
  pending.wait();
  expect(values[0] == comm.size() && values[999] == comm.size(), "the sum arrived");
}

/// The byte at `offset` of the segment rank `owner` fills in round `round`.
std::byte segment_byte(int owner, std::size_t offset, int round) {
  return static_cast<std::byte>((owner * 131 + static_cast<int>(offset % 251) * 7 + round * 29) &
                                255);
}

/// Segments of rank-dependent sizes (rank 1's empty): every rank fills its own, fences, and checks
/// every other rank's byte for byte; then each rank writes its right neighbour's segment and the
/// owner checks it after the next fence.
void shared_window_rounds(boost::mpi::communicator const& comm, std::size_t scale) {
  int const n = comm.size(), me = comm.rank();
  auto bytes_of = [&](int r) {
    return r == 1 ? std::size_t{0} : scale * static_cast<std::size_t>(r + 1) + 3;
  };
  mp::shared_window window(comm, bytes_of(me));
  expect(window.allocated() && window.size() == n, "the window has a segment per rank");
  for (int r = 0; r < n; ++r)
    expect(window.segment_bytes(r) == bytes_of(r), "segment " + std::to_string(r) + " holds " +
                                                       std::to_string(window.segment_bytes(r)) +
                                                       " bytes");
  for (std::size_t i = 0; i < bytes_of(me); ++i) window.segment(me)[i] = segment_byte(me, i, 0);
  window.fence();
  for (int r = 0; r < n; ++r) {
    bool same = true;
    for (std::size_t i = 0; i < bytes_of(r); ++i)
      same = same && window.segment(r)[i] == segment_byte(r, i, 0);
    expect(same,
           "rank " + std::to_string(r) + "'s segment as rank " + std::to_string(me) + " reads it");
  }
  window.fence();  // every read above is done before any rank overwrites a segment
  int const right = (me + 1) % n, left = (me + n - 1) % n;
  for (std::size_t i = 0; i < bytes_of(right); ++i)
    window.segment(right)[i] = segment_byte(right, i, 1 + me);
  window.fence();
  bool same = true;
  for (std::size_t i = 0; i < bytes_of(me); ++i)
    same = same && window.segment(me)[i] == segment_byte(me, i, 1 + left);
  expect(same, "rank " + std::to_string(me) + "'s segment as its left neighbour wrote it");
  window.free();
  expect(!window.allocated(), "a freed window is empty");
}

/// The space checks end as the same agreed error on every rank, and nothing is left allocated: a
/// backing directory that is not writable, and more bytes than the backing directory has free.
void shared_window_errors(boost::mpi::communicator const& comm) {
  ::setenv("OMPI_MCA_osc_sm_backing_directory", "/nonexistent/megamoe", 1);
  expect_agreed_error(comm, "shared window in a missing directory", "is not a writable directory",
                      [&] { mp::shared_window window(comm, 4096); });
  ::unsetenv("OMPI_MCA_osc_sm_backing_directory");
  std::uint64_t free_bytes = 0;
  if (comm.rank() == 0)
    if (auto const space = mp::shared_memory_space_for_windows()) free_bytes = space->free_bytes;
  boost::mpi::broadcast(comm, free_bytes, 0);
  if (free_bytes > 0) {
    // Rank 0 asks for all of it, the others for a little: the sum decides, not one rank's share.
    std::size_t const mine = comm.rank() == 0 ? free_bytes : 4096;
    expect_agreed_error(comm, "a window larger than the free shared memory", "MiB free in",
                        [&] { mp::shared_window window(comm, mine); });
  }
  mp::shared_memory_space const small{"/dev/shm", std::uint64_t{3} << 20};
  bool refused = false;
  try {
    mp::require_shared_memory_space(small, (std::uint64_t{2} << 20) + 1);
  } catch (megamoe::input_error const& e) {
    refused = std::strstr(e.what(),
                          "2.0 MiB of shared memory asked for (and 1 MiB for Open MPI), 3.0 MiB "
                          "free in /dev/shm") != nullptr;
  }
  expect(refused, "2 MiB and a byte, with the 1 MiB margin, is refused in 3 MiB");
  mp::require_shared_memory_space(small, std::uint64_t{2} << 20);  // exactly fits
}

}  // namespace

int main(int argc, char** argv) {
  return mp::run_main(argc, argv, [&](mp::environment& env) {
    auto const& world = env.world();
    for (bool blocking : {true, false}) {
      all_to_all<float>(world, blocking);
      all_to_all<double>(world, blocking);
      all_gather<float>(world, blocking);
      all_gather<double>(world, blocking);
      reduce_scatter<float>(world, blocking);
      reduce_scatter<double>(world, blocking);
    }
    for (int bad = 0; bad < world.size(); ++bad) malformed(world, bad);
    // Still in step after the agreed errors: one more exchange must work.
    all_to_all<float>(world, true);
    progress_during_compute(world);
    shared_window_rounds(world, 1000);
    shared_window_rounds(world, 100000);  // a second, larger window after the first was freed
    shared_window_errors(world);
    shared_window_rounds(world, 10);  // still in step after the agreed errors
    int const failed = boost::mpi::all_reduce(world, failures, std::plus<int>());
    if (world.rank() == 0)
      std::cout << "collectives on " << world.size() << " ranks: " << checks << " checks per rank, "
                << (failed == 0 ? "all ok" : "failures") << "\n";
    return failed == 0 ? 0 : 1;
  });
}
