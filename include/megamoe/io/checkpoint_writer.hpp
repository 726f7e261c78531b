// SPDX-License-Identifier: Apache-2.0
// megamoe/io/checkpoint_writer.hpp — saving a checkpoint: each rank's pieces to its own file in
// parallel, the index and the tracker by rank 0, atomically.
//
// Atomic: the files go to ROOT/.iter_000000N.partial, are flushed to disk, the folder is renamed
// to iter_000000N (exchanged with an older save of the same iteration), the root is flushed, and
// only then does the tracker name N. A crash or a failed write at any point leaves the tracker
// naming the previous checkpoint, whole. The writer checks that every element of every tensor
// lies in exactly one piece before recording the checkpoint.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/io/checkpoint_index.hpp>
#include <megamoe/io/files.hpp>
#include <megamoe/io/safetensors.hpp>
#include <megamoe/parallel/environment.hpp>

#include <fcntl.h>
#include <stdio.h>
#include <boost/mpi/collectives/broadcast.hpp>
#include <boost/mpi/collectives/gather.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace megamoe::io {

namespace detail {

/// Exchanges two paths (both exist) in one step: renameat2(RENAME_EXCHANGE).
MEGAMOE_DECL bool exchange_paths(std::filesystem::path const& a, std::filesystem::path const& b);

}  // namespace detail

/// Collects this rank's pieces, then commit() writes the checkpoint (collective over `world`).
class checkpoint_writer {
 public:
  checkpoint_writer(boost::mpi::communicator const& world, std::filesystem::path root,
                    int iteration)
      : world_(world), root_(std::move(root)), iteration_(iteration) {}

  /// Adds the rectangle `r` of tensor `name` ([rows, cols] as a matrix, `shape` the reference's):
  /// r.rows x r.cols values, row-major, from `values` (copied). Every element of a tensor must
  /// be added by exactly one rank.
  template <class T>
  void add(std::string const& name, std::vector<std::int64_t> const& shape, std::int64_t rows,
           std::int64_t cols, global_rectangle const& r, T const* values) {
    std::size_t const bytes = static_cast<std::size_t>(r.rows * r.cols) * sizeof(T);
    staged piece{name, dtype_of<T>, shape, rows, cols, r, {}};
    piece.bytes.resize(bytes);
    std::memcpy(piece.bytes.data(), values, bytes);
    staged_.push_back(std::move(piece));
  }
  /// Adds a whole tensor (one rank's call).
  template <class T>
  void add_whole(std::string const& name, std::vector<std::int64_t> const& shape, std::int64_t rows,
                 std::int64_t cols, T const* values) {
    add(name, shape, rows, cols, global_rectangle{0, 0, 0, rows, cols}, values);
  }
  [[nodiscard]] std::size_t staged_bytes() const noexcept;

  /// Writes every rank's file, checks that every tensor is whole, writes the index with `state`
  /// (rank 0's), renames the folder into place and records the iteration in the tracker. Returns
  /// the bytes written by all ranks (every rank the same).
  std::uint64_t commit(nlohmann::json const& state);

  /// commit() in three parts, for a save written while training goes on: prepare() (collective)
  /// makes the checkpoint's temporary folder; write_file() (local, on any thread, no MPI) writes
  /// this rank's file from the staged copies, then frees them, keeping a failure for finish();
  /// finish(state) (collective) agrees on every rank's write and records the checkpoint as
  /// commit() does. Until finish() has renamed the folder, the tracker names the previous
  /// checkpoint.
  void prepare();
  void write_file() noexcept;
  std::uint64_t finish(nlohmann::json const& state);
  [[nodiscard]] int iteration() const noexcept { return iteration_; }

 private:
  /// Where the files go until finish() renames the folder (a dot folder no reader lists).
  [[nodiscard]] std::filesystem::path partial_folder() const;

  struct staged {
    std::string name;
    dtype type;
    std::vector<std::int64_t> shape;
    std::int64_t rows, cols;
    global_rectangle rect;
    std::vector<std::byte> bytes;
  };

  boost::mpi::communicator world_;
  std::filesystem::path root_;
  int iteration_;
  std::vector<staged> staged_;
  nlohmann::json written_;    // this rank's file: its pieces, bytes and CRC-32
  std::string write_error_;  // write_file()'s failure, thrown by finish() on every rank
};

}  // namespace megamoe::io

#if MEGAMOE_HEADER_ONLY
#include <megamoe/io/checkpoint_writer.ipp>
#endif
