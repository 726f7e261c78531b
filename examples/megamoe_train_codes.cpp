// SPDX-License-Identifier: Apache-2.0
// megamoe-train's small preset with its linear weights held as codes (--fp8-param-gather,
// --fp4-param-gather), Adam's moments in fp32.
#include "megamoe_train.hpp"

namespace megamoe::train_job {

int run_small_codes(mm::parallel::environment& env, mt::job_options const& o,
                    mm::io::checkpoint_reader* resume) {
  auto run = [&]<class Config>() { return mt::run_job<Config, false>(env, o, resume); };
  return presets::with_quantized_recipe<presets::small_config_in, presets::quantized_weights_plan>(
      o.precision, run);
}

}  // namespace megamoe::train_job
