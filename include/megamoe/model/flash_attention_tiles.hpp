// SPDX-License-Identifier: Apache-2.0
// megamoe/model/flash_attention_tiles.hpp — flash attention's tile kernels: the tile product and
// the online softmax forward and backward, as portable loops (any T) and on AVX-512 (fp32).
#pragma once

#include <megamoe/core/vector_math.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace megamoe::attention::detail {

/// The portable tile operations (any T).
template <class T>
struct portable_tiles {
  /// C[m, n] (+)= A B: A(i, p) = a[i*ars + p*acs], B row-major (ldb), C row-major (ldc).
  static void product(int m, int n, int k, T const* a, std::ptrdiff_t ars, std::ptrdiff_t acs,
                      T const* b, std::ptrdiff_t ldb, T* c, std::ptrdiff_t ldc, bool accumulate) {
    for (int i = 0; i < m; ++i) {
      T* row = c + i * ldc;
      if (!accumulate) std::fill(row, row + n, T(0));
      for (int p = 0; p < k; ++p) {
        T const x = a[i * ars + p * acs];
        T const* brow = b + p * ldb;
        for (int j = 0; j < n; ++j) row[j] += x * brow[j];
      }
    }
  }
  /// Online softmax over a tile of scores (row i sees its first valid[i] columns): the tile
  /// becomes exp(s - new max) (0 where unseen), max and sum are updated, alpha[i] is what the
  /// row's earlier output is to be multiplied by.
  static void softmax_forward(int rows, int cols, T* s, std::ptrdiff_t lds, int const* valid,
                              T* max, T* sum, T* alpha) {
    for (int i = 0; i < rows; ++i) {
      T* row = s + i * lds;
      int const n = valid[i];
      T top = max[i];
      for (int j = 0; j < n; ++j) top = std::max(top, row[j]);
      alpha[i] = n == 0 ? T(1) : std::exp(max[i] - top);
      T total = 0;
      for (int j = 0; j < n; ++j) total += (row[j] = std::exp(row[j] - top));
      std::fill(row + n, row + cols, T(0));
      sum[i] = sum[i] * alpha[i] + total;
      max[i] = top;
    }
  }
  /// Backward of the softmax: s becomes P = exp(s - lse) (0 where unseen) and dp becomes
  /// dS = P (dp - d).
  static void softmax_backward(int rows, int cols, T* s, T* dp, std::ptrdiff_t ld, int const* valid,
                               T const* lse, T const* d) {
    for (int i = 0; i < rows; ++i) {
      T* srow = s + i * ld;
      T* drow = dp + i * ld;
      int const n = valid[i];
      for (int j = 0; j < n; ++j) {
        srow[j] = std::exp(srow[j] - lse[i]);
        drow[j] = srow[j] * (drow[j] - d[i]);
      }
      std::fill(srow + n, srow + cols, T(0));
      std::fill(drow + n, drow + cols, T(0));
    }
  }
};

#if MEGAMOE_VECTOR_MATH_AVX512

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

using simd::exp16;
using simd::lanes;

