// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/sgemm_avx512.hpp — megamoe's own fp32 GEMM for AVX-512: packing and a 14x32
// register micro-kernel, single-threaded, on buffers the caller owns.
//
// Every function here carries a function-level target attribute, so users' builds need no ISA
// flag; expert/gemm.hpp calls in only after core/cpu_features.hpp found AVX-512 at start-up.
//
// Blocking: for each kc-deep slice of k and mc-tall block of rows, A is packed once into kc x 14
// micro-panels (the block stays in L3); for each nc-wide block of columns B is packed into kc x 32
// micro-panels (the block stays in L2). One A micro-panel stays in L1 while the kernel walks along
// a row of micro-tiles, streaming B's micro-panels from L2. The micro-kernel holds a 14 x 32 tile
// of C in 28 zmm registers and adds one rank-1 update per k from one broadcast of A and two
// vectors of B. Operands stored with k contiguous are transposed 16 x 16 in registers on packing.
//
// Numerics: each kc block is summed from zero in k order and added to C block after block, so a
// row of C depends on nothing but its own row of op(A) and op(B): cutting a problem into row shares
// (the grouped backend, the overlapped dispatcher's pieces) never changes a bit.
#pragma once

#include <megamoe/expert/gemm_problem.hpp>

#include <algorithm>
#include <cstddef>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MEGAMOE_HAS_AVX512_KERNELS 1
#define MEGAMOE_TARGET_AVX512 __attribute__((target("avx512f")))
#else
#define MEGAMOE_HAS_AVX512_KERNELS 0
#endif

