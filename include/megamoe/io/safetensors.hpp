// SPDX-License-Identifier: Apache-2.0
// megamoe/io/safetensors.hpp — writing and reading the safetensors format: an 8-byte little-endian
// header length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}} and the tensors' little-endian bytes, row-major, in header order.
// PyTorch users load the files with `safetensors.torch.load_file`.
#pragma once

#include <megamoe/core/error.hpp>

#include <nlohmann/json.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace megamoe::io {

static_assert(std::endian::native == std::endian::little,
              "megamoe: safetensors are little-endian; this writer copies native bytes");

/// One tensor to write: fp32 values, row-major.
struct tensor_view {
  std::string name;
  std::vector<std::int64_t> shape;
  std::span<float const> values;
};

/// A tensor read back.
struct tensor_data {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

/// Writes `tensors` (F32) and `metadata` (string values) to `path`, replacing it.
inline void write_safetensors(std::filesystem::path const& path,
                              std::vector<tensor_view> const& tensors,
                              std::map<std::string, std::string> const& metadata = {}) {
  nlohmann::ordered_json header;
  std::uint64_t offset = 0;
  for (auto const& t : tensors) {
    std::int64_t count = 1;
    for (auto d : t.shape) count *= d;
    if (count != static_cast<std::int64_t>(t.values.size()))
      throw input_error("safetensors: " + t.name + " has " + std::to_string(t.values.size()) +
                        " values for its shape");
    std::uint64_t const bytes = t.values.size() * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw input_error("safetensors: cannot write " + path.string());
  std::uint64_t const length = text.size();
  out.write(reinterpret_cast<char const*>(&length), sizeof length);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (auto const& t : tensors)
    out.write(reinterpret_cast<char const*>(t.values.data()),
              static_cast<std::streamsize>(t.values.size() * sizeof(float)));
  if (!out) throw input_error("safetensors: writing " + path.string() + " failed");
}

/// Reads every F32 tensor of a safetensors file.
inline std::map<std::string, tensor_data> read_safetensors(std::filesystem::path const& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("safetensors: cannot read " + path.string());
  std::uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), sizeof length);
  if (!in || length > (std::uint64_t{1} << 30))
    throw input_error("safetensors: " + path.string() + " has no valid header");
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  auto const header = nlohmann::json::parse(text);
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, tensor_data> out;
  for (auto const& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (entry.at("dtype") != "F32") throw input_error("safetensors: " + name + " is not F32");
    auto const begin = entry.at("data_offsets")[0].get<std::uint64_t>();
    auto const end = entry.at("data_offsets")[1].get<std::uint64_t>();
    if (end < begin || end > data.size())
      throw input_error("safetensors: " + name + " lies outside the file");
    tensor_data t;
    t.shape = entry.at("shape").get<std::vector<std::int64_t>>();
    t.values.resize((end - begin) / sizeof(float));
    std::memcpy(t.values.data(), data.data() + begin, end - begin);
    out.emplace(name, std::move(t));
  }
  return out;
}

}  // namespace megamoe::io
