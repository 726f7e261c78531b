// SPDX-License-Identifier: Apache-2.0
// Preprocessing against Megatron's own output: the 600 fortune documents of
// tests/data/megatron_data, as JSON lines or as "%"-separated text, byte-tokenized with an
// end-of-document id by two workers, give the `.bin/.idx` pair Megatron wrote, byte for byte, and
// read back as the documents; several keys and sentence lists; bad lines, keys, values and ids.
#include <megamoe/data/indexed_dataset.hpp>
#include <megamoe/data/preprocess.hpp>

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
using megamoe::test::megatron_data;
using megamoe::test::read_bytes;
using megamoe::test::read_json;

fs::path fresh(std::string const& name) {
  auto const dir = fs::temp_directory_path() / ("megamoe_preprocess_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<std::string> fortune_documents() {
  return read_json(megatron_data() / "data" / "fortunes_corpus.json")["documents"]
      .get<std::vector<std::string>>();
}

void expect_megatrons_pair(fs::path const& prefix) {
  auto const shipped = megatron_data() / "data" / "bytes_doc_u16";
  EXPECT_EQ(read_bytes(mdata::data_path(prefix)), read_bytes(mdata::data_path(shipped)));
  EXPECT_EQ(read_bytes(mdata::index_path(prefix)), read_bytes(mdata::index_path(shipped)));
}

TEST(Preprocess, JsonLinesGiveMegatronsBytes) {
  auto const dir = fresh("jsonl");
  auto const documents = fortune_documents();
  {
    std::ofstream out(dir / "corpus.jsonl", std::ios::binary);
    for (auto const& d : documents) out << nlohmann::json{{"text", d}, {"id", 1}}.dump() << "\n";
  }
  mdata::preprocess_options o;
  o.inputs = {dir / "corpus.jsonl"};
  o.output_prefix = dir / "out";
  o.append_eod = true;
  o.workers = 2;
  auto const r = mdata::preprocess(mdata::byte_tokenizer{}, o);
  ASSERT_EQ(r.prefixes.size(), 1U);
  EXPECT_EQ(r.prefixes[0], dir / "out_text_document");
  EXPECT_EQ(r.documents, 600);
  expect_megatrons_pair(r.prefixes[0]);
  // Read back: each document's text and its end-of-document id.
  mdata::indexed_dataset const ds(r.prefixes[0]);
  ASSERT_EQ(ds.document_count(), 600);
  mdata::byte_tokenizer const bytes;
  for (std::int64_t i = 0; i < 600; i += 37) {
    auto const tokens = ds.get(i);
    EXPECT_EQ(tokens.back(), bytes.eod());
    EXPECT_EQ(bytes.decode(tokens), documents[static_cast<std::size_t>(i)]);
  }
  fs::remove_all(dir);
}

TEST(Preprocess, PercentSeparatedTextGivesTheSameBytes) {
  auto const dir = fresh("text");
  {
    // Two files: the split between them ends a document too.
    std::ofstream a(dir / "a", std::ios::binary), b(dir / "b", std::ios::binary);
    auto const documents = fortune_documents();
    for (std::size_t i = 0; i < documents.size(); ++i)
      (i < 336 ? a : b) << documents[i] << (i + 1 == 336 || i + 1 == documents.size() ? "" : "%\n");
    std::ofstream(dir / "a.dat") << "fortune's index, skipped";
  }
  mdata::preprocess_options o;
  o.inputs = {dir};
  o.format = mdata::text_format::text;
  o.output_prefix = dir / "out" / "fortunes";
  o.append_eod = true;
  auto const r = mdata::preprocess(mdata::byte_tokenizer{}, o);
  EXPECT_EQ(r.documents, 600);
  expect_megatrons_pair(r.prefixes[0]);
  fs::remove_all(dir);
}

TEST(Preprocess, KeysSentencesAndEmptyDocuments) {
  auto const dir = fresh("keys");
  {
    std::ofstream out(dir / "in.jsonl", std::ios::binary);
    out << R"({"text": ["ab", "", "c"], "title": "T"})" << "\n";
    out << R"({"text": "", "title": "U"})" << "\n";
    out << R"({"text": "d", "title": ""})" << "\n";
  }
  mdata::preprocess_options o;
  o.inputs = {dir / "in.jsonl"};
  o.json_keys = {"text", "title"};
  o.output_prefix = dir / "k";
  o.append_eod = true;
  auto const r = mdata::preprocess(mdata::byte_tokenizer{}, o);
  ASSERT_EQ(r.prefixes.size(), 2U);
  mdata::indexed_dataset const text(r.prefixes[0]), title(r.prefixes[1]);
  // "ab" and "c" are sequences of the first document (the empty sentence dropped), the EOD on
  // the last; the empty second document has no sequence and no EOD.
  EXPECT_EQ(text.sequence_lengths(), (std::vector<std::int32_t>{2, 2, 2}));
  EXPECT_EQ(text.document_indices(), (std::vector<std::int64_t>{0, 2, 2, 3}));
  EXPECT_EQ(text.get(1), (std::vector<std::int64_t>{'c', 256}));
  EXPECT_EQ(title.document_indices(), (std::vector<std::int64_t>{0, 1, 2, 2}));
  fs::remove_all(dir);
}

TEST(Preprocess, BadInputIsNamedAndLeavesNoFiles) {
  auto const dir = fresh("bad");
  auto const message = [&](std::string const& lines, mdata::tokenizer const& t) {
    {
      std::ofstream(dir / "in.jsonl", std::ios::binary) << lines;
    }
    mdata::preprocess_options o;
    o.inputs = {dir / "in.jsonl"};
    o.output_prefix = dir / "bad";
    try {
      (void)mdata::preprocess(t, o);
    } catch (megamoe::input_error const& e) {
      EXPECT_FALSE(fs::exists(dir / "bad_text_document.bin"));
      EXPECT_FALSE(fs::exists(dir / "bad_text_document.idx"));
      return std::string(e.what());
    }
    return std::string("no error");
  };
  mdata::byte_tokenizer const bytes;
  EXPECT_NE(message("{\"text\": \"a\"}\nnot json\n", bytes).find("in.jsonl:2"), std::string::npos);
  EXPECT_NE(message("{\"text\": \"a\"}\n\n", bytes).find("in.jsonl:2"), std::string::npos);
  EXPECT_NE(message("{\"body\": \"a\"}\n", bytes).find("no key 'text'"), std::string::npos);
  EXPECT_NE(message("{\"text\": 3}\n", bytes).find("not text"), std::string::npos);
  EXPECT_NE(message("[1, 2]\n", bytes).find("not a JSON object"), std::string::npos);
  EXPECT_NE(message("{\"text\": \"3 12\"}\n", mdata::null_tokenizer(10)).find("12"),
            std::string::npos);
  // The first fault in input order is reported, whichever worker or reader found it: an id
  // outside the vocabulary on line 2 before one on line 5 (the other worker's), and before a
  // line that is not JSON on line 6.
  auto const ordered = [&](std::string const& lines) {
    {
      std::ofstream(dir / "in.jsonl", std::ios::binary) << lines;
    }
    mdata::preprocess_options p;
    p.inputs = {dir / "in.jsonl"};
    p.output_prefix = dir / "bad";
    p.workers = 2;
    try {
      (void)mdata::preprocess(mdata::null_tokenizer(10), p);
    } catch (megamoe::input_error const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto const first = ordered(
      "{\"text\": \"1\"}\n{\"text\": \"11\"}\n{\"text\": \"2\"}\n{\"text\": \"3\"}\n"
      "{\"text\": \"12\"}\nnot json\n");
  EXPECT_NE(first.find("in.jsonl:2"), std::string::npos) << first;
  EXPECT_NE(first.find("11"), std::string::npos) << first;
  auto const parse = ordered("{\"text\": \"1\"}\nnot json\n{\"text\": \"12\"}\n");
  EXPECT_NE(parse.find("in.jsonl:2"), std::string::npos) << parse;

  // Text input that is not UTF-8.
  {
    std::ofstream(dir / "latin1.txt", std::ios::binary) << "ok\ncaf\xe9\n%\n";
  }
  mdata::preprocess_options text;
  text.inputs = {dir / "latin1.txt"};
  text.format = mdata::text_format::text;
  text.output_prefix = dir / "bad";
  try {
    (void)mdata::preprocess(bytes, text);
    ADD_FAILURE() << "no error";
  } catch (megamoe::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("latin1.txt:2: not UTF-8"), std::string::npos) << e.what();
  }

  mdata::preprocess_options o;
  o.inputs = {dir / "missing.jsonl"};
  o.output_prefix = dir / "bad";
  EXPECT_THROW((void)mdata::preprocess(bytes, o), megamoe::input_error);
  fs::remove_all(dir);
}

}  // namespace
