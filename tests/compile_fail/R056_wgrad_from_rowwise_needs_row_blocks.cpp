// SPDX-License-Identifier: Apache-2.0
// R056: the wgrad copies come from the rowwise codes only under a recipe with row-local blocks and
// distinct copies (MXFP8, blockwise FP8); NVFP4's rowwise blocks sit under the tensor's amax.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R056]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::precision::wgrad_from_rowwise<mm::precision::nvfp4>
#else
#define MEGAMOE_TEST_CHOICE mm::precision::wgrad_from_rowwise<mm::precision::fp8_blockwise>
#endif

using cfg =
    mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>, MEGAMOE_TEST_CHOICE>;
static_assert(mm::rules::check<cfg>());
