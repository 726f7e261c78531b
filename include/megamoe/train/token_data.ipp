// SPDX-License-Identifier: Apache-2.0
// megamoe/train/token_data.ipp — the definitions behind token_data.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/token_data.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>
#include <variant>

namespace megamoe::train {

MEGAMOE_DECL data::dataset_builder_options builder_options(data_options const& o, int seq_length,
                                                           std::uint32_t seed) {
  data::dataset_builder_options b;
  bool const per_split =
      std::ranges::any_of(o.split_path, [](auto const& p) { return !p.empty(); });
  if (o.data_path.empty() && !per_split)
    throw input_error("data: give --data-path, or --train-data-path and its valid and test paths");
  if (!o.data_path.empty() && per_split)
    throw input_error(
        "data: give --data-path or the per-split paths (--train-data-path ...), not "
        "both");
  if (!o.data_path.empty()) b.data = data::parse_blend(o.data_path);
  for (auto const split : data::split_kinds) {
    auto const& words = o.split_path[static_cast<std::size_t>(split)];
    if (!words.empty()) b.per_split[static_cast<std::size_t>(split)] = data::parse_blend(words);
  }
  if (per_split && !b.per_split[0])
    throw input_error("data: --valid-data-path and --test-data-path need --train-data-path");
  b.split = o.split;
  b.seq_length = seq_length;
  b.seed = seed;
  b.mid_level_surplus = o.mid_level_surplus;
  if (!o.cache.empty()) b.cache = std::filesystem::path(o.cache);
  return b;
}

MEGAMOE_DECL std::int64_t text_bytes(data::tokenizer const& t, std::span<std::int64_t const> ids) {
  if (auto const* bytes = std::get_if<data::byte_tokenizer>(&t)) {
    return std::ranges::count_if(ids, [&](std::int64_t id) { return id != bytes->eod(); });
  }
  return static_cast<std::int64_t>(data::decode(t, ids).size());
}

MEGAMOE_DECL token_data::token_data(data_options const& options, data::tokenizer tokenizer,
                                    int seq_length, std::uint32_t seed,
                                    data::split_sizes const& samples)
    : tokenizer_(std::move(tokenizer)),
      seq_length_(seq_length),
      pad_(data::pad(tokenizer_)),
      vocabulary_(data::vocab_size(tokenizer_)),
      eod_mask_loss_(options.eod_mask_loss) {
  if (seq_length < 1) throw input_error("data: the sequence length must be at least 1");
  if (eod_mask_loss_) {
    eod_ = data::eod(tokenizer_);
  } else {
    try {
      eod_ = data::eod(tokenizer_);
    } catch (input_error const&) {
      eod_ = -1;  // a tokenizer without one (needed only by --eod-mask-loss)
    }
  }
  // A sample of S + 1 tokens spans at most S + 1 documents: its buffers never grow in a step.
  sample_.text.reserve(static_cast<std::size_t>(seq_length) + 1);
  sample_.document_ids.reserve(static_cast<std::size_t>(seq_length) + 2);
  auto splits = data::build_datasets(builder_options(options, seq_length, seed), samples);
  if (!splits[0])
    throw input_error("data: no train split (--split " + options.split +
                      " gives the training part no documents)");
  train_ = std::move(splits[0]);
  valid_ = std::move(splits[1]);
  for (auto const& dataset : train_->datasets())
    if (dataset.indices().tokens_per_epoch < std::int64_t{seq_length} + 1)
      throw input_error("data: the train split of " + dataset.dataset().prefix().string() +
                        " holds " + std::to_string(dataset.indices().tokens_per_epoch) +
                        " tokens, too few for one sample of " + std::to_string(seq_length + 1));
  if (samples[0] && train_->size() < *samples[0])
    throw input_error("data: the train split holds " + std::to_string(train_->size()) +
                      " samples of " + std::to_string(seq_length + 1) + " tokens; the run needs " +
                      std::to_string(*samples[0]));
  // Tokens the tokenizer cannot have made: a dataset and a tokenizer that do not belong together.
  auto const check = [&](data::split_dataset const& split, char const* name) {
    auto const n = std::min<std::int64_t>(split.size(), 64);
    for (std::int64_t i = 0; i < n; ++i) {
      split.sample(i, -1, sample_);
      for (auto const id : sample_.text)
        if (id >= vocabulary_ || (id < 0 && id != pad_))
          throw input_error("data: token " + std::to_string(id) + " in " + name + " sample " +
                            std::to_string(i) + " is outside the tokenizer's vocabulary of " +
                            std::to_string(vocabulary_) +
                            " (a dataset made by another tokenizer?)");
    }
  };
  check(*train_, "train");
  if (valid_) check(*valid_, "valid");
}

MEGAMOE_DECL auto token_data::valid() const -> data::split_dataset const& {
  if (!valid_)
    throw input_error("data: no valid split to evaluate on (--split gives it no documents)");
  return *valid_;
}

MEGAMOE_DECL void token_data::fill(data::split_dataset const& split, std::int64_t index, int batch,
                                   int b, std::span<std::int32_t> tokens,
                                   std::span<std::int32_t> targets) const {
  split.sample(index, -1, sample_);
  auto const& text = sample_.text;
  auto const S = static_cast<std::size_t>(seq_length_);
  char const* name = &split == &*train_ ? "train" : "valid";
  if (text.size() != S + 1)
    throw input_error(std::string("data: ") + name + " sample " + std::to_string(index) +
                      " holds " + std::to_string(text.size()) + " tokens, not " +
                      std::to_string(S + 1));
  for (std::size_t s = 0; s < S; ++s) {
    auto const t = s * static_cast<std::size_t>(batch) + static_cast<std::size_t>(b);
    auto const token = text[s], label = text[s + 1];
    if (token >= vocabulary_ || label >= vocabulary_)
      throw input_error("data: token " + std::to_string(std::max(token, label)) + " of " + name +
                        " sample " + std::to_string(index) +
                        " is outside the tokenizer's vocabulary of " + std::to_string(vocabulary_));
    // GPTDataset's masks, then its pads as id 0.
    bool const ignored = label == pad_ || label < 0 || (eod_mask_loss_ && token == eod_);
    tokens[t] = token < 0 || token == pad_ ? 0 : static_cast<std::int32_t>(token);
    targets[t] = ignored ? ignored_token : static_cast<std::int32_t>(label);
  }
}

MEGAMOE_DECL void token_data::training_batch(std::int64_t first, int seq, int batch,
                                             std::span<std::int32_t> tokens,
                                             std::span<std::int32_t> targets) const {
  if (seq != seq_length_)
    throw input_error("data: samples of " + std::to_string(seq_length_) + " tokens, not " +
                      std::to_string(seq));
  for (int b = 0; b < batch; ++b) fill(*train_, first + b, batch, b, tokens, targets);
}

MEGAMOE_DECL void token_data::valid_sample(std::int64_t index, int batch, int b,
                                           std::span<std::int32_t> tokens,
                                           std::span<std::int32_t> targets) const {
  auto const& split = valid();
  fill(split, index % split.size(), batch, b, tokens, targets);
}

MEGAMOE_DECL std::int64_t token_data::target_bytes(std::span<std::int32_t const> targets, int batch,
                                                   int b) const {
  ids_.clear();
  for (std::size_t t = static_cast<std::size_t>(b); t < targets.size();
       t += static_cast<std::size_t>(batch))
    if (targets[t] != ignored_token && targets[t] != eod_ && targets[t] != pad_)
      ids_.push_back(targets[t]);
  return text_bytes(tokenizer_, ids_);
}

MEGAMOE_DECL double token_data::bytes_per_token(std::int64_t samples) const {
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(seq_length_)), targets(tokens.size());
  double counted = 0.0, bytes = 0.0;
  for (std::int64_t i = 0; i < std::clamp<std::int64_t>(samples, 1, train_->size()); ++i) {
    fill(*train_, i, 1, 0, tokens, targets);
    counted += static_cast<double>(
        std::ranges::count_if(targets, [](std::int32_t id) { return id != ignored_token; }));
    bytes += static_cast<double>(target_bytes(targets, 1, 0));
  }
  return counted > 0.0 && bytes > 0.0 ? bytes / counted : 1.0;
}

