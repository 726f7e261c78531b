// SPDX-License-Identifier: Apache-2.0
// megamoe-train's presets of the reference's model families (qwen3, mixtral, deepseek) under
// fp32, in a translation unit of their own so they build beside the others.
#include "megamoe_train.hpp"

namespace megamoe::train_job {

int run_family_presets(mm::parallel::environment& env, mt::job_options const& o,
                       mm::io::checkpoint_reader* resume) {
  auto run = [&]<class Config>() { return mt::run_job<Config, false>(env, o, resume); };
  if (o.preset == "qwen3") return run.template operator()<presets::qwen3_config>();
  if (o.preset == "deepseek") return run.template operator()<presets::deepseek_config>();
  return run.template operator()<presets::mixtral_config>();
}

}  // namespace megamoe::train_job
