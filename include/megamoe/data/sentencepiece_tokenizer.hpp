// SPDX-License-Identifier: Apache-2.0
// megamoe/data/sentencepiece_tokenizer.hpp — a SentencePiece model (`--tokenizer-model`), as
// Megatron's SentencePieceTokenizer uses it: ids as the model encodes them with nothing added,
// the end of a document its eos id. Through Debian's libsentencepiece.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace megamoe::data {

class sentencepiece_tokenizer {
 public:
  /// Loads `model`; throws input_error when it does not load.
  explicit sentencepiece_tokenizer(std::filesystem::path const& model);

  [[nodiscard]] std::vector<std::int64_t> encode(std::string_view text) const;
  [[nodiscard]] std::string decode(std::span<std::int64_t const> ids) const;
  /// The model's pieces.
  [[nodiscard]] std::int64_t vocab_size() const;
  /// The model's eos id; throws input_error when it has none.
  [[nodiscard]] std::int64_t eod() const;
  /// The model's pad id (-1: none).
  [[nodiscard]] std::int64_t pad() const;

 private:
  std::shared_ptr<sentencepiece::SentencePieceProcessor const> processor_;
};

}  // namespace megamoe::data

#if MEGAMOE_HEADER_ONLY
#include <megamoe/data/sentencepiece_tokenizer.ipp>
#endif
