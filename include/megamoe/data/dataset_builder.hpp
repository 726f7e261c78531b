// SPDX-License-Identifier: Apache-2.0
// megamoe/data/dataset_builder.hpp — Megatron-Core's BlendedMegatronDatasetBuilder: from
// `--data-path` (or one path list per split), `--split`, the sequence length, the seed and the
// samples each split is asked for, the train, valid and test datasets whose samples are, in order,
// the token ids Megatron-Core's GPTDataset and BlendedDataset give.
//
// One dataset without weights is built with each split's requested size directly. A blend's
// datasets are each built with their share of the size and the mid-level surplus (half a percent),
// all with the same seed, and a blended dataset draws from them by build_blending_indices. A blend
// without weights builds one epoch of each dataset and blends them in proportion to their lengths,
// up to the requested size, or, with no size, over all of their samples.
//
// With a cache directory, a split's indices are kept there in a file named by a hash of everything
// they depend on, and a later build with the same inputs maps that file instead of building: the
// ranks of a node that read it share its pages.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/data/blended_dataset.hpp>
#include <megamoe/data/gpt_dataset.hpp>
#include <megamoe/data/indexed_dataset.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace megamoe::data {

/// Train, valid and test, in Megatron's order.
enum class split_kind : int { train = 0, valid = 1, test = 2 };
inline constexpr std::array<split_kind, 3> split_kinds{split_kind::train, split_kind::valid,
                                                       split_kind::test};
/// "train", "valid", "test".
MEGAMOE_DECL std::string_view name_of(split_kind split);

/// Dataset prefixes and, for a weighted blend, their weights (as given; normalised when built).
struct blend {
  std::vector<std::filesystem::path> prefixes;
  std::optional<std::vector<double>> weights;
};

/// Megatron's `--data-path` words: "A B C" (prefixes) or "0.3 A 0.7 B" (weight, prefix pairs).
/// Throws input_error for no words, a weight that is negative, zero or not finite, and weights
/// and prefixes that do not pair up (an odd count whose first word is a number).
MEGAMOE_DECL blend parse_blend(std::span<std::string const> words);

/// Samples asked of each split (none: one epoch, without a blend's weights).
using split_sizes = std::array<std::optional<std::int64_t>, 3>;

/// Megatron's requested sizes for a run of `train_iters` steps of `global_batch` samples that
/// evaluates `eval_iters` batches every `eval_interval` steps: train steps x batch, valid
/// (steps / interval + 1) x eval iters x batch, test eval iters x batch.
MEGAMOE_DECL split_sizes requested_samples(std::int64_t train_iters, std::int64_t global_batch,
                                           std::int64_t eval_interval, std::int64_t eval_iters);

/// One split of one indexed dataset in GPTDataset's order.
class gpt_split_dataset {
 public:
  gpt_split_dataset(std::shared_ptr<indexed_dataset const> dataset, gpt_indices indices,
                    gpt_dataset_options options)
      : dataset_(std::move(dataset)), indices_(std::move(indices)), options_(options) {}

  /// len(GPTDataset): whole epochs are built, so this is at least what was asked for.
  [[nodiscard]] std::int64_t size() const noexcept { return indices_.size(); }
  [[nodiscard]] gpt_sample sample(std::int64_t i, std::int64_t pad = -1) const {
    return query_sample(*dataset_, indices_, options_, i, pad);
  }
  void sample(std::int64_t i, std::int64_t pad, gpt_sample& out) const {
    query_sample(*dataset_, indices_, options_, i, pad, out);
  }
  [[nodiscard]] indexed_dataset const& dataset() const noexcept { return *dataset_; }
  [[nodiscard]] gpt_indices const& indices() const noexcept { return indices_; }
  [[nodiscard]] gpt_dataset_options const& options() const noexcept { return options_; }

 private:
  std::shared_ptr<indexed_dataset const> dataset_;
  gpt_indices indices_;
  gpt_dataset_options options_;
};

/// A split as the trainer draws it: one dataset, or a blend of several.
class split_dataset {
 public:
  /// One dataset's split.
  explicit split_dataset(gpt_split_dataset dataset);
  /// A blend: blended sample s is sample blending.dataset_sample_index[s] of dataset
  /// blending.dataset_index[s]; `weights` as the blend holds them. Throws input_error when the
  /// blend asks a dataset for more samples than it has.
  split_dataset(std::vector<gpt_split_dataset> datasets, std::vector<double> weights,
                blending_indices blending);

  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  /// Sample i (seq_length + 1 ids) and the dataset of the blend it comes from.
  [[nodiscard]] gpt_sample sample(std::int64_t i, std::int64_t pad = -1) const;
  /// The same into `out` (its vectors keep their capacity).
  void sample(std::int64_t i, std::int64_t pad, gpt_sample& out) const;
  [[nodiscard]] std::int16_t dataset_of(std::int64_t i) const;
  [[nodiscard]] std::span<gpt_split_dataset const> datasets() const noexcept { return datasets_; }
  [[nodiscard]] std::span<double const> weights() const noexcept { return weights_; }
  [[nodiscard]] bool blended() const noexcept { return blending_.has_value(); }
  [[nodiscard]] blending_indices const* blending() const noexcept {
    return blending_ ? &*blending_ : nullptr;
  }

 private:
  void check_index(std::int64_t i) const;

  std::vector<gpt_split_dataset> datasets_;
  std::vector<double> weights_;
  std::optional<blending_indices> blending_;
  std::int64_t size_ = 0;
};

/// What BlendedMegatronDatasetBuilder builds from (Megatron's flags in brackets).
struct dataset_builder_options {
  std::optional<blend> data;                   // [--data-path]
  std::array<std::optional<blend>, 3> per_split;  // [--train-data-path, --valid-, --test-]
  std::string split = "969, 30, 1";            // [--split], with --data-path only
  std::int64_t seq_length = 0;                 // [--seq-length]
  std::uint32_t seed = 1234;                   // [--seed]
  bool add_extra_token = true;
  bool drop_last_partial_validation = true;
  double mid_level_surplus = 0.005;            // [--mid-level-dataset-surplus]
  std::optional<std::filesystem::path> cache;  // [--data-cache-path]
  bool multimodal = false;
};

/// The three splits (none where a split is not built: its share is empty, it has no paths, or
/// it is asked for no samples). Throws input_error for a dataset that does not open, a split
/// with no tokens that is asked for samples, weights without sizes, and a blend that asks a
/// dataset for more samples than it has.
MEGAMOE_DECL std::array<std::optional<split_dataset>, 3> build_datasets(
    dataset_builder_options const& options, split_sizes const& sizes);

/// The indices of a split, mapped from `cache` when a file there was made from the same inputs,
/// otherwise built and written there (a temporary file renamed into place, so that ranks
/// building together never read half a file). No cache: built.
MEGAMOE_DECL gpt_indices cached_gpt_indices(std::optional<std::filesystem::path> const& cache,
                                            indexed_dataset const& dataset,
                                            std::filesystem::path const& prefix,
                                            std::int64_t begin, std::int64_t end,
                                            gpt_dataset_options const& options);

}  // namespace megamoe::data

#if MEGAMOE_HEADER_ONLY
#include <megamoe/data/dataset_builder.ipp>
#endif
