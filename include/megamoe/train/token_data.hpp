// SPDX-License-Identifier: Apache-2.0
// megamoe/train/token_data.hpp — what a training job reads: Megatron's train and valid splits
// (data/dataset_builder.hpp) of tokenized `.bin/.idx` datasets and the tokenizer that made them,
// as micro-batches of tokens and targets.
//
// Sample i of a split holds seq_length + 1 tokens; its tokens are the first S and its targets
// the last S, as GPTDataset makes them: a target is ignored where the label is the pad id, and
// with --eod-mask-loss where the input token is the end of a document. The trainer consumes
// train samples as Megatron's pretraining sampler does (train/trainer.hpp).
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/data/dataset_builder.hpp>
#include <megamoe/data/tokenizer.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace megamoe::train {

/// Megatron's data flags.
struct data_options {
  std::vector<std::string> data_path{};                  // --data-path: prefixes, or weight prefix
  std::array<std::vector<std::string>, 3> split_path{};  // --train-/--valid-/--test-data-path
  std::string split = "969, 30, 1";                      // --split (with --data-path)
  std::string cache{};                                   // --data-cache-path ("": none)
  double mid_level_surplus = 0.005;                      // --mid-level-dataset-surplus
  bool eod_mask_loss = false;                            // --eod-mask-loss
  data::tokenizer_options tokenizer{};                   // --tokenizer-type and its files
};

/// The builder's options for samples of `seq_length` + 1 tokens shuffled by `seed`. Throws
/// input_error for blends that do not parse, and for no data or both kinds of paths.
MEGAMOE_DECL data::dataset_builder_options builder_options(data_options const& o, int seq_length,
                                                           std::uint32_t seed);

/// One target the loss counts or ignores (model/lm_head.hpp's ignored_target).
inline constexpr std::int32_t ignored_token = -1;

/// The UTF-8 bytes of the text `ids` decode to (the byte tokenizer's: its bytes; the end of a
/// document none).
MEGAMOE_DECL std::int64_t text_bytes(data::tokenizer const& t, std::span<std::int64_t const> ids);

class token_data {
 public:
  /// Builds the train and valid splits for `samples` (train, valid, test: Megatron's requested
  /// sizes, data::requested_samples). Throws input_error for data that does not open or build, a
  /// train split that cannot fill `samples[0]` samples or has none, and a token outside the
  /// tokenizer's vocabulary in the first samples.
  token_data(data_options const& options, data::tokenizer tokenizer, int seq_length,
             std::uint32_t seed, data::split_sizes const& samples);

  [[nodiscard]] int seq_length() const noexcept { return seq_length_; }
  [[nodiscard]] data::tokenizer const& tokenizer() const noexcept { return tokenizer_; }
  [[nodiscard]] std::int64_t vocab_size() const { return data::vocab_size(tokenizer_); }
  /// The tokenizer's end-of-document id; -1 where it names none.
  [[nodiscard]] std::int64_t end_of_document() const noexcept { return eod_; }
  [[nodiscard]] data::split_dataset const& train() const noexcept { return *train_; }
  [[nodiscard]] bool has_valid() const noexcept { return valid_.has_value(); }
  /// Throws input_error when the split is not built (--split gives it no documents).
  [[nodiscard]] data::split_dataset const& valid() const;

  /// Train samples [first, first + batch) as a micro-batch: tokens and targets [S * batch],
  /// position t = s * batch + b. `seq` must be the data's sequence length.
  void training_batch(std::int64_t first, int seq, int batch, std::span<std::int32_t> tokens,
                      std::span<std::int32_t> targets) const;
  /// Valid sample `index` (modulo the split's size) as sequence b of a micro-batch of `batch`.
  void valid_sample(std::int64_t index, int batch, int b, std::span<std::int32_t> tokens,
                    std::span<std::int32_t> targets) const;
  /// The UTF-8 bytes of the text of sequence b's counted targets (those not ignored; the end of a
  /// document and the pad hold no text).
  [[nodiscard]] std::int64_t target_bytes(std::span<std::int32_t const> targets, int batch,
                                          int b) const;

  /// The UTF-8 bytes per counted target of the first `samples` train samples.
  [[nodiscard]] double bytes_per_token(std::int64_t samples) const;

  /// Nats of the counted targets of valid samples [first, first + count) under the train split's
  /// token frequencies with add-one smoothing over the vocabulary (the frequencies of the first
  /// `train_samples` train samples), and their UTF-8 bytes: a unigram baseline in bits per byte.
  [[nodiscard]] double unigram_bits_per_byte(std::int64_t first, std::int64_t count,
                                             std::int64_t train_samples) const;

 private:
  void fill(data::split_dataset const& split, std::int64_t index, int batch, int b,
            std::span<std::int32_t> tokens, std::span<std::int32_t> targets) const;

  data::tokenizer tokenizer_;
  int seq_length_ = 0;
  std::int64_t eod_ = -1, pad_ = -1, vocabulary_ = 0;  // eod_ -1: the tokenizer names none
  bool eod_mask_loss_ = false;
  std::optional<data::split_dataset> train_, valid_;
  // Buffers kept between samples, so that a step allocates nothing: a token_data serves one
  // thread at a time.
  mutable data::gpt_sample sample_;
  mutable std::vector<std::int64_t> ids_;
};

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/token_data.ipp>
#endif
