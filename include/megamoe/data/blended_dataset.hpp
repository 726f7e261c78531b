// SPDX-License-Identifier: Apache-2.0
// megamoe/data/blended_dataset.hpp — Megatron-Core's blends (`--data-path 0.3 A 0.7 B`): how many
// samples each dataset of a blend is asked for, and which dataset's which sample each blended
// sample is (helpers.cpp's build_blending_indices and build_exhaustive_blending_indices), bit for
// bit.
//
// The builder asks each dataset for ceil(size x weight) samples, and builds it with half a percent
// more (the mid-level surplus) so that rounding never leaves a blended sample without one. A
// blended sample goes to the dataset furthest behind its share so far (ties to the lower index).
#pragma once

#include <megamoe/core/compiled_once.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace megamoe::data {

/// One split's samples asked of each dataset of a blend: `target` (what the blend draws) and
/// `buffer` (what each dataset is built with: by default 0.5 % more).
struct blend_sample_counts {
  std::vector<std::int64_t> target, buffer;
};
/// For `size` blended samples over datasets of normalised `weights`; `surplus` is Megatron's
/// --mid-level-dataset-surplus.
MEGAMOE_DECL blend_sample_counts blend_counts(std::span<double const> weights, std::int64_t size,
                                              double surplus = 0.005);

/// Blended sample s is sample dataset_sample_index[s] of dataset dataset_index[s].
struct blending_indices {
  std::vector<std::int16_t> dataset_index;
  std::vector<std::int64_t> dataset_sample_index;
};
/// `size` samples after `weights` (as BlendedDataset holds them: normalised again).
MEGAMOE_DECL blending_indices build_blending_indices(std::span<double const> weights,
                                                     std::int64_t size);
/// Every sample of datasets of `sizes` samples, in proportion (a blend without weights and
/// without a requested size).
MEGAMOE_DECL blending_indices build_exhaustive_blending_indices(
    std::span<std::int64_t const> sizes);

}  // namespace megamoe::data

#if MEGAMOE_HEADER_ONLY
#include <megamoe/data/blended_dataset.ipp>
#endif
