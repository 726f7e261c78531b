// SPDX-License-Identifier: Apache-2.0
// megamoe/io/safetensors.hpp — the safetensors format: an 8-byte little-endian header length, a
// JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, ..., "__metadata__":
// {string: string}} and the tensors' little-endian bytes, row-major, in header order. PyTorch
// users load the files with `safetensors.torch.load_file`; numpy users read the header and
// `numpy.frombuffer` the bytes.
//
// Reading checks everything a damaged file could break: the header length against the file, the
// JSON, each dtype, each tensor's bytes against its shape and the file, and that no two tensors
// overlap.
#pragma once

#include <megamoe/core/bf16.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/io/files.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace megamoe::io {

static_assert(std::endian::native == std::endian::little,
              "megamoe: safetensors are little-endian; this writer copies native bytes");

/// The element types megamoe writes.
enum class dtype { f32, f64, i64, i32, u8, bf16 };

inline constexpr char const* dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f64: return "F64";
    case dtype::i64: return "I64";
    case dtype::i32: return "I32";
    case dtype::u8: return "U8";
    case dtype::bf16: return "BF16";
  }
  return "?";
}
inline constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
    case dtype::i32: return 4;
    case dtype::f64:
    case dtype::i64: return 8;
    case dtype::u8: return 1;
    case dtype::bf16: return 2;
  }
  return 0;
}
inline std::optional<dtype> parse_dtype(std::string const& name) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::i64, dtype::i32, dtype::u8, dtype::bf16})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}
/// The dtype of a C++ element type.
template <class T>
inline constexpr dtype dtype_of = [] {
  if constexpr (std::is_same_v<T, float>)
    return dtype::f32;
  else if constexpr (std::is_same_v<T, double>)
    return dtype::f64;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return dtype::i64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return dtype::i32;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return dtype::u8;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return dtype::bf16;
  else
    static_assert(sizeof(T) == 0, "megamoe: no safetensors dtype for this type");
}();

