// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/permute.hpp — grouping tokens by expert and back.
//
// `make_permutation` turns a routing map [T,E] into the row order the experts read: rows grouped by
// expert ascending, tokens ascending inside an expert (the reference's order). In drop-and-pad mode
// every expert gets exactly C rows (its routed tokens first, then its lowest-index other tokens).
// `permute` gathers token rows into that order, `unpermute` scatter-adds rows back to their tokens
// (optionally weighted by their probs), and `sort_chunks` re-orders contiguous chunks (the
// all-to-all dispatcher's second permutation). The permuted buffer is the only [N,H] buffer.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace megamoe::dispatch {

/// The row order of a permutation: row j holds token `source_token[j]` for expert `row_expert[j]`.
struct permutation {
  std::vector<int> source_token;                // [N] (the reference's sorted_indices)
  std::vector<int> row_expert;                  // [N]
  std::vector<std::int64_t> tokens_per_expert;  // [E] rows per expert
  int num_tokens = 0;                           // T
  bool drop_and_pad = false;

  [[nodiscard]] int rows() const noexcept { return static_cast<int>(source_token.size()); }
};

/// Row order for `map` [T,E]. With `capacity` > 0 (drop-and-pad), each expert gets exactly
/// min(capacity, T) rows. Only the experts [first_expert, first_expert + count) take part (all of
/// them by default), numbered from 0 in `row_expert` and `tokens_per_expert`. `out` is reused: no
/// allocation once it has grown. `map` is a mask_matrix or a map of one.
template <class Map>
void make_permutation(Map const& map, permutation& out, int capacity = 0, int first_expert = 0,
                      int count = -1) {
  int const tokens = static_cast<int>(map.rows());
  int const experts = count < 0 ? static_cast<int>(map.cols()) - first_expert : count;
  if (first_expert < 0 || first_expert + experts > map.cols())
    throw input_error("make_permutation: experts [" + std::to_string(first_expert) + ", " +
                      std::to_string(first_expert + experts) + ") outside a map of " +
                      std::to_string(map.cols()) + " experts");
  out.num_tokens = tokens;
  out.drop_and_pad = capacity > 0;
  out.source_token.clear();
  out.row_expert.clear();
  out.tokens_per_expert.assign(static_cast<std::size_t>(experts), 0);
  for (int e = 0; e < experts; ++e) {
    int taken = 0;
    int const limit = out.drop_and_pad ? std::min(capacity, tokens) : tokens;
    for (int pass = 0; pass < (out.drop_and_pad ? 2 : 1); ++pass) {
      for (int t = 0; t < tokens && taken < limit; ++t) {
        bool const routed = map(t, first_expert + e) != 0;
        if (routed != (pass == 0)) continue;
        out.source_token.push_back(t);
        out.row_expert.push_back(e);
        ++taken;
      }
    }
    out.tokens_per_expert[static_cast<std::size_t>(e)] = taken;
  }
}

/// rows[j] = tokens[source_token[j]]; `rows` is resized to [N,H].
template <class T, class In>
void permute(Eigen::MatrixBase<In> const& tokens, permutation const& p, row_matrix<T>& rows) {
  if (tokens.rows() != p.num_tokens)
    throw input_error("permute: tokens have " + std::to_string(tokens.rows()) +
                      " rows but the routing map has " + std::to_string(p.num_tokens));
  rows.resize(p.rows(), tokens.cols());
  for (int j = 0; j < p.rows(); ++j)
    rows.row(j) = tokens.row(p.source_token[static_cast<std::size_t>(j)]).template cast<T>();
}

/// row_probs[j] = probs(source_token[j], row_expert[j]).
template <class P, class In>
void permute_probs(Eigen::MatrixBase<In> const& probs, permutation const& p,
                   std::vector<P>& row_probs) {
  row_probs.resize(static_cast<std::size_t>(p.rows()));
  for (int j = 0; j < p.rows(); ++j)
    row_probs[static_cast<std::size_t>(j)] = static_cast<P>(probs(
        p.source_token[static_cast<std::size_t>(j)], p.row_expert[static_cast<std::size_t>(j)]));
}

/// out[t] = sum of rows j with source t (times row_probs[j] when given), accumulated in the rows'
/// type or the probs' type, whichever is wider, then stored as Out. `out` is resized to [T,H].
template <class Out, class Rows, class P = Out>
void unpermute(Eigen::MatrixBase<Rows> const& rows, permutation const& p, row_matrix<Out>& out,
               std::span<P const> row_probs = {}) {
  using acc =
      std::conditional_t<(sizeof(P) > sizeof(typename Rows::Scalar)), P, typename Rows::Scalar>;
  if (rows.rows() != p.rows())
    throw input_error("unpermute: got " + std::to_string(rows.rows()) +
                      " rows, the permutation has " + std::to_string(p.rows()));
  auto accumulate = [&](row_matrix<acc>& sum) {
    sum.setZero(p.num_tokens, rows.cols());
    for (int j = 0; j < p.rows(); ++j) {
      auto const t = p.source_token[static_cast<std::size_t>(j)];
      if (row_probs.empty()) {
        sum.row(t) += rows.row(j).template cast<acc>();
      } else {
        sum.row(t) += rows.row(j).template cast<acc>() *
                      static_cast<acc>(row_probs[static_cast<std::size_t>(j)]);
      }
    }
  };
  if constexpr (std::is_same_v<acc, Out>) {
    accumulate(out);  // straight into the output: no buffer besides it
  } else {
    // A wider type than the output (fp64 probs on fp32 rows): sum there, then round once, as the
    // reference's promoted unpermute does.
    row_matrix<acc> sum;
    accumulate(sum);
    out = sum.template cast<Out>();
  }
}

/// Concatenates the chunks of `in` (sizes `split_sizes`, in order) in the order `chunk_order`.
template <class T>
void sort_chunks(row_matrix<T> const& in, std::span<std::int64_t const> split_sizes,
                 std::span<int const> chunk_order, row_matrix<T>& out) {
  std::vector<std::int64_t> start(split_sizes.size() + 1, 0);
  for (std::size_t i = 0; i < split_sizes.size(); ++i) start[i + 1] = start[i] + split_sizes[i];
  if (start.back() != in.rows())
    throw input_error("sort_chunks: split sizes add up to " + std::to_string(start.back()) +
                      " rows but the input has " + std::to_string(in.rows()));
  std::vector<bool> seen(split_sizes.size(), false);
  if (chunk_order.size() != split_sizes.size())
    throw input_error("sort_chunks: the chunk order must name every chunk once");
  for (int chunk : chunk_order) {
    if (chunk < 0 || static_cast<std::size_t>(chunk) >= split_sizes.size() ||
        seen[static_cast<std::size_t>(chunk)])
      throw input_error(
          "sort_chunks: the chunk order must name every chunk once (bad or repeated "
          "index " +
          std::to_string(chunk) + ")");
    seen[static_cast<std::size_t>(chunk)] = true;
  }
  out.resize(in.rows(), in.cols());
  Eigen::Index row = 0;
  for (int chunk : chunk_order) {
    auto const n = split_sizes[static_cast<std::size_t>(chunk)];
    out.middleRows(row, n) = in.middleRows(start[static_cast<std::size_t>(chunk)], n);
    row += n;
  }
}

}  // namespace megamoe::dispatch
