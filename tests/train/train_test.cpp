// SPDX-License-Identifier: Apache-2.0
// The byte corpus (split, windows, unigram baseline, errors) and a short training run on the
// shipped sample (tests/data/corpus_sample.txt) whose held-out loss must fall below the unigram
// baseline.
#include <megamoe/config/config.hpp>
#include <megamoe/train/corpus.hpp>
#include <megamoe/train/trainer.hpp>

#include "support/allocation_counter.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mt = megamoe::train;

namespace {

std::filesystem::path sample() {
  return std::filesystem::path(MEGAMOE_TEST_DATA) / "corpus_sample.txt";
}

TEST(ByteCorpus, HoldsOutTheLastBytesAndCutsWindows) {
  std::vector<std::uint8_t> bytes(200);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i % 7 + 97);
  mt::byte_corpus const corpus(bytes, 0.05);
  EXPECT_EQ(corpus.training().size(), 190u);
  EXPECT_EQ(corpus.heldout().size(), 10u);
  EXPECT_EQ(corpus.heldout()[0], bytes[190]);
  int const S = 4, B = 3;
  std::vector<std::int32_t> tokens(S * B), targets(S * B);
  corpus.training_batch(7, 2, 0, S, B, tokens, targets);
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s) {
      auto const t = static_cast<std::size_t>(s * B + b);
      EXPECT_EQ(targets[t], (tokens[t] - 97 + 1) % 7 + 97) << "the target is the next byte";
    }
  // The same sequence whichever micro-batch holds it.
  std::vector<std::int32_t> one(S), next(S);
  corpus.training_batch(7, 2, 2, S, 1, one, next);
  for (int s = 0; s < S; ++s)
    EXPECT_EQ(one[static_cast<std::size_t>(s)], tokens[static_cast<std::size_t>(s * B + 2)]);
  EXPECT_EQ(corpus.heldout_windows(3), 3);
}

TEST(ByteCorpus, UnigramBaselineIsTheSmoothedCrossEntropy) {
  std::vector<std::uint8_t> bytes{'a', 'a', 'b', 'a', 'c', 'a', 'a', 'b', 'a', 'b'};
  mt::byte_corpus const corpus(bytes, 0.2);  // train: aabacaab, held out: ab
  double const total = 8 + 256;
  double const expected = -(std::log2((5 + 1) / total) + std::log2((2 + 1) / total)) / 2;
  EXPECT_NEAR(corpus.unigram_bits_per_byte(), expected, 1e-12);
}

// Over windows: exactly the held-out bytes the windows predict (bytes 1 .. windows*S), never the
// first held-out byte, which no window predicts.
TEST(ByteCorpus, WindowedUnigramBaselineCoversThePredictedBytes) {
  std::vector<std::uint8_t> bytes(20, 'a');
  for (auto b : {'a', 'b', 'c', 'b', 'b', 'a'}) bytes.push_back(static_cast<std::uint8_t>(b));
  mt::byte_corpus const corpus(bytes, 6.0 / 26.0);  // held out: a b c b b a
  ASSERT_EQ(corpus.heldout().size(), 6u);
  double const total = 20 + 256;
  auto bits = [&](double count) { return -std::log2((count + 1) / total); };
  EXPECT_EQ(corpus.heldout_windows(2), 2);  // windows [a b c] and [c b b]: predicts b c b b
  EXPECT_NEAR(corpus.unigram_bits_per_byte(2, 2), bits(0), 1e-12);
  EXPECT_NEAR(corpus.unigram_bits_per_byte(2, 1), bits(0), 1e-12);
  EXPECT_NEAR(corpus.unigram_bits_per_byte(2, 9), bits(0), 1e-12);  // at most every window
  EXPECT_EQ(corpus.heldout_windows(5), 1);                          // predicts b c b b a
  EXPECT_NEAR(corpus.unigram_bits_per_byte(5, 1), (4 * bits(0) + bits(20)) / 5, 1e-12);
  EXPECT_NEAR(corpus.unigram_bits_per_byte(), (4 * bits(0) + 2 * bits(20)) / 6, 1e-12);
  EXPECT_THROW((void)corpus.unigram_bits_per_byte(2, 0), mm::input_error);
}

TEST(ByteCorpus, MissingEmptyOrTooSmallCorporaAreErrors) {
  EXPECT_THROW(mt::byte_corpus::load("/nonexistent/corpus.txt"), mm::input_error);
  auto const empty = std::filesystem::temp_directory_path() / "megamoe_empty_corpus.txt";
  std::ofstream(empty).close();
  EXPECT_THROW(mt::byte_corpus::load(empty), mm::input_error);
  std::filesystem::remove(empty);
  mt::byte_corpus const tiny(std::vector<std::uint8_t>(40, 'x'), 0.05);
  EXPECT_THROW(tiny.require_windows(16), mm::input_error);
  auto const corpus = mt::byte_corpus::load(sample());
  EXPECT_EQ(corpus.training().size() + corpus.heldout().size(), 60000u);
}

