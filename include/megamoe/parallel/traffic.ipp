// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/traffic.ipp — the definitions behind traffic.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/traffic.hpp>

namespace megamoe::parallel {

MEGAMOE_DECL traffic& traffic::instance() {
  static traffic tally;
  return tally;
}

MEGAMOE_DECL void traffic::add(MPI_Comm comm, std::int64_t bytes) {
  for (auto& e : entries_)
    if (e.comm == comm) {
      e.bytes += bytes;
      return;
    }
  entries_.push_back({comm, bytes});
}

MEGAMOE_DECL std::int64_t traffic::bytes(MPI_Comm comm) const {
  for (auto const& e : entries_)
    if (e.comm == comm) return e.bytes;
  return 0;
}

MEGAMOE_DECL void traffic::reset() {
  for (auto& e : entries_) e.bytes = 0;
}

}  // namespace megamoe::parallel
