// SPDX-License-Identifier: Apache-2.0
// megamoe/io/files.hpp — durable files for checkpoints: a file written in full, flushed to disk
// and closed with every error reported (a full disk shows in write, fsync or close), a directory
// flushed after a rename, reads of byte ranges, CRC-32 checksums, and the fault-injection hook
// the checkpoint tests use where a full disk cannot be made.
//
// MEGAMOE_CHECKPOINT_FAULT=write_error[:rank]  a write fails halfway through (as ENOSPC would)
// MEGAMOE_CHECKPOINT_FAULT=kill_in_save[:rank] the process kills itself (SIGKILL) after writing
//                                              half of a file, as a preempted job would die
// Without ":rank" every rank fails; with it only that world rank.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <boost/crc.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megamoe::io {

/// CRC-32 (the zlib polynomial) of `bytes`, continuing from `crc` (0 to start).
MEGAMOE_DECL std::uint32_t crc32(std::span<std::byte const> bytes, std::uint32_t crc = 0);

/// "%08x" of a checksum, as the checkpoint index writes it.
MEGAMOE_DECL std::string crc_text(std::uint32_t crc);

/// The fault MEGAMOE_CHECKPOINT_FAULT asks of this rank ("" when none).
MEGAMOE_DECL std::string checkpoint_fault(int world_rank);

/// A file written from the start, flushed to disk by finish(); a file not finished is removed.
class durable_file {
 public:
  durable_file(std::filesystem::path path, std::string fault = {})
      : path_(std::move(path)), fault_(std::move(fault)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create");
  }
  durable_file(durable_file const&) = delete;
  durable_file& operator=(durable_file const&) = delete;
  ~durable_file();

  /// Appends `bytes`; the file's CRC-32 follows.
  void write(std::span<std::byte const> bytes);
  void write(std::string_view text) { write(std::as_bytes(std::span(text.data(), text.size()))); }

  /// Flushes the file to disk and closes it.
  void finish();

  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint32_t crc() const noexcept { return crc_; }

 private:
  [[noreturn]] void fail(char const* what) const;
  // The fault hook: half of this write reaches the file, then the write fails or the process
  // dies. Only a write of real data counts (headers are small and come first).
  void inject(std::span<std::byte const> bytes);

  std::filesystem::path path_;
  std::string fault_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::uint32_t crc_ = 0;
};

/// Flushes a directory's entries (a rename or a new file in it) to disk.
MEGAMOE_DECL void sync_directory(std::filesystem::path const& dir);

/// Writes `text` to `path` through a temporary file in the same folder and a rename, so that a
/// reader sees the old file or the new one, never a part.
MEGAMOE_DECL void replace_file(std::filesystem::path const& path, std::string_view text);

/// A file open for reading byte ranges.
class readable_file {
 public:
  explicit readable_file(std::filesystem::path path);
  readable_file(readable_file&& other) noexcept
      : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}
  readable_file(readable_file const&) = delete;
  readable_file& operator=(readable_file const&) = delete;
  readable_file& operator=(readable_file&&) = delete;
  ~readable_file();

  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] std::filesystem::path const& path() const noexcept { return path_; }

  /// Reads bytes [offset, offset + out.size()); the file must hold them.
  void read(std::uint64_t offset, std::span<std::byte> out) const;
  /// The whole file's CRC-32, read in blocks.
  [[nodiscard]] std::uint32_t crc() const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace megamoe::io

#if MEGAMOE_HEADER_ONLY
#include <megamoe/io/files.ipp>
#endif
