// SPDX-License-Identifier: Apache-2.0
// R015: the shared-expert gate needs a shared expert.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R015]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>
#else
#define MEGAMOE_TEST_CHOICE \
  mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>, mm::shared_ffn<256>>
#endif

using cfg = mm::make_config<MEGAMOE_TEST_CHOICE, mm::expert::mlp<mm::expert::shared_expert_gate>>;
static_assert(mm::rules::check<cfg>());
