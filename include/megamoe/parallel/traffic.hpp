// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/traffic.hpp — bytes this rank sends on each communicator through the data
// path's collectives (parallel/collectives.hpp), for the step profile.
//
// A collective counts what must leave this rank in the least exchange that does it: an
// all-to-all what it sends to the others; an all-gather its rows once per other rank; a
// reduce-scatter the blocks of the others; an all-reduce 2 n (P - 1) / P (a reduce-scatter, then
// an all-gather); a ring step what it sends. So the counts compare with the volume a layout
// implies, whatever algorithm MPI picks. The small agreement messages (counts, headers, error
// flags) and the router's reductions of a few numbers per layer are not counted. Collectives run on
// the thread that drives MPI (funneled), which is the only one that counts.
#pragma once

#include <megamoe/core/compiled_once.hpp>

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace megamoe::parallel {

class traffic {
 public:
  /// The process's tally.
  static traffic& instance();

  void add(MPI_Comm comm, std::int64_t bytes);
  /// Bytes counted on `comm` since the last reset.
  [[nodiscard]] std::int64_t bytes(MPI_Comm comm) const;
  /// Every count back to zero (the communicators stay known: no allocation afterwards).
  void reset();

 private:
  struct entry {
    MPI_Comm comm;
    std::int64_t bytes;
  };
  std::vector<entry> entries_;
};

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/traffic.ipp>
#endif
