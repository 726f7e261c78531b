// SPDX-License-Identifier: Apache-2.0
// my-model — a model of one's own (shape, router, dispatcher, recipe), trained by megamoe's
// training job with every flag of megamoe-train (--help lists them):
//   ./build/examples/my-model --data tests/data/corpus_sample.txt --steps 20
//   mpiexec -n 2 ./build/examples/my-model --ep 2 --data tests/data/corpus_sample.txt
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/precision/operands.hpp>
#include <megamoe/train/run.hpp>

namespace mm = megamoe;
namespace md = megamoe::model;
namespace rt = megamoe::router;

struct my_model : mm::defaults {  // the slots not named keep megamoe's defaults
  using shape = mm::shape<mm::hidden<96>, mm::ffn<128>, mm::experts<8>, mm::shared_ffn<64>>;
  using router = rt::aux_loss_free<2, rt::group_limit<4, 2>, rt::seq_aux_loss<1e-4>>;
  using dispatch = mm::dispatch::all_gather;
  using expert = mm::expert::mlp<mm::expert::swiglu, mm::expert::grouped>;
  using precision = mm::precision::fp8_tensorwise<mm::precision::current>;
  using parallel =
      mm::parallel::mapping<mm::parallel::tp<mm::dynamic>, mm::parallel::cp<mm::dynamic>,
                            mm::parallel::pp<mm::dynamic>, mm::parallel::ep<mm::dynamic>>;
  using model =
      md::decoder<md::layers<3>, md::heads<4>, md::query_groups<2>, md::vocabulary<mm::dynamic>,
                  md::dense_ffn<256>, md::moe_layer_pattern<0, 1, 1>>;
};
static_assert(mm::rules::check<my_model>());

int main(int argc, char** argv) {
  return mm::train::run<my_model>(argc, argv);
}
