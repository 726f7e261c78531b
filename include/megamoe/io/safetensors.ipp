// SPDX-License-Identifier: Apache-2.0
// megamoe/io/safetensors.ipp — the definitions behind safetensors.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/io/safetensors.hpp>

namespace megamoe::io {

MEGAMOE_DECL std::optional<dtype> parse_dtype(std::string const& name) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::i64, dtype::i32, dtype::u8, dtype::bf16,
                  dtype::f16})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

MEGAMOE_DECL std::int64_t element_count(std::span<std::int64_t const> shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

MEGAMOE_DECL void write_safetensors(durable_file& file, std::vector<tensor_bytes> const& tensors,
                                    std::map<std::string, std::string> const& metadata) {
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

MEGAMOE_DECL safetensors_header read_safetensors_header(readable_file const& file) {
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

MEGAMOE_DECL void write_safetensors(std::filesystem::path const& path,
                                    std::vector<tensor_bytes> const& tensors,
                                    std::map<std::string, std::string> const& metadata) {
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

MEGAMOE_DECL void write_safetensors(std::filesystem::path const& path,
                                    std::vector<tensor_view> const& tensors,
                                    std::map<std::string, std::string> const& metadata) {
  std::vector<tensor_bytes> bytes;
  for (auto const& t : tensors) {
    if (element_count(t.shape) != static_cast<std::int64_t>(t.values.size()))
      throw input_error("safetensors: " + t.name + " has " + std::to_string(t.values.size()) +
                        " values for its shape");
    bytes.push_back({t.name, dtype::f32, t.shape, std::as_bytes(t.values)});
  }
  write_safetensors(path, bytes, metadata);
}

MEGAMOE_DECL std::map<std::string, tensor_data> read_safetensors(
    std::filesystem::path const& path) {
  readable_file const file(path);
  auto const header = read_safetensors_header(file);
  std::map<std::string, tensor_data> out;
  for (auto const& t : header.tensors)
    out.emplace(t.name, tensor_data{t.shape, read_tensor<float>(file, t)});
  return out;
}

MEGAMOE_DECL std::map<std::string, std::string> read_safetensors_metadata(
    std::filesystem::path const& path) {
  return read_safetensors_header(readable_file(path)).metadata;
}

}  // namespace megamoe::io

namespace megamoe::io {

MEGAMOE_DECL auto safetensors_header::find(std::string const& name) const
    -> safetensors_entry const* {
  for (auto const& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace megamoe::io
