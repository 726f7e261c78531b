// SPDX-License-Identifier: Apache-2.0
// megamoe/io/checkpoint_reader.hpp — loading a checkpoint: the tracker, the index and every
// file checked, then any rectangle of any tensor read from the pieces that hold it.
//
// Checked: the reader refuses, naming the file and the reason, a missing tracker or index,
// another format, a missing, truncated or corrupted file (whole-file and per-piece CRC-32), a
// tensor that is absent, of another dtype (F32 and BF16 read into each other) or shape, or not
// covered.
#pragma once

#include <megamoe/core/bf16.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/io/checkpoint_index.hpp>
#include <megamoe/io/files.hpp>
#include <megamoe/io/safetensors.hpp>
#include <megamoe/parallel/environment.hpp>

#include <boost/mpi/collectives/broadcast.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/serialization/string.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe::io {

namespace detail {

/// Whether a tensor stored as `stored` reads into T by conversion: F32 and BF16 into each other
/// (Adam's moments saved under one --exp-avg-dtype load under the other: BF16 widens exactly,
/// F32 rounds to nearest even).
template <class T>
bool converts(dtype stored) {
  return (std::is_same_v<T, float> && stored == dtype::bf16) ||
         (std::is_same_v<T, bfloat16> && stored == dtype::f32);
}

/// Elements [first, first + count) of a piece's bytes, stored as `stored`, into `out` as T.
template <class T>
void copy_as(dtype stored, std::byte const* bytes, std::int64_t first, std::int64_t count, T* out) {
  if (stored == dtype_of<T>) {
    std::memcpy(out, bytes + first * static_cast<std::int64_t>(sizeof(T)),
                static_cast<std::size_t>(count) * sizeof(T));
  } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16>) {
    using stored_type = std::conditional_t<std::is_same_v<T, float>, bfloat16, float>;
    stored_type element;
    for (std::int64_t i = 0; i < count; ++i) {
      std::memcpy(&element, bytes + (first + i) * static_cast<std::int64_t>(sizeof(stored_type)),
                  sizeof element);
      out[i] = static_cast<T>(element);
    }
  }
}

}  // namespace detail

/// A checkpoint opened for reading: its index, checked, and every file's size and CRC-32.
class checkpoint_reader {
 public:
  /// The iteration `root`'s tracker names (collective: every rank gets it, or the same error).
  static int latest_iteration(boost::mpi::communicator const& world,
                              std::filesystem::path const& root);

  /// Opens iteration `iteration` of `root` (collective).
  checkpoint_reader(boost::mpi::communicator const& world, std::filesystem::path root,
                    int iteration);

  [[nodiscard]] int iteration() const noexcept { return iteration_; }
  [[nodiscard]] std::filesystem::path const& folder() const noexcept { return folder_; }
  [[nodiscard]] nlohmann::json const& state() const noexcept { return state_; }
  [[nodiscard]] int saved_world_size() const noexcept { return world_size_; }
  /// Seconds the constructor took (the index read and every file's CRC-32 checked).
  [[nodiscard]] double open_seconds() const noexcept { return open_seconds_; }
  [[nodiscard]] std::map<std::string, checkpoint_tensor> const& tensors() const noexcept;
  [[nodiscard]] bool contains(std::string const& name) const { return tensors_.contains(name); }
  [[nodiscard]] std::uint64_t bytes() const noexcept;
  /// The tensor `name`; a clear error when the checkpoint lacks it.
  [[nodiscard]] checkpoint_tensor const& tensor(std::string const& name) const;

  /// Reads rectangle `r` of tensor `name`, whose matrix form must be [rows, cols] and dtype T's,
  /// into `out` (r.rows x r.cols, row-major). Local; every piece read is checked against its
  /// CRC-32.
  template <class T>
  void read(std::string const& name, std::int64_t rows, std::int64_t cols,
            global_rectangle const& r, T* out) {
    auto const& t = tensor(name);
    if (t.rows != rows || t.cols != cols)
      throw input_error("checkpoint " + folder_.string() + " holds " + name + " as [" +
                        std::to_string(t.rows) + ", " + std::to_string(t.cols) +
                        "], this model's is [" + std::to_string(rows) + ", " +
                        std::to_string(cols) + "] (saved by another model?)");
    if (t.type != dtype_of<T> && !detail::converts<T>(t.type))
      throw input_error("checkpoint " + folder_.string() + " holds " + name + " as " +
                        dtype_name(t.type) + ", this model's is " + dtype_name(dtype_of<T>));
    std::int64_t covered = 0;
    for (auto const& p : t.pieces) {
      std::int64_t const r0 = std::max(r.row, p.row), r1 = std::min(r.row + r.rows, p.row + p.rows);
      std::int64_t const c0 = std::max(r.col, p.col), c1 = std::min(r.col + r.cols, p.col + p.cols);
      if (r0 >= r1 || c0 >= c1) continue;
      auto const& bytes = piece_bytes(p, t);
      for (std::int64_t row = r0; row < r1; ++row)
        detail::copy_as(t.type, bytes.data(), (row - p.row) * p.cols + (c0 - p.col), c1 - c0,
                        out + (row - r.row) * r.cols + (c0 - r.col));
      covered += (r1 - r0) * (c1 - c0);
    }
    if (covered != r.rows * r.cols)
      throw input_error("checkpoint " + folder_.string() + ": " + name + " is missing part of " +
                        detail::piece_key(name, r));
  }
  /// Reads a whole tensor.
  template <class T>
  std::vector<T> read_whole(std::string const& name) {
    auto const& t = tensor(name);
    std::vector<T> out(static_cast<std::size_t>(t.rows * t.cols));
    read(name, t.rows, t.cols, global_rectangle{0, 0, 0, t.rows, t.cols}, out.data());
    return out;
  }
  /// Forgets the pieces read so far (their memory).
  void release();

 private:
  struct file_record {
    std::string name;
    std::uint64_t bytes = 0;
    std::uint32_t crc = 0;
  };
  struct opened_file {
    readable_file file;
    safetensors_header header;
  };

  void parse(std::string const& text);

  void verify(std::size_t f) const;

  std::vector<std::byte> const& piece_bytes(checkpoint_piece const& p, checkpoint_tensor const& t);

  std::filesystem::path folder_;
  int iteration_;
  int world_size_ = 0;
  double open_seconds_ = 0.0;
  std::vector<file_record> files_;
  nlohmann::json state_;
  std::map<std::string, checkpoint_tensor> tensors_;
  std::map<int, opened_file> opened_;
  std::map<std::pair<int, std::string>, std::vector<std::byte>> pieces_;
};

}  // namespace megamoe::io

#if MEGAMOE_HEADER_ONLY
#include <megamoe/io/checkpoint_reader.ipp>
#endif
