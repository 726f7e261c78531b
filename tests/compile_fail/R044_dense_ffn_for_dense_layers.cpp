// SPDX-License-Identifier: Apache-2.0
// R044: a dense layer needs a dense FFN width.
// Built with MEGAMOE_COMPILE_FAIL the configuration breaks the rule and the compiler must print
// megamoe[R044]; built without, the twin differs only in that choice and compiles.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>

namespace mm = megamoe;
namespace md = mm::model;

#ifdef MEGAMOE_COMPILE_FAIL
#define MEGAMOE_TEST_CHOICE md::heads<4>, md::moe_layer_freq<2>, md::dense_ffn<0>
#else
#define MEGAMOE_TEST_CHOICE md::heads<4>, md::moe_layer_freq<2>, md::dense_ffn<256>
#endif

using cfg = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
                            md::decoder<md::layers<4>, md::vocabulary<256>, MEGAMOE_TEST_CHOICE>>;
static_assert(mm::rules::check<cfg>());
