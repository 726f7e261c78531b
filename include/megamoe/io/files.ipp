// SPDX-License-Identifier: Apache-2.0
// megamoe/io/files.ipp — the definitions behind files.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/io/files.hpp>

namespace megamoe::io {

MEGAMOE_DECL std::uint32_t crc32(std::span<std::byte const> bytes, std::uint32_t crc) {
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

MEGAMOE_DECL std::string crc_text(std::uint32_t crc) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(8, '0');
  for (int i = 7; i >= 0; --i, crc >>= 4) out[static_cast<std::size_t>(i)] = digits[crc & 15U];
  return out;
}

MEGAMOE_DECL std::string checkpoint_fault(int world_rank) {
  char const* env = std::getenv("MEGAMOE_CHECKPOINT_FAULT");
  if (env == nullptr || *env == '\0') return {};
  std::string_view spec(env);
  auto const colon = spec.find(':');
  if (colon != std::string_view::npos &&
      std::string(spec.substr(colon + 1)) != std::to_string(world_rank))
    return {};
  return std::string(spec.substr(0, colon));
}

MEGAMOE_DECL void sync_directory(std::filesystem::path const& dir) {
  int const fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw input_error("checkpoint: cannot open " + dir.string() + ": " + std::strerror(errno));
  int const rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0)
    throw input_error("checkpoint: cannot flush " + dir.string() + ": " + std::strerror(errno));
}

MEGAMOE_DECL void replace_file(std::filesystem::path const& path, std::string_view text) {
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

}  // namespace megamoe::io

namespace megamoe::io {

MEGAMOE_DECL durable_file::~durable_file() {
  if (fd_ >= 0) {
    ::close(fd_);
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
}

MEGAMOE_DECL auto durable_file::write(std::span<std::byte const> bytes) -> void {
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

MEGAMOE_DECL auto durable_file::finish() -> void {
  if (::fsync(fd_) != 0) fail("cannot flush");
  int const fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
    fail("cannot close");
  }
}

MEGAMOE_DECL auto durable_file::fail(char const* what) const -> [[noreturn]] void {
  throw input_error("checkpoint: " + std::string(what) + " " + path_.string() + ": " +
                    std::strerror(errno));
}

MEGAMOE_DECL auto durable_file::inject(std::span<std::byte const> bytes) -> void {
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

MEGAMOE_DECL readable_file::readable_file(std::filesystem::path path) : path_(std::move(path)) {
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

MEGAMOE_DECL readable_file::~readable_file() {
  if (fd_ >= 0) ::close(fd_);
}

MEGAMOE_DECL auto readable_file::read(std::uint64_t offset, std::span<std::byte> out) const
    -> void {
  if (offset > size_ || out.size() > size_ - offset)
    throw input_error("checkpoint: " + path_.string() + " is truncated (" + std::to_string(size_) +
                      " bytes, reading " + std::to_string(out.size()) + " at " +
                      std::to_string(offset) + ")");
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

MEGAMOE_DECL auto readable_file::crc() const -> std::uint32_t {
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

}  // namespace megamoe::io
