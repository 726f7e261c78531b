// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/tile_gemm.ipp — the definitions behind tile_gemm.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/expert/tile_gemm.hpp>

namespace megamoe::expert::tiles {

MEGAMOE_DECL void packed_a::reset(int m, int k) {
  rows = m;
  depth = k;
  rows_padded = round_up(std::max(m, 1), tile_rows);
  depth_padded = round_up(std::max(k, 1), tile_depth);
  bits.assign(static_cast<std::size_t>(rows_padded) * static_cast<std::size_t>(depth_padded), 0);
}

MEGAMOE_DECL void packed_b::reset(int k, int n) {
  depth = k;
  cols = n;
  depth_padded = round_up(std::max(k, 1), tile_depth);
  cols_padded = round_up(std::max(n, 1), tile_columns);
  bits.assign(static_cast<std::size_t>(depth_padded) * static_cast<std::size_t>(cols_padded), 0);
}

#if MEGAMOE_HAS_AVX512_KERNELS
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace detail {

MEGAMOE_DECL MEGAMOE_TARGET_AVX512 void pack_a_avx512(operand_view const& v, int m, int k,
                                                      packed_a& out) {
  out.reset(m, k);
  auto row_of = [&](int r) {
    return out.bits.data() +
           static_cast<std::size_t>(r) * static_cast<std::size_t>(out.depth_padded);
  };
  if (!v.transposed) {
    for (int r = 0; r < m; ++r)
      for (int c = 0; c < k; c += 16)
        _mm512_mask_cvtepi32_storeu_epi16(row_of(r) + c, lanes(k - c),
                                          bf16_lanes(v.data + r * v.ld + c, k - c, v.unit));
    return;
  }
  // Stored [K, M]: pairs of stored rows give 16 rows of A a pair each; a 16 x 16 transpose of
  // those pairs makes 16 pairs of each of 16 rows.
  __m512i block[16];
  for (int r0 = 0; r0 < m; r0 += 16)
    for (int c0 = 0; c0 < k; c0 += 32) {
      for (int p = 0; p < 16; ++p) {
        int const c = c0 + 2 * p;
        block[p] =
            c < k ? vnni_pairs(v, c, std::min(2, k - c), r0, m - r0) : _mm512_setzero_si512();
      }
      transpose_16x16(block);
      for (int i = 0; i < 16 && r0 + i < m; ++i) _mm512_storeu_si512(row_of(r0 + i) + c0, block[i]);
    }
}

MEGAMOE_DECL MEGAMOE_TARGET_AVX512 void pack_b_avx512(operand_view const& v, int k, int n,
                                                      packed_b& out) {
  out.reset(k, n);
  auto tile_row = [&](int n_block, int pair) {
    return out.bits.data() + out.tile_offset(n_block, (2 * pair) / tile_depth) +
           static_cast<std::size_t>(pair % (tile_depth / 2)) * tile_depth;
  };
  if (!v.transposed) {
    // Stored [K, N]: two stored rows make one tile row per 16 columns.
    for (int pair = 0; 2 * pair < k; ++pair)
      for (int c = 0; c < n; c += tile_columns)
        _mm512_storeu_si512(tile_row(c / tile_columns, pair),
                            vnni_pairs(v, 2 * pair, std::min(2, k - 2 * pair), c, n - c));
    return;
  }
  // Stored [N, K]: 32 values of each of 16 stored rows are 16 pairs of 16 columns; a 16 x 16
  // transpose makes the tile's rows.
  __m512i block[16];
  for (int c0 = 0; c0 < n; c0 += tile_columns)
    for (int k0 = 0; k0 < k; k0 += tile_depth) {
      for (int i = 0; i < 16; ++i)
        block[i] = c0 + i < n ? row_pairs(v.data + (c0 + i) * v.ld + k0, k - k0, v.unit)
                              : _mm512_setzero_si512();
      transpose_16x16(block);
      for (int p = 0; p < 16; ++p)
        _mm512_storeu_si512(tile_row(c0 / tile_columns, k0 / 2 + p), block[p]);
    }
}

}  // namespace detail
#pragma GCC diagnostic pop
#endif

MEGAMOE_DECL void pack_a(operand_view const& v, int m, int k, packed_a& out) {
#if MEGAMOE_HAS_AVX512_KERNELS
  if (cpu().use_avx512()) return detail::pack_a_avx512(v, m, k, out);
#endif
  pack_a(
      m, k, [&](int r, int c) { return v.at(r, c); }, out);
}

MEGAMOE_DECL void pack_b(operand_view const& v, int k, int n, packed_b& out) {
#if MEGAMOE_HAS_AVX512_KERNELS
  if (cpu().use_avx512()) return detail::pack_b_avx512(v, k, n, out);
#endif
  pack_b(
      k, n, [&](int r, int c) { return v.at(r, c); }, out);
}

MEGAMOE_DECL std::atomic<std::uint64_t>& products_issued() {
  static std::atomic<std::uint64_t> count{0};
  return count;
}

}  // namespace megamoe::expert::tiles