namespace megamoe::expert::avx512 {

/// Register and cache blocking of the kernel.
struct sgemm_blocking {
  /// Rows of a micro-tile: 14 x 2 accumulators + 2 vectors of B + 1 broadcast fit 32 registers.
  static constexpr int mr = 14;
  /// Columns of a micro-tile: two 16-lane vectors.
  static constexpr int nr = 32;
  /// Depth of a packed slice: an A micro-panel (kc x mr floats, 21 KiB) stays in L1.
  static constexpr int kc = 384;
  /// Rows of a packed A block (1344 x 384 floats, 2 MiB) stay in L3; a thread's share of an
  /// expert's rows mostly fits one block, so B is packed about once per slice.
  static constexpr int mc = 96 * mr;
  /// Columns of a packed B block (384 x 256 floats, 384 KiB) stay in L2.
  static constexpr int nc = 256;
  static constexpr std::size_t a_elements = static_cast<std::size_t>(mc) * kc;
  static constexpr std::size_t b_elements = static_cast<std::size_t>(kc) * nc;
};

#if MEGAMOE_HAS_AVX512_KERNELS

// GCC 12's unmasked shuffles start from _mm512_undefined_ps(), which -Wmaybe-uninitialized reports
// once they are inlined here (and -Wuninitialized where a caller makes GCC emit them out of line);
// the value is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace detail {

using blk = sgemm_blocking;

/// The low `count` lanes of a 16-lane mask (count clamped to [0, 16]).
MEGAMOE_TARGET_AVX512 inline __mmask16 lanes(int count) {
  if (count >= 16) return static_cast<__mmask16>(0xFFFF);
  if (count <= 0) return 0;
  return static_cast<__mmask16>((1u << count) - 1u);
}

/// In-register transpose of a 16 x 16 block: rows[i] lane j becomes rows[j] lane i.
MEGAMOE_TARGET_AVX512 inline void transpose_16x16(__m512 (&rows)[16]) {
  __m512 pairs[16], quads[16];
  for (int i = 0; i < 16; i += 2) {
    pairs[i] = _mm512_unpacklo_ps(rows[i], rows[i + 1]);
    pairs[i + 1] = _mm512_unpackhi_ps(rows[i], rows[i + 1]);
  }
  // quads[4g + j], 128-bit lane l: column 4l + j of rows 4g .. 4g + 3.
  for (int g = 0; g < 16; g += 4) {
    __m512d const p0 = _mm512_castps_pd(pairs[g]), p1 = _mm512_castps_pd(pairs[g + 1]);
    __m512d const p2 = _mm512_castps_pd(pairs[g + 2]), p3 = _mm512_castps_pd(pairs[g + 3]);
    quads[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(p0, p2));
    quads[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(p0, p2));
    quads[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(p1, p3));
    quads[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(p1, p3));
  }
  // Column 4l + j gathers 128-bit lane l of quads[j], quads[4 + j], quads[8 + j], quads[12 + j].
  for (int j = 0; j < 4; ++j) {
    __m512 const even01 = _mm512_shuffle_f32x4(quads[j], quads[4 + j], _MM_SHUFFLE(2, 0, 2, 0));
    __m512 const odd01 = _mm512_shuffle_f32x4(quads[j], quads[4 + j], _MM_SHUFFLE(3, 1, 3, 1));
    __m512 const even23 =
        _mm512_shuffle_f32x4(quads[8 + j], quads[12 + j], _MM_SHUFFLE(2, 0, 2, 0));
    __m512 const odd23 = _mm512_shuffle_f32x4(quads[8 + j], quads[12 + j], _MM_SHUFFLE(3, 1, 3, 1));
    rows[j] = _mm512_shuffle_f32x4(even01, even23, _MM_SHUFFLE(2, 0, 2, 0));
    rows[4 + j] = _mm512_shuffle_f32x4(odd01, odd23, _MM_SHUFFLE(2, 0, 2, 0));
    rows[8 + j] = _mm512_shuffle_f32x4(even01, even23, _MM_SHUFFLE(3, 1, 3, 1));
    rows[12 + j] = _mm512_shuffle_f32x4(odd01, odd23, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

/// Transposes `count` (<= 16) rows of a matrix stored with k contiguous, depths [0, kb), into
/// [kb][stride] at `dst` (lanes [0, lanes_out) of each depth; rows past `count` are zero).
MEGAMOE_TARGET_AVX512 inline void transpose_rows(float const* src, std::ptrdiff_t ld, int count,
                                                 int kb, float* dst, int stride,
                                                 __mmask16 lanes_out) {
  __m512 block[16];
  for (int k0 = 0; k0 < kb; k0 += 16) {
    int const depths = std::min(16, kb - k0);
    __mmask16 const valid = lanes(depths);
    for (int i = 0; i < 16; ++i)
      block[i] = i < count ? _mm512_maskz_loadu_ps(valid, src + i * ld + k0) : _mm512_setzero_ps();
    transpose_16x16(block);
    for (int d = 0; d < depths; ++d)
      _mm512_mask_storeu_ps(dst + static_cast<std::ptrdiff_t>(k0 + d) * stride, lanes_out,
                            block[d]);
  }
}

/// op(A) rows [i0, i0 + mb), depths [p0, p0 + kb) into mr-row micro-panels laid out [kb][mr];
/// rows past mb are zero.
template <gemm_op Op>
MEGAMOE_TARGET_AVX512 void pack_a(float const* a, std::ptrdiff_t lda, int i0, int mb, int p0,
                                  int kb, float* dst) {
  constexpr int mr = blk::mr;
  for (int q = 0; q < mb; q += mr) {
    int const rows = std::min(mr, mb - q);
    float* const panel = dst + static_cast<std::ptrdiff_t>(q) * kb;
    if constexpr (Op == gemm_op::tn) {
      // Stored [k, m]: each depth holds the panel's rows side by side.
      __mmask16 const valid = lanes(rows);
      float const* src = a + static_cast<std::ptrdiff_t>(p0) * lda + i0 + q;
      for (int k = 0; k < kb; ++k, src += lda)
        _mm512_mask_storeu_ps(panel + k * mr, lanes(mr), _mm512_maskz_loadu_ps(valid, src));
    } else {
      transpose_rows(a + static_cast<std::ptrdiff_t>(i0 + q) * lda + p0, lda, rows, kb, panel, mr,
                     lanes(mr));
    }
  }
}

/// op(B) depths [p0, p0 + kb), columns [j0, j0 + nb) into nr-column micro-panels laid out
/// [kb][nr]; columns past nb are zero.
template <gemm_op Op>
MEGAMOE_TARGET_AVX512 void pack_b(float const* b, std::ptrdiff_t ldb, int p0, int kb, int j0,
                                  int nb, float* dst) {
  constexpr int nr = blk::nr;
  for (int q = 0; q < nb; q += nr) {
    int const cols = std::min(nr, nb - q);
    float* const panel = dst + static_cast<std::ptrdiff_t>(q) * kb;
    if constexpr (Op == gemm_op::nt) {
      // Stored [n, k]: two 16-column halves, each transposed.
      for (int half = 0; half < nr; half += 16)
        transpose_rows(b + static_cast<std::ptrdiff_t>(j0 + q + half) * ldb + p0, ldb,
                       std::clamp(cols - half, 0, 16), kb, panel + half, nr, lanes(16));
    } else {
      __mmask16 const low = lanes(cols), high = lanes(cols - 16);
      float const* src = b + static_cast<std::ptrdiff_t>(p0) * ldb + j0 + q;
      for (int k = 0; k < kb; ++k, src += ldb) {
        _mm512_storeu_ps(panel + k * nr, _mm512_maskz_loadu_ps(low, src));
        _mm512_storeu_ps(panel + k * nr + 16, _mm512_maskz_loadu_ps(high, src + 16));
      }
    }
  }
}

/// C[rows, cols] (=|+=) a_panel^T b_panel over kb depths; the tile is computed whole (padding rows
/// and columns are zero) and stored under masks.
MEGAMOE_TARGET_AVX512 inline void micro_kernel(int kb, float const* a, float const* b, float* c,
                                               std::ptrdiff_t ldc, int rows, int cols,
                                               bool overwrite) {
  constexpr int mr = blk::mr;
  // C's tile is read only after the k loop; fetching it now hides its misses behind the FMAs.
  for (int r = 0; r < rows; ++r) {
    _mm_prefetch(reinterpret_cast<char const*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<char const*>(c + r * ldc + 16), _MM_HINT_T0);
  }
  __m512 low[mr], high[mr];
#pragma GCC unroll 14
  for (int r = 0; r < mr; ++r) {
    low[r] = _mm512_setzero_ps();
    high[r] = _mm512_setzero_ps();
  }
  for (int k = 0; k < kb; ++k) {
    __m512 const b_low = _mm512_loadu_ps(b);
    __m512 const b_high = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 14
    for (int r = 0; r < mr; ++r) {
      __m512 const a_r = _mm512_set1_ps(a[r]);
      low[r] = _mm512_fmadd_ps(a_r, b_low, low[r]);
      high[r] = _mm512_fmadd_ps(a_r, b_high, high[r]);
    }
    a += mr;
    b += blk::nr;
  }
  __mmask16 const low_mask = lanes(cols), high_mask = lanes(cols - 16);
#pragma GCC unroll 14
  for (int r = 0; r < mr; ++r) {
    if (r < rows) {
      float* const row = c + r * ldc;
      if (!overwrite) {
        low[r] = _mm512_add_ps(low[r], _mm512_maskz_loadu_ps(low_mask, row));
        high[r] = _mm512_add_ps(high[r], _mm512_maskz_loadu_ps(high_mask, row + 16));
      }
      _mm512_mask_storeu_ps(row, low_mask, low[r]);
      _mm512_mask_storeu_ps(row + 16, high_mask, high[r]);
    }
  }
}

}  // namespace detail

/// Rows [row_begin, row_end) of C for problem `p` (p.k > 0), packing into `packed_a`
/// (sgemm_blocking::a_elements) and `packed_b` (sgemm_blocking::b_elements).
template <gemm_op Op>
MEGAMOE_TARGET_AVX512 void gemm_rows(gemm_problem<float> const& p, int row_begin, int row_end,
                                     float* packed_a, float* packed_b) {
  using blk = sgemm_blocking;
  int const m = row_end - row_begin;
  std::ptrdiff_t const ldc = p.ldc;
  float* const c = p.c + static_cast<std::ptrdiff_t>(row_begin) * ldc;
  for (int pc = 0; pc < p.k; pc += blk::kc) {
    int const kb = std::min(blk::kc, p.k - pc);
    bool const overwrite = pc == 0 && !p.accumulate;
    for (int ic = 0; ic < m; ic += blk::mc) {
      int const mb = std::min(blk::mc, m - ic);
      detail::pack_a<Op>(p.a, p.lda, row_begin + ic, mb, pc, kb, packed_a);
      for (int jc = 0; jc < p.n; jc += blk::nc) {
        int const nb = std::min(blk::nc, p.n - jc);
        detail::pack_b<Op>(p.b, p.ldb, pc, kb, jc, nb, packed_b);
        for (int ir = 0; ir < mb; ir += blk::mr)
          for (int jr = 0; jr < nb; jr += blk::nr)
            detail::micro_kernel(kb, packed_a + static_cast<std::ptrdiff_t>(ir) * kb,
                                 packed_b + static_cast<std::ptrdiff_t>(jr) * kb,
                                 c + static_cast<std::ptrdiff_t>(ic + ir) * ldc + jc + jr, ldc,
                                 std::min(blk::mr, mb - ir), std::min(blk::nr, nb - jr), overwrite);
      }
    }
  }
}

#pragma GCC diagnostic pop

#endif  // MEGAMOE_HAS_AVX512_KERNELS

}  // namespace megamoe::expert::avx512
