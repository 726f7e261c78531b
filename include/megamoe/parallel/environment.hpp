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
inline std::pair<int, std::string> describe_failure(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (config_error const& e) {
    return {e.rule_id(), e.what()};
  } catch (std::exception const& e) {
    return {0, e.what()};
  } catch (...) {
    return {0, "unknown error"};
  }
}
}  // namespace detail

/// Collective over `comm`: if any rank passes a failure, every rank throws an agreed error
/// (`agreed_config_error` keeping the rule id, or `agreed_input_error`). A rank that failed throws
/// its own error; the others throw the lowest failing rank's, marked with that rank's number. Each
/// rank must call this at the same point, and the checks before it must not communicate.
inline void agree_on_failure(boost::mpi::communicator const& comm, std::exception_ptr local) {
  int const me = comm.rank();
  int first_failing = comm.size();
  {
    watched_collective const watch(MPI_Comm(comm), "agree_on_failure", 1);
    first_failing =
        boost::mpi::all_reduce(comm, local ? me : comm.size(), boost::mpi::minimum<int>());
  }
  if (first_failing == comm.size()) return;
  watched_collective const watch(MPI_Comm(comm), "broadcast_failure", 2);

  auto [rule_id, text] = local ? detail::describe_failure(local) : std::pair<int, std::string>{};
  int sent_rule = rule_id;
  int length = static_cast<int>(text.size());
  boost::mpi::broadcast(comm, sent_rule, first_failing);
  boost::mpi::broadcast(comm, length, first_failing);
  std::vector<char> chars(text.begin(), text.end());
  chars.resize(static_cast<std::size_t>(length));
  if (length > 0) boost::mpi::broadcast(comm, chars.data(), length, first_failing);
  if (!local) {
    rule_id = sent_rule;
    text.assign(chars.begin(), chars.end());
    text += " [reported by rank " + std::to_string(first_failing) + "]";
  }
  if (rule_id != 0) throw agreed_config_error(static_cast<rules::id>(rule_id), text);
  throw agreed_input_error(text);
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

/// The MPI environment of one process: FUNNELED MPI, the world, the ranks on this machine, the
/// threads this rank may use (MEGAMOE_NUM_THREADS, or cores / ranks on the machine) and the
/// collective watchdog (MEGAMOE_WATCHDOG_SECONDS; parallel/watchdog.hpp).
class environment {
 public:
  /// Collective. When a start-up check fails (R028, R029, R035) every rank prints the error and
  /// throws the same `agreed_config_error`; MPI is then finalized cleanly, since every rank stops
  /// there.
  environment(int& argc, char**& argv)
      : env_(argc, argv, boost::mpi::threading::funneled, /*abort_on_exception=*/false),
        uncaught_at_start_(std::uncaught_exceptions()) {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_Comm(world_), MPI_COMM_TYPE_SHARED, world_.rank(), MPI_INFO_NULL,
                        &node);
    MPI_Comm_size(node, &ranks_on_node_);
    MPI_Comm_free(&node);
    try {
      double watchdog_seconds = 0.0;
      check_on_every_rank(world_, [&] {
        if (env_.thread_level() < boost::mpi::threading::funneled)
          throw config_error(rules::id::mpi_thread_level_funneled,
                             "the MPI library granted a lower thread level");
        num_threads_ = num_threads_from_environment(ranks_on_node_);
        if (char const* text = std::getenv("MEGAMOE_WATCHDOG_SECONDS"))
          watchdog_seconds = parse_watchdog_seconds(text);
      });
      if (watchdog_seconds > 0.0)
        watchdog::instance().start(watchdog_seconds, world_.rank(), world_.size());
    } catch (std::exception const& e) {
      // Printed here, while MPI is still up: once MPI is finalized a rank may exit, and mpiexec
      // then stops the others, possibly before they could print.
      print_error_line(rank_prefix(world_) + e.what());
      world_.barrier();  // the ranks agreed on this failure: every rank prints before any exits
      throw;
    }
  }

  /// Leaving by an exception may leave other ranks waiting inside a collective, so that aborts the
  /// whole job instead of finalizing (`run_main` catches agreed failures first and ends cleanly).
  ~environment() {
    watchdog::instance().stop();
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
