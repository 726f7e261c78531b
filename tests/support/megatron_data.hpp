// SPDX-License-Identifier: Apache-2.0
// Reading the vectors Megatron's data pipeline made (tests/data/megatron_data, README there):
// JSON files, raw bytes, and array summaries checked whole by their FNV-1a hash.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace megamoe::test {

inline std::filesystem::path megatron_data() {
  return std::filesystem::path(MEGAMOE_TEST_DATA) / "megatron_data";
}

inline nlohmann::json read_json(std::filesystem::path const& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

inline std::vector<char> read_bytes(std::filesystem::path const& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// 64-bit FNV-1a over each value as 8 little-endian bytes, as the summaries' fnv1a64_int64.
inline std::string fnv1a64(std::vector<std::int64_t> const& values) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::int64_t const v : values)
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<std::uint64_t>(v) >> (8 * b)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

/// Expects `values` (row-major, `width` per row) to be the array `summary` describes: its length,
/// head and tail, and its hash over the whole.
inline void expect_summary(std::vector<std::int64_t> const& values, nlohmann::json const& summary,
                           std::string const& what, std::size_t width = 1) {
  auto const flat = [&](nlohmann::json const& rows) {
    std::vector<std::int64_t> out;
    for (auto const& r : rows)
      if (width == 1) {
        out.push_back(r.get<std::int64_t>());
      } else {
        for (auto const& x : r) out.push_back(x.get<std::int64_t>());
      }
    return out;
  };
  ASSERT_EQ(values.size(), summary["length"].get<std::size_t>() * width) << what;
  auto const head = flat(summary["head"]);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), values.begin())) << what << ": head";
  if (!summary["complete"].get<bool>()) {
    auto const tail = flat(summary["tail"]);
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), values.end() - static_cast<long>(tail.size())))
        << what << ": tail";
  }
  EXPECT_EQ(fnv1a64(values), summary["fnv1a64_int64"].get<std::string>()) << what << ": hash";
}

}  // namespace megamoe::test
