// SPDX-License-Identifier: Apache-2.0
// megamoe/io/checkpoint.hpp — sharded, self-describing, atomic checkpoints.
//
// A checkpoint of iteration N under ROOT:
//   ROOT/iter_000000N/rank_00000.safetensors ...   each rank's pieces, written in parallel
//   ROOT/iter_000000N/index.json                   every tensor: dtype, shape, its pieces; every
//                                                  file: bytes and CRC-32; the caller's state
//   ROOT/latest_checkpointed_iteration.txt         "N", written last
// A piece is a rectangle [row, row + rows) x [col, col + cols) of a tensor's matrix form (a 1-D
// tensor is one row), stored in its rank's file under the key "name[r0:r1,c0:c1]" with the
// tensor's dtype, so numpy alone can read it (the index says where each piece belongs). Every
// element of every tensor lies in exactly one piece: the writer checks it before recording the
// checkpoint, the reader before using it.
//
// Atomic: the files go to ROOT/.iter_000000N.partial, are flushed to disk, the folder is renamed
// to iter_000000N (exchanged with an older save of the same iteration), the root is flushed, and
// only then does the tracker name N. A crash or a failed write at any point leaves the tracker
// naming the previous checkpoint, whole. Checked: the reader refuses, naming the file and the
// reason, a missing tracker or index, another format, a missing, truncated or corrupted file
// (whole-file and per-piece CRC-32), a tensor that is absent, of another dtype (F32 and BF16 read
// into each other) or shape, or not covered. The index holds no absolute paths: a copied checkpoint
// folder loads.
//
// Collective calls (the writer's commit, the reader's constructor) agree on failure over the
// world: every rank throws the same error, none hangs. read() is local; callers wrap their reads
// in parallel::check_on_every_rank.
#pragma once

#include <megamoe/core/bf16.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/io/files.hpp>
#include <megamoe/io/safetensors.hpp>
#include <megamoe/parallel/environment.hpp>

#include <stdio.h>
#include <boost/mpi/collectives/all_gather.hpp>
#include <boost/mpi/collectives/broadcast.hpp>
#include <boost/mpi/collectives/gather.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe::io {

inline constexpr char const* checkpoint_format = "megamoe-checkpoint";
// 2: linear_qkv's rows per query group (its query heads, key, value), as the reference's.
inline constexpr int checkpoint_version = 2;
inline constexpr char const* checkpoint_tracker = "latest_checkpointed_iteration.txt";

/// "iter_0000042", as the reference names an iteration's folder.
inline std::string iteration_folder(int iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07d", iteration);
  return name;
}
inline std::string rank_file(int rank) {
  char name[40];
  std::snprintf(name, sizeof name, "rank_%05d.safetensors", rank);
  return name;
}

/// The reference's shape of a parameter held as [rows, cols]: norms' weights, biases and the
/// expert bias are vectors.
inline std::vector<std::int64_t> reference_shape(std::string_view name, std::int64_t rows,
                                                 std::int64_t cols) {
  bool const vector = rows == 1 && (name.find("norm") != std::string_view::npos ||
                                    name.find(".bias") != std::string_view::npos ||
                                    name.find("expert_bias") != std::string_view::npos);
  if (vector) return {cols};
  return {rows, cols};
}

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

inline std::string piece_key(std::string const& name, global_rectangle const& r) {
  return name + "[" + std::to_string(r.row) + ":" + std::to_string(r.row + r.rows) + "," +
         std::to_string(r.col) + ":" + std::to_string(r.col + r.cols) + "]";
}

