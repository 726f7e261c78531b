// SPDX-License-Identifier: Apache-2.0
// The training job's token data (micro-batches, the end-of-document mask, the unigram baseline,
// errors) and a short training run on the shipped sample (tests/data/corpus_sample.txt) whose
// held-out loss must fall below the unigram baseline.
#include <megamoe/config/config.hpp>
#include <megamoe/train/job_options.hpp>
#include <megamoe/train/trainer.hpp>

#include "support/allocation_counter.hpp"
#include "support/sample_data.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mt = megamoe::train;

namespace {

using mm::testing::sample_data;

// A micro-batch is the train split's samples in order: position t = s B + b holds token s of
// sample first + b, its target token s + 1.
TEST(TokenData, AMicroBatchIsTheTrainSamplesInOrder) {
  auto const data = sample_data(16);
  int const S = 16, B = 3;
  std::vector<std::int32_t> tokens(S * B), targets(S * B);
  data.training_batch(5, S, B, tokens, targets);
  for (int b = 0; b < B; ++b) {
    auto const text = data.train().sample(5 + b).text;
    ASSERT_EQ(text.size(), static_cast<std::size_t>(S + 1));
    for (int s = 0; s < S; ++s) {
      auto const t = static_cast<std::size_t>(s * B + b);
      EXPECT_EQ(tokens[t], text[static_cast<std::size_t>(s)]);
      EXPECT_EQ(targets[t], text[static_cast<std::size_t>(s) + 1]);
    }
  }
  EXPECT_THROW(data.training_batch(0, S + 1, 1, tokens, targets), mm::input_error);
}

// --eod-mask-loss: no loss on the token after an end of document (the input is the end), as
// GPTDataset's loss mask; the end of a document is no byte of the text.
TEST(TokenData, EodMaskLossIgnoresTheTargetAfterAnEndOfDocument) {
  int const S = 64;
  auto const plain = sample_data(S, {.append_eod = true});
  auto const masked = sample_data(S, {.append_eod = true, .eod_mask_loss = true});
  std::vector<std::int32_t> tokens(S), targets(S), masked_targets(S);
  int ends = 0, ignored = 0;
  std::int64_t bytes = 0;
  for (int i = 0; i < 40; ++i) {
    plain.training_batch(i, S, 1, tokens, targets);
    masked.training_batch(i, S, 1, tokens, masked_targets);
    for (int s = 0; s < S; ++s) {
      auto const t = static_cast<std::size_t>(s);
      ends += tokens[t] == 256;
      EXPECT_NE(targets[t], mt::ignored_token);
      if (masked_targets[t] == mt::ignored_token) {
        ++ignored;
        EXPECT_EQ(tokens[t], 256);
      } else {
        EXPECT_EQ(masked_targets[t], targets[t]);
      }
      bytes += targets[t] != 256;
    }
    EXPECT_EQ(masked.target_bytes(masked_targets, 1, 0),
              std::count_if(masked_targets.begin(), masked_targets.end(),
                            [](std::int32_t id) { return id != 256 && id != mt::ignored_token; }));
  }
  EXPECT_GT(ends, 4);
  EXPECT_EQ(ignored, ends);
  EXPECT_NEAR(plain.bytes_per_token(40), static_cast<double>(bytes) / (40.0 * S), 1e-12);
}

// The unigram baseline against the same sums written out: add-one frequencies of the first train
// samples' targets over the 257 ids, the cross-entropy of the valid samples' targets per byte.
TEST(TokenData, UnigramBaselineIsTheSmoothedCrossEntropyPerByte) {
  int const S = 32;
  auto const data = sample_data(S, {.append_eod = true});
  std::vector<double> counts(257, 1.0);
  double total = 257;
  std::vector<std::int32_t> tokens(S), targets(S);
  for (int i = 0; i < 50; ++i) {
    data.training_batch(i, S, 1, tokens, targets);
    for (auto id : targets) counts[static_cast<std::size_t>(id)] += 1, total += 1;
  }
  double nats = 0;
  double bytes = 0;
  for (int i = 3; i < 3 + 20; ++i) {
    data.valid_sample(i, 1, 0, tokens, targets);
    for (auto id : targets) {
      nats -= std::log(counts[static_cast<std::size_t>(id)] / total);
      bytes += id != 256;
    }
  }
  EXPECT_NEAR(data.unigram_bits_per_byte(3, 20, 50), nats / std::log(2.0) / bytes, 1e-9);
}

TEST(TokenData, DataThatCannotServeTheRunIsAnError) {
  // A sequence longer than the train split's tokens.
  EXPECT_THROW(sample_data(100000, {.train_samples = 1, .valid_samples = 1}), mm::input_error);
  // A split that leaves the train part no documents.
  EXPECT_THROW(sample_data(16, {.split = "0, 100, 0"}), mm::input_error);
  // Tokens beyond the tokenizer's vocabulary (byte data read as ids of a vocabulary of 100).
  std::string folder = (std::filesystem::temp_directory_path() / "megamoe_vocab_XXXXXX").string();
  ASSERT_NE(::mkdtemp(folder.data()), nullptr);
  mm::data::preprocess_options p;
  p.inputs = {mm::testing::corpus_sample()};
  p.format = mm::data::text_format::text;
  p.output_prefix = std::filesystem::path(folder) / "sample";
  auto const report = mm::data::preprocess(mm::data::byte_tokenizer{}, p);
  mt::data_options d;
  d.data_path = {report.prefixes.front().string()};
  EXPECT_THROW(mt::token_data(d, mm::data::null_tokenizer(100), 16, 1, {64, 8, 0}),
               mm::input_error);
  EXPECT_NO_THROW(mt::token_data(d, mm::data::byte_tokenizer{}, 16, 1, {64, 8, 0}));
  // No data, or both kinds of paths.
  EXPECT_THROW(mt::token_data(mt::data_options{}, mm::data::byte_tokenizer{}, 16, 1, {64, 8, 0}),
               mm::input_error);
  d.split_path[0] = d.data_path;
  EXPECT_THROW(mt::token_data(d, mm::data::byte_tokenizer{}, 16, 1, {64, 8, 0}), mm::input_error);
  std::filesystem::remove_all(folder);
}

// The job's vocabulary: the tokenizer's where the type leaves it dynamic; a fixed one holding it
// trains (the rest is padding), a smaller one is an error naming both sizes.
TEST(JobValues, TheVocabularyIsTheTokenizersOrHoldsIt) {
  mt::job_options o;
  mm::parallel::degrees const d{};
  auto const dynamic = mt::job_values(d, 1, o, mm::dynamic, 50257);
  EXPECT_EQ(dynamic.vocabulary, 50257);
  EXPECT_FALSE(dynamic.vocab_multiple.has_value());
  EXPECT_FALSE(mt::job_values(d, 1, o, 300, 257).vocabulary.has_value());
  try {
    (void)mt::job_values(d, 1, o, 256, 257);
    ADD_FAILURE() << "a vocabulary of 256 took a tokenizer of 257";
  } catch (mm::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary of 256 is smaller than the tokenizer's 257"),
              std::string::npos)
        << e.what();
  }
  o.vocab_multiple = 64;
  EXPECT_EQ(mt::job_values(d, 1, o, mm::dynamic, 257).vocab_multiple, 64);
  o.vocab_multiple = -8;
  EXPECT_THROW((void)mt::job_values(d, 1, o, mm::dynamic, 257), mm::input_error);
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
  auto const corpus = sample_data(32);
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
  double const unigram = corpus.unigram_bits_per_byte(0, 32, 4096);
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
  auto const corpus = sample_data(16);
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
  EXPECT_EQ(m.failed_check, "non-finite loss");
  EXPECT_EQ(m.rerun, mt::rerun_outcome::persistent);
  EXPECT_FALSE(m.fault_at.empty());
  model.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    if (name == "output_layer.weight") {
      EXPECT_EQ(mm::row_matrix<float>(value), before);
    }
  });
  settings.stop_on_failed_check = true;
  mt::trainer<tiny_moe> strict(model, corpus, settings);
  EXPECT_THROW(strict.step(ctx), mm::input_error);
}

