// SPDX-License-Identifier: Apache-2.0
// megamoe/data/gpt_dataset.hpp — Megatron-Core's GPTDataset sample order, exactly: the split
// string to sequence ranges, the document index (sequences repeated per epoch and shuffled, a
// short last epoch shuffled apart), the sample index (samples of seq_length + 1 tokens that
// span sequences and epochs), the shuffle index, and a sample's tokens, labels and masks.
//
// GPTDataset samples sequences, not documents: its "documents" are sequence ids, and a split is a
// range of them. Every floating-point step is done in double in the reference's order (the one
// float32 step, the sample count without drop_last, too), and the shuffles draw from one
// numpy_random_state per split, the document index first.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/data/indexed_dataset.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace megamoe::data {

/// numpy.sum of doubles (pairwise summation, blocks of eight), bit for bit.
MEGAMOE_DECL double numpy_sum(std::span<double const> x);
/// Megatron's normalize: each weight over numpy.sum of them.
MEGAMOE_DECL std::vector<double> normalize(std::span<double const> weights);

/// A split's share of a dataset: [begin, end) as fractions, or none (the split is not built).
using split_bookends = std::array<std::optional<std::pair<double, double>>, 3>;

/// Megatron's `--split` ("969,30,1", "70 20 10", "99,1"): up to three numbers, padded with
/// zeros, normalised; split k is none where its share is empty. Throws input_error for more
/// than three numbers, a number that does not parse, or shares summing to zero.
MEGAMOE_DECL split_bookends parse_split(std::string_view split);

/// The sequence ids [begin, end) of a split's bookends in a dataset of `sequences` (rounded half
/// to even, as Python's round).
MEGAMOE_DECL std::pair<std::int64_t, std::int64_t> split_range(std::pair<double, double> bookends,
                                                               std::int64_t sequences);

/// What a GPTDataset over one split is built from.
struct gpt_dataset_options {
  std::int64_t seq_length = 0;
  bool add_extra_token = true;  // add_extra_token_to_sequence: samples of seq_length + 1
  /// Samples asked of the split (num_samples); none: one epoch.
  std::optional<std::int64_t> num_samples;
  /// Drop a last partial sample (always for train and test; the valid split's
  /// drop_last_partial_validation_sequence).
  bool drop_last = true;
  std::uint32_t seed = 0;
};

/// One of a split's index arrays, held as the reference holds it: 4-byte elements where the
/// values fit (int32; uint32 for the shuffle index), 8-byte ones where they do not. Its bytes
/// are its own, or a view into a mapped cache file that the ranks of a node share.
class index_array {
 public:
  enum class element : std::uint8_t { int32 = 1, uint32 = 2, int64 = 3 };

  index_array() = default;
  explicit index_array(std::vector<std::int32_t> values) { own(std::move(values), element::int32); }
  explicit index_array(std::vector<std::uint32_t> values) { own(std::move(values), element::uint32); }
  explicit index_array(std::vector<std::int64_t> values) { own(std::move(values), element::int64); }
  /// `size` elements of type `e` at `data`, kept alive by `owner`.
  index_array(std::shared_ptr<void const> owner, std::byte const* data, std::size_t size,
              element e)
      : owner_(std::move(owner)), data_(data), size_(size), element_(e) {}

  [[nodiscard]] std::int64_t operator[](std::size_t i) const noexcept {
    switch (element_) {
      case element::int32: return load<std::int32_t>(i);
      case element::uint32: return load<std::uint32_t>(i);
      case element::int64: break;
    }
    return load<std::int64_t>(i);
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] element type() const noexcept { return element_; }
  [[nodiscard]] static std::size_t width(element e) noexcept { return e == element::int64 ? 8 : 4; }
  /// The elements as stored.
  [[nodiscard]] std::span<std::byte const> bytes() const noexcept {
    return {data_, size_ * width(element_)};
  }
  /// The values, widened.
  [[nodiscard]] std::vector<std::int64_t> values() const {
    std::vector<std::int64_t> out(size_);
    for (std::size_t i = 0; i < size_; ++i) out[i] = (*this)[i];
    return out;
  }

 private:
  template <class T>
  void own(std::vector<T> values, element e) {
    auto held = std::make_shared<std::vector<T> const>(std::move(values));
    data_ = reinterpret_cast<std::byte const*>(held->data());
    size_ = held->size();
    element_ = e;
    owner_ = std::move(held);
  }
  template <class T>
  [[nodiscard]] std::int64_t load(std::size_t i) const noexcept {
    T v;
    std::memcpy(&v, data_ + i * sizeof(T), sizeof(T));  // a cache file's arrays are not aligned
    return static_cast<std::int64_t>(v);
  }

  std::shared_ptr<void const> owner_;
  std::byte const* data_ = nullptr;
  std::size_t size_ = 0;
  element element_ = element::int64;
};

/// The indices of one split: sample s of the dataset is sample shuffle_index[s] of the
/// concatenation of document_index's sequences, which starts at sample_index row j.
struct gpt_indices {
  std::int64_t tokens_per_epoch = 0;
  std::int64_t epochs = 0;
  bool separate_final_epoch = false;
  index_array document_index;  // int32
  index_array sample_index;    // [samples + 1][2]: (document_index position, offset)
  index_array shuffle_index;
  /// len(GPTDataset).
  [[nodiscard]] std::int64_t size() const noexcept {
    return static_cast<std::int64_t>(shuffle_index.size());
  }
};

/// Builds a split's indices over the sequences [begin, end) of a dataset whose sequence lengths
/// are `lengths`. Throws input_error when the split holds no tokens.
MEGAMOE_DECL gpt_indices build_gpt_indices(std::span<std::int32_t const> lengths,
                                           std::int64_t begin, std::int64_t end,
                                           gpt_dataset_options const& options);

/// A sample's tokens (seq_length + extra of them, padded with `pad` only past the data's end
/// without drop_last) and the sequences they come from.
struct gpt_sample {
  std::vector<std::int64_t> text;
  std::vector<std::int64_t> document_ids;
};

/// Sample `index` of the split (GPTDataset._query_document_sample_shuffle_indices).
MEGAMOE_DECL gpt_sample query_sample(indexed_dataset const& dataset, gpt_indices const& indices,
                                     gpt_dataset_options const& options, std::int64_t index,
                                     std::int64_t pad = -1);
/// The same into `out`, whose vectors keep their capacity from sample to sample.
MEGAMOE_DECL void query_sample(indexed_dataset const& dataset, gpt_indices const& indices,
                               gpt_dataset_options const& options, std::int64_t index,
                               std::int64_t pad, gpt_sample& out);

/// What GPTDataset.__getitem__ makes of a sample.
struct gpt_item_options {
  bool add_extra_token = true;  // as the sample was made; without, labels roll and end in pad
  std::int64_t eod = 0;
  std::int64_t pad = -1;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
};
struct gpt_item {
  std::vector<std::int64_t> tokens, labels, position_ids;
  std::vector<float> loss_mask;
  /// Row r of the attention mask is open on columns [attention_row_start[r], r].
  std::vector<std::int64_t> attention_row_start;
};
/// Tokens and labels of a sample (extra token: text[:-1] and text[1:]; without: text, and text
/// rolled left ending in pad), its loss mask, position ids and attention rows; pads become 0
/// after the masks are made.
MEGAMOE_DECL gpt_item make_item(std::span<std::int64_t const> text, gpt_item_options const& o);

}  // namespace megamoe::data

#if MEGAMOE_HEADER_ONLY
#include <megamoe/data/gpt_dataset.ipp>
#endif
