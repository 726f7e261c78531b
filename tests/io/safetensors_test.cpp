// SPDX-License-Identifier: Apache-2.0
// safetensors: a written file read back (names, shapes, values, 8-byte aligned data), its header
// as the format defines it, and malformed input.
#include <megamoe/io/safetensors.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

namespace mio = megamoe::io;

TEST(Safetensors, WrittenTensorsReadBackWithTheirShapes) {
  auto const path = std::filesystem::temp_directory_path() / "megamoe_test.safetensors";
  std::vector<float> const a{1.0f, -2.5f, 3.25f, 4.0f, 5.0f, 6.0f}, b{0.125f, 7.0f, -1e-3f};
  mio::write_safetensors(path, {{"layer.weight", {2, 3}, a}, {"norm.weight", {3}, b}},
                         {{"producer", "test"}});
  std::ifstream in(path, std::ios::binary);
  std::uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), sizeof length);
  EXPECT_EQ(length % 8, 0u);
  std::string header(length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(length));
  auto const json = nlohmann::json::parse(header);
  EXPECT_EQ(json["layer.weight"]["dtype"], "F32");
  EXPECT_EQ(json["norm.weight"]["data_offsets"][0], 24);
  EXPECT_EQ(json["norm.weight"]["data_offsets"][1], 36);
  EXPECT_EQ(json["__metadata__"]["producer"], "test");
  auto const tensors = mio::read_safetensors(path);
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors.at("layer.weight").shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(tensors.at("layer.weight").values, a);
  EXPECT_EQ(tensors.at("norm.weight").shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(tensors.at("norm.weight").values, b);
  EXPECT_THROW(mio::write_safetensors(path, {{"bad", {2, 2}, a}}), megamoe::input_error);
  std::ofstream(path, std::ios::trunc) << "nonsense";
  EXPECT_THROW(mio::read_safetensors(path), megamoe::input_error);
  std::filesystem::remove(path);
}
