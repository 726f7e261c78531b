// SPDX-License-Identifier: Apache-2.0
// megamoe/data/indexed_dataset.hpp — Megatron's indexed dataset: a `.bin` of token sequences and
// the `.idx` that says where each one starts, as Megatron's `tools/preprocess_data.py` writes them.
//
// `.idx` (little-endian, no padding): the magic "MMIDIDX\0\0", uint64 version 1, uint8 dtype code,
// uint64 sequence count S, uint64 document-index count D (documents + 1), int32 lengths[S], int64
// byte pointers[S] into `.bin`, int64 document indices[D] (document k is sequences
// [indices[k], indices[k+1])), and for multimodal files int8 modes[S]. `.bin` is the sequences'
// tokens back to back in the dtype. Both files are memory-mapped, never read whole: the ranks of
// a node share their pages through the page cache.
//
// Opening checks everything a reader relies on and names the file and the fault: the sizes of
// both files, the magic, version and dtype code, pointers that follow from the lengths, the last
// sequence ending where `.bin` ends, and document indices from 0 to S in order.
// indexed_dataset_builder writes the pair byte for byte as Megatron's IndexedDatasetBuilder does.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/io/files.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megamoe::data {

/// The element type of a `.bin`'s tokens, by its `.idx` dtype code (Megatron's DType).
enum class token_dtype : std::uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8,
};

/// Bytes per token of `t`.
MEGAMOE_DECL std::size_t size_of(token_dtype t);
/// numpy's name of `t` ("uint16", ...).
MEGAMOE_DECL std::string_view name_of(token_dtype t);
/// The dtype preprocess_data.py chooses for a vocabulary (DType.optimal_dtype): uint16 below
/// 65500 tokens, else int32.
MEGAMOE_DECL token_dtype optimal_dtype(std::int64_t vocab_size);

/// `.idx` and `.bin` beside each other: prefix + ".idx", prefix + ".bin".
MEGAMOE_DECL std::filesystem::path index_path(std::filesystem::path const& prefix);
MEGAMOE_DECL std::filesystem::path data_path(std::filesystem::path const& prefix);

/// A whole file mapped read-only (an empty file maps to no bytes).
class mapped_file {
 public:
  explicit mapped_file(std::filesystem::path path);
  mapped_file(mapped_file&& other) noexcept
      : path_(std::move(other.path_)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  mapped_file(mapped_file const&) = delete;
  mapped_file& operator=(mapped_file const&) = delete;
  mapped_file& operator=(mapped_file&&) = delete;
  ~mapped_file();

  [[nodiscard]] std::span<std::byte const> bytes() const noexcept { return {data_, size_}; }
  [[nodiscard]] std::filesystem::path const& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  std::byte const* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A Megatron indexed dataset, read in place. Sequence ids are Megatron's "documents" in
/// GPTDataset (it samples sequences); document_indices() groups them into documents.
class indexed_dataset {
 public:
  /// Opens prefix.idx and prefix.bin; `multimodal`: the `.idx` ends with a mode per sequence
  /// (nothing in the file says so). Throws input_error naming the file and what is wrong.
  explicit indexed_dataset(std::filesystem::path const& prefix, bool multimodal = false);

  [[nodiscard]] std::filesystem::path const& prefix() const noexcept { return prefix_; }
  [[nodiscard]] token_dtype dtype() const noexcept { return dtype_; }
  [[nodiscard]] std::int64_t sequence_count() const noexcept { return sequences_; }
  /// Documents: the document-index count less one.
  [[nodiscard]] std::int64_t document_count() const noexcept { return document_entries_ - 1; }
  [[nodiscard]] bool multimodal() const noexcept { return multimodal_; }
  /// Tokens in every sequence together.
  [[nodiscard]] std::int64_t token_count() const noexcept { return tokens_; }

  [[nodiscard]] std::int32_t sequence_length(std::int64_t i) const;
  /// Byte offset of sequence i in `.bin`.
  [[nodiscard]] std::int64_t sequence_pointer(std::int64_t i) const;
  /// Entry k of the document index (k in [0, document_count()]).
  [[nodiscard]] std::int64_t document_index(std::int64_t k) const;
  /// Sequence i's mode (multimodal files only).
  [[nodiscard]] std::int8_t sequence_mode(std::int64_t i) const;

  /// The whole arrays, copied out of the map.
  [[nodiscard]] std::vector<std::int32_t> sequence_lengths() const;
  [[nodiscard]] std::vector<std::int64_t> sequence_pointers() const;
  [[nodiscard]] std::vector<std::int64_t> document_indices() const;

  /// Megatron's get(i, offset, length): `length` tokens of sequence i from token `offset` (to
  /// the sequence's end when absent), as int64 values (float tokens converted as numpy does).
  [[nodiscard]] std::vector<std::int64_t> get(std::int64_t i, std::int64_t offset = 0,
                                              std::optional<std::int64_t> length = {}) const;
  /// The same into `out` (out.size() tokens from `offset`).
  void read(std::int64_t i, std::int64_t offset, std::span<std::int64_t> out) const;

 private:
  template <class T>
  T field(std::size_t at) const;
  /// Throws std::out_of_range unless i names a sequence.
  void check_sequence(std::int64_t i) const;

  std::filesystem::path prefix_;
  mapped_file index_;
  mapped_file data_;
  bool multimodal_ = false;
  token_dtype dtype_ = token_dtype::uint16;
  std::int64_t sequences_ = 0;
  std::int64_t document_entries_ = 0;
  std::int64_t tokens_ = 0;
  std::size_t lengths_at_ = 0, pointers_at_ = 0, documents_at_ = 0, modes_at_ = 0;
};

/// Writes a `.bin` as tokens come and its `.idx` at finalize(), byte for byte as Megatron's
/// IndexedDatasetBuilder: add_item() appends a sequence, end_document() closes a document (its
/// sequences since the last one), add_document() does both for a document of several sequences.
/// A token that the dtype cannot hold is an error, not a wrapped value. A builder destroyed
/// before finalize() removes its `.bin`.
class indexed_dataset_builder {
 public:
  indexed_dataset_builder(std::filesystem::path const& bin, token_dtype dtype,
                          bool multimodal = false);

  /// One sequence (its mode: multimodal files only).
  void add_item(std::span<std::int64_t const> tokens, std::int8_t mode = 0);
  /// Ends the document holding the sequences added since the last one.
  void end_document();
  /// A whole document: `tokens` cut into sequences of `lengths` (which add up to its size).
  void add_document(std::span<std::int64_t const> tokens, std::span<std::int64_t const> lengths,
                    std::span<std::int8_t const> modes = {});
  /// Writes the `.idx` and closes both files, flushed to disk.
  void finalize(std::filesystem::path const& idx);

  [[nodiscard]] std::int64_t sequence_count() const noexcept {
    return static_cast<std::int64_t>(lengths_.size());
  }

 private:
  void append(std::span<std::int64_t const> tokens);

  std::filesystem::path bin_path_;
  std::unique_ptr<io::durable_file> bin_;
  token_dtype dtype_;
  bool multimodal_;
  std::vector<std::int32_t> lengths_;
  std::vector<std::int64_t> documents_{0};
  std::vector<std::int8_t> modes_;
  std::vector<std::byte> staging_;
};

}  // namespace megamoe::data

#if MEGAMOE_HEADER_ONLY
#include <megamoe/data/indexed_dataset.ipp>
#endif
