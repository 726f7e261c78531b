// SPDX-License-Identifier: Apache-2.0
// A rank's share of a global batch of S positions x B sequences, for MPI tests that compare a
// mapped run with one rank: DP ranks split the sequences, the TP x CP ranks of a replica split its
// positions (sequence parallelism). Token order inside a shard is t = s*B + b, as everywhere.
#pragma once

#include <megamoe/core/tensor.hpp>

namespace megamoe::testing {

struct sequence_shard {
  int first_position, num_positions, first_sequence, num_sequences;
  [[nodiscard]] int tokens() const { return num_positions * num_sequences; }
};

/// [tokens, cols] of a shard: entry (t, c) = value(global position, global sequence, c).
template <class T, class F>
row_matrix<T> shard_table(sequence_shard const& sh, int cols, F&& value) {
  row_matrix<T> out(sh.tokens(), cols);
  for (int s = 0; s < sh.num_positions; ++s)
    for (int b = 0; b < sh.num_sequences; ++b)
      for (int c = 0; c < cols; ++c)
        out(s * sh.num_sequences + b, c) =
            static_cast<T>(value(sh.first_position + s, sh.first_sequence + b, c));
  return out;
}

/// Row of `outer` (a shard containing `inner`) for token t of `inner`.
inline int row_in(sequence_shard const& outer, sequence_shard const& inner, int t) {
  int const s = inner.first_position + t / inner.num_sequences;
  int const b = inner.first_sequence + t % inner.num_sequences;
  return (s - outer.first_position) * outer.num_sequences + (b - outer.first_sequence);
}

}  // namespace megamoe::testing
