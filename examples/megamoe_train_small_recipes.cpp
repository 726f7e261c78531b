// SPDX-License-Identifier: Apache-2.0
// megamoe-train's small preset under the FP8 and FP4 recipes.
#include "megamoe_train.hpp"

namespace megamoe::train_job {

int run_small_recipes(mm::parallel::environment& env, mt::job_options const& o,
                      mm::io::checkpoint_reader* resume) {
  auto run = [&]<class Config>() { return mt::run_job<Config>(env, o, resume); };
  return presets::with_quantized_recipe<presets::small_config_in>(o.precision, run);
}

}  // namespace megamoe::train_job
