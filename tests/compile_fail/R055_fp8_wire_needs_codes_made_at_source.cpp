// SPDX-License-Identifier: Apache-2.0
// R055: FP8 codes on the dispatch's wire need codes the senders can make: under plain MXFP8 the
// wgrad copy is quantized along the tokens, from values the codes do not carry; with the wgrad
// copies made from the rowwise codes (precision::wgrad_from_rowwise) they carry everything.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R055]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::precision::mxfp8
#else
#define MEGAMOE_TEST_CHOICE mm::precision::wgrad_from_rowwise<mm::precision::mxfp8>
#endif

using cfg = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
                            mm::dispatch::fp8_wire<>, MEGAMOE_TEST_CHOICE,
                            mm::parallel::mapping<mm::parallel::ep<2>, mm::parallel::etp<1>>>;
static_assert(mm::rules::check<cfg>());
