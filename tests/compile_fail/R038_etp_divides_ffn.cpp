// SPDX-License-Identifier: Apache-2.0
// R038: ETP splits every expert's FFN width evenly.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R038]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE mm::parallel::mapping<mm::parallel::etp<3>, mm::parallel::ep<2>>
#else
#define MEGAMOE_TEST_CHOICE mm::parallel::mapping<mm::parallel::etp<4>, mm::parallel::ep<2>>
#endif

using cfg = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
                            mm::dispatch::all_to_all, MEGAMOE_TEST_CHOICE>;
static_assert(mm::rules::check<cfg>());
