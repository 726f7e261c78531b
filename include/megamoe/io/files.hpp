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
inline std::uint32_t crc32(std::span<std::byte const> bytes, std::uint32_t crc = 0) {
  // boost keeps the running remainder bit-reversed (reflected CRC) and not yet complemented:
  // continuing from a finished checksum undoes both.
  std::uint32_t const open = crc ^ 0xFFFFFFFFU;
  std::uint32_t reversed = 0;
  for (int bit = 0; bit < 32; ++bit)
    if ((open >> bit) & 1U) reversed |= 1U << (31 - bit);
  boost::crc_32_type sum;
  sum.reset(reversed);
  sum.process_bytes(bytes.data(), bytes.size());
  return sum.checksum();
}

/// "%08x" of a checksum, as the checkpoint index writes it.
inline std::string crc_text(std::uint32_t crc) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(8, '0');
  for (int i = 7; i >= 0; --i, crc >>= 4) out[static_cast<std::size_t>(i)] = digits[crc & 15U];
  return out;
}

/// The fault MEGAMOE_CHECKPOINT_FAULT asks of this rank ("" when none).
inline std::string checkpoint_fault(int world_rank) {
  char const* env = std::getenv("MEGAMOE_CHECKPOINT_FAULT");
  if (env == nullptr || *env == '\0') return {};
  std::string_view spec(env);
  auto const colon = spec.find(':');
  if (colon != std::string_view::npos &&
      std::string(spec.substr(colon + 1)) != std::to_string(world_rank))
    return {};
  return std::string(spec.substr(0, colon));
}

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
  ~durable_file() {
    if (fd_ >= 0) {
      ::close(fd_);
      std::error_code ignored;
      std::filesystem::remove(path_, ignored);
    }
  }

  /// Appends `bytes`; the file's CRC-32 follows.
  void write(std::span<std::byte const> bytes) {
    crc_ = crc32(bytes, crc_);
    if (!fault_.empty()) inject(bytes);
    std::byte const* at = bytes.data();
    std::size_t left = bytes.size();
    while (left > 0) {
      ssize_t const n = ::write(fd_, at, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("cannot write");
      at += n;
      left -= static_cast<std::size_t>(n);
    }
    size_ += bytes.size();
  }
  void write(std::string_view text) { write(std::as_bytes(std::span(text.data(), text.size()))); }

  /// Flushes the file to disk and closes it.
  void finish() {
    if (::fsync(fd_) != 0) fail("cannot flush");
    int const fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
      std::error_code ignored;
      std::filesystem::remove(path_, ignored);
      fail("cannot close");
    }
  }

  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint32_t crc() const noexcept { return crc_; }

 private:
  [[noreturn]] void fail(char const* what) const {
    throw input_error("checkpoint: " + std::string(what) + " " + path_.string() + ": " +
                      std::strerror(errno));
  }
  // The fault hook: half of this write reaches the file, then the write fails or the process
  // dies. Only a write of real data counts (headers are small and come first).
  void inject(std::span<std::byte const> bytes) {
    if (bytes.size() < 64) return;
    std::span<std::byte const> const half = bytes.first(bytes.size() / 2);
    [[maybe_unused]] auto const n = ::write(fd_, half.data(), half.size());
    if (fault_ == "kill_in_save") {
      ::fsync(fd_);
      std::raise(SIGKILL);
    }
    errno = ENOSPC;
    fail("cannot write");
  }

  std::filesystem::path path_;
  std::string fault_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::uint32_t crc_ = 0;
};

/// Flushes a directory's entries (a rename or a new file in it) to disk.
inline void sync_directory(std::filesystem::path const& dir) {
  int const fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw input_error("checkpoint: cannot open " + dir.string() + ": " + std::strerror(errno));
  int const rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0)
    throw input_error("checkpoint: cannot flush " + dir.string() + ": " + std::strerror(errno));
}

/// Writes `text` to `path` through a temporary file in the same folder and a rename, so that a
/// reader sees the old file or the new one, never a part.
inline void replace_file(std::filesystem::path const& path, std::string_view text) {
  auto const temporary = path.parent_path() / ("." + path.filename().string() + ".partial");
  durable_file file(temporary);
  file.write(text);
  file.finish();
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error)
    throw input_error("checkpoint: cannot rename " + temporary.string() + " to " + path.string() +
                      ": " + error.message());
  sync_directory(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
}

/// A file open for reading byte ranges.
class readable_file {
 public:
  explicit readable_file(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw input_error("checkpoint: cannot read " + path_.string() + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      ::close(fd_);
      throw input_error("checkpoint: cannot read " + path_.string() + ": " + std::strerror(errno));
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  readable_file(readable_file&& other) noexcept
      : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}
  readable_file(readable_file const&) = delete;
  readable_file& operator=(readable_file const&) = delete;
  readable_file& operator=(readable_file&&) = delete;
  ~readable_file() {
    if (fd_ >= 0) ::close(fd_);
  }

  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] std::filesystem::path const& path() const noexcept { return path_; }

  /// Reads bytes [offset, offset + out.size()); the file must hold them.
  void read(std::uint64_t offset, std::span<std::byte> out) const {
    if (offset > size_ || out.size() > size_ - offset)
      throw input_error("checkpoint: " + path_.string() + " is truncated (" +
                        std::to_string(size_) + " bytes, reading " + std::to_string(out.size()) +
                        " at " + std::to_string(offset) + ")");
    std::size_t done = 0;
    while (done < out.size()) {
      ssize_t const n =
          ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw input_error("checkpoint: cannot read " + path_.string() + ": " +
                          (n == 0 ? std::string("unexpected end") : std::strerror(errno)));
      done += static_cast<std::size_t>(n);
    }
  }
  /// The whole file's CRC-32, read in blocks.
  [[nodiscard]] std::uint32_t crc() const {
    std::vector<std::byte> block(std::size_t{1} << 20);
    std::uint32_t sum = 0;
    for (std::uint64_t at = 0; at < size_; at += block.size()) {
      auto const part = std::span(block).first(
          static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), size_ - at)));
      read(at, part);
      sum = crc32(part, sum);
    }
    return sum;
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace megamoe::io
