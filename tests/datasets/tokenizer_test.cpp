// SPDX-License-Identifier: Apache-2.0
// The tokenizers against encodings made by Hugging Face's tokenizers and SentencePiece from the
// same files (tests/data/tokenizers, made by its make_vectors.py): a GPT-2-format BPE from its
// vocab.json and merges.txt and from its tokenizer.json, a tokenizer.json with an NFC normalizer,
// a Split pre-tokenizer and two special tokens, the kinds of Llama 3's, DeepSeek-V3's and an
// NFKC one with single digits and a prefix space, and a SentencePiece BPE; decoding back to the
// text; the null and byte tokenizers; Megatron's padded vocabulary; bad tokenizer files.
#include <megamoe/data/tokenizer.hpp>

#include "support/megatron_data.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace mdata = megamoe::data;
namespace fs = std::filesystem;
using megamoe::test::read_json;

fs::path tokenizer_data() { return fs::path(MEGAMOE_TEST_DATA) / "tokenizers"; }

nlohmann::json const& encodings() {
  static auto const j = read_json(tokenizer_data() / "encodings.json");
  return j;
}

void expect_encodings(mdata::tokenizer const& t, std::string const& name) {
  auto const& texts = encodings()["texts"];
  auto const& ids = encodings()["tokenizers"][name];
  auto const& decoded = encodings()["decoded"][name];
  ASSERT_EQ(texts.size(), ids.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    auto const text = texts[i].get<std::string>();
    auto const got = mdata::encode(t, text);
    EXPECT_EQ(got, ids[i].get<std::vector<std::int64_t>>()) << name << ", text " << i << ": "
                                                             << text.substr(0, 80);
    EXPECT_EQ(mdata::decode(t, got), decoded[i].get<std::string>()) << name << ", text " << i;
  }
}

TEST(Tokenizer, Gpt2FilesEncodeAsHuggingFace) {
  auto const t = mdata::make_tokenizer({.type = "GPT2BPETokenizer",
                                        .vocab_file = tokenizer_data() / "gpt2" / "vocab.json",
                                        .merge_file = tokenizer_data() / "gpt2" / "merges.txt"});
  EXPECT_EQ(mdata::vocab_size(t), encodings()["gpt2_vocab_size"].get<std::int64_t>());
  EXPECT_EQ(mdata::eod(t), encodings()["gpt2_eod"].get<std::int64_t>());
  expect_encodings(t, "gpt2");
  // Byte-level BPE loses nothing: every text comes back.
  for (auto const& text : encodings()["texts"])
    EXPECT_EQ(mdata::decode(t, mdata::encode(t, text.get<std::string>())), text.get<std::string>());
}

TEST(Tokenizer, HuggingFaceJsonEncodesAsHuggingFace) {
  auto const same = mdata::make_tokenizer(
      {.type = "HuggingFaceTokenizer", .model = tokenizer_data() / "gpt2" / "tokenizer.json"});
  EXPECT_EQ(mdata::eod(same), encodings()["gpt2_eod"].get<std::int64_t>());
  expect_encodings(same, "gpt2");
  // A folder holding tokenizer.json loads too.
  auto const split = mdata::make_tokenizer(
      {.type = "HuggingFaceTokenizer", .model = tokenizer_data() / "split_nfc"});
  expect_encodings(split, "split_nfc");
  auto const& b = std::get<mdata::bpe_tokenizer>(split);
  EXPECT_EQ(b.eod(), b.id_of("<|endoftext|>"));
  EXPECT_EQ(b.vocab_size(), 700);
}

TEST(Tokenizer, RealModelsKindsEncodeAsHuggingFace) {
  // Llama 3's: Split then byte level, ignore_merges, <|begin_of_text|> added by the template, the
  // eos of tokenizer_config.json, and <mask> taking the white space around it.
  auto const llama = mdata::make_tokenizer(
      {.type = "HuggingFaceTokenizer", .model = tokenizer_data() / "llama3_like"});
  expect_encodings(llama, "llama3_like");
  EXPECT_EQ(mdata::eod(llama), encodings()["llama3_like_eod"].get<std::int64_t>());
  // DeepSeek-V3's: three Splits before the byte level.
  expect_encodings(mdata::make_tokenizer({.type = "HuggingFaceTokenizer",
                                          .model = tokenizer_data() / "deepseek_like"}),
                   "deepseek_like");
  // NFKC, single digits and a prefix space over the GPT-2 BPE.
  expect_encodings(mdata::make_tokenizer({.type = "HuggingFaceTokenizer",
                                          .model = tokenizer_data() / "prefix_digits"}),
                   "prefix_digits");
}

