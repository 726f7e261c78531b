// SPDX-License-Identifier: Apache-2.0
// megamoe/optim/adamw.ipp — the definitions behind adamw.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/optim/adamw.hpp>

namespace megamoe::optim {

MEGAMOE_DECL double lr_schedule::at(int step) const {
  if (warmup > 0 && step <= warmup) return peak * step / warmup;
  if (step >= total) return minimum;
  double const progress =
      static_cast<double>(step - warmup) / static_cast<double>(std::max(1, total - warmup));
  return minimum + 0.5 * (peak - minimum) * (1.0 + std::cos(std::numbers::pi * progress));
}

MEGAMOE_DECL bool decays(std::string_view name, Eigen::Index rows) {
  return rows > 1 && name.find("norm") == std::string_view::npos &&
         name.find(".bias") == std::string_view::npos;
}

}  // namespace megamoe::optim
