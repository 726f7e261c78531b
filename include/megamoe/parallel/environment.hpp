// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/environment.hpp — MPI start-up, threads per rank, and start-up errors that every
// rank reports instead of a hang.
//
// MPI is initialised FUNNELED: only the main thread calls MPI; megamoe's thread pool does the
// compute. Start-up checks run locally on each rank, then the ranks agree (one small all-reduce) on
// whether any failed, so a bad value on one rank becomes the same error on all of them, never a
// rank left waiting in a collective.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/parallel/threads.hpp>
#include <megamoe/parallel/watchdog.hpp>
#include <megamoe/policy/error.hpp>

#include <mpi.h>
#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/collectives/broadcast.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace megamoe::parallel {

/// Marks an error that every rank of a communicator throws at the same point, so a rank may stop
/// cleanly without leaving another waiting in a collective (see `agree_on_failure`).
struct agreed_failure {
  virtual ~agreed_failure() = default;
};

/// A broken configuration rule that every rank agreed on.
class agreed_config_error : public config_error, public agreed_failure {
 public:
  agreed_config_error(rules::id which, std::string const& text)
      : config_error(config_error::verbatim(which, text)) {}
};

/// Bad input that every rank agreed on.
class agreed_input_error : public input_error, public agreed_failure {
 public:
  using input_error::input_error;
};

namespace detail {
/// The rule id (0: not a configuration rule) and text of an exception.
MEGAMOE_DECL std::pair<int, std::string> describe_failure(std::exception_ptr failure);
}  // namespace detail

/// Collective over `comm`: if any rank passes a failure, every rank throws an agreed error
/// (`agreed_config_error` keeping the rule id, or `agreed_input_error`). A rank that failed throws
/// its own error; the others throw the lowest failing rank's, marked with that rank's number. Each
/// rank must call this at the same point, and the checks before it must not communicate.
MEGAMOE_DECL void agree_on_failure(boost::mpi::communicator const& comm, std::exception_ptr local);

/// One line for stderr, written at once so that lines from several ranks do not interleave.
MEGAMOE_DECL void print_error_line(std::string const& line);

/// "megamoe: rank r of n: ", the prefix of every error line a rank prints.
MEGAMOE_DECL std::string rank_prefix(boost::mpi::communicator const& world);

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

/// The MPI environment of one process: FUNNELED MPI, the world, the ranks on this machine, the
/// threads this rank may use (MEGAMOE_NUM_THREADS, or cores / ranks on the machine) and the
/// collective watchdog (MEGAMOE_WATCHDOG_SECONDS; parallel/watchdog.hpp).
class environment {
 public:
  /// Collective. When a start-up check fails (R028, R029, R035) every rank prints the error and
  /// throws the same `agreed_config_error`; MPI is then finalized cleanly, since every rank stops
  /// there.
  environment(int& argc, char**& argv);

  /// Leaving by an exception may leave other ranks waiting inside a collective, so that aborts the
  /// whole job instead of finalizing (`run_main` catches agreed failures first and ends cleanly).
  ~environment();

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

/// A `main` for MPI programs: starts the environment and runs `body(env)`. An error every rank
/// agreed on (`agreed_failure`, e.g. a start-up check) is printed by each rank with its number,
/// before MPI is finalized, and gives exit code 1. Any other exception is printed and aborts the
/// whole job, since the other ranks may be waiting for this one.
template <class Body>
int run_main(int argc, char** argv, Body&& body) {
  try {
    environment env(argc, argv);
    auto const& world = env.world();
    try {
      return std::invoke(std::forward<Body>(body), env);
    } catch (std::exception const& e) {
      print_error_line(rank_prefix(world) + e.what());
      if (dynamic_cast<agreed_failure const*>(&e) == nullptr) world.abort(1);
      watched_collective const watch(MPI_Comm(world), "barrier", 0);
      world.barrier();  // every rank has printed before any exits
      return 1;
    }
  } catch (std::exception const& e) {
    // The environment printed an agreed failure on every rank already.
    if (dynamic_cast<agreed_failure const*>(&e) == nullptr)
      print_error_line(std::string("megamoe: ") + e.what());
    return 1;
  }
}

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/environment.ipp>
#endif
