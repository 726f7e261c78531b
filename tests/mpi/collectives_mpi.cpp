// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. The data-path collectives of parallel/collectives.hpp against what each rank
// can compute alone: every row carries (sender, receiver, row, column) in its values, so a row that
// lands in the wrong place or with the wrong width is seen. Blocking, non-blocking and checked
// forms, for float and double; and malformed counts on one rank, which every rank must report as
// the same agreed error (and then carry on: nothing is left half-sent).
//
//   mpiexec -n 4 megamoe_collectives_mpi
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/progress.hpp>

#include <megamoe/core/thread_pool.hpp>

#include <boost/mpi/collectives/all_reduce.hpp>

#include <chrono>
#include <cstdint>
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
    int const failed = boost::mpi::all_reduce(world, failures, std::plus<int>());
    if (world.rank() == 0)
      std::cout << "collectives on " << world.size() << " ranks: " << checks << " checks per rank, "
                << (failed == 0 ? "all ok" : "failures") << "\n";
    return failed == 0 ? 0 : 1;
  });
}