MEGAMOE_DECL double token_data::unigram_bits_per_byte(std::int64_t first, std::int64_t count,
                                                      std::int64_t train_samples) const {
  int const S = seq_length_;
  std::vector<double> counts(static_cast<std::size_t>(vocabulary_), 1.0);
  double total = static_cast<double>(vocabulary_);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(S)), targets(tokens.size());
  auto const n = std::clamp<std::int64_t>(train_samples, 1, train_->size());
  for (std::int64_t i = 0; i < n; ++i) {
    fill(*train_, i, 1, 0, tokens, targets);
    for (auto const id : targets)
      if (id != ignored_token) {
        counts[static_cast<std::size_t>(id)] += 1.0;
        total += 1.0;
      }
  }
  double nats = 0.0;
  std::int64_t bytes = 0;
  for (std::int64_t i = 0; i < std::max<std::int64_t>(count, 1); ++i) {
    valid_sample(first + i, 1, 0, tokens, targets);
    for (auto const id : targets)
      if (id != ignored_token) nats -= std::log(counts[static_cast<std::size_t>(id)] / total);
    bytes += target_bytes(targets, 1, 0);
  }
  return nats / std::numbers::ln2 / static_cast<double>(std::max<std::int64_t>(bytes, 1));
}

}  // namespace megamoe::train
