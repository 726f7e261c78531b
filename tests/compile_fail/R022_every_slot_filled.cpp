// SPDX-License-Identifier: Apache-2.0
// R022: every slot must hold a policy of its kind. Built with MEGAMOE_COMPILE_FAIL the struct below
// has no router; built without, it has one and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

struct cfg {
  using shape = mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>;
#ifndef MEGAMOE_COMPILE_FAIL
  using router = mm::router::top_k<2>;
#endif
  using dispatch = mm::dispatch::local;
  using expert = mm::expert::mlp<>;
  using precision = mm::precision::fp32;
  using parallel = mm::parallel::mapping<>;
  using memory = mm::memory::keep_all;
  using model = mm::model::decoder<>;
};
static_assert(mm::rules::check<cfg>());
