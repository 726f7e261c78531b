// SPDX-License-Identifier: Apache-2.0
// megamoe/train/faults.hpp — faults a test plants in a training job through MEGAMOE_FAULT, in the
// style of the checkpoint fault hook (MEGAMOE_CHECKPOINT_FAULT): a comma-separated list of
//   slow:RANK:MILLISECONDS   world rank RANK works that much longer in every training step (a
//                            sleep before the step, counted as its compute)
//   bitflip:RANK:STEP        after step STEP's backward, world rank RANK flips the top exponent
//                            bit of one gradient element (a machine's fault: once, so that a
//                            recomputation of the step does not see it)
//   nan:RANK:STEP            after step STEP's backward, world rank RANK writes a NaN into one
//                            gradient element on every pass (a fault of the model: it recurs)
// Each rank reads the same text; a rank another fault names does nothing.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter_list.hpp>

#include <string>
#include <string_view>
#include <utility>

namespace megamoe::train {

struct planted_faults {
  double slow_milliseconds = 0.0;  // this rank's extra time per step
  int bit_flip_step = 0;           // the step whose gradients this rank corrupts once (0: none)
  int nan_step = 0;                // the step whose every backward this rank corrupts (0: none)
};

/// The faults `text` plants on world rank `rank`; input_error naming the entry when it is not one
/// of the forms above.
MEGAMOE_DECL planted_faults parse_planted_faults(std::string_view text, int rank);

/// MEGAMOE_FAULT's faults on `rank` (none when unset).
MEGAMOE_DECL planted_faults planted_faults_from_environment(int rank);

/// Sleeps the step's planted delay, if any.
MEGAMOE_DECL void slow_down(planted_faults const& faults);

// A failed step's checks over a rank's gradients, in the order of the model's
// numbered_parameters(): code keyed by the element type, not by the configuration.

/// The name of the first parameter holding a non-finite gradient ("" where none does).
MEGAMOE_DECL std::string first_nonfinite_gradient(parameter_list<float> const& parameters);
MEGAMOE_DECL std::string first_nonfinite_gradient(parameter_list<double> const& parameters);

/// The parameter holding the largest gradient element, and that element's magnitude (-1 where no
/// parameter has an element).
MEGAMOE_DECL std::pair<std::string, double> largest_gradient(
    parameter_list<float> const& parameters);
MEGAMOE_DECL std::pair<std::string, double> largest_gradient(
    parameter_list<double> const& parameters);

/// A planted fault: a NaN in, or the top exponent bit of, the element of the first non-empty
/// gradient that is largest below 2 in magnitude (so that the flip makes it 2^128 times larger,
/// 2^1024 in double, or not finite).
MEGAMOE_DECL void corrupt_first_gradient(parameter_list<float>& parameters,
                                         bool not_a_number);
MEGAMOE_DECL void corrupt_first_gradient(parameter_list<double>& parameters,
                                         bool not_a_number);

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/faults.ipp>
#endif
