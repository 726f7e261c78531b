// SPDX-License-Identifier: Apache-2.0
// R001: shape needs hidden, ffn and experts.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R001]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::shape<mm::hidden<64>, mm::ffn<128>>
#else
#define MEGAMOE_TEST_CHOICE mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>
#endif

using cfg = mm::make_config<MEGAMOE_TEST_CHOICE>;
static_assert(mm::rules::check<cfg>());
