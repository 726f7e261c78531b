// SPDX-License-Identifier: Apache-2.0
// R055: FP8 codes on the dispatch's wire need a per-tensor FP8 recipe: under MXFP8 the wgrad copy
// is quantized along the tokens, from values the codes do not carry.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R055]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::precision::mxfp8
#else
#define MEGAMOE_TEST_CHOICE mm::precision::fp8_tensorwise<mm::precision::current>
#endif

using cfg = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
                            mm::dispatch::fp8_wire<>, MEGAMOE_TEST_CHOICE,
                            mm::parallel::mapping<mm::parallel::ep<2>, mm::parallel::etp<1>>>;
static_assert(mm::rules::check<cfg>());
