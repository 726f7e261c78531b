// SPDX-License-Identifier: Apache-2.0
// R008: softmax after top-k needs k > 1.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R008]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::router::softmax_after_topk
#else
#define MEGAMOE_TEST_CHOICE mm::router::softmax_before_topk
#endif

using cfg = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
                            mm::router::top_k<1, MEGAMOE_TEST_CHOICE>>;
static_assert(mm::rules::check<cfg>());
