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
#include <megamoe/core/compiled_once.hpp>
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

/// The element types megamoe writes, and F16, which Hugging Face checkpoints may hold (read only).
enum class dtype { f32, f64, i64, i32, u8, bf16, f16 };

inline constexpr char const* dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f64: return "F64";
    case dtype::i64: return "I64";
    case dtype::i32: return "I32";
    case dtype::u8: return "U8";
    case dtype::bf16: return "BF16";
    case dtype::f16: return "F16";
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
    case dtype::bf16:
    case dtype::f16: return 2;
  }
  return 0;
}
MEGAMOE_DECL std::optional<dtype> parse_dtype(std::string const& name);
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
MEGAMOE_DECL std::int64_t element_count(std::span<std::int64_t const> shape);

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

  [[nodiscard]] safetensors_entry const* find(std::string const& name) const;
};

/// Writes `tensors` and `metadata` to `file` (not finished: the caller flushes it).
MEGAMOE_DECL void write_safetensors(durable_file& file, std::vector<tensor_bytes> const& tensors,
                                    std::map<std::string, std::string> const& metadata = {});

/// Reads and checks the header of `file`.
MEGAMOE_DECL safetensors_header read_safetensors_header(readable_file const& file);

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
MEGAMOE_DECL void write_safetensors(std::filesystem::path const& path,
                                    std::vector<tensor_bytes> const& tensors,
                                    std::map<std::string, std::string> const& metadata = {});

/// Writes `tensors` (F32) and `metadata` to `path`, replacing it whole.
MEGAMOE_DECL void write_safetensors(std::filesystem::path const& path,
                                    std::vector<tensor_view> const& tensors,
                                    std::map<std::string, std::string> const& metadata = {});

/// Reads every tensor of a safetensors file as fp32 (F32 tensors only).
MEGAMOE_DECL std::map<std::string, tensor_data> read_safetensors(std::filesystem::path const& path);

/// The metadata of a safetensors file.
MEGAMOE_DECL std::map<std::string, std::string> read_safetensors_metadata(
    std::filesystem::path const& path);

}  // namespace megamoe::io

#if MEGAMOE_HEADER_ONLY
#include <megamoe/io/safetensors.ipp>
#endif
