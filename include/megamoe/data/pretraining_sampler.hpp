// SPDX-License-Identifier: Apache-2.0
// megamoe/data/pretraining_sampler.hpp — the order in which a data-parallel job consumes a
// split's samples, as Megatron's MegatronPretrainingSampler hands them out: consecutive samples
// from the number already consumed, in blocks of micro-batch x DP samples; in each block, DP rank
// r takes the micro-batch-sized slice r. A global batch of M micro-batches per rank is M blocks,
// so the samples one step reads do not depend on how the ranks are laid out beyond DP.
#pragma once

#include <megamoe/core/error.hpp>

#include <cstdint>
#include <string>

namespace megamoe::data {

struct pretraining_sampler {
  std::int64_t micro_batch = 1;
  std::int64_t data_parallel_size = 1;
  std::int64_t data_parallel_rank = 0;

  /// Samples in one block (one micro-batch of every DP rank).
  [[nodiscard]] constexpr std::int64_t block() const noexcept {
    return micro_batch * data_parallel_size;
  }
  /// The sample that position b of this rank's micro-batch m reads, m counted in blocks from
  /// `consumed` samples.
  [[nodiscard]] constexpr std::int64_t sample(std::int64_t consumed, std::int64_t m,
                                              std::int64_t b) const noexcept {
    return consumed + m * block() + data_parallel_rank * micro_batch + b;
  }
  /// Whole blocks left in a split of `total` samples after `consumed` (a last partial block is
  /// dropped, as Megatron's sampler drops it).
  [[nodiscard]] constexpr std::int64_t blocks_left(std::int64_t total,
                                                   std::int64_t consumed) const noexcept {
    return consumed >= total ? 0 : (total - consumed) / block();
  }
  /// Throws input_error unless the degrees make sense.
  void check() const {
    if (micro_batch < 1 || data_parallel_size < 1 || data_parallel_rank < 0 ||
        data_parallel_rank >= data_parallel_size)
      throw input_error("pretraining sampler: micro-batch " + std::to_string(micro_batch) +
                        ", DP rank " + std::to_string(data_parallel_rank) + " of " +
                        std::to_string(data_parallel_size));
  }
};

}  // namespace megamoe::data
