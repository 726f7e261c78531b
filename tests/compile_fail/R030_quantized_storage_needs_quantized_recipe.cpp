// SPDX-License-Identifier: Apache-2.0
// R030: quantized activation storage needs an FP8 or FP4 recipe.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R030]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::precision::bf16
#else
#define MEGAMOE_TEST_CHOICE mm::precision::fp8_blockwise
#endif

using cfg =
    mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
                    mm::memory::plan<mm::memory::quantized_activations>, MEGAMOE_TEST_CHOICE>;
static_assert(mm::rules::check<cfg>());