/// R rows x V vectors of C, all of depth k, in registers.
template <int R, int V>
MEGAMOE_AVX512_TARGET inline void product_block(int n, int k, float const* a, std::ptrdiff_t ars,
                                                std::ptrdiff_t acs, float const* b,
                                                std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc,
                                                bool accumulate) {
  __mmask16 mask[V];
  for (int v = 0; v < V; ++v) mask[v] = lanes(n - 16 * v);
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      acc[r][v] =
          accumulate ? _mm512_maskz_loadu_ps(mask[v], c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int p = 0; p < k; ++p) {
    __m512 bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) bv[v] = _mm512_maskz_loadu_ps(mask[v], b + p * ldb + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512 const x = _mm512_set1_ps(a[r * ars + p * acs]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(c + r * ldc + 16 * v, mask[v], acc[r][v]);
}

/// Rows in blocks of R (8 rows of up to two vectors, 6 of three or four), the rest one by one.
template <int V>
MEGAMOE_AVX512_TARGET inline void product_panel(int m, int n, int k, float const* a,
                                                std::ptrdiff_t ars, std::ptrdiff_t acs,
                                                float const* b, std::ptrdiff_t ldb, float* c,
                                                std::ptrdiff_t ldc, bool accumulate) {
  constexpr int R = V <= 2 ? 8 : 6;
  int i = 0;
  for (; i + R <= m; i += R)
    product_block<R, V>(n, k, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, accumulate);
  for (; i < m; ++i)
    product_block<1, V>(n, k, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, accumulate);
}

struct avx512_tiles {
  MEGAMOE_AVX512_TARGET static void product(int m, int n, int k, float const* a, std::ptrdiff_t ars,
                                            std::ptrdiff_t acs, float const* b, std::ptrdiff_t ldb,
                                            float* c, std::ptrdiff_t ldc, bool accumulate) {
    for (int j = 0; j < n; j += 64) {
      int const w = std::min(64, n - j);
      switch ((w + 15) / 16) {
        case 1: product_panel<1>(m, w, k, a, ars, acs, b + j, ldb, c + j, ldc, accumulate); break;
        case 2: product_panel<2>(m, w, k, a, ars, acs, b + j, ldb, c + j, ldc, accumulate); break;
        case 3: product_panel<3>(m, w, k, a, ars, acs, b + j, ldb, c + j, ldc, accumulate); break;
        default: product_panel<4>(m, w, k, a, ars, acs, b + j, ldb, c + j, ldc, accumulate);
      }
    }
  }

  MEGAMOE_AVX512_TARGET static void softmax_forward(int rows, int cols, float* s,
                                                    std::ptrdiff_t lds, int const* valid,
                                                    float* max, float* sum, float* alpha) {
    float const lowest = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < rows; ++i) {
      float* row = s + i * lds;
      int const n = valid[i];
      __m512 top = _mm512_set1_ps(max[i]);
      for (int j = 0; j < n; j += 16)
        top =
            _mm512_max_ps(top, _mm512_mask_loadu_ps(_mm512_set1_ps(lowest), lanes(n - j), row + j));
      float const m = _mm512_reduce_max_ps(top);
      alpha[i] = n == 0 ? 1.0f : std::exp(max[i] - m);
      __m512 const shift = _mm512_set1_ps(m);
      __m512 total = _mm512_setzero_ps();
      for (int j = 0; j < cols; j += 16) {
        __mmask16 const live = lanes(n - j), store = lanes(cols - j);
        __m512 const p = _mm512_maskz_mov_ps(
            live, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, row + j), shift)));
        total = _mm512_add_ps(total, p);
        _mm512_mask_storeu_ps(row + j, store, p);
      }
      sum[i] = sum[i] * alpha[i] + _mm512_reduce_add_ps(total);
      max[i] = m;
    }
  }

  MEGAMOE_AVX512_TARGET static void softmax_backward(int rows, int cols, float* s, float* dp,
                                                     std::ptrdiff_t ld, int const* valid,
                                                     float const* lse, float const* d) {
    for (int i = 0; i < rows; ++i) {
      float* srow = s + i * ld;
      float* drow = dp + i * ld;
      __m512 const l = _mm512_set1_ps(lse[i]), di = _mm512_set1_ps(d[i]);
      for (int j = 0; j < cols; j += 16) {
        __mmask16 const live = lanes(valid[i] - j), store = lanes(cols - j);
        __m512 const p = _mm512_maskz_mov_ps(
            live, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, srow + j), l)));
        __m512 const g = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(live, drow + j), di));
        _mm512_mask_storeu_ps(srow + j, store, p);
        _mm512_mask_storeu_ps(drow + j, store, g);
      }
    }
  }
};

#pragma GCC diagnostic pop

#endif  // MEGAMOE_VECTOR_MATH_AVX512

}  // namespace megamoe::attention::detail
