// SPDX-License-Identifier: Apache-2.0
// megamoe/model/moe_wire.hpp — the sender's half of dispatch::fp8_wire: this rank's token rows as
// the FP8 codes their experts' fc1 would make of them after the dispatch.
//
// Per-tensor scaling needs each expert's amax over its whole input, which is spread over every
// sender. So each rank takes the amax of each of its token rows once, the largest per expert
// over the rows it sends there, and one all-reduce over EP gives every rank every expert's amax
// (and, under delayed scaling, the scale each expert's owner holds for this step). Then each sent
// row is encoded with its expert's scale: the codes and the scale are the ones the experts'
// operands would make, bit for bit. Blocks within a row (wgrad_from_rowwise<mxfp8 or
// fp8_blockwise>) depend on the row alone: each token is quantized once, and each sent row is its
// token's codes followed by their block scales. The receiver's half is the routed operands'
// arrive_codes().
#pragma once

#include <megamoe/core/buffer.hpp>
#include <megamoe/core/by_need.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/token_rows.hpp>
#include <megamoe/parallel/watchdog.hpp>
#include <megamoe/precision/quantize.hpp>
#include <megamoe/precision/recipe.hpp>
#include <megamoe/precision/scaling.hpp>

#include <mpi.h>
#include <boost/mpi/communicator.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace megamoe {

/// Operands: the routed experts' operands (precision::grouped_operands with CodesOnWire).
template <class Operands>
class fp8_wire_codes {
 public:
  static constexpr auto format = Operands::input_row;
  static constexpr bool delayed = Operands::recipe.recipe == precision::recipe_id::fp8_delayed;
  static constexpr bool row_blocks = Operands::row_codes_travel;

  /// The codes of `rows` (permutation 1 of this rank's tokens [T, hidden] over every expert, in
  /// global expert order), each row Operands::wire_row_bytes(hidden) bytes. Per-tensor scales:
  /// collective over `ep` (ETP = 1), every expert's amax and scale first; `ops` holds experts
  /// [first_expert, + local_experts) (delayed scaling's scales).
  void encode(thread_pool& pool, boost::mpi::communicator const& ep,
              dispatch::token_rows const& rows, float const* tokens, int hidden,
              Operands const& ops, int first_expert, int local_experts) {
    if constexpr (row_blocks)
      encode_rows(pool, rows, tokens, hidden);
    else
      encode_with_tensor_scales(pool, ep, rows, tokens, hidden, ops, first_expert, local_experts);
  }

  /// The codes encode() made: [sent rows, wire row bytes].
  [[nodiscard]] std::uint8_t const* codes() const noexcept { return send_.data(); }
  /// Where the local experts' code rows arrive: [rows, wire row bytes], reused across
  /// micro-batches.
  std::uint8_t* arrivals(int rows, int hidden) {
    return received_.reserve(static_cast<std::size_t>(rows) * Operands::wire_row_bytes(hidden));
  }
  /// Per-tensor scales: each local expert's amax over every sender's rows (the operands'
  /// arrive_codes()); empty under block scales.
  [[nodiscard]] std::span<float const> local_amax() const noexcept { return local_amax_; }