// The router's expert bias and global aux loss count tokens across a global batch's forwards: a
// recomputed step must forget the first pass's counts.
using biased_moe =
    mm::make_config<mm::shape<mm::hidden<32>, mm::ffn<48>, mm::experts<4>>,
                    rt::top_k<2, rt::sigmoid, rt::expert_bias<>, rt::global_aux_loss<1e-2>>,
                    mm::dispatch::local, mm::expert::mlp<mm::expert::swiglu>, mm::precision::fp32,
                    md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<256>, md::dense_ffn<64>,
                                md::moe_layer_freq<2>>>;

struct checked_run {
  std::vector<mt::step_metrics> steps;
  std::vector<mm::row_matrix<float>> weights;
};
/// `steps` steps of a fresh biased_moe model with `faults` planted; every step's metrics and the
/// final weights.
checked_run run_checked(mt::train_settings settings, mt::planted_faults faults,
                        std::function<void(int, mm::transformer<biased_moe>&)> before_step = {}) {
  auto const corpus = sample_data(16);
  mm::transformer<biased_moe> model;
  model.initialize(3, 0.05);
  settings.seq_length = 16;
  settings.micro_batch = 4;
  settings.micro_batches = 2;
  settings.schedule = {3e-3, 3e-4, 2, settings.steps};
  mt::trainer<biased_moe> trainer(model, corpus, settings);
  trainer.plant(faults);
  mm::context ctx(2);
  checked_run out;
  for (int i = 1; i <= settings.steps; ++i) {
    if (before_step) before_step(i, model);
    out.steps.push_back(trainer.step(ctx));
  }
  model.for_each_parameter([&](std::string_view, auto value, auto, mm::parameter_kind) {
    out.weights.emplace_back(value);
  });
  return out;
}

