// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/collectives.hpp — small collectives over a communicator, shaped for the callers
// that take a group as a concept (the router's `count_group`).
#pragma once

#include <mpi.h>
#include <boost/mpi/communicator.hpp>

#include <span>

namespace megamoe::parallel {

/// Sums numbers in place over a communicator (every rank gets the total). Pointer and count over a
/// native type, in place: the fast path of MPI_Allreduce (docs/PLATFORM.md).
class communicator_sum {
 public:
  explicit communicator_sum(boost::mpi::communicator const& comm) : comm_(&comm) {}

  [[nodiscard]] int size() const { return comm_->size(); }

  void sum(std::span<double> values) const {
    if (values.empty() || comm_->size() == 1) return;
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                  MPI_Comm(*comm_));
  }

 private:
  boost::mpi::communicator const* comm_;
};

}  // namespace megamoe::parallel
