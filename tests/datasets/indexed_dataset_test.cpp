// SPDX-License-Identifier: Apache-2.0
// Megatron's indexed dataset: the pair Megatron's IndexedDatasetBuilder wrote
// (tests/data/megatron_data) read as its IndexedDataset reads it, written again byte for byte
// from the same documents, every dtype and documents of several sequences round-tripped, and
// each kind of damage refused with the file and the fault named.
#include <megamoe/data/indexed_dataset.hpp>

#include "support/megatron_data.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace mdata = megamoe::data;
using megamoe::test::megatron_data;
using megamoe::test::read_bytes;
using megamoe::test::read_json;

void write_file(fs::path const& p, std::vector<char> const& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A fresh folder under the test's temporary directory.
fs::path indexed_scratch(std::string const& name) {
  auto const dir = fs::temp_directory_path() / ("megamoe_indexed_dataset_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// The documents of fortunes_corpus.json as byte tokens followed by the end-of-document id.
std::vector<std::vector<std::int64_t>> fortune_documents(int eod) {
  std::vector<std::vector<std::int64_t>> out;
  auto const corpus = read_json(megatron_data() / "data/fortunes_corpus.json");
  for (auto const& text : corpus["documents"]) {
    std::vector<std::int64_t> ids;
    for (unsigned char const c : text.get<std::string>()) ids.push_back(c);
    ids.push_back(eod);
    out.push_back(std::move(ids));
  }
  return out;
}

TEST(IndexedDataset, ReadsMegatronsPairAsItsReaderDoes) {
  auto const v = read_json(megatron_data() / "idx_bytes_doc_u16.json");
  mdata::indexed_dataset const ds(megatron_data() / "data/bytes_doc_u16");
  EXPECT_EQ(static_cast<int>(ds.dtype()), v["dtype_code"].get<int>());
  EXPECT_EQ(mdata::name_of(ds.dtype()), v["dtype"].get<std::string>());
  EXPECT_EQ(mdata::size_of(ds.dtype()), v["dtype_size"].get<std::size_t>());
  EXPECT_EQ(ds.sequence_count(), v["sequence_count"].get<std::int64_t>());
  EXPECT_EQ(ds.document_count() + 1, v["document_count_field"].get<std::int64_t>());
  EXPECT_EQ(ds.document_count(), v["num_documents"].get<std::int64_t>());
  EXPECT_EQ(ds.token_count(), v["num_tokens"].get<std::int64_t>());
  EXPECT_EQ(ds.sequence_lengths(), v["sequence_lengths"].get<std::vector<std::int32_t>>());
  EXPECT_EQ(ds.sequence_pointers(), v["sequence_pointers"].get<std::vector<std::int64_t>>());
  EXPECT_EQ(ds.document_indices(), v["document_indices"].get<std::vector<std::int64_t>>());
  for (auto const& [i, tokens] : v["sequences"].items())
    EXPECT_EQ(ds.get(std::stoll(i)), tokens.get<std::vector<std::int64_t>>()) << "sequence " << i;
  for (auto const& e : v["get_examples"]) {
    std::optional<std::int64_t> length;
    if (!e["length"].is_null()) length = e["length"].get<std::int64_t>();
    EXPECT_EQ(ds.get(e["idx"].get<std::int64_t>(), e["offset"].get<std::int64_t>(), length),
              e["tokens"].get<std::vector<std::int64_t>>())
        << e["idx"] << " from " << e["offset"];
  }
  auto const slice = v["slice_1_4"];
  for (std::size_t k = 0; k < slice.size(); ++k)
    EXPECT_EQ(ds.get(static_cast<std::int64_t>(k) + 1), slice[k].get<std::vector<std::int64_t>>());
  EXPECT_THROW((void)ds.get(600), std::out_of_range);
  EXPECT_THROW((void)ds.get(0, 100, 11), std::out_of_range);
}

TEST(IndexedDataset, WritesMegatronsPairByteForByte) {
  auto const dir = indexed_scratch("fortunes");
  auto const documents = fortune_documents(256);
  EXPECT_EQ(mdata::optimal_dtype(257), mdata::token_dtype::uint16);
  // add_item then end_document, and add_document with one length, give the same files.
  {
    mdata::indexed_dataset_builder b(dir / "items.bin", mdata::optimal_dtype(257));
    for (auto const& d : documents) {
      b.add_item(d);
      b.end_document();
    }
    b.finalize(dir / "items.idx");
  }
  {
    mdata::indexed_dataset_builder b(dir / "documents.bin", mdata::token_dtype::uint16);
    for (auto const& d : documents) {
      std::int64_t const length = static_cast<std::int64_t>(d.size());
      b.add_document(d, std::span(&length, 1));
    }
    b.finalize(dir / "documents.idx");
  }
  auto const reference = megatron_data() / "data/bytes_doc_u16";
  for (std::string const name : {"items", "documents"}) {
    EXPECT_EQ(read_bytes(dir / (name + ".bin")), read_bytes(mdata::data_path(reference))) << name;
    EXPECT_EQ(read_bytes(dir / (name + ".idx")), read_bytes(mdata::index_path(reference))) << name;
  }
  fs::remove_all(dir);
}

TEST(IndexedDataset, EveryDtypeAndDocumentsOfSeveralSequencesRoundTrip) {
  auto const dir = indexed_scratch("dtypes");
  std::vector<std::int64_t> const tokens{0, 1, 2, 3, 100, 7, 99, 5, 4, 120, 6};
  std::vector<std::int64_t> const lengths{3, 0, 5};  // a document of three sequences
  for (int code = 1; code <= 8; ++code) {
    auto const dtype = static_cast<mdata::token_dtype>(code);
    auto const prefix = dir / std::string(mdata::name_of(dtype));
    {
      mdata::indexed_dataset_builder b(mdata::data_path(prefix), dtype);
      b.add_document(std::span(tokens).first(8), lengths);
      b.add_item(std::span(tokens).subspan(8));
      b.add_item(std::span(tokens).first(1));
      b.end_document();
      b.end_document();  // an empty document, as Megatron allows
      b.finalize(mdata::index_path(prefix));
    }
    mdata::indexed_dataset const ds(prefix);
    EXPECT_EQ(ds.dtype(), dtype);
    EXPECT_EQ(ds.sequence_count(), 5);
    EXPECT_EQ(ds.document_count(), 3);
    EXPECT_EQ(ds.document_indices(), (std::vector<std::int64_t>{0, 3, 5, 5}));
    EXPECT_EQ(ds.sequence_lengths(), (std::vector<std::int32_t>{3, 0, 5, 3, 1}));
    auto const item = static_cast<std::int64_t>(mdata::size_of(dtype));
    EXPECT_EQ(ds.sequence_pointers(),
              (std::vector<std::int64_t>{0, 3 * item, 3 * item, 8 * item, 11 * item}));
    EXPECT_EQ(ds.get(0), (std::vector<std::int64_t>{0, 1, 2}));
    EXPECT_TRUE(ds.get(1).empty());
    EXPECT_EQ(ds.get(2, 1, 3), (std::vector<std::int64_t>{100, 7, 99}));
    EXPECT_EQ(ds.get(3), (std::vector<std::int64_t>{4, 120, 6}));
    EXPECT_EQ(fs::file_size(mdata::data_path(prefix)), static_cast<std::uintmax_t>(12 * item));
  }
  // Multimodal files end with a mode per sequence.
  {
    auto const prefix = dir / "modes";
    mdata::indexed_dataset_builder b(mdata::data_path(prefix), mdata::token_dtype::int32, true);
    b.add_item(std::span(tokens).first(2), 3);
    std::vector<std::int8_t> const modes{1, 0, 2};
    b.add_document(std::span(tokens).first(8), lengths, modes);
    b.finalize(mdata::index_path(prefix));
    mdata::indexed_dataset const ds(prefix, true);
    EXPECT_EQ(ds.sequence_count(), 4);
    EXPECT_EQ(ds.document_indices(), (std::vector<std::int64_t>{0, 4}));
    EXPECT_EQ(ds.sequence_mode(0), 3);
    EXPECT_EQ(ds.sequence_mode(3), 2);
    // Read without modes, its size does not match its header.
    EXPECT_THROW(mdata::indexed_dataset{prefix}, megamoe::input_error);
  }
  fs::remove_all(dir);
}

TEST(IndexedDataset, TokensTheDtypeCannotHoldAreRefused) {
  auto const dir = indexed_scratch("narrow");
  {
    mdata::indexed_dataset_builder b(dir / "u8.bin", mdata::token_dtype::uint8);
    std::vector<std::int64_t> const big{1, 256};
    try {
      b.add_item(big);
      ADD_FAILURE() << "256 written as uint8";
    } catch (megamoe::input_error const& e) {
      EXPECT_NE(std::string(e.what()).find("token 256 does not fit the dtype uint8"),
                std::string::npos)
          << e.what();
    }
    std::vector<std::int64_t> const negative{-1};
    EXPECT_THROW(b.add_item(negative), megamoe::input_error);
    std::vector<std::int64_t> const lengths{2, 2};
    std::vector<std::int64_t> const three{1, 2, 3};
    EXPECT_THROW(b.add_document(three, lengths), megamoe::input_error);
  }
  // A builder that never finished leaves no .bin behind.
  EXPECT_FALSE(fs::exists(dir / "u8.bin"));
  fs::remove_all(dir);
}

/// The shipped pair copied to `dir`, its .idx changed by `edit`, opened: the message it gives.
template <class Edit>
std::string opening_fails(fs::path const& dir, Edit edit) {
  auto const reference = megatron_data() / "data/bytes_doc_u16";
  auto idx = read_bytes(mdata::index_path(reference));
  auto bin = read_bytes(mdata::data_path(reference));
  edit(idx, bin);
  auto const prefix = dir / "damaged";
  write_file(mdata::index_path(prefix), idx);
  write_file(mdata::data_path(prefix), bin);
  try {
    mdata::indexed_dataset const ds(prefix);
  } catch (megamoe::input_error const& e) {
    return e.what();
  }
  return "(opened)";
}

template <class T>
void put(std::vector<char>& bytes, std::size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}

TEST(IndexedDataset, DamagedFilesAreRefusedNamingTheFault) {
  auto const dir = indexed_scratch("damaged");
  std::size_t const s = 600, lengths = 34, pointers = 34 + 4 * s, documents = 34 + 12 * s;
  auto const expect = [&](auto edit, std::string const& says) {
    auto const message = opening_fails(dir, edit);
    EXPECT_NE(message.find(says), std::string::npos) << message;
    EXPECT_NE(message.find("damaged."), std::string::npos) << message;
  };
  EXPECT_EQ(opening_fails(dir, [](auto&, auto&) {}), "(opened)");  // the copy itself opens
  expect([](auto& idx, auto&) { idx.resize(20); }, "fewer than the 34 of a header");
  expect([](auto& idx, auto&) { idx[3] = 'X'; }, "its magic is not MMIDIDX");
  expect([](auto& idx, auto&) { put<std::uint64_t>(idx, 9, 2); }, "has version 2");
  expect([](auto& idx, auto&) { put<std::uint8_t>(idx, 17, 9); }, "has dtype code 9");
  expect([](auto& idx, auto&) { idx.pop_back(); }, "(truncated)");
  expect([](auto& idx, auto&) { idx.push_back(0); }, "needs 12042");
  expect([&](auto& idx, auto&) { put<std::uint64_t>(idx, 18, std::uint64_t{1} << 60); },
         "more than a file holds");
  expect([&](auto& idx, auto&) { put<std::int32_t>(idx, lengths + 4 * 7, -3); },
         "sequence 7 the negative length -3");
  expect([&](auto& idx, auto&) { put<std::int32_t>(idx, lengths + 4 * 7, 298); },
         "points sequence 8 at byte 1736 of the .bin, but the lengths before it end at byte 1738");
  expect([&](auto& idx, auto&) { put<std::int64_t>(idx, pointers + 8 * 5, 925); },
         "points sequence 5 at byte 925");
  expect([](auto&, auto& bin) { bin.resize(bin.size() - 2); }, "the .bin is truncated");
  expect([](auto&, auto& bin) { bin.push_back(0); }, "holds 237349 bytes");
  expect([&](auto& idx, auto&) { put<std::int64_t>(idx, documents + 8 * 10, 12); },
         "document index entry 11 (11) before the one preceding it (12)");
  expect([&](auto& idx, auto&) { put<std::int64_t>(idx, documents + 8 * 600, 599); },
         "ending at sequence 599");
  expect([&](auto& idx, auto&) { put<std::int64_t>(idx, documents, 1); },
         "does not start at sequence 0");
  // A missing file is named.
  try {
    mdata::indexed_dataset const ds(dir / "absent");
    ADD_FAILURE() << "a missing dataset opened";
  } catch (megamoe::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("absent.idx"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
