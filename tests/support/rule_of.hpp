// SPDX-License-Identifier: Apache-2.0
// Test helper: which rule a call breaks.
#pragma once

#include <megamoe/core/error.hpp>

#include <utility>

namespace megamoe::testing {

/// The rule id of the `config_error` that `f()` throws, or 0 when it throws none.
template <class F>
int rule_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (config_error const& e) {
    return e.rule_id();
  }
  return 0;
}

}  // namespace megamoe::testing
