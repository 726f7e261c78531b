// SPDX-License-Identifier: Apache-2.0
// megamoe/data/tokenizer.hpp — the tokenizers behind `--tokenizer-type`, one small interface:
// encode text to ids, decode ids to text, the vocabulary's size, the end-of-document id and the
// pad id. Megatron's GPT2BPETokenizer, HuggingFaceTokenizer (byte-level BPE), SentencePieceTokenizer
// (and its GPT and Llama 2 names) and NullTokenizer, and megamoe's ByteTokenizer: a text's UTF-8
// bytes, with 256 the end of a document.
//
// A tokenizer is chosen when a job starts, so `tokenizer` is a variant of them; the data path
// visits it, never a training step.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/data/bpe_tokenizer.hpp>
#include <megamoe/data/sentencepiece_tokenizer.hpp>

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace megamoe::data {

/// What the data path asks of a tokenizer.
template <class T>
concept text_tokenizer =
    requires(T const& t, std::string_view text, std::span<std::int64_t const> ids) {
      { t.encode(text) } -> std::same_as<std::vector<std::int64_t>>;
      { t.decode(ids) } -> std::same_as<std::string>;
      { t.vocab_size() } -> std::same_as<std::int64_t>;
      { t.eod() } -> std::same_as<std::int64_t>;
      { t.pad() } -> std::same_as<std::int64_t>;
    };

/// A text's UTF-8 bytes; 256 ends a document. Decoding skips 256 and makes the bytes valid text.
class byte_tokenizer {
 public:
  [[nodiscard]] std::vector<std::int64_t> encode(std::string_view text) const;
  [[nodiscard]] std::string decode(std::span<std::int64_t const> ids) const;
  [[nodiscard]] std::int64_t vocab_size() const noexcept { return 257; }
  [[nodiscard]] std::int64_t eod() const noexcept { return 256; }
  [[nodiscard]] std::int64_t pad() const noexcept { return -1; }
};

/// Megatron's NullTokenizer: the text is the ids, written in decimal and separated by single
/// spaces; the vocabulary is `--vocab-size`, the end of a document its last id unless given.
class null_tokenizer {
 public:
  explicit null_tokenizer(std::int64_t vocab_size, std::optional<std::int64_t> eod = {});
  /// Throws input_error for text that is not ids, and for an id outside the vocabulary.
  [[nodiscard]] std::vector<std::int64_t> encode(std::string_view text) const;
  [[nodiscard]] std::string decode(std::span<std::int64_t const> ids) const;
  [[nodiscard]] std::int64_t vocab_size() const noexcept { return vocab_size_; }
  [[nodiscard]] std::int64_t eod() const noexcept { return eod_; }
  [[nodiscard]] std::int64_t pad() const noexcept { return -1; }

 private:
  std::int64_t vocab_size_, eod_;
};

static_assert(text_tokenizer<byte_tokenizer> && text_tokenizer<null_tokenizer> &&
              text_tokenizer<bpe_tokenizer> && text_tokenizer<sentencepiece_tokenizer>);

using tokenizer = std::variant<byte_tokenizer, null_tokenizer, bpe_tokenizer, sentencepiece_tokenizer>;

/// Megatron's tokenizer flags.
struct tokenizer_options {
  std::string type = "ByteTokenizer";        // --tokenizer-type
  std::filesystem::path vocab_file{};          // --vocab-file (GPT2BPETokenizer)
  std::filesystem::path merge_file{};          // --merge-file (GPT2BPETokenizer)
  std::filesystem::path model{};               // --tokenizer-model (Hugging Face, SentencePiece)
  std::optional<std::int64_t> vocab_size{};    // --vocab-size (NullTokenizer)
  std::optional<std::int64_t> null_eod{};      // --null-tokenizer-eod-id
};

/// The tokenizer the options name. Throws input_error for an unknown type (naming the known
/// ones), a file that is missing or malformed, and a missing flag the type needs.
MEGAMOE_DECL tokenizer make_tokenizer(tokenizer_options const& options);

[[nodiscard]] inline std::vector<std::int64_t> encode(tokenizer const& t, std::string_view text) {
  return std::visit([&](auto const& k) { return k.encode(text); }, t);
}
[[nodiscard]] inline std::string decode(tokenizer const& t, std::span<std::int64_t const> ids) {
  return std::visit([&](auto const& k) { return k.decode(ids); }, t);
}
[[nodiscard]] inline std::int64_t vocab_size(tokenizer const& t) {
  return std::visit([](auto const& k) { return k.vocab_size(); }, t);
}
[[nodiscard]] inline std::int64_t eod(tokenizer const& t) {
  return std::visit([](auto const& k) { return k.eod(); }, t);
}
[[nodiscard]] inline std::int64_t pad(tokenizer const& t) {
  return std::visit([](auto const& k) { return k.pad(); }, t);
}

/// Megatron's padded vocabulary: `vocab_size` rounded up to a multiple of divisible_by x TP
/// (--make-vocab-size-divisible-by, --tensor-model-parallel-size).
MEGAMOE_DECL std::int64_t padded_vocab_size(std::int64_t vocab_size, std::int64_t divisible_by,
                                            std::int64_t tensor_parallel);

}  // namespace megamoe::data

#if MEGAMOE_HEADER_ONLY
#include <megamoe/data/tokenizer.ipp>
#endif
