// SPDX-License-Identifier: Apache-2.0
// R037: the BF16 backends (amx, avx512_bf16) need a bf16, FP8 or FP4 recipe (they multiply BF16
// values).
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R037]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::precision::fp32
#else
#define MEGAMOE_TEST_CHOICE mm::precision::nvfp4
#endif

using cfg = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
                            mm::expert::mlp<mm::expert::swiglu, mm::expert::avx512_bf16>,
                            MEGAMOE_TEST_CHOICE>;
static_assert(mm::rules::check<cfg>());
