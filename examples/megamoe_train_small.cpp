// SPDX-License-Identifier: Apache-2.0
// megamoe-train's small preset under fp32 and bf16 (bf16 on each GEMM unit).
#include "megamoe_train.hpp"

namespace megamoe::train_job {

int run_small(mm::parallel::environment& env, mt::job_options const& o, mm::io::checkpoint_reader* resume) {
  auto run = [&]<class Config>() { return mt::run_job<Config>(env, o, resume); };
  return presets::with_unquantized_recipe<presets::small_config_in>(o.precision, o.backend, run);
}

}  // namespace megamoe::train_job