/// Elements of a shape.
inline std::int64_t element_count(std::span<std::int64_t const> shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

/// One tensor to write: its bytes, row-major.
struct tensor_bytes {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;
  std::span<std::byte const> bytes;
};

/// A tensor of a file: where its bytes lie in the file.
struct safetensors_entry {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // absolute offsets in the file
};

/// A file's header, checked against the file's size.
struct safetensors_header {
  std::vector<safetensors_entry> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;

  [[nodiscard]] safetensors_entry const* find(std::string const& name) const {
    for (auto const& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

/// Writes `tensors` and `metadata` to `file` (not finished: the caller flushes it).
inline void write_safetensors(durable_file& file, std::vector<tensor_bytes> const& tensors,
                              std::map<std::string, std::string> const& metadata = {}) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (auto const& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || header.contains(t.name))
      throw input_error("safetensors: the tensor name '" + t.name + "' is empty or repeated");
    auto const count = element_count(t.shape);
    if (count < 0 || static_cast<std::uint64_t>(count) * dtype_size(t.type) != t.bytes.size())
      throw input_error("safetensors: " + t.name + " has " + std::to_string(t.bytes.size()) +
                        " bytes for its shape");
    header[t.name] = {{"dtype", dtype_name(t.type)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  std::uint64_t const length = text.size();
  file.write(std::as_bytes(std::span(&length, 1)));
  file.write(text);
  for (auto const& t : tensors) file.write(t.bytes);
}

/// Reads and checks the header of `file`.
inline safetensors_header read_safetensors_header(readable_file const& file) {
  auto const bad = [&](std::string const& why) {
    return input_error("safetensors: " + file.path().string() + ": " + why);
  };
  if (file.size() < 8)
    throw bad("shorter than a header (" + std::to_string(file.size()) + " bytes)");
  std::uint64_t length = 0;
  file.read(0, std::as_writable_bytes(std::span(&length, 1)));
  if (length > file.size() - 8 || length > (std::uint64_t{1} << 30))
    throw bad("the header length " + std::to_string(length) + " exceeds the file");
  std::string text(length, '\0');
  file.read(8, std::as_writable_bytes(std::span(text.data(), text.size())));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (nlohmann::json::exception const& e) {
    throw bad(std::string("the header is not JSON (") + e.what() + ")");
  }
  if (!json.is_object()) throw bad("the header is not a JSON object");
  safetensors_header out;
  out.data_start = 8 + length;
  std::uint64_t const data_bytes = file.size() - out.data_start;
  try {
    for (auto const& [name, entry] : json.items()) {
      if (name == "__metadata__") {
        out.metadata = entry.get<std::map<std::string, std::string>>();
        continue;
      }
      auto const type = parse_dtype(entry.at("dtype").get<std::string>());
      if (!type) throw bad(name + " has the unknown dtype " + entry.at("dtype").dump());
      safetensors_entry t{name, *type, entry.at("shape").get<std::vector<std::int64_t>>(), 0, 0};
      auto const offsets = entry.at("data_offsets").get<std::vector<std::uint64_t>>();
      if (offsets.size() != 2 || offsets[1] < offsets[0] || offsets[1] > data_bytes)
        throw bad(name + " lies outside the file (data_offsets " + entry.at("data_offsets").dump() +
                  ", " + std::to_string(data_bytes) + " data bytes)");
      if (std::any_of(t.shape.begin(), t.shape.end(), [](auto d) { return d < 0; }) ||
          static_cast<std::uint64_t>(element_count(t.shape)) * dtype_size(*type) !=
              offsets[1] - offsets[0])
        throw bad(name + "'s bytes do not match its shape");
      t.begin = out.data_start + offsets[0];
      t.end = out.data_start + offsets[1];
      out.tensors.push_back(std::move(t));
    }
  } catch (nlohmann::json::exception const& e) {
    throw bad(std::string("malformed header (") + e.what() + ")");
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](auto const& a, auto const& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < out.tensors.size(); ++i)
    if (out.tensors[i].begin < out.tensors[i - 1].end)
      throw bad(out.tensors[i - 1].name + " and " + out.tensors[i].name + " overlap");
  return out;
}

/// Reads tensor `t`'s elements as T (its dtype must be T's).
template <class T>
std::vector<T> read_tensor(readable_file const& file, safetensors_entry const& t) {
  if (t.type != dtype_of<T>)
    throw input_error("safetensors: " + file.path().string() + ": " + t.name + " is " +
                      dtype_name(t.type) + ", expected " + dtype_name(dtype_of<T>));
  std::vector<T> out(static_cast<std::size_t>((t.end - t.begin) / sizeof(T)));
  file.read(t.begin, std::as_writable_bytes(std::span(out)));
  return out;
}

// --- Whole files of fp32 tensors (model.safetensors)
// --------------------------------------------

/// One fp32 tensor to write, row-major.
struct tensor_view {
  std::string name;
  std::vector<std::int64_t> shape;
  std::span<float const> values;
};

/// An fp32 tensor read back.
struct tensor_data {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

/// Writes `tensors` and `metadata` to `path`, replacing it whole (a temporary file and a rename:
/// a reader never sees a part).
inline void write_safetensors(std::filesystem::path const& path,
                              std::vector<tensor_bytes> const& tensors,
                              std::map<std::string, std::string> const& metadata = {}) {
  auto const folder = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  auto const temporary = folder / ("." + path.filename().string() + ".partial");
  durable_file file(temporary);
  write_safetensors(file, tensors, metadata);
  file.finish();
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error)
    throw input_error("safetensors: cannot write " + path.string() + ": " + error.message());
}

/// Writes `tensors` (F32) and `metadata` to `path`, replacing it whole.
inline void write_safetensors(std::filesystem::path const& path,
                              std::vector<tensor_view> const& tensors,
                              std::map<std::string, std::string> const& metadata = {}) {
  std::vector<tensor_bytes> bytes;
  for (auto const& t : tensors) {
    if (element_count(t.shape) != static_cast<std::int64_t>(t.values.size()))
      throw input_error("safetensors: " + t.name + " has " + std::to_string(t.values.size()) +
                        " values for its shape");
    bytes.push_back({t.name, dtype::f32, t.shape, std::as_bytes(t.values)});
  }
  write_safetensors(path, bytes, metadata);
}

/// Reads every tensor of a safetensors file as fp32 (F32 tensors only).
inline std::map<std::string, tensor_data> read_safetensors(std::filesystem::path const& path) {
  readable_file const file(path);
  auto const header = read_safetensors_header(file);
  std::map<std::string, tensor_data> out;
  for (auto const& t : header.tensors)
    out.emplace(t.name, tensor_data{t.shape, read_tensor<float>(file, t)});
  return out;
}

/// The metadata of a safetensors file.
inline std::map<std::string, std::string> read_safetensors_metadata(
    std::filesystem::path const& path) {
  return read_safetensors_header(readable_file(path)).metadata;
}

}  // namespace megamoe::io
