// SPDX-License-Identifier: Apache-2.0
// megamoe/core/error.hpp — the exception megamoe throws for bad run-time input. A broken
// configuration rule is a `config_error` (policy/error.hpp).
#pragma once

#include <stdexcept>

namespace megamoe {

/// Bad run-time input that is not a configuration rule: a missing or malformed file, a tensor of
/// the wrong shape. The message names the input and what was expected.
class input_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace megamoe
