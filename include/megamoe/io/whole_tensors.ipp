// SPDX-License-Identifier: Apache-2.0
// megamoe/io/whole_tensors.ipp — the definitions behind whole_tensors.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/io/whole_tensors.hpp>

namespace megamoe::io {

MEGAMOE_DECL std::vector<std::int64_t> reference_shape(std::string_view name, std::int64_t rows,
                                                       std::int64_t cols) {
  bool const vector = rows == 1 && (name.find("norm") != std::string_view::npos ||
                                    name.find(".bias") != std::string_view::npos ||
                                    name.find("expert_bias") != std::string_view::npos);
  if (vector) return {cols};
  return {rows, cols};
}

}  // namespace megamoe::io

namespace megamoe::io {

MEGAMOE_DECL auto whole_tensors::write(std::filesystem::path const& path,
                                       std::map<std::string, std::string> const& metadata) const
    -> void {
  std::vector<tensor_bytes> tensors;
  tensors.reserve(tensors_.size());
  for (auto const& [name, t] : tensors_)
    tensors.push_back({name, t.type, t.shape, std::span<std::byte const>(t.bytes)});
  write_safetensors(path, tensors, metadata);
}

}  // namespace megamoe::io
