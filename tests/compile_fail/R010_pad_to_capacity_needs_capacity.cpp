// SPDX-License-Identifier: Apache-2.0
// R010: pad-to-capacity needs a capacity factor.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R010]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::router::top_k<2, mm::router::pad_to_capacity>
#else
#define MEGAMOE_TEST_CHOICE \
  mm::router::top_k<2, mm::router::pad_to_capacity, mm::router::capacity<1.0>>
#endif

using cfg =
    mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>, MEGAMOE_TEST_CHOICE>;
static_assert(mm::rules::check<cfg>());
