// SPDX-License-Identifier: Apache-2.0
// megamoe/io/checkpoint_index.hpp — what a checkpoint's index.json records and how it is named:
// the format and version, the iteration folder and rank file names, each tensor's dtype, shape,
// matrix form and pieces, and the check that the pieces cover a tensor exactly once.
//
// A piece is a rectangle [row, row + rows) x [col, col + cols) of a tensor's matrix form (a 1-D
// tensor is one row), stored in its rank's file under the key "name[r0:r1,c0:c1]" with the
// tensor's dtype, so numpy alone can read it (the index says where each piece belongs). The
// index holds no absolute paths: a copied checkpoint folder loads.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/io/files.hpp>
#include <megamoe/io/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace megamoe::io {

inline constexpr char const* checkpoint_format = "megamoe-checkpoint";
// 2: linear_qkv's rows per query group (its query heads, key, value), as the reference's.
inline constexpr int checkpoint_version = 2;
inline constexpr char const* checkpoint_tracker = "latest_checkpointed_iteration.txt";

/// "iter_0000042", as the reference names an iteration's folder.
MEGAMOE_DECL std::string iteration_folder(int iteration);
MEGAMOE_DECL std::string rank_file(int rank);

/// One rectangle of a tensor in a rank's file.
struct checkpoint_piece {
  int file = 0;
  std::string key;
  std::int64_t row = 0, col = 0, rows = 0, cols = 0;
  std::uint32_t crc = 0;
};

/// A tensor of a checkpoint: its dtype, its shape (the reference's), its matrix form and pieces.
struct checkpoint_tensor {
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;
  std::int64_t rows = 0, cols = 0;
  std::vector<checkpoint_piece> pieces;
};

namespace detail {

/// The key a piece is stored under in its rank's file: "name[r0:r1,c0:c1]".
MEGAMOE_DECL std::string piece_key(std::string const& name, global_rectangle const& r);

/// Every element of `t` in exactly one piece, every piece inside `t`; else why not.
MEGAMOE_DECL std::string coverage_problem(std::string const& name, checkpoint_tensor const& t);

MEGAMOE_DECL nlohmann::json tensor_json(checkpoint_tensor const& t);

MEGAMOE_DECL std::uint32_t parse_crc(std::string const& text);

MEGAMOE_DECL checkpoint_tensor tensor_of_json(nlohmann::json const& j);

}  // namespace detail

}  // namespace megamoe::io

#if MEGAMOE_HEADER_ONLY
#include <megamoe/io/checkpoint_index.ipp>
#endif
