// SPDX-License-Identifier: Apache-2.0
// megamoe/data/indexed_dataset.ipp — the definitions behind indexed_dataset.hpp (compiled once
// under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/data/indexed_dataset.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

namespace megamoe::data {

namespace detail {

inline constexpr std::array<char, 9> index_magic{'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::size_t index_header_bytes = 34;

inline std::string quoted(std::filesystem::path const& p) { return "'" + p.string() + "'"; }

/// Token t of type T at `bytes`, as int64 (float tokens truncated, as numpy's astype does).
template <class T>
void widen(std::byte const* bytes, std::span<std::int64_t> out) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    T v;
    std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
    out[i] = static_cast<std::int64_t>(v);
  }
}

/// `v` as T, if T holds it exactly.
template <class T>
bool narrow(std::int64_t v, std::byte* out) {
  T t{};
  if constexpr (std::is_floating_point_v<T>) {
    constexpr std::int64_t exact = std::int64_t{1} << std::numeric_limits<T>::digits;
    if (v > exact || v < -exact) return false;
    t = static_cast<T>(v);
  } else {
    if (!std::in_range<T>(v)) return false;
    t = static_cast<T>(v);
  }
  std::memcpy(out, &t, sizeof(T));
  return true;
}

/// Calls f(T{}) with the C++ type of dtype `t`.
template <class F>
decltype(auto) with_token_type(token_dtype t, F&& f) {
  switch (t) {
    case token_dtype::uint8: return f(std::uint8_t{});
    case token_dtype::int8: return f(std::int8_t{});
    case token_dtype::int16: return f(std::int16_t{});
    case token_dtype::int32: return f(std::int32_t{});
    case token_dtype::int64: return f(std::int64_t{});
    case token_dtype::float64: return f(double{});
    case token_dtype::float32: return f(float{});
    case token_dtype::uint16: return f(std::uint16_t{});
  }
  throw std::logic_error("megamoe: unknown token dtype");
}

}  // namespace detail

MEGAMOE_DECL std::size_t size_of(token_dtype t) {
  return detail::with_token_type(t, [](auto v) { return sizeof(v); });
}

MEGAMOE_DECL std::string_view name_of(token_dtype t) {
  switch (t) {
    case token_dtype::uint8: return "uint8";
    case token_dtype::int8: return "int8";
    case token_dtype::int16: return "int16";
    case token_dtype::int32: return "int32";
    case token_dtype::int64: return "int64";
    case token_dtype::float64: return "float64";
    case token_dtype::float32: return "float32";
    case token_dtype::uint16: return "uint16";
  }
  return "unknown";
}

MEGAMOE_DECL token_dtype optimal_dtype(std::int64_t vocab_size) {
  return vocab_size < 65500 ? token_dtype::uint16 : token_dtype::int32;
}

MEGAMOE_DECL std::filesystem::path index_path(std::filesystem::path const& prefix) {
  return std::filesystem::path(prefix.string() + ".idx");
}

MEGAMOE_DECL std::filesystem::path data_path(std::filesystem::path const& prefix) {
  return std::filesystem::path(prefix.string() + ".bin");
}

MEGAMOE_DECL mapped_file::mapped_file(std::filesystem::path path) : path_(std::move(path)) {
  int const fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw input_error("indexed dataset: cannot open " + detail::quoted(path_) + ": " +
                      std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw input_error("indexed dataset: " + detail::quoted(path_) + " is not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int const e = errno;
      ::close(fd);
      throw input_error("indexed dataset: cannot map " + detail::quoted(path_) + ": " +
                        std::strerror(e));
    }
    data_ = static_cast<std::byte const*>(p);
  }
  ::close(fd);  // the map keeps the file
}

MEGAMOE_DECL mapped_file::~mapped_file() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

template <class T>
T indexed_dataset::field(std::size_t at) const {
  T v;
  std::memcpy(&v, index_.bytes().data() + at, sizeof(T));  // the arrays are not aligned
  return v;
}

