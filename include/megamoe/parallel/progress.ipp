// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/progress.ipp — the definitions behind progress.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/progress.hpp>

namespace megamoe::parallel {

MEGAMOE_DECL bool exchange_progress::poll() {
  ++polls_;
  bool pending = false;
  for (MPI_Request* r : requests_)
    if (*r != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Test(r, &flag, MPI_STATUS_IGNORE);
      pending = pending || flag == 0;
    }
  return pending;
}

}  // namespace megamoe::parallel