/// Every element of `t` in exactly one piece, every piece inside `t`; else why not.
inline std::string coverage_problem(std::string const& name, checkpoint_tensor const& t) {
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

inline nlohmann::json tensor_json(checkpoint_tensor const& t) {
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

inline std::uint32_t parse_crc(std::string const& text) {
  if (text.size() != 8 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw input_error("not a CRC-32: '" + text + "'");
  return static_cast<std::uint32_t>(std::stoul(text, nullptr, 16));
}

inline checkpoint_tensor tensor_of_json(nlohmann::json const& j) {
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

/// Exchanges two paths (both exist) in one step: renameat2(RENAME_EXCHANGE).
inline bool exchange_paths(std::filesystem::path const& a, std::filesystem::path const& b) {
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
}

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
  [[nodiscard]] std::size_t staged_bytes() const noexcept {
    std::size_t n = 0;
    for (auto const& s : staged_) n += s.bytes.size();
    return n;
  }

  /// Writes every rank's file, checks that every tensor is whole, writes the index with `state`
  /// (rank 0's), renames the folder into place and records the iteration in the tracker. Returns
  /// the bytes written by all ranks (every rank the same).
  std::uint64_t commit(nlohmann::json const& state) {
    int const rank = world_.rank();
    auto const folder = iteration_folder(iteration_);
    auto const partial = root_ / ("." + folder + ".partial");
    parallel::check_on_every_rank(world_, [&] {
      if (rank != 0) return;
      std::error_code error;
      std::filesystem::create_directories(root_, error);
      if (error || !std::filesystem::is_directory(root_))
        throw input_error("checkpoint: cannot create " + root_.string() + ": " + error.message());
      // What a killed save left: never chosen (the tracker names none), removed here.
      std::vector<std::filesystem::path> stale;
      for (auto const& entry : std::filesystem::directory_iterator(root_, error)) {
        auto const name = entry.path().filename().string();
        if (name.starts_with(".iter_") && name.ends_with(".partial")) stale.push_back(entry.path());
      }
      for (auto const& path : stale) std::filesystem::remove_all(path, error);
      std::filesystem::remove_all(partial, error);
      if (!std::filesystem::create_directory(partial, error))
        throw input_error("checkpoint: cannot create " + partial.string() + ": " + error.message());
    });

    // Each rank's file, in parallel.
    nlohmann::json mine = nlohmann::json::object();
    parallel::check_on_every_rank(world_, [&] {
      durable_file file(partial / rank_file(rank), checkpoint_fault(rank));
      std::vector<tensor_bytes> tensors;
      nlohmann::json pieces = nlohmann::json::array();
      for (auto const& s : staged_) {
        std::string const key = detail::piece_key(s.name, s.rect);
        std::vector<std::int64_t> shape{s.rect.rows, s.rect.cols};
        if (s.shape.size() == 1) shape = {s.rect.cols};
        tensors.push_back({key, s.type, shape, std::span<std::byte const>(s.bytes)});
        checkpoint_tensor t{s.type,
                            s.shape,
                            s.rows,
                            s.cols,
                            {{rank, key, s.rect.row, s.rect.col, s.rect.rows, s.rect.cols,
                              crc32(std::span<std::byte const>(s.bytes))}}};
        pieces.push_back({{"name", s.name}, {"tensor", detail::tensor_json(t)}});
      }
      write_safetensors(file, tensors,
                        {{"format", checkpoint_format},
                         {"iteration", std::to_string(iteration_)},
                         {"rank", std::to_string(rank)}});
      file.finish();
      mine = {{"pieces", pieces}, {"bytes", file.size()}, {"crc32", crc_text(file.crc())}};
    });

    std::vector<std::string> all;
    boost::mpi::gather(world_, mine.dump(), all, 0);
    std::uint64_t total = 0;
    parallel::check_on_every_rank(world_, [&] {
      if (rank != 0) return;
      std::map<std::string, checkpoint_tensor> tensors;
      nlohmann::json files = nlohmann::json::array();
      for (std::size_t r = 0; r < all.size(); ++r) {
        auto const j = nlohmann::json::parse(all[r]);
        files.push_back({{"name", rank_file(static_cast<int>(r))},
                         {"bytes", j.at("bytes")},
                         {"crc32", j.at("crc32")}});
        total += j.at("bytes").get<std::uint64_t>();
        for (auto const& p : j.at("pieces")) {
          auto const name = p.at("name").get<std::string>();
          auto const t = detail::tensor_of_json(p.at("tensor"));
          auto [it, fresh] = tensors.try_emplace(name, t);
          if (fresh) continue;
          if (it->second.type != t.type || it->second.shape != t.shape || it->second.rows != t.rows)
            throw input_error("checkpoint: ranks disagree on the dtype or shape of " + name);
          it->second.pieces.push_back(t.pieces.front());
        }
      }
      nlohmann::json index_tensors = nlohmann::json::object();
      for (auto const& [name, t] : tensors) {
        if (auto const why = detail::coverage_problem(name, t); !why.empty())
          throw input_error("checkpoint: not saved, the ranks' pieces are wrong: " + why);
        index_tensors[name] = detail::tensor_json(t);
      }
      nlohmann::json index = {{"format", checkpoint_format},
                              {"version", checkpoint_version},
                              {"iteration", iteration_},
                              {"world_size", world_.size()},
                              {"files", files},
                              {"state", state},
                              {"tensors", index_tensors}};
      std::string const text = index.dump(1);
      durable_file file(partial / "index.json");
      file.write(text);
      file.finish();
      total += file.size();
      sync_directory(partial);
      auto const final_folder = root_ / folder;
      std::error_code error;
      if (std::filesystem::exists(final_folder, error)) {
        // An older save of this iteration: exchanged in one step, then removed.
        if (!detail::exchange_paths(partial, final_folder))
          throw input_error("checkpoint: cannot replace " + final_folder.string() + ": " +
                            std::strerror(errno));
        sync_directory(root_);
        std::filesystem::remove_all(partial, error);
      } else {
        std::filesystem::rename(partial, final_folder, error);
        if (error)
          throw input_error("checkpoint: cannot rename " + partial.string() + " to " +
                            final_folder.string() + ": " + error.message());
        sync_directory(root_);
      }
      replace_file(root_ / checkpoint_tracker, std::to_string(iteration_) + "\n");
    });
    boost::mpi::broadcast(world_, total, 0);
    return total;
  }

 private:
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
};

/// A checkpoint opened for reading: its index, checked, and every file's size and CRC-32.
class checkpoint_reader {
 public:
  /// The iteration `root`'s tracker names (collective: every rank gets it, or the same error).
  static int latest_iteration(boost::mpi::communicator const& world,
                              std::filesystem::path const& root) {
    int iteration = -1;
    parallel::check_on_every_rank(world, [&] {
      if (world.rank() != 0) return;
      auto const tracker = root / checkpoint_tracker;
      if (!std::filesystem::is_directory(root))
        throw input_error("checkpoint: " + root.string() + " is not a folder");
      std::ifstream in(tracker);
      if (!in)
        throw input_error("checkpoint: " + tracker.string() +
                          " does not exist: no checkpoint was completed in " + root.string());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      if (text.empty() || text.size() > 9 ||
          text.find_first_not_of("0123456789") != std::string::npos)
        throw input_error("checkpoint: " + tracker.string() + " does not name an iteration ('" +
                          text.substr(0, 40) + "')");
      iteration = std::stoi(text);
    });
    boost::mpi::broadcast(world, iteration, 0);
    return iteration;
  }

  /// Opens iteration `iteration` of `root` (collective).
  checkpoint_reader(boost::mpi::communicator const& world, std::filesystem::path root,
                    int iteration)
      : folder_(root / iteration_folder(iteration)), iteration_(iteration) {
    auto const start = std::chrono::steady_clock::now();
    std::string text;
    parallel::check_on_every_rank(world, [&] {
      if (world.rank() != 0) return;
      auto const path = folder_ / "index.json";
      std::ifstream in(path);
      if (!in) throw input_error("checkpoint: " + path.string() + " does not exist");
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    });
    boost::mpi::broadcast(world, text, 0);
    parallel::check_on_every_rank(world, [&] { parse(text); });
    // Every file's size and CRC-32, the files dealt over the ranks.
    parallel::check_on_every_rank(world, [&] {
      for (std::size_t f = static_cast<std::size_t>(world.rank()); f < files_.size();
           f += static_cast<std::size_t>(world.size()))
        verify(f);
    });
    open_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  [[nodiscard]] int iteration() const noexcept { return iteration_; }
  [[nodiscard]] std::filesystem::path const& folder() const noexcept { return folder_; }
  [[nodiscard]] nlohmann::json const& state() const noexcept { return state_; }
  [[nodiscard]] int saved_world_size() const noexcept { return world_size_; }
  /// Seconds the constructor took (the index read and every file's CRC-32 checked).
  [[nodiscard]] double open_seconds() const noexcept { return open_seconds_; }
  [[nodiscard]] std::map<std::string, checkpoint_tensor> const& tensors() const noexcept {
    return tensors_;
  }
  [[nodiscard]] bool contains(std::string const& name) const { return tensors_.contains(name); }
  [[nodiscard]] std::uint64_t bytes() const noexcept {
    std::uint64_t n = 0;
    for (auto const& f : files_) n += f.bytes;
    return n;
  }
  /// The tensor `name`; a clear error when the checkpoint lacks it.
  [[nodiscard]] checkpoint_tensor const& tensor(std::string const& name) const {
    auto const it = tensors_.find(name);
    if (it == tensors_.end())
      throw input_error("checkpoint " + folder_.string() + " holds no tensor " + name +
                        " (saved by another model or configuration?)");
    return it->second;
  }

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
  void release() {
    pieces_.clear();
    opened_.clear();
  }

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

  void parse(std::string const& text) {
    auto const path = (folder_ / "index.json").string();
    try {
      auto const j = nlohmann::json::parse(text);
      if (!j.is_object() || j.value("format", "") != checkpoint_format)
        throw input_error("not a megamoe checkpoint index (format '" +
                          (j.is_object() ? j.value("format", "") : std::string()) + "')");
      if (j.at("version").get<int>() != checkpoint_version)
        throw input_error("version " + j.at("version").dump() + ", this megamoe reads version " +
                          std::to_string(checkpoint_version));
      if (j.at("iteration").get<int>() != iteration_)
        throw input_error("it says iteration " + j.at("iteration").dump() + ", its folder " +
                          std::to_string(iteration_));
      world_size_ = j.at("world_size").get<int>();
      for (auto const& f : j.at("files")) {
        auto const name = f.at("name").get<std::string>();
        if (name.empty() || name.find('/') != std::string::npos || name.front() == '.')
          throw input_error("file name '" + name + "' is not a plain name in the folder");
        files_.push_back({name, f.at("bytes").get<std::uint64_t>(),
                          detail::parse_crc(f.at("crc32").get<std::string>())});
      }
      state_ = j.at("state");
      for (auto const& [name, t] : j.at("tensors").items()) {
        auto tensor = detail::tensor_of_json(t);
        for (auto const& p : tensor.pieces)
          if (p.file < 0 || p.file >= std::ssize(files_))
            throw input_error(name + " names file " + std::to_string(p.file) + " of " +
                              std::to_string(files_.size()));
        if (auto const why = detail::coverage_problem(name, tensor); !why.empty())
          throw input_error(why);
        tensors_.emplace(name, std::move(tensor));
      }
    } catch (nlohmann::json::exception const& e) {
      throw input_error("checkpoint: " + path + " is malformed (" + e.what() + ")");
    } catch (input_error const& e) {
      throw input_error("checkpoint: " + path + ": " + e.what());
    }
  }

  void verify(std::size_t f) const {
    auto const path = folder_ / files_[f].name;
    if (!std::filesystem::exists(path))
      throw input_error("checkpoint: " + path.string() + " is missing (a shard of " +
                        std::to_string(files_.size()) + " files)");
    readable_file const file(path);
    if (file.size() != files_[f].bytes)
      throw input_error("checkpoint: " + path.string() + " is " + std::to_string(file.size()) +
                        " bytes, the index says " + std::to_string(files_[f].bytes) +
                        (file.size() < files_[f].bytes ? " (truncated)" : ""));
    if (auto const crc = file.crc(); crc != files_[f].crc)
      throw input_error("checkpoint: " + path.string() + " is corrupted (CRC-32 " + crc_text(crc) +
                        ", the index says " + crc_text(files_[f].crc) + ")");
  }

  std::vector<std::byte> const& piece_bytes(checkpoint_piece const& p, checkpoint_tensor const& t) {
    auto const cached = pieces_.find(std::pair(p.file, p.key));
    if (cached != pieces_.end()) return cached->second;
    auto it = opened_.find(p.file);
    if (it == opened_.end()) {
      readable_file file(folder_ / files_[static_cast<std::size_t>(p.file)].name);
      auto header = read_safetensors_header(file);
      it = opened_.emplace(p.file, opened_file{std::move(file), std::move(header)}).first;
    }
    auto const& [file, header] = it->second;
    auto const* entry = header.find(p.key);
    auto const bytes = static_cast<std::uint64_t>(p.rows * p.cols) * dtype_size(t.type);
    if (entry == nullptr || entry->type != t.type || entry->end - entry->begin != bytes)
      throw input_error("checkpoint: " + file.path().string() + " lacks " + p.key +
                        " as the index describes it");
    std::vector<std::byte> data(bytes);
    file.read(entry->begin, data);
    if (crc32(data) != p.crc)
      throw input_error("checkpoint: " + file.path().string() + ": " + p.key +
                        " is corrupted (CRC-32 mismatch)");
    return pieces_.emplace(std::pair(p.file, p.key), std::move(data)).first->second;
  }

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
