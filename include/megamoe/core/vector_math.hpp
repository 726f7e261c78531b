// SPDX-License-Identifier: Apache-2.0
// megamoe/core/vector_math.hpp — elementwise math on 16 fp32 lanes of AVX-512, for the kernels that
// choose AVX-512 by CPUID at run time (the library is built for any x86-64): each function carries
// its own target attribute, so callers need the same attribute and nothing else.
#pragma once

#include <algorithm>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MEGAMOE_VECTOR_MATH_AVX512 1
#define MEGAMOE_AVX512_TARGET __attribute__((target("avx512f")))
#else
#define MEGAMOE_VECTOR_MATH_AVX512 0
#endif

namespace megamoe::simd {

#if MEGAMOE_VECTOR_MATH_AVX512

/// exp(x) on 16 lanes: 2^n e^r with |r| <= ln2/2 (ln2 split in two for an exact reduction), e^r by
/// its degree-7 Taylor polynomial; relative error below 1.5e-7 (seen: 7.3e-8) from -87 to 88, and
/// 0 or denormals below.
MEGAMOE_AVX512_TARGET inline __m512 exp16(__m512 x) {
  // The masked forms name every operand: GCC 12's unmasked ones start from _mm512_undefined_ps(),
  // which -Wmaybe-uninitialized reports wherever they are inlined.
  __mmask16 const all = 0xFFFF;
  x = _mm512_mask_max_ps(x, all, x, _mm512_set1_ps(-87.5f));
  x = _mm512_mask_min_ps(x, all, x, _mm512_set1_ps(88.5f));
  __m512 const scaled = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  __m512 const n =
      _mm512_mask_roundscale_ps(scaled, all, scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_mask_scalef_ps(p, all, p, n);
}

/// The mask of the first n of 16 lanes (none for n <= 0, all for n >= 16).
MEGAMOE_AVX512_TARGET inline __mmask16 lanes(int n) {
  return n >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << std::max(0, n)) - 1u);
}

#endif

}  // namespace megamoe::simd
