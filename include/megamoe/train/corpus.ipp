// SPDX-License-Identifier: Apache-2.0
// megamoe/train/corpus.ipp — the definitions behind corpus.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/corpus.hpp>

namespace megamoe::train {

MEGAMOE_DECL auto byte_corpus::load(std::filesystem::path const& path, double heldout_fraction)
    -> byte_corpus {
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
    bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (bytes.empty()) throw input_error("corpus: " + path.string() + " holds no bytes");
  return byte_corpus(std::move(bytes), heldout_fraction);
}

MEGAMOE_DECL byte_corpus::byte_corpus(std::vector<std::uint8_t> bytes, double heldout_fraction)
    : bytes_(std::move(bytes)) {
  if (!(heldout_fraction > 0.0 && heldout_fraction < 1.0))
    throw input_error("corpus: the held-out fraction must be in (0, 1)");
  split_ = bytes_.size() - static_cast<std::size_t>(
                               std::ceil(heldout_fraction * static_cast<double>(bytes_.size())));
}

MEGAMOE_DECL auto byte_corpus::heldout() const -> std::span<std::uint8_t const> {
  return {bytes_.data() + split_, bytes_.size() - split_};
}

MEGAMOE_DECL auto byte_corpus::require_windows(int seq) const -> void {
  auto const need = static_cast<std::size_t>(seq) + 1;
  if (training().size() < need || heldout().size() < need)
    throw input_error("corpus: " + std::to_string(bytes_.size()) +
                      " bytes are too few for windows of " + std::to_string(need) +
                      " bytes in both the training and the held-out part");
}

MEGAMOE_DECL auto byte_corpus::unigram_bits_per_byte(int seq, int windows) const -> double {
  auto const n = static_cast<std::size_t>(std::clamp(windows, 0, heldout_windows(seq))) *
                 static_cast<std::size_t>(seq);
  if (n == 0) throw input_error("corpus: no held-out window of " + std::to_string(seq) + " bytes");
  return unigram_bits(heldout().subspan(1, n));
}

MEGAMOE_DECL auto byte_corpus::training_batch(std::uint64_t seed, std::uint64_t step,
                                              std::uint64_t first_sequence, int seq, int batch,
                                              std::span<std::int32_t> tokens,
                                              std::span<std::int32_t> targets) const -> void {
  auto const starts = training().size() - static_cast<std::size_t>(seq);
  std::uint64_t const step_key = splitmix64(seed ^ splitmix64(step));
  for (int b = 0; b < batch; ++b) {
    std::uint64_t const r = splitmix64(step_key ^ (first_sequence + static_cast<std::uint64_t>(b)));
    fill(training().data() + r % starts, seq, batch, b, tokens, targets);
  }
}

MEGAMOE_DECL auto byte_corpus::heldout_windows(int seq) const -> int {
  return static_cast<int>((heldout().size() - 1) / static_cast<std::size_t>(seq));
}

MEGAMOE_DECL auto byte_corpus::heldout_batch(int first_window, int seq, int batch,
                                             std::span<std::int32_t> tokens,
                                             std::span<std::int32_t> targets) const -> void {
  for (int b = 0; b < batch; ++b) heldout_window(first_window + b, seq, batch, b, tokens, targets);
}

MEGAMOE_DECL auto byte_corpus::heldout_window(int window, int seq, int batch, int b,
                                              std::span<std::int32_t> tokens,
                                              std::span<std::int32_t> targets) const -> void {
  fill(heldout().data() + static_cast<std::size_t>(window) * seq, seq, batch, b, tokens, targets);
}

MEGAMOE_DECL auto byte_corpus::unigram_bits(std::span<std::uint8_t const> bytes) const -> double {
  std::array<double, 256> counts{};
  counts.fill(1.0);
  for (std::uint8_t b : training()) counts[b] += 1.0;
  double const total = static_cast<double>(training().size()) + 256.0;
  double bits = 0.0;
  for (std::uint8_t b : bytes) bits -= std::log2(counts[b] / total);
  return bits / static_cast<double>(bytes.size());
}

MEGAMOE_DECL auto byte_corpus::fill(std::uint8_t const* window, int seq, int batch, int b,
                                    std::span<std::int32_t> tokens, std::span<std::int32_t> targets)
    -> void {
  for (int s = 0; s < seq; ++s) {
    auto const t = static_cast<std::size_t>(s) * batch + b;
    tokens[t] = window[s];
    targets[t] = window[s + 1];
  }
}

}  // namespace megamoe::train
