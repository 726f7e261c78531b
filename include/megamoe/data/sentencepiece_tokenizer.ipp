// SPDX-License-Identifier: Apache-2.0
// megamoe/data/sentencepiece_tokenizer.ipp — the definitions behind sentencepiece_tokenizer.hpp
// (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp). Needs
// libsentencepiece.
#pragma once

#include <megamoe/data/sentencepiece_tokenizer.hpp>

#include <sentencepiece_processor.h>

namespace megamoe::data {

MEGAMOE_DECL sentencepiece_tokenizer::sentencepiece_tokenizer(std::filesystem::path const& model) {
  auto processor = std::make_shared<sentencepiece::SentencePieceProcessor>();
  if (!std::filesystem::is_regular_file(model))
    throw input_error("SentencePiece tokenizer: no model file " + model.string());
  if (auto const status = processor->Load(model.string()); !status.ok())
    throw input_error("SentencePiece tokenizer: " + model.string() + " does not load (" +
                      status.ToString() + ")");
  processor_ = std::move(processor);
}

MEGAMOE_DECL std::vector<std::int64_t> sentencepiece_tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  if (auto const status = processor_->Encode(text, &ids); !status.ok())
    throw input_error("SentencePiece tokenizer: " + status.ToString());
  return {ids.begin(), ids.end()};
}

MEGAMOE_DECL std::string sentencepiece_tokenizer::decode(std::span<std::int64_t const> ids) const {
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (auto const id : ids) {
    if (id < 0 || id >= vocab_size())
      throw input_error("SentencePiece tokenizer: id " + std::to_string(id) +
                        " is not in the vocabulary of " + std::to_string(vocab_size()));
    narrow.push_back(static_cast<int>(id));
  }
  std::string text;
  if (auto const status = processor_->Decode(narrow, &text); !status.ok())
    throw input_error("SentencePiece tokenizer: " + status.ToString());
  return text;
}

MEGAMOE_DECL std::int64_t sentencepiece_tokenizer::vocab_size() const {
  return processor_->GetPieceSize();
}

MEGAMOE_DECL std::int64_t sentencepiece_tokenizer::eod() const {
  auto const eos = processor_->eos_id();
  if (eos < 0) throw input_error("SentencePiece tokenizer: the model has no eos piece");
  return eos;
}

MEGAMOE_DECL std::int64_t sentencepiece_tokenizer::pad() const { return processor_->pad_id(); }

}  // namespace megamoe::data