MEGAMOE_DECL indexed_dataset::indexed_dataset(std::filesystem::path const& prefix,
                                              bool multimodal)
    : prefix_(prefix),
      index_(index_path(prefix)),
      data_(data_path(prefix)),
      multimodal_(multimodal) {
  auto const idx = detail::quoted(index_.path());
  auto const bad = [&](std::string const& what) {
    return input_error("indexed dataset: " + idx + " " + what);
  };
  auto const bytes = index_.bytes();
  if (bytes.size() < detail::index_header_bytes)
    throw bad("holds " + std::to_string(bytes.size()) + " bytes, fewer than the 34 of a header");
  if (std::memcmp(bytes.data(), detail::index_magic.data(), detail::index_magic.size()) != 0)
    throw bad("is not a Megatron index: its magic is not MMIDIDX\\0\\0");
  if (auto const version = field<std::uint64_t>(9); version != 1)
    throw bad("has version " + std::to_string(version) + "; only version 1 exists");
  auto const code = field<std::uint8_t>(17);
  if (code < 1 || code > 8)
    throw bad("has dtype code " + std::to_string(code) + "; Megatron's codes are 1 to 8");
  dtype_ = static_cast<token_dtype>(code);
  auto const s = field<std::uint64_t>(18), d = field<std::uint64_t>(26);
  // Counts beyond what any file could hold would overflow the size below.
  constexpr std::uint64_t limit = std::uint64_t{1} << 48;
  if (s > limit || d > limit)
    throw bad("claims " + std::to_string(s) + " sequences and " + std::to_string(d) +
              " document-index entries, more than a file holds");
  std::uint64_t const expected =
      detail::index_header_bytes + 12 * s + 8 * d + (multimodal ? s : 0);
  if (bytes.size() != expected)
    throw bad("holds " + std::to_string(bytes.size()) + " bytes; its header (" +
              std::to_string(s) + " sequences, " + std::to_string(d) +
              " document-index entries" + (multimodal ? ", multimodal" : "") + ") needs " +
              std::to_string(expected) + (bytes.size() < expected ? " (truncated)" : ""));
  sequences_ = static_cast<std::int64_t>(s);
  document_entries_ = static_cast<std::int64_t>(d);
  lengths_at_ = detail::index_header_bytes;
  pointers_at_ = lengths_at_ + 4 * s;
  documents_at_ = pointers_at_ + 8 * s;
  modes_at_ = documents_at_ + 8 * d;

  auto const item = static_cast<std::int64_t>(size_of(dtype_));
  std::int64_t expected_pointer = 0;
  for (std::int64_t i = 0; i < sequences_; ++i) {
    auto const length = sequence_length(i);
    if (length < 0)
      throw bad("gives sequence " + std::to_string(i) + " the negative length " +
                std::to_string(length));
    if (auto const pointer = sequence_pointer(i); pointer != expected_pointer)
      throw bad("points sequence " + std::to_string(i) + " at byte " + std::to_string(pointer) +
                " of the .bin, but the lengths before it end at byte " +
                std::to_string(expected_pointer));
    expected_pointer += length * item;
    tokens_ += length;
  }
  auto const bin_bytes = static_cast<std::int64_t>(data_.bytes().size());
  if (expected_pointer != bin_bytes)
    throw input_error("indexed dataset: " + detail::quoted(data_.path()) + " holds " +
                      std::to_string(bin_bytes) + " bytes, but " + idx + "'s sequences need " +
                      std::to_string(expected_pointer) + " (" + std::to_string(tokens_) + " " +
                      std::string(name_of(dtype_)) + " tokens)" +
                      (bin_bytes < expected_pointer ? ": the .bin is truncated" : ""));
  if (document_entries_ < 1 || document_index(0) != 0)
    throw bad("has a document index that does not start at sequence 0");
  for (std::int64_t k = 1; k < document_entries_; ++k)
    if (document_index(k) < document_index(k - 1))
      throw bad("has document index entry " + std::to_string(k) + " (" +
                std::to_string(document_index(k)) + ") before the one preceding it (" +
                std::to_string(document_index(k - 1)) + ")");
  if (document_index(document_entries_ - 1) != sequences_)
    throw bad("has a document index ending at sequence " +
              std::to_string(document_index(document_entries_ - 1)) + ", not at the " +
              std::to_string(sequences_) + " sequences it counts");
}

MEGAMOE_DECL std::int32_t indexed_dataset::sequence_length(std::int64_t i) const {
  return field<std::int32_t>(lengths_at_ + 4 * static_cast<std::size_t>(i));
}

MEGAMOE_DECL std::int64_t indexed_dataset::sequence_pointer(std::int64_t i) const {
  return field<std::int64_t>(pointers_at_ + 8 * static_cast<std::size_t>(i));
}

MEGAMOE_DECL std::int64_t indexed_dataset::document_index(std::int64_t k) const {
  return field<std::int64_t>(documents_at_ + 8 * static_cast<std::size_t>(k));
}

MEGAMOE_DECL std::int8_t indexed_dataset::sequence_mode(std::int64_t i) const {
  if (!multimodal_) throw std::logic_error("megamoe: sequence_mode of a dataset without modes");
  return field<std::int8_t>(modes_at_ + static_cast<std::size_t>(i));
}

MEGAMOE_DECL std::vector<std::int32_t> indexed_dataset::sequence_lengths() const {
  std::vector<std::int32_t> out(static_cast<std::size_t>(sequences_));
  std::memcpy(out.data(), index_.bytes().data() + lengths_at_, out.size() * 4);
  return out;
}

MEGAMOE_DECL std::vector<std::int64_t> indexed_dataset::sequence_pointers() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(sequences_));
  std::memcpy(out.data(), index_.bytes().data() + pointers_at_, out.size() * 8);
  return out;
}

MEGAMOE_DECL std::vector<std::int64_t> indexed_dataset::document_indices() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(document_entries_));
  std::memcpy(out.data(), index_.bytes().data() + documents_at_, out.size() * 8);
  return out;
}

MEGAMOE_DECL void indexed_dataset::check_sequence(std::int64_t i) const {
  if (i < 0 || i >= sequences_)
    throw std::out_of_range("indexed dataset: sequence " + std::to_string(i) + " of " +
                            std::to_string(sequences_));
}

