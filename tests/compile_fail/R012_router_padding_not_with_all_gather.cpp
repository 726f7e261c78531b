// SPDX-License-Identifier: Apache-2.0
// R012: router-side padding is not allowed with all_gather.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R012]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::dispatch::all_gather
#else
#define MEGAMOE_TEST_CHOICE mm::dispatch::all_to_all
#endif

using cfg =
    mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
                    mm::router::top_k<2, mm::router::pad_for_quantization<>>, mm::precision::mxfp8,
                    mm::parallel::mapping<mm::parallel::ep<2>>, MEGAMOE_TEST_CHOICE>;
static_assert(mm::rules::check<cfg>());
