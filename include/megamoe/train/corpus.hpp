// SPDX-License-Identifier: Apache-2.0
// megamoe/train/corpus.hpp — a byte-level text corpus: training bytes, the held-out last part
// (never trained on), batches of windows, and the unigram baseline.
#pragma once

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
  static byte_corpus load(std::filesystem::path const& path, double heldout_fraction = 0.05) {
    namespace fs = std::filesystem;
    std::error_code error;
    if (!fs::exists(path, error)) throw input_error("corpus: " + path.string() + " does not exist");
    std::vector<fs::path> files;
    if (fs::is_directory(path, error)) {
      for (auto const& entry : fs::directory_iterator(path, error)) {
        auto const ext = entry.path().extension();
        if (entry.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(path);
    }
    std::vector<std::uint8_t> bytes;
    for (auto const& file : files) {
      std::ifstream in(file, std::ios::binary);
      if (!in) throw input_error("corpus: cannot read " + file.string());
      bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in),
                   std::istreambuf_iterator<char>());
    }
    if (bytes.empty()) throw input_error("corpus: " + path.string() + " holds no bytes");
    return byte_corpus(std::move(bytes), heldout_fraction);
  }

  byte_corpus(std::vector<std::uint8_t> bytes, double heldout_fraction) : bytes_(std::move(bytes)) {
    if (!(heldout_fraction > 0.0 && heldout_fraction < 1.0))
      throw input_error("corpus: the held-out fraction must be in (0, 1)");
    split_ = bytes_.size() - static_cast<std::size_t>(
                                 std::ceil(heldout_fraction * static_cast<double>(bytes_.size())));
  }

  [[nodiscard]] std::span<std::uint8_t const> training() const { return {bytes_.data(), split_}; }
  [[nodiscard]] std::span<std::uint8_t const> heldout() const {
    return {bytes_.data() + split_, bytes_.size() - split_};
  }

  /// Checks that both parts hold at least one window of `seq` + 1 bytes.
  void require_windows(int seq) const {
    auto const need = static_cast<std::size_t>(seq) + 1;
    if (training().size() < need || heldout().size() < need)
      throw input_error("corpus: " + std::to_string(bytes_.size()) +
                        " bytes are too few for windows of " + std::to_string(need) +
                        " bytes in both the training and the held-out part");
  }

  /// Cross-entropy of the held-out bytes, in bits per byte, under the training bytes' frequencies
  /// with add-one smoothing over all 256 byte values.
  [[nodiscard]] double unigram_bits_per_byte() const { return unigram_bits(heldout()); }
  /// The same over exactly the bytes that the first `windows` held-out windows of `seq` predict
  /// (held-out bytes 1 .. windows*seq): the baseline of heldout bits per byte over those windows.
  [[nodiscard]] double unigram_bits_per_byte(int seq, int windows) const {
    auto const n = static_cast<std::size_t>(std::clamp(windows, 0, heldout_windows(seq))) *
                   static_cast<std::size_t>(seq);
    if (n == 0)
      throw input_error("corpus: no held-out window of " + std::to_string(seq) + " bytes");
    return unigram_bits(heldout().subspan(1, n));
  }

  /// B training windows of S + 1 bytes: sequence g of step k's global batch starts at a position
  /// drawn from (seed, k, g), so a sequence is the same whichever rank and micro-batch hold it.
  /// tokens and targets [S*B] with t = s*B + b (targets are the next bytes).
  void training_batch(std::uint64_t seed, std::uint64_t step, std::uint64_t first_sequence, int seq,
                      int batch, std::span<std::int32_t> tokens,
                      std::span<std::int32_t> targets) const {
    auto const starts = training().size() - static_cast<std::size_t>(seq);
    std::uint64_t const step_key = splitmix64(seed ^ splitmix64(step));
    for (int b = 0; b < batch; ++b) {
      std::uint64_t const r =
          splitmix64(step_key ^ (first_sequence + static_cast<std::uint64_t>(b)));
      fill(training().data() + r % starts, seq, batch, b, tokens, targets);
    }
  }

  /// Held-out windows: window w covers held-out bytes [w*S, w*S + S] (S + 1 bytes).
  [[nodiscard]] int heldout_windows(int seq) const {
    return static_cast<int>((heldout().size() - 1) / static_cast<std::size_t>(seq));
  }
  void heldout_batch(int first_window, int seq, int batch, std::span<std::int32_t> tokens,
                     std::span<std::int32_t> targets) const {
    for (int b = 0; b < batch; ++b)
      heldout_window(first_window + b, seq, batch, b, tokens, targets);
  }
  /// Held-out window `window` as sequence b of a micro-batch of `batch`.
  void heldout_window(int window, int seq, int batch, int b, std::span<std::int32_t> tokens,
                      std::span<std::int32_t> targets) const {
    fill(heldout().data() + static_cast<std::size_t>(window) * seq, seq, batch, b, tokens, targets);
  }

 private:
  [[nodiscard]] double unigram_bits(std::span<std::uint8_t const> bytes) const {
    std::array<double, 256> counts{};
    counts.fill(1.0);
    for (std::uint8_t b : training()) counts[b] += 1.0;
    double const total = static_cast<double>(training().size()) + 256.0;
    double bits = 0.0;
    for (std::uint8_t b : bytes) bits -= std::log2(counts[b] / total);
    return bits / static_cast<double>(bytes.size());
  }

  static void fill(std::uint8_t const* window, int seq, int batch, int b,
                   std::span<std::int32_t> tokens, std::span<std::int32_t> targets) {
    for (int s = 0; s < seq; ++s) {
      auto const t = static_cast<std::size_t>(s) * batch + b;
      tokens[t] = window[s];
      targets[t] = window[s + 1];
    }
  }

  std::vector<std::uint8_t> bytes_;
  std::size_t split_ = 0;
};

}  // namespace megamoe::train
