// SPDX-License-Identifier: Apache-2.0
// megamoe/data/bpe_tokenizer.hpp — byte-level BPE, as GPT-2 and Hugging Face's byte-level
// tokenizers encode: added tokens split out of the text first, each remaining part normalised and
// cut into pieces by the pre-tokenizers' regular expressions, each piece's UTF-8 bytes mapped to
// GPT-2's printable characters, and the piece's symbols merged pair by pair, lowest-ranked pair
// first, until no ranked pair is left.
//
// Loads OpenAI's GPT-2 files as they are (`--vocab-file` encoder.json / vocab.json, `--merge-file`
// vocab.bpe / merges.txt, as Megatron's GPT2BPETokenizer) and a Hugging Face `tokenizer.json` whose
// model is a byte-level BPE (`--tokenizer-model`, as Megatron's HuggingFaceTokenizer): its
// normalizer (NFC, NFD, NFKC, NFKD), pre-tokenizers (ByteLevel, Split, Digits), added and special
// tokens and post-processor (TemplateProcessing). The regular expressions run on ICU's engine,
// which has the lookahead GPT-2's pattern needs; `\s` is read as Unicode's White_Space, as the
// reference's engines read it.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe::data {

class bpe_tokenizer {
 public:
  /// GPT-2's files: the vocabulary as JSON (token -> id) and the merges, one "a b" pair per line
  /// after an optional "#version" line. `<|endoftext|>` is the end-of-document id and is split
  /// out of text as a special token. Throws input_error naming the file and the fault.
  static bpe_tokenizer from_gpt2_files(std::filesystem::path const& vocab,
                                       std::filesystem::path const& merges);
  /// A Hugging Face tokenizer: `tokenizer.json`, or a folder holding it. The end-of-document id
  /// is the eos_token of a `tokenizer_config.json` beside it, else the first special token
  /// named <|endoftext|>, <|end_of_text|>, </s> or <eos>. Throws input_error for a file that
  /// does not parse and for any part this tokenizer does not implement, by name.
  static bpe_tokenizer from_huggingface(std::filesystem::path const& path);

  [[nodiscard]] std::vector<std::int64_t> encode(std::string_view text) const;
  /// The text of `ids`; bytes that do not form UTF-8 become U+FFFD.
  [[nodiscard]] std::string decode(std::span<std::int64_t const> ids) const;

  /// Megatron's vocab_size: the tokens of the vocabulary and the added tokens together.
  [[nodiscard]] std::int64_t vocab_size() const noexcept;
  /// The end-of-document id; throws input_error when the tokenizer names none.
  [[nodiscard]] std::int64_t eod() const;
  /// The pad id (-1: none).
  [[nodiscard]] std::int64_t pad() const noexcept;
  /// The id of `token` (none when it is not in the vocabulary or the added tokens).
  [[nodiscard]] std::optional<std::int64_t> id_of(std::string_view token) const;

  struct model;  // the vocabulary, merges, added tokens and compiled patterns (bpe_tokenizer.ipp)

 private:
  explicit bpe_tokenizer(std::shared_ptr<model const> m) : model_(std::move(m)) {}
  std::shared_ptr<model const> model_;
};

}  // namespace megamoe::data

#if MEGAMOE_HEADER_ONLY
#include <megamoe/data/bpe_tokenizer.ipp>
#endif
