// SPDX-License-Identifier: Apache-2.0
// megamoe-train's presets as jobs (train/run.hpp), one group of configurations per translation
// unit so that they compile side by side: small under fp32 and bf16 (megamoe_train_small.cpp),
// under the FP8 and FP4 recipes (megamoe_train_small_recipes.cpp) and with its weights held as
// codes (megamoe_train_codes.cpp); medium and the presets built for fp32 only
// (megamoe_train_other.cpp); the model families' presets (megamoe_train_families.cpp).
#pragma once

#include "presets.hpp"

#include <megamoe/train/run.hpp>

namespace megamoe::train_job {

namespace mm = megamoe;
namespace mt = megamoe::train;
using job = int(mm::parallel::environment&, mt::job_options const&, mm::io::checkpoint_reader*);

job run_small, run_small_recipes, run_small_codes, run_medium, run_fp32_presets,
    run_family_presets;

}  // namespace megamoe::train_job