 private:
  static std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }

  /// Row-local blocks: each token's codes and scales once, then each sent row a copy of its
  /// token's.
  void encode_rows(thread_pool& pool, dispatch::token_rows const& rows, float const* tokens,
                   int hidden) {
    auto const width = Operands::wire_row_bytes(hidden);
    auto const H = static_cast<std::size_t>(hidden);
    std::uint8_t* per_token = token_codes_.reserve(static_cast<std::size_t>(rows.tokens()) * width);
    parallel_rows(pool, rows.tokens(), [&](int begin, int end) {
      thread_local precision::quantized_matrix q;
      precision::quantize<format>(tokens + static_cast<std::size_t>(begin) * H, end - begin, hidden,
                                  1.0F, 0, q);
      precision::rows_to_bytes<format>(q, per_token + static_cast<std::size_t>(begin) * width);
    });
    std::uint8_t* out = send_.reserve(static_cast<std::size_t>(rows.rows()) * width);
    parallel_rows(pool, rows.rows(), [&](int begin, int end) {
      for (int r = begin; r < end; ++r)
        std::memcpy(out + static_cast<std::size_t>(r) * width,
                    per_token + static_cast<std::size_t>(rows.source_token(r)) * width, width);
    });
  }

  void encode_with_tensor_scales(thread_pool& pool, boost::mpi::communicator const& ep,
                                 dispatch::token_rows const& rows, float const* tokens, int hidden,
                                 Operands const& ops, int first_expert, int local_experts) {
    auto const& per_expert = rows.permutation().tokens_per_expert;
    auto const E = per_expert.size();
    auto const H = static_cast<std::size_t>(hidden);
    token_amax_.resize(static_cast<std::size_t>(rows.tokens()));
    parallel_rows(pool, rows.tokens(), [&](int begin, int end) {
      for (int t = begin; t < end; ++t)
        token_amax_[static_cast<std::size_t>(t)] =
            precision::amax_of(std::span<float const>(tokens + t * H, H));
    });
    // Bit patterns: non-negative floats order as their bits do, and NaN (0x7fc00000) above +inf,
    // so MPI's unsigned maximum is amax_of's maximum, NaN kept.
    reduced_.assign(delayed ? 2 * E : E, 0U);
    for (std::size_t e = 0, r = 0; e < E; ++e) {
      std::uint32_t most = 0;
      for (auto end = r + static_cast<std::size_t>(per_expert[e]); r < end; ++r)
        most = std::max(
            most,
            bits(token_amax_[static_cast<std::size_t>(rows.source_token(static_cast<int>(r)))]));
      reduced_[e] = most;
    }
    if constexpr (delayed)
      for (int l = 0; l < local_experts; ++l)
        reduced_[E + static_cast<std::size_t>(first_expert + l)] = bits(ops.delayed_input_scale(l));
    if (ep.size() > 1) {
      parallel::watched_collective const watch(MPI_Comm(ep), "fp8 wire amax",
                                               static_cast<std::int64_t>(reduced_.size()));
      MPI_Allreduce(MPI_IN_PLACE, reduced_.data(), static_cast<int>(reduced_.size()), MPI_UINT32_T,
                    MPI_MAX, MPI_Comm(ep));
    }
    scale_.resize(E);
    for (std::size_t e = 0; e < E; ++e)
      scale_[e] = delayed ? std::bit_cast<float>(reduced_[E + e])
                          : Operands::current_input_scale(std::bit_cast<float>(reduced_[e]));
    local_amax_.resize(static_cast<std::size_t>(local_experts));
    for (int l = 0; l < local_experts; ++l)
      local_amax_[static_cast<std::size_t>(l)] =
          std::bit_cast<float>(reduced_[static_cast<std::size_t>(first_expert + l)]);
    // The codes, as the operands' quantize<F> makes them.
    std::uint8_t* out = send_.reserve(static_cast<std::size_t>(rows.rows()) * H);
    parallel_rows(pool, rows.rows(), [&](int begin, int end) {
      for (int r = begin; r < end; ++r)
        precision::encode_per_tensor<format>(
            tokens + static_cast<std::size_t>(rows.source_token(r)) * H, H,
            scale_[static_cast<std::size_t>(rows.row_expert(r))],
            out + static_cast<std::size_t>(r) * H);
    });
  }

  std::vector<float> token_amax_;       // [T]
  std::vector<std::uint32_t> reduced_;  // [E] amax bits, then under delayed scaling [E] scale bits
  std::vector<float> scale_;            // [E]
  std::vector<float> local_amax_;       // [L]
  buffer<std::uint8_t> token_codes_, send_, received_;
};

}  // namespace megamoe

namespace megamoe::by_need {
/// This header is included.
template <class Dependent>
inline constexpr bool included<module::fp8_wire, Dependent> = true;
}  // namespace megamoe::by_need