namespace rt = mm::router;
namespace md = mm::model;
using tiny_moe = mm::make_config<mm::shape<mm::hidden<32>, mm::ffn<48>, mm::experts<4>>,
                                 rt::top_k<2, rt::aux_loss<1e-2>>, mm::dispatch::local,
                                 mm::expert::mlp<mm::expert::swiglu>, mm::precision::fp32,
                                 md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<256>,
                                             md::dense_ffn<64>, md::moe_layer_freq<2>>>;

/// MoE layer, then a dense layer; small initial weights.
mm::transformer<tiny_moe> two_layer_model() {
  mm::transformer<tiny_moe> model;
  model.initialize(1, 0.05);
  return model;
}

TEST(Training, HeldOutLossFallsBelowTheUnigramBaselineOnTheSample) {
  auto const corpus = mt::byte_corpus::load(sample());
  auto model = two_layer_model();
  mt::train_settings settings;
  settings.seq_length = 32;
  settings.micro_batch = 8;
  settings.micro_batches = 2;
  settings.steps = 150;
  settings.schedule = {3e-3, 3e-4, 8, settings.steps};
  mt::trainer<tiny_moe> trainer(model, corpus, settings);
  mm::context ctx(2);
  double const before = trainer.heldout_bits_per_byte(ctx, 32);
  mt::step_metrics last;
  for (int i = 0; i < settings.steps; ++i) last = trainer.step(ctx);
  double const after = trainer.heldout_bits_per_byte(ctx, 32);
  double const unigram = corpus.unigram_bits_per_byte();
  EXPECT_FALSE(last.skipped);
  EXPECT_EQ(last.expert_load.size(), 1u);
  double load = 0.0;
  for (double v : last.expert_load[0]) load += v;
  EXPECT_EQ(load, 2.0 * settings.seq_length * settings.micro_batch * settings.micro_batches);
  EXPECT_LT(after, before);
  EXPECT_LT(after, unigram) << "held-out " << after << " bits per byte vs unigram " << unigram;
  std::cout << "held-out bits per byte: " << before << " before, " << after << " after "
            << settings.steps << " steps; unigram " << unigram << "\n";
}

TEST(Training, ANonFiniteGradientSkipsTheStepOrStops) {
  auto const corpus = mt::byte_corpus::load(sample());
  auto model = two_layer_model();
  mt::train_settings settings;
  settings.seq_length = 16;
  settings.micro_batch = 4;
  settings.steps = 2;
  mt::trainer<tiny_moe> trainer(model, corpus, settings);
  mm::context ctx(2);
  model.for_each_parameter([](std::string_view name, auto value, auto, mm::parameter_kind) {
    if (name == "decoder.layers.1.mlp.linear_fc2.weight")
      value(0, 0) = std::numeric_limits<float>::quiet_NaN();
  });
  mm::row_matrix<float> before;
  model.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    if (name == "output_layer.weight") before = value;
  });
  auto const m = trainer.step(ctx);
  EXPECT_TRUE(m.skipped);
  EXPECT_FALSE(m.nonfinite_at.empty());
  model.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    if (name == "output_layer.weight") {
      EXPECT_EQ(mm::row_matrix<float>(value), before);
    }
  });
  settings.stop_on_nonfinite = true;
  mt::trainer<tiny_moe> strict(model, corpus, settings);
  EXPECT_THROW(strict.step(ctx), mm::input_error);
}

// After the first steps have grown every buffer, a step on one rank allocates nothing: forward,
// backward, loss, clipping, the optimizer and the metrics included; and the bytes held stay the
// same.
TEST(Training, AStepAfterTheFirstAllocatesNothing) {
  auto const corpus = mt::byte_corpus::load(sample());
  auto model = two_layer_model();
  mt::train_settings settings;
  settings.seq_length = 32;
  settings.micro_batch = 4;
  settings.micro_batches = 2;
  settings.steps = 10;
  settings.schedule = {3e-3, 3e-4, 2, settings.steps};
  settings.optimizer.clip_grad = 1e-3;  // every step clips
  mt::trainer<tiny_moe> trainer(model, corpus, settings);
  mm::context ctx(2);
  trainer.step(ctx);
  trainer.step(ctx);
  std::vector<std::uint64_t> calls;
  calls.reserve(3);
  auto const start = mm::testing::allocations();
  for (int i = 0; i < 3; ++i) {
    auto const before = mm::testing::allocations().calls;
    auto const& m = trainer.step(ctx);
    calls.push_back(mm::testing::allocations().calls - before);
    EXPECT_LT(m.clip_factor, 1.0);
    EXPECT_FALSE(m.skipped);
  }
  EXPECT_EQ(calls, (std::vector<std::uint64_t>{0, 0, 0}));
  EXPECT_EQ(mm::testing::allocations().live_bytes, start.live_bytes);
}

}  // namespace
