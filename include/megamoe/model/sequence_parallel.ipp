// SPDX-License-Identifier: Apache-2.0
// megamoe/model/sequence_parallel.ipp — the definitions behind sequence_parallel.hpp that depend on
// no configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/model/sequence_parallel.hpp>

namespace megamoe {

MEGAMOE_DECL void keep_context_chunks(std::span<std::int32_t const> all, int seq, int batch, int cp,
                                      int rank, std::vector<std::int32_t>& mine) {
  int const L = seq / (2 * cp);
  auto const run = static_cast<std::size_t>(L) * static_cast<std::size_t>(batch);
  mine.resize(2 * run);
  int const chunks[2] = {rank, 2 * cp - 1 - rank};
  for (int i = 0; i < 2; ++i)
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(chunks[i] * run), run,
                mine.begin() + static_cast<std::ptrdiff_t>(i * run));
}

MEGAMOE_DECL int context_chunks<true>::keep(std::span<std::int32_t const> tokens,
                                            std::span<std::int32_t const> targets, int seq,
                                            int batch) {
  tokens_ = tokens;
  targets_ = targets;
  int const cp = ranks();
  if (cp == 1) return seq;
  keep_context_chunks(tokens, seq, batch, cp, rank(), local_tokens_);
  tokens_ = local_tokens_;
  if (!targets.empty()) {
    keep_context_chunks(targets, seq, batch, cp, rank(), local_targets_);
    targets_ = local_targets_;
  }
  return seq / cp;
}

}  // namespace megamoe