// A bit flipped in one gradient once (the machine's fault): the large-gradient check fails, the
// recomputation differs, and the run goes on with it: every later step and the final weights
// equal the run without the fault, bit for bit (expert bias and global aux counts included).
TEST(Training, AFlippedBitIsRecomputedAsTransient) {
  mt::train_settings settings;
  settings.steps = 8;
  settings.check_large_grads = true;
  auto const clean = run_checked(settings, {});
  auto const flipped = run_checked(settings, {.bit_flip_step = 5});
  for (int i = 0; i < settings.steps; ++i) {
    auto const& m = flipped.steps[static_cast<std::size_t>(i)];
    EXPECT_FALSE(m.skipped) << "step " << i + 1;
    EXPECT_EQ(m.loss, clean.steps[static_cast<std::size_t>(i)].loss) << "step " << i + 1;
    EXPECT_EQ(m.grad_norm, clean.steps[static_cast<std::size_t>(i)].grad_norm);
    EXPECT_TRUE(clean.steps[static_cast<std::size_t>(i)].failed_check.empty());
    if (i + 1 != 5) {
      EXPECT_TRUE(m.failed_check.empty()) << "step " << i + 1;
    }
  }
  auto const& hit = flipped.steps[4];
  EXPECT_TRUE(hit.failed_check == "large gradient" || hit.failed_check == "non-finite gradient")
      << hit.failed_check;
  EXPECT_EQ(hit.rerun, mt::rerun_outcome::transient);
  EXPECT_GT(hit.first_grad_norm, 1e10 * hit.grad_norm);
  EXPECT_EQ(hit.fault_at, "embedding.word_embeddings.weight");
  EXPECT_EQ(hit.fault_rank, 0);
  EXPECT_EQ(flipped.weights, clean.weights);
  // Without recomputation the step is skipped, and the weights part.
  settings.recompute_failed_steps = false;
  auto const skipped = run_checked(settings, {.bit_flip_step = 5});
  EXPECT_TRUE(skipped.steps[4].skipped);
  EXPECT_EQ(skipped.steps[4].rerun, mt::rerun_outcome::none);
  EXPECT_NE(skipped.weights, clean.weights);
}

// A NaN written on every pass (the model's fault) repeats in the recomputation: persistent, the
// step skipped with the tensor named, or the job stopped.
TEST(Training, ANaNThatRecursIsPersistent) {
  mt::train_settings settings;
  settings.steps = 4;
  auto const clean = run_checked(settings, {});
  auto const run = run_checked(settings, {.nan_step = 3});
  auto const& hit = run.steps[2];
  EXPECT_EQ(hit.failed_check, "non-finite gradient");
  EXPECT_EQ(hit.rerun, mt::rerun_outcome::persistent);
  EXPECT_TRUE(hit.skipped);
  EXPECT_TRUE(std::isnan(hit.first_grad_norm));
  EXPECT_EQ(hit.fault_at, "embedding.word_embeddings.weight");
  EXPECT_EQ(hit.loss, clean.steps[2].loss);  // the forward is untouched
  EXPECT_FALSE(run.steps[3].skipped);
  settings.stop_on_failed_check = true;
  try {
    (void)run_checked(settings, {.nan_step = 2});
    ADD_FAILURE() << "no error";
  } catch (mm::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite gradient at step 2 (persistent), in "
                                         "embedding.word_embeddings.weight on rank 0"),
              std::string::npos)
        << e.what();
  }
}

// A loss far above the recent ones (the output layer scaled up before step 5) fails the spiky-loss
// check; the recomputation repeats it, so the step is skipped and the weights stay.
TEST(Training, ASpikyLossThatRecursIsSkipped) {
  mt::train_settings settings;
  settings.steps = 5;
  settings.check_spiky_loss = true;
  settings.spike_factor = 3.0;
  std::vector<mm::row_matrix<float>> before;
  auto const run = run_checked(settings, {}, [&](int step, mm::transformer<biased_moe>& model) {
    if (step != 5) return;
    model.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
      if (name == "output_layer.weight") value *= 400.0F;
      before.emplace_back(value);
    });
  });
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(run.steps[static_cast<std::size_t>(i)].failed_check.empty());
  auto const& hit = run.steps[4];
  EXPECT_EQ(hit.failed_check, "spiky loss");
  EXPECT_EQ(hit.rerun, mt::rerun_outcome::persistent);
  EXPECT_TRUE(hit.skipped);
  EXPECT_GT(hit.loss, 3.0 * run.steps[0].loss);
  EXPECT_EQ(run.weights, before);
}

// After the first steps have grown every buffer, a step on one rank allocates nothing: forward,
// backward, loss, clipping, the optimizer and the metrics included; and the bytes held stay the
// same.
TEST(Training, AStepAfterTheFirstAllocatesNothing) {
  auto const corpus = sample_data(32);
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