TEST(Tokenizer, SentencePieceEncodesAsSentencePiece) {
  auto const t = mdata::make_tokenizer(
      {.type = "SentencePieceTokenizer", .model = tokenizer_data() / "sentencepiece" / "bpe.model"});
  auto const& sp = encodings()["sentencepiece"];
  EXPECT_EQ(mdata::vocab_size(t), sp["vocab_size"].get<std::int64_t>());
  EXPECT_EQ(mdata::eod(t), sp["eos"].get<std::int64_t>());
  EXPECT_EQ(mdata::pad(t), sp["pad"].get<std::int64_t>());
  expect_encodings(t, "sentencepiece");
}

TEST(Tokenizer, NullAndByteTokenizers) {
  mdata::null_tokenizer const null(1000);
  EXPECT_EQ(null.eod(), 999);
  EXPECT_EQ(null.encode("3 14 159"), (std::vector<std::int64_t>{3, 14, 159}));
  EXPECT_EQ(null.encode("+7"), (std::vector<std::int64_t>{7}));
  std::vector<std::int64_t> const ids{5, 0, 999};
  EXPECT_EQ(null.decode(ids), "5 0 999");
  for (char const* bad : {"", "1  2", "x", "1000", "-1", "12 "})
    EXPECT_THROW((void)null.encode(bad), megamoe::input_error) << "'" << bad << "'";
  EXPECT_EQ(mdata::null_tokenizer(1000, 0).eod(), 0);
  EXPECT_THROW(mdata::null_tokenizer(10, 10), megamoe::input_error);
  EXPECT_THROW((void)mdata::make_tokenizer({.type = "NullTokenizer"}), megamoe::input_error);

  mdata::byte_tokenizer const bytes;
  std::string const text = "caf\xc3\xa9 \xe2\x9d\xa4";
  auto encoded = bytes.encode(text);
  ASSERT_EQ(encoded.size(), text.size());
  EXPECT_EQ(encoded[3], 0xc3);
  encoded.push_back(bytes.eod());
  EXPECT_EQ(bytes.decode(encoded), text);  // the end of a document is not text
  std::vector<std::int64_t> const cut{'a', 0xe2, 0x9d};
  EXPECT_EQ(bytes.decode(cut), "a\xef\xbf\xbd");  // a cut character is one U+FFFD
  EXPECT_EQ(bytes.vocab_size(), 257);
}

TEST(Tokenizer, PaddedVocabularyIsMegatrons) {
  EXPECT_EQ(mdata::padded_vocab_size(50257, 128, 1), 50304);
  EXPECT_EQ(mdata::padded_vocab_size(50257, 128, 2), 50432);
  EXPECT_EQ(mdata::padded_vocab_size(256, 128, 1), 256);
  EXPECT_EQ(mdata::padded_vocab_size(257, 1, 1), 257);
  EXPECT_THROW((void)mdata::padded_vocab_size(257, 0, 1), megamoe::input_error);
}

TEST(Tokenizer, BadFilesAreNamed) {
  auto const dir = fs::temp_directory_path() / "megamoe_tokenizer_bad";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto const write = [&](std::string const& name, std::string const& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return dir / name;
  };
  auto const message = [](mdata::tokenizer_options const& o) {
    try {
      (void)mdata::make_tokenizer(o);
    } catch (megamoe::input_error const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto const vocab = tokenizer_data() / "gpt2" / "vocab.json";
  auto const merges = tokenizer_data() / "gpt2" / "merges.txt";
  EXPECT_NE(message({.type = "Word"}).find("not one of"), std::string::npos);
  EXPECT_NE(message({.type = "GPT2BPETokenizer", .merge_file = merges}).find("--vocab-file"),
            std::string::npos);
  EXPECT_NE(message({.type = "GPT2BPETokenizer", .vocab_file = dir / "none.json",
                     .merge_file = merges})
                .find("no such file"),
            std::string::npos);
  EXPECT_NE(message({.type = "GPT2BPETokenizer", .vocab_file = write("bad.json", "{\"a\": 1,"),
                     .merge_file = merges})
                .find("not JSON"),
            std::string::npos);
  EXPECT_NE(message({.type = "GPT2BPETokenizer", .vocab_file = vocab,
                     .merge_file = write("bad.txt", "#version: 0.2\n\xc4\xa0 t\nh e x\n")})
                .find("line 3"),
            std::string::npos);
  EXPECT_NE(message({.type = "GPT2BPETokenizer", .vocab_file = vocab,
                     .merge_file = write("unknown.txt", "#version: 0.2\nqq zz\n")})
                .find("not in the vocabulary"),
            std::string::npos);
  EXPECT_NE(message({.type = "GPT2BPETokenizer", .vocab_file = write("small.json", "{\"a\": 0}"),
                     .merge_file = write("none.txt", "#version: 0.2\n")})
                .find("no merges"),
            std::string::npos);
  EXPECT_NE(message({.type = "HuggingFaceTokenizer",
                     .model = write("wordpiece.json", R"({"model": {"type": "WordPiece"}})")})
                .find("not BPE"),
            std::string::npos);
  EXPECT_NE(message({.type = "SentencePieceTokenizer", .model = write("bad.model", "not a model")})
                .find("does not load"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
