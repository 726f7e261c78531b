// SPDX-License-Identifier: Apache-2.0
// megamoe/io/checkpoint_index.ipp — the definitions behind checkpoint_index.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/io/checkpoint_index.hpp>

namespace megamoe::io {

MEGAMOE_DECL std::string iteration_folder(int iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07d", iteration);
  return name;
}

MEGAMOE_DECL std::string rank_file(int rank) {
  char name[40];
  std::snprintf(name, sizeof name, "rank_%05d.safetensors", rank);
  return name;
}
}  // namespace megamoe::io

namespace megamoe::io::detail {

MEGAMOE_DECL std::string piece_key(std::string const& name, global_rectangle const& r) {
  return name + "[" + std::to_string(r.row) + ":" + std::to_string(r.row + r.rows) + "," +
         std::to_string(r.col) + ":" + std::to_string(r.col + r.cols) + "]";
}

MEGAMOE_DECL std::string coverage_problem(std::string const& name, checkpoint_tensor const& t) {
  std::int64_t volume = 0;
  for (auto const& p : t.pieces) {
    if (p.rows < 1 || p.cols < 1 || p.row < 0 || p.col < 0 || p.row + p.rows > t.rows ||
        p.col + p.cols > t.cols)
      return name + " has a piece outside its [" + std::to_string(t.rows) + ", " +
             std::to_string(t.cols) + "] (" + p.key + ")";
    volume += p.rows * p.cols;
  }
  auto pieces = t.pieces;
  std::sort(pieces.begin(), pieces.end(), [](auto const& a, auto const& b) {
    return std::tie(a.row, a.col) < std::tie(b.row, b.col);
  });
  for (std::size_t i = 0; i < pieces.size(); ++i)
    for (std::size_t j = i + 1; j < pieces.size() && pieces[j].row < pieces[i].row + pieces[i].rows;
         ++j)
      if (pieces[j].col < pieces[i].col + pieces[i].cols &&
          pieces[i].col < pieces[j].col + pieces[j].cols)
        return name + " has overlapping pieces " + pieces[i].key + " and " + pieces[j].key;
  if (volume != t.rows * t.cols)
    return name + " is not whole: its pieces hold " + std::to_string(volume) + " of its " +
           std::to_string(t.rows * t.cols) + " elements";
  return {};
}

MEGAMOE_DECL nlohmann::json tensor_json(checkpoint_tensor const& t) {
  nlohmann::json pieces = nlohmann::json::array();
  for (auto const& p : t.pieces)
    pieces.push_back({{"file", p.file},
                      {"key", p.key},
                      {"offset", {p.row, p.col}},
                      {"shape", {p.rows, p.cols}},
                      {"crc32", crc_text(p.crc)}});
  return {{"dtype", dtype_name(t.type)},
          {"shape", t.shape},
          {"matrix", {t.rows, t.cols}},
          {"pieces", pieces}};
}

MEGAMOE_DECL std::uint32_t parse_crc(std::string const& text) {
  if (text.size() != 8 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw input_error("not a CRC-32: '" + text + "'");
  return static_cast<std::uint32_t>(std::stoul(text, nullptr, 16));
}

MEGAMOE_DECL checkpoint_tensor tensor_of_json(nlohmann::json const& j) {
  checkpoint_tensor t;
  auto const type = parse_dtype(j.at("dtype").get<std::string>());
  if (!type) throw input_error("unknown dtype " + j.at("dtype").dump());
  t.type = *type;
  t.shape = j.at("shape").get<std::vector<std::int64_t>>();
  auto const matrix = j.at("matrix").get<std::vector<std::int64_t>>();
  if (matrix.size() != 2 || matrix[0] < 1 || matrix[1] < 1 ||
      matrix[0] * matrix[1] != element_count(t.shape))
    throw input_error("matrix form " + j.at("matrix").dump() + " does not fit its shape");
  t.rows = matrix[0];
  t.cols = matrix[1];
  for (auto const& p : j.at("pieces")) {
    checkpoint_piece piece;
    piece.file = p.at("file").get<int>();
    piece.key = p.at("key").get<std::string>();
    auto const offset = p.at("offset").get<std::vector<std::int64_t>>();
    auto const shape = p.at("shape").get<std::vector<std::int64_t>>();
    if (offset.size() != 2 || shape.size() != 2) throw input_error("a piece is not 2-D");
    piece.row = offset[0];
    piece.col = offset[1];
    piece.rows = shape[0];
    piece.cols = shape[1];
    piece.crc = parse_crc(p.at("crc32").get<std::string>());
    t.pieces.push_back(std::move(piece));
  }
  return t;
}

}  // namespace megamoe::io::detail
