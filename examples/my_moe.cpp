// SPDX-License-Identifier: Apache-2.0
// my-moe — megamoe in your own project: compose a configuration type, check it at compile time,
// print what it means, and train a model built on it for a few steps.
//
//   ./build/examples/my-moe [TEXT [STEPS]]     # default tests/data/corpus_sample.txt, 20 steps
//   mpiexec -n 2 ./build/examples/my-moe tests/data/corpus_sample.txt   # EP 2
// (A program with flags of its own, all of megamoe-train's among them, is train::run's: see
// my_model.cpp.)
#include <megamoe/config/config.hpp>
#include <megamoe/config/describe.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/train/job_options.hpp>
#include <megamoe/train/trainer.hpp>

#include <iostream>
#include <sstream>
#include <string>

namespace mm = megamoe;
namespace rt = megamoe::router;

// One type holds every choice. Swap a policy and the compiler re-checks the rules.
using my_moe = mm::make_config<
    mm::shape<mm::hidden<64>, mm::ffn<96>, mm::experts<8>, mm::shared_ffn<64>>,
    rt::top_k<2, rt::softmax_before_topk, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>,   // router
    mm::dispatch::all_to_all,                                                      // dispatcher
    mm::expert::mlp<mm::expert::swiglu, mm::expert::grouped,                       // experts and
                    mm::expert::shared_expert_gate>,                               // GEMM backend
    mm::precision::fp32,                                                           // recipe
    mm::parallel::mapping<mm::parallel::etp<1>, mm::parallel::ep<mm::dynamic>>,    // mapping
    mm::memory::recompute<mm::memory::moe_act>,                                    // memory
    mm::model::decoder<mm::model::layers<2>, mm::model::heads<4>,                  // the model:
                       mm::model::vocabulary<mm::dynamic>,                         // MoE, then
                       mm::model::dense_ffn<128>, mm::model::moe_layer_freq<2>>>;  // dense

// Compile-time checks: every configuration rule, and anything else your project relies on.
static_assert(mm::rules::check<my_moe>());
static_assert(mm::values_of<my_moe>().router->top_k == 2);
static_assert(mm::values_of<my_moe>().shape.experts % 2 == 0, "EP 2 must divide the experts");

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    std::string const data = argc > 1 ? argv[1] : "tests/data/corpus_sample.txt";
    int steps = 20;
    mm::parallel::check_on_every_rank(env.world(), [&] {
      if (argc > 2 && !(std::istringstream(argv[2]) >> steps && steps > 0))
        throw mm::input_error(std::string("my-moe: STEPS must be a positive count, not ") +
                              argv[2]);
    });
    bool const root = env.world().rank() == 0;
    if (root) std::cout << mm::describe<my_moe>().text << "\n";

    // The text, tokenized by bytes into my-moe-out/data/, split and sampled as Megatron's
    // builder does; the vocabulary (dynamic in the type) is the tokenizer's.
    mm::train::job_options o;
    o.data = data;
    o.out = "my-moe-out";
    o.steps = steps;
    o.seq_len = 32;
    o.eval_iters = 4;
    o.eval_interval = steps;
    int const global_batch = 8 * env.world().size();
    auto const corpus = mm::train::job_data(env.world(), o, global_batch);
    mm::parallel::process_groups const groups(env.world(), {.ep = env.world().size()});
    mm::transformer<my_moe> model(groups, {.vocabulary = static_cast<int>(corpus.vocab_size())});
    model.initialize(7, 0.05);
    megamoe::train::train_settings settings;
    settings.seq_length = 32;
    settings.micro_batch = 8;
    settings.steps = steps;
    settings.schedule = {3e-3, 3e-4, 2, steps};
    megamoe::train::trainer<my_moe> trainer(groups, model, corpus, settings);
    mm::context ctx(env.num_threads());
    for (int i = 0; i < steps; ++i) {
      auto const& m = trainer.step(ctx);
      if (root && (m.step % 5 == 0 || m.step == steps))
        std::cout << "step " << m.step << ": loss " << m.loss << " nats/token\n";
    }
    auto const valid = trainer.evaluate(ctx, 0, 4 * global_batch);
    if (root)
      std::cout << "held-out " << valid.bits_per_byte() << " bits/byte, perplexity "
                << valid.perplexity() << " (unigram "
                << corpus.unigram_bits_per_byte(0, 4 * global_batch, steps * global_batch) << ")\n";
    return 0;
  });
}
