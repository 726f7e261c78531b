// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/environment.hpp — MPI start-up, threads per rank, and start-up errors that every
// rank reports instead of a hang.
//
// MPI is initialised FUNNELED: only the main thread calls MPI; megamoe's thread pool does the
// compute. Start-up checks run locally on each rank, then the ranks agree (one small all-reduce) on
// whether any failed, so a bad value on one rank becomes the same error on all of them, never a
// rank left waiting in a collective.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/thread_pool.hpp>

#include <mpi.h>
#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/collectives/broadcast.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace megamoe::parallel {

/// Collective over `comm`: if any rank passes a failure, every rank throws. A rank that failed
/// throws its own error; the others throw the lowest failing rank's error, marked with that rank's
/// number (a `config_error` keeps its rule id). Each rank must call this at the same point, and the
/// checks before it must not communicate.
inline void agree_on_failure(boost::mpi::communicator const& comm, std::exception_ptr local) {
  int const me = comm.rank();
  int const first_failing =
      boost::mpi::all_reduce(comm, local ? me : comm.size(), boost::mpi::minimum<int>());
  if (first_failing == comm.size()) return;

  int rule_id = 0;
  std::string text;
  if (me == first_failing) {
    try {
      std::rethrow_exception(local);
    } catch (config_error const& e) {
      rule_id = e.rule_id();
      text = e.what();
    } catch (std::exception const& e) {
      text = e.what();
    } catch (...) {
      text = "unknown error";
    }
  }
  int length = static_cast<int>(text.size());
  boost::mpi::broadcast(comm, rule_id, first_failing);
  boost::mpi::broadcast(comm, length, first_failing);
  std::vector<char> chars(text.begin(), text.end());
  chars.resize(static_cast<std::size_t>(length));
  if (length > 0) boost::mpi::broadcast(comm, chars.data(), length, first_failing);
  if (local) std::rethrow_exception(local);
  text.assign(chars.begin(), chars.end());
  text += " [reported by rank " + std::to_string(first_failing) + "]";
  if (rule_id != 0) throw config_error::verbatim(rule_id, text);
  throw input_error(text);
}

/// One line for stderr, written at once so that lines from several ranks do not interleave.
inline void print_error_line(std::string const& line) {
  std::string const text = line + "\n";
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

/// "megamoe: rank r of n: ", the prefix of every error line a rank prints.
inline std::string rank_prefix(boost::mpi::communicator const& world) {
  return "megamoe: rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()) +
         ": ";
}

/// Runs `check()` on every rank of `comm`, then agrees on failure (see `agree_on_failure`).
template <class Check>
void check_on_every_rank(boost::mpi::communicator const& comm, Check&& check) {
  std::exception_ptr failure;
  try {
    std::invoke(std::forward<Check>(check));
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_failure(comm, failure);
}

/// The MPI environment of one process: FUNNELED MPI, the world, the ranks on this machine and the
/// threads this rank may use (MEGAMOE_NUM_THREADS, or cores / ranks on the machine).
class environment {
 public:
  /// Collective. Throws the same `config_error` on every rank when a start-up check fails (R028,
  /// R029); MPI is then finalized cleanly, since every rank stops at the same point.
  environment(int& argc, char**& argv)
      : env_(argc, argv, boost::mpi::threading::funneled, /*abort_on_exception=*/false),
        uncaught_at_start_(std::uncaught_exceptions()) {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_Comm(world_), MPI_COMM_TYPE_SHARED, world_.rank(), MPI_INFO_NULL,
                        &node);
    MPI_Comm_size(node, &ranks_on_node_);
    MPI_Comm_free(&node);
    try {
      check_on_every_rank(world_, [&] {
        if (env_.thread_level() < boost::mpi::threading::funneled)
          throw config_error(29, "the MPI library granted a lower thread level");
        num_threads_ = num_threads_from_environment(ranks_on_node_);
      });
    } catch (config_error const& e) {
      // Printed here, while MPI is still up: once MPI is finalized a rank may exit, and mpiexec
      // then stops the others, possibly before they could print.
      print_error_line(rank_prefix(world_) + e.what());
      world_.barrier();  // every rank has printed before any can exit
      throw;
    }
  }

  /// Leaving by an exception that the ranks did not agree on may leave other ranks waiting inside a
  /// collective, so that aborts the whole job instead of finalizing.
  ~environment() {
    if (std::uncaught_exceptions() > uncaught_at_start_) world_.abort(1);
  }

  environment(environment const&) = delete;
  environment& operator=(environment const&) = delete;

  [[nodiscard]] boost::mpi::communicator const& world() const noexcept { return world_; }
  /// Ranks of this job that share this machine's memory.
  [[nodiscard]] int ranks_on_node() const noexcept { return ranks_on_node_; }
  /// Threads for this rank's pool.
  [[nodiscard]] int num_threads() const noexcept { return num_threads_; }

 private:
  boost::mpi::environment env_;
  int uncaught_at_start_;
  boost::mpi::communicator world_;
  int ranks_on_node_ = 1;
  int num_threads_ = 1;
};

/// A `main` for MPI programs: starts the environment and runs `body(env)`. A `config_error` (which
/// `check_on_every_rank` raises on all ranks alike) is printed by each rank with its number and
/// gives exit code 1 after a clean shutdown; any other exception is printed and aborts the whole
/// job, since the other ranks may be waiting for this one.
template <class Body>
int run_main(int argc, char** argv, Body&& body) {
  try {
    environment env(argc, argv);
    auto const& world = env.world();
    try {
      return std::invoke(std::forward<Body>(body), env);
    } catch (config_error const& e) {
      print_error_line(rank_prefix(world) + e.what());
      world.barrier();  // the ranks agreed on this error; all print before any exits
      return 1;
    } catch (std::exception const& e) {
      print_error_line(rank_prefix(world) + e.what());
      world.abort(1);
    }
  } catch (config_error const&) {
    return 1;  // a start-up check failed; `environment` printed it on every rank
  } catch (std::exception const& e) {
    print_error_line(std::string("megamoe: ") + e.what());
    return 1;
  }
  return 1;
}

}  // namespace megamoe::parallel
