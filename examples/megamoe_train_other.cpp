// SPDX-License-Identifier: Apache-2.0
// megamoe-train's other presets: medium under fp32 and bf16, and the presets built for fp32 with
// fp32 moments only (tiny, fine, dense).
#include "megamoe_train.hpp"

namespace megamoe::train_job {

int run_medium(mm::parallel::environment& env, mt::job_options const& o,
               mm::io::checkpoint_reader* resume) {
  auto run = [&]<class Config>() { return mt::run_job<Config>(env, o, resume); };
  return presets::with_unquantized_recipe<presets::medium_config_in>(o.precision, o.backend, run);
}

int run_fp32_presets(mm::parallel::environment& env, mt::job_options const& o,
                     mm::io::checkpoint_reader* resume) {
  auto run = [&]<class Config>() { return mt::run_job<Config, false>(env, o, resume); };
  if (o.preset == "tiny") return run.template operator()<presets::tiny_config>();
  if (o.preset == "fine") return run.template operator()<presets::fine_config>();
  return run.template operator()<presets::dense_config>();
}

}  // namespace megamoe::train_job
