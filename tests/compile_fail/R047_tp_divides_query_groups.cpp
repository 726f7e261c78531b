// SPDX-License-Identifier: Apache-2.0
// R047: attention TP divides the query groups.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R047]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;
namespace md = mm::model;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE md::query_groups<2>
#else
#define MEGAMOE_TEST_CHOICE md::query_groups<4>
#endif

using cfg = mm::make_config<
    mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
    mm::parallel::mapping<mm::parallel::tp<4>>,
    md::decoder<md::layers<4>, md::heads<8>, md::vocabulary<256>, MEGAMOE_TEST_CHOICE>>;
static_assert(mm::rules::check<cfg>());
