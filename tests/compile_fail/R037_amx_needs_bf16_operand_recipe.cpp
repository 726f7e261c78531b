// SPDX-License-Identifier: Apache-2.0
// R037: the AMX backend needs a recipe whose dequantized operands are BF16 values.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R037]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::precision::fp8_tensorwise<mm::precision::current>
#else
#define MEGAMOE_TEST_CHOICE mm::precision::mxfp8
#endif

using cfg =
    mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
                    mm::expert::mlp<mm::expert::swiglu, mm::expert::amx>, MEGAMOE_TEST_CHOICE>;
static_assert(mm::rules::check<cfg>());
