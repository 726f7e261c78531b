// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/all_to_all_pieces.hpp — the all-to-all dispatcher's in-place exchange, piece by
// piece of local experts: each piece's MPI datatypes and the all-to-all-w sides of both directions.
#pragma once

#include <megamoe/dispatch/expert_chunks.hpp>
#include <megamoe/dispatch/groups.hpp>
#include <megamoe/dispatch/token_rows.hpp>
#include <megamoe/parallel/collectives.hpp>

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace megamoe::dispatch::detail {

/// The in-place exchange of local experts [first, last): datatypes and both directions' sides.
struct all_to_all_piece {
  all_to_all_piece() = default;
  all_to_all_piece(all_to_all_piece&&) noexcept = default;
  all_to_all_piece& operator=(all_to_all_piece&&) noexcept = default;
  all_to_all_piece(all_to_all_piece const&) = delete;  // owns its datatypes
  all_to_all_piece& operator=(all_to_all_piece const&) = delete;
  ~all_to_all_piece() = default;

  int first = 0, last = 0;
  std::vector<parallel::datatype> row_types;
  std::array<std::vector<parallel::datatype>, 2> chunk_types;
  std::array<parallel::typed_side, 2> forward_send, forward_recv, backward_send, backward_recv;
  // CodesOnWire: the codes' chunks (bytes), sent contiguously in permutation-1 order.
  std::vector<parallel::datatype> code_types;
  parallel::typed_side code_send, code_recv;
};

/// Piece `piece` of local experts [first, last) of the in-place exchange (ETP = 1): datatypes that
/// let one all-to-all-w do permutation 1, the exchange and permutation 2 (and the reverse) without
/// staging copies: per destination EP rank, its token rows where they lie in the token buffer; per
/// source EP rank, its chunks where they belong in the expert-major rows (for tokens and for probs,
/// and with CodesOnWire for the codes' bytes). Lane 0 carries tokens, lane 1 probs.
/// `expert_start`: where each global expert's rows start in permutation-1 order; `offsets` and
/// `lengths` are scratch.
template <class T, bool CodesOnWire>
void build_piece(all_to_all_piece& piece, int first, int last, expert_groups const& groups,
                 expert_chunks const& chunks, int hidden, std::int64_t code_row_bytes,
                 std::span<std::int64_t const> expert_start, std::vector<MPI_Aint>& offsets,
                 std::vector<int>& lengths) {
  int const EP = groups.ep_size(), L = groups.local_experts();
  auto const peers = static_cast<std::size_t>(EP);
  piece.first = first;
  piece.last = last;
  piece.row_types.resize(peers);
  for (auto& t : piece.chunk_types) t.resize(peers);
  for (auto* side : {&piece.forward_send[0], &piece.forward_send[1], &piece.forward_recv[0],
                     &piece.forward_recv[1], &piece.backward_send[0], &piece.backward_send[1],
                     &piece.backward_recv[0], &piece.backward_recv[1]})
    side->resize(peers);
  if constexpr (CodesOnWire) {
    piece.code_send.resize(peers);
    piece.code_recv.resize(peers);
    piece.code_types.resize(peers);
  }
  for (int j = 0; j < EP; ++j) {
    auto const J = static_cast<std::size_t>(j);
    std::int64_t const begin = expert_start[J * L + piece.first];
    std::int64_t const n = expert_start[J * L + piece.last] - begin;
    offsets.resize(static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < n; ++r)
      offsets[static_cast<std::size_t>(r)] =
          static_cast<MPI_Aint>(chunks.send_rows().source_token(static_cast<int>(begin + r))) *
          hidden * static_cast<MPI_Aint>(sizeof(T));
    piece.row_types[J] = parallel::equal_blocks_type<T>(hidden, offsets);
    std::int64_t arriving = 0;
    for (int l = piece.first; l < piece.last; ++l) arriving += chunks.chunk_size()[J * L + l];
    for (int k = 0; k < 2; ++k) {
      int const width = k == 0 ? hidden : 1;
      lengths.resize(static_cast<std::size_t>(piece.last - piece.first));
      offsets.resize(lengths.size());
      for (int l = piece.first; l < piece.last; ++l) {
        std::size_t const c = J * L + l;
        auto const at = static_cast<std::size_t>(l - piece.first);
        lengths[at] = static_cast<int>(chunks.chunk_size()[c] * width);
        offsets[at] =
            static_cast<MPI_Aint>(chunks.target_start()[c] * width * std::int64_t{sizeof(T)});
      }
      piece.chunk_types[k][J] = parallel::blocks_type<T>(lengths, offsets);
      // Expert side: one chunk type per peer, when it has rows.
      for (auto* side : {&piece.forward_recv[k], &piece.backward_send[k]}) {
        side->counts[J] = arriving > 0 ? 1 : 0;
        side->types[J] = piece.chunk_types[k][J].get();
      }
      // Token side, contiguous in permutation-1 order (probs both ways, token rows coming
      // back).
      for (auto* side : {&piece.forward_send[k], &piece.backward_recv[k]}) {
        side->counts[J] = static_cast<int>(n * width);
        side->byte_offsets[J] = static_cast<int>(begin * width * std::int64_t{sizeof(T)});
        side->types[J] = parallel::mpi_type<T>();
      }
    }
    // Token rows leave straight from the token buffer.
    piece.forward_send[0].counts[J] = n > 0 ? 1 : 0;
    piece.forward_send[0].byte_offsets[J] = 0;
    piece.forward_send[0].types[J] = piece.row_types[J].get();
    if constexpr (CodesOnWire) {  // codes: contiguous rows out, chunks of bytes in
      for (int l = piece.first; l < piece.last; ++l) {
        std::size_t const c = J * L + l;
        auto const at = static_cast<std::size_t>(l - piece.first);
        lengths[at] = static_cast<int>(chunks.chunk_size()[c] * code_row_bytes);
        offsets[at] = static_cast<MPI_Aint>(chunks.target_start()[c] * code_row_bytes);
      }
      piece.code_types[J] = parallel::blocks_type<std::uint8_t>(lengths, offsets);
      piece.code_recv.counts[J] = arriving > 0 ? 1 : 0;
      piece.code_recv.types[J] = piece.code_types[J].get();
      piece.code_send.counts[J] = static_cast<int>(n * code_row_bytes);
      piece.code_send.byte_offsets[J] = static_cast<int>(begin * code_row_bytes);
      piece.code_send.types[J] = parallel::mpi_type<std::uint8_t>();
    }
  }
}

}  // namespace megamoe::dispatch::detail
