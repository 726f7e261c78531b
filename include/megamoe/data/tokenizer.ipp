// SPDX-License-Identifier: Apache-2.0
// megamoe/data/tokenizer.ipp — the definitions behind tokenizer.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/data/tokenizer.hpp>
#include <megamoe/data/utf8.hpp>

#include <charconv>

namespace megamoe::data {

MEGAMOE_DECL std::vector<std::int64_t> byte_tokenizer::encode(std::string_view text) const {
  std::vector<std::int64_t> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

MEGAMOE_DECL std::string byte_tokenizer::decode(std::span<std::int64_t const> ids) const {
  std::string bytes;
  bytes.reserve(ids.size());
  for (auto const id : ids) {
    if (id == eod()) continue;
    if (id < 0 || id > 255)
      throw input_error("byte tokenizer: id " + std::to_string(id) + " is not a byte");
    bytes += static_cast<char>(id);
  }
  return utf8::lossy(bytes);
}

MEGAMOE_DECL null_tokenizer::null_tokenizer(std::int64_t vocab_size, std::optional<std::int64_t> eod)
    : vocab_size_(vocab_size), eod_(eod.value_or(vocab_size - 1)) {
  if (vocab_size < 1)
    throw input_error("NullTokenizer: --vocab-size must be positive, not " +
                      std::to_string(vocab_size));
  if (eod_ < 0 || eod_ >= vocab_size)
    throw input_error("NullTokenizer: the end-of-document id " + std::to_string(eod_) +
                      " is outside the vocabulary of " + std::to_string(vocab_size));
}

MEGAMOE_DECL std::vector<std::int64_t> null_tokenizer::encode(std::string_view text) const {
  std::vector<std::int64_t> out;
  std::size_t at = 0;
  while (true) {
    auto const space = text.find(' ', at);
    auto word = text.substr(at, space == std::string_view::npos ? std::string_view::npos
                                                                 : space - at);
    // Python's int(): white space around the digits and a sign are allowed.
    while (!word.empty() && (word.front() == '\t' || word.front() == '\n' || word.front() == '\r'))
      word.remove_prefix(1);
    while (!word.empty() && (word.back() == '\t' || word.back() == '\n' || word.back() == '\r'))
      word.remove_suffix(1);
    if (!word.empty() && word.front() == '+') word.remove_prefix(1);
    std::int64_t id = 0;
    auto const [end, error] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (word.empty() || error != std::errc() || end != word.data() + word.size())
      throw input_error("NullTokenizer: '" + std::string(text.substr(at, space - at)) +
                        "' is not an id (the text must be ids separated by single spaces)");
    if (id < 0 || id >= vocab_size_)
      throw input_error("NullTokenizer: id " + std::to_string(id) +
                        " is outside the vocabulary of " + std::to_string(vocab_size_));
    out.push_back(id);
    if (space == std::string_view::npos) break;
    at = space + 1;
  }
  return out;
}

MEGAMOE_DECL std::string null_tokenizer::decode(std::span<std::int64_t const> ids) const {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

MEGAMOE_DECL tokenizer make_tokenizer(tokenizer_options const& o) {
  auto const need = [&](std::filesystem::path const& p, char const* flag) {
    if (p.empty()) throw input_error("--tokenizer-type " + o.type + " needs " + flag);
    if (!std::filesystem::exists(p))
      throw input_error(std::string(flag) + ": no such file or folder " + p.string());
  };
  if (o.type == "ByteTokenizer") return byte_tokenizer{};
  if (o.type == "NullTokenizer") {
    if (!o.vocab_size) throw input_error("--tokenizer-type NullTokenizer needs --vocab-size");
    return null_tokenizer(*o.vocab_size, o.null_eod);
  }
  if (o.type == "GPT2BPETokenizer") {
    need(o.vocab_file, "--vocab-file");
    need(o.merge_file, "--merge-file");
    return bpe_tokenizer::from_gpt2_files(o.vocab_file, o.merge_file);
  }
  if (o.type == "HuggingFaceTokenizer") {
    need(o.model, "--tokenizer-model");
    return bpe_tokenizer::from_huggingface(o.model);
  }
  if (o.type == "SentencePieceTokenizer" || o.type == "GPTSentencePieceTokenizer" ||
      o.type == "Llama2Tokenizer") {
    need(o.model, "--tokenizer-model");
    return sentencepiece_tokenizer(o.model);
  }
  throw input_error("--tokenizer-type: '" + o.type +
                    "' is not one of ByteTokenizer, NullTokenizer, GPT2BPETokenizer, "
                    "HuggingFaceTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, "
                    "Llama2Tokenizer");
}

MEGAMOE_DECL std::int64_t padded_vocab_size(std::int64_t vocab_size, std::int64_t divisible_by,
                                            std::int64_t tensor_parallel) {
  if (vocab_size < 1 || divisible_by < 1 || tensor_parallel < 1)
    throw input_error("padded vocabulary: the vocabulary, --make-vocab-size-divisible-by and TP "
                      "must be positive");
  auto const multiple = divisible_by * tensor_parallel;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

}  // namespace megamoe::data
