// SPDX-License-Identifier: Apache-2.0
// megamoe/train/corpus.hpp — a byte-level text corpus: training bytes, the held-out last part
// (never trained on), batches of windows, and the unigram baseline.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/random.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace megamoe::train {

class byte_corpus {
 public:
  /// The bytes of `path`: a file, or every regular file of a directory in name order (the
  /// `fortune` index files *.dat and *.u8 skipped). The last `heldout_fraction` of the bytes is
  /// held out. Throws input_error for a missing or empty corpus.
  static byte_corpus load(std::filesystem::path const& path, double heldout_fraction = 0.05);

  byte_corpus(std::vector<std::uint8_t> bytes, double heldout_fraction);

  [[nodiscard]] std::span<std::uint8_t const> training() const { return {bytes_.data(), split_}; }
  [[nodiscard]] std::span<std::uint8_t const> heldout() const;

  /// Checks that both parts hold at least one window of `seq` + 1 bytes.
  void require_windows(int seq) const;

  /// Cross-entropy of the held-out bytes, in bits per byte, under the training bytes' frequencies
  /// with add-one smoothing over all 256 byte values.
  [[nodiscard]] double unigram_bits_per_byte() const { return unigram_bits(heldout()); }
  /// The same over exactly the bytes that the first `windows` held-out windows of `seq` predict
  /// (held-out bytes 1 .. windows*seq): the baseline of heldout bits per byte over those windows.
  [[nodiscard]] double unigram_bits_per_byte(int seq, int windows) const;

  /// B training windows of S + 1 bytes: sequence g of step k's global batch starts at a position
  /// drawn from (seed, k, g), so a sequence is the same whichever rank and micro-batch hold it.
  /// tokens and targets [S*B] with t = s*B + b (targets are the next bytes).
  void training_batch(std::uint64_t seed, std::uint64_t step, std::uint64_t first_sequence, int seq,
                      int batch, std::span<std::int32_t> tokens,
                      std::span<std::int32_t> targets) const;

  /// Held-out windows: window w covers held-out bytes [w*S, w*S + S] (S + 1 bytes).
  [[nodiscard]] int heldout_windows(int seq) const;
  void heldout_batch(int first_window, int seq, int batch, std::span<std::int32_t> tokens,
                     std::span<std::int32_t> targets) const;
  /// Held-out window `window` as sequence b of a micro-batch of `batch`.
  void heldout_window(int window, int seq, int batch, int b, std::span<std::int32_t> tokens,
                      std::span<std::int32_t> targets) const;

 private:
  [[nodiscard]] double unigram_bits(std::span<std::uint8_t const> bytes) const;

  static void fill(std::uint8_t const* window, int seq, int batch, int b,
                   std::span<std::int32_t> tokens, std::span<std::int32_t> targets);

  std::vector<std::uint8_t> bytes_;
  std::size_t split_ = 0;
};

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/corpus.ipp>
#endif
