// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/environment.ipp — the definitions behind environment.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/environment.hpp>

namespace megamoe::parallel {

namespace detail {

MEGAMOE_DECL std::pair<int, std::string> describe_failure(std::exception_ptr failure) {
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

MEGAMOE_DECL void agree_on_failure(boost::mpi::communicator const& comm, std::exception_ptr local) {
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

MEGAMOE_DECL void print_error_line(std::string const& line) {
  std::string const text = line + "\n";
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

MEGAMOE_DECL std::string rank_prefix(boost::mpi::communicator const& world) {
  return "megamoe: rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()) +
         ": ";
}

MEGAMOE_DECL environment::environment(int& argc, char**& argv)
    : env_(argc, argv, boost::mpi::threading::funneled, /*abort_on_exception=*/false),
      uncaught_at_start_(std::uncaught_exceptions()) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_Comm(world_), MPI_COMM_TYPE_SHARED, world_.rank(), MPI_INFO_NULL, &node);
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

MEGAMOE_DECL environment::~environment() {
  watchdog::instance().stop();
  if (std::uncaught_exceptions() > uncaught_at_start_) world_.abort(1);
}

}  // namespace megamoe::parallel
