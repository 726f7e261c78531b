// SPDX-License-Identifier: Apache-2.0
// R043: one key / value head per query head (no grouped-query attention yet).
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R043]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;
namespace md = mm::model;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE md::heads<8>, md::query_groups<4>
#else
#define MEGAMOE_TEST_CHOICE md::heads<8>, md::query_groups<8>
#endif

using cfg = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
                            md::decoder<md::layers<4>, md::vocabulary<256>, MEGAMOE_TEST_CHOICE>>;
static_assert(mm::rules::check<cfg>());
