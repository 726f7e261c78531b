// SPDX-License-Identifier: Apache-2.0
// R058: multi-token prediction's loss scale is a weight of the objective, so it is not negative.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R058]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;
namespace md = mm::model;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE md::multi_token_prediction<1, -0.1>
#else
#define MEGAMOE_TEST_CHOICE md::multi_token_prediction<1, 0.1>
#endif

using cfg = mm::make_config<
    mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
    md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<64>, MEGAMOE_TEST_CHOICE>>;
static_assert(mm::rules::check<cfg>());
