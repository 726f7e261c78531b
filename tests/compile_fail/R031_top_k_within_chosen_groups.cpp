// SPDX-License-Identifier: Apache-2.0
// R031: top_k must fit in the experts of the chosen groups (group_top_k * experts / num_groups).
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R031]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::router::group_limit<4, 1>
#else
#define MEGAMOE_TEST_CHOICE mm::router::group_limit<4, 2>
#endif

// 16 experts in 4 groups of 4: one chosen group cannot hold 6 experts, two can.
using cfg = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<16>>,
                            mm::router::top_k<6, MEGAMOE_TEST_CHOICE>>;
static_assert(mm::rules::check<cfg>());
