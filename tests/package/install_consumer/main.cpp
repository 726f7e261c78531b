// SPDX-License-Identifier: Apache-2.0
// A downstream program against the installed package: configuration types, their compile-time
// check, start-up resolution and the process-group layout.
#include <megamoe/config/config.hpp>
#include <megamoe/config/describe.hpp>
#include <megamoe/config/resolve.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/parallel/layout.hpp>
#include <megamoe/version.hpp>

#include <iostream>

namespace mm = megamoe;

using my_layer =
    mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<16>>,
                    mm::router::aux_loss_free<4, mm::router::group_limit<4, 2>>,
                    mm::parallel::mapping<mm::parallel::ep<mm::dynamic>>, mm::dispatch::all_to_all>;
static_assert(mm::rules::check<my_layer>());

int main() {
  auto const values = mm::resolve<my_layer>({.ep = 8, .world_size = 16});
  auto const layout = mm::parallel::layout::resolve(16, values.parallel);
  auto const ep_groups = layout.expert_grid().groups("ep");
  if (layout.edp != 2 || ep_groups.size() != 2 || ep_groups[1].front() != 8) return 1;
  std::cout << "megamoe " << mm::version_major << "." << mm::version_minor << ": "
            << mm::describe(values).json["parallel"].dump() << "\n";
  std::cout << "consumer ok\n";
  return 0;
}