MEGAMOE_DECL void indexed_dataset::read(std::int64_t i, std::int64_t offset,
                                        std::span<std::int64_t> out) const {
  check_sequence(i);
  auto const length = static_cast<std::int64_t>(out.size());
  if (offset < 0 || offset + length > sequence_length(i))
    throw std::out_of_range("indexed dataset: tokens [" + std::to_string(offset) + ", " +
                            std::to_string(offset + length) + ") of sequence " +
                            std::to_string(i) + ", which holds " +
                            std::to_string(sequence_length(i)));
  auto const item = size_of(dtype_);
  std::byte const* at = data_.bytes().data() + sequence_pointer(i) +
                        static_cast<std::size_t>(offset) * item;
  detail::with_token_type(dtype_, [&](auto v) { detail::widen<decltype(v)>(at, out); });
}

MEGAMOE_DECL std::vector<std::int64_t> indexed_dataset::get(
    std::int64_t i, std::int64_t offset, std::optional<std::int64_t> length) const {
  check_sequence(i);
  std::vector<std::int64_t> out(
      static_cast<std::size_t>(std::max<std::int64_t>(0, length.value_or(sequence_length(i) - offset))));
  read(i, offset, out);
  return out;
}

MEGAMOE_DECL indexed_dataset_builder::indexed_dataset_builder(std::filesystem::path const& bin,
                                                              token_dtype dtype, bool multimodal)
    : bin_path_(bin),
      bin_(std::make_unique<io::durable_file>(bin)),
      dtype_(dtype),
      multimodal_(multimodal) {}

MEGAMOE_DECL void indexed_dataset_builder::append(std::span<std::int64_t const> tokens) {
  if (bin_ == nullptr) throw std::logic_error("megamoe: indexed_dataset_builder after finalize");
  auto const item = size_of(dtype_);
  staging_.resize(tokens.size() * item);
  detail::with_token_type(dtype_, [&](auto v) {
    using T = decltype(v);
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (!detail::narrow<T>(tokens[i], staging_.data() + i * item))
        throw input_error("indexed dataset: token " + std::to_string(tokens[i]) +
                          " does not fit the dtype " + std::string(name_of(dtype_)) + " of " +
                          detail::quoted(bin_path_));
  });
  bin_->write(staging_);
}

MEGAMOE_DECL void indexed_dataset_builder::add_item(std::span<std::int64_t const> tokens,
                                                    std::int8_t mode) {
  if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw input_error("indexed dataset: a sequence of " + std::to_string(tokens.size()) +
                      " tokens; an index holds int32 lengths");
  append(tokens);
  lengths_.push_back(static_cast<std::int32_t>(tokens.size()));
  if (multimodal_) modes_.push_back(mode);
}

MEGAMOE_DECL void indexed_dataset_builder::end_document() {
  documents_.push_back(static_cast<std::int64_t>(lengths_.size()));
}

MEGAMOE_DECL void indexed_dataset_builder::add_document(std::span<std::int64_t const> tokens,
                                                        std::span<std::int64_t const> lengths,
                                                        std::span<std::int8_t const> modes) {
  std::int64_t total = 0;
  for (auto const l : lengths) {
    if (l < 0 || l > std::numeric_limits<std::int32_t>::max())
      throw input_error("indexed dataset: a sequence length of " + std::to_string(l));
    total += l;
  }
  if (total != static_cast<std::int64_t>(tokens.size()))
    throw input_error("indexed dataset: a document of " + std::to_string(tokens.size()) +
                      " tokens given sequence lengths adding up to " + std::to_string(total));
  if (multimodal_ && modes.size() != lengths.size())
    throw input_error("indexed dataset: a multimodal document needs a mode per sequence");
  append(tokens);
  for (auto const l : lengths) lengths_.push_back(static_cast<std::int32_t>(l));
  if (multimodal_) modes_.insert(modes_.end(), modes.begin(), modes.end());
  end_document();
}

MEGAMOE_DECL void indexed_dataset_builder::finalize(std::filesystem::path const& idx) {
  if (bin_ == nullptr) throw std::logic_error("megamoe: indexed_dataset_builder finalized twice");
  bin_->finish();
  bin_.reset();
  std::vector<std::byte> out;
  auto const put = [&](auto const& v) {
    auto const* p = reinterpret_cast<std::byte const*>(&v);
    out.insert(out.end(), p, p + sizeof(v));
  };
  for (char const c : detail::index_magic) put(c);
  put(std::uint64_t{1});
  put(static_cast<std::uint8_t>(dtype_));
  put(static_cast<std::uint64_t>(lengths_.size()));
  put(static_cast<std::uint64_t>(documents_.size()));
  for (auto const l : lengths_) put(l);
  auto const item = static_cast<std::int64_t>(size_of(dtype_));
  std::int64_t pointer = 0;
  for (auto const l : lengths_) {
    put(pointer);
    pointer += l * item;
  }
  for (auto const d : documents_) put(d);
  for (auto const m : modes_) put(m);
  io::durable_file file(idx);
  file.write(out);
  file.finish();
}

}  // namespace megamoe::data
