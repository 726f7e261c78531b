// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/rank_generator.ipp — the definitions behind rank_generator.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/rank_generator.hpp>

namespace megamoe::parallel {

MEGAMOE_DECL rank_generator::rank_generator(int tp, int cp, int ep, int dp, int pp,
                                            std::string_view order) {
  std::array<std::pair<std::string_view, int>, 5> const sizes{
      {{"tp", tp}, {"cp", cp}, {"ep", ep}, {"dp", dp}, {"pp", pp}}};
  for (auto const& [name, size] : sizes)
    if (size < 1)
      throw input_error("rank_generator: axis " + std::string(name) + " has size " +
                        std::to_string(size) + "; every axis needs at least 1");
  if (cp > 1 && ep > 1)
    throw input_error("rank_generator: cp and ep cannot both exceed 1 in one grid (cp " +
                      std::to_string(cp) + ", ep " + std::to_string(ep) + ")");
  for (auto const& token : split(order)) {
    auto const it = std::find_if(sizes.begin(), sizes.end(),
                                 [&](auto const& entry) { return entry.first == token; });
    if (it == sizes.end())
      throw input_error("rank_generator: unknown axis '" + token + "' in order '" +
                        std::string(order) + "' (axes are tp, cp, ep, dp, pp)");
    if (std::find(names_.begin(), names_.end(), token) != names_.end())
      throw input_error("rank_generator: axis '" + token + "' appears twice in order '" +
                        std::string(order) + "'");
    names_.push_back(token);
    sizes_.push_back(it->second);
  }
  for (auto const& [name, size] : sizes) {
    if (std::find(names_.begin(), names_.end(), name) != names_.end()) continue;
    if (size != 1)
      throw input_error("rank_generator: axis " + std::string(name) + " has size " +
                        std::to_string(size) + " but is missing from order '" + std::string(order) +
                        "'");
    names_.emplace_back(name);
    sizes_.push_back(1);
  }
  world_size_ = 1;
  for (int s : sizes_) world_size_ *= s;
}

MEGAMOE_DECL std::string rank_generator::order() const {
  std::string text;
  for (auto const& name : names_) text += (text.empty() ? "" : "-") + name;
  return text;
}

MEGAMOE_DECL rank_groups rank_generator::groups(std::string_view axes) const {
  std::vector<bool> masked(names_.size(), false);
  for (auto const& token : split(axes)) {
    auto const it = std::find(names_.begin(), names_.end(), token);
    if (it == names_.end())
      throw input_error("rank_generator: unknown axis '" + token + "' in group type '" +
                        std::string(axes) + "'");
    masked[static_cast<std::size_t>(it - names_.begin())] = true;
  }
  std::vector<int> in_sizes, in_strides, out_sizes, out_strides;
  int stride = 1;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    (masked[i] ? in_sizes : out_sizes).push_back(sizes_[i]);
    (masked[i] ? in_strides : out_strides).push_back(stride);
    stride *= sizes_[i];
  }
  int const group_size = product(in_sizes);
  int const group_count = world_size_ / group_size;
  rank_groups result(static_cast<std::size_t>(group_count));
  for (int g = 0; g < group_count; ++g) {
    int const base = offset(g, out_sizes, out_strides);
    auto& group = result[static_cast<std::size_t>(g)];
    group.reserve(static_cast<std::size_t>(group_size));
    for (int r = 0; r < group_size; ++r) group.push_back(base + offset(r, in_sizes, in_strides));
  }
  return result;
}

MEGAMOE_DECL std::vector<std::string> rank_generator::split(std::string_view text) {
  std::vector<std::string> tokens;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t const end = std::min(text.find('-', start), text.size());
    tokens.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return tokens;
}

MEGAMOE_DECL int rank_generator::product(std::vector<int> const& values) {
  int p = 1;
  for (int v : values) p *= v;
  return p;
}

MEGAMOE_DECL int rank_generator::offset(int index, std::vector<int> const& sizes,
                                        std::vector<int> const& strides) {
  int rank = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    rank += (index % sizes[i]) * strides[i];
    index /= sizes[i];
  }
  return rank;
}

}  // namespace megamoe::parallel
