// SPDX-License-Identifier: Apache-2.0
// megamoe/core/vector_math.hpp — elementwise math on 16 fp32 lanes of AVX-512, for the kernels that
// choose AVX-512 by CPUID at run time (the library is built for any x86-64): each function carries
// its own target attribute, so callers need the same attribute and nothing else.
#pragma once

#include <algorithm>
#include <cstdint>

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

/// 16 fp32 lanes as BF16 bits in each 32-bit lane's low half, rounded as to_bf16_bits
/// (core/bf16.hpp): to nearest even, NaN quiet with its sign, no saturation.
MEGAMOE_AVX512_TARGET inline __m512i bf16_bits(__m512 x) {
  __m512i const u = _mm512_castps_si512(x);
  __m512i const high = _mm512_srli_epi32(u, 16);
  __m512i const lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  __m512i const rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  __mmask16 const nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  __m512i const quiet =
      _mm512_or_si512(_mm512_set1_epi32(0x7FC0), _mm512_and_si512(high, _mm512_set1_epi32(0x8000)));
  return _mm512_mask_mov_epi32(rounded, nan, quiet);
}

/// The first `count` of 16 BF16 numbers (their bits) at `p` as fp32 (exact); the others zero.
/// AVX-512F alone (no 16-bit masked moves): a short run goes through a local copy.
MEGAMOE_AVX512_TARGET inline __m512 load_bf16(std::uint16_t const* p, int count) {
  alignas(32) std::uint16_t tail[16] = {};
  if (count < 16) {
    std::copy_n(p, std::max(0, count), tail);
    p = tail;
  }
  __m256i const bits = _mm256_loadu_si256(reinterpret_cast<__m256i const*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

/// Stores the first `count` of x's 16 lanes at `p` as BF16 bits (bf16_bits' rounding).
MEGAMOE_AVX512_TARGET inline void store_bf16(std::uint16_t* p, int count, __m512 x) {
  __m256i const bits = _mm512_cvtepi32_epi16(bf16_bits(x));
  if (count >= 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
    return;
  }
  alignas(32) std::uint16_t tail[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(tail), bits);
  std::copy_n(tail, std::max(0, count), p);
}

#endif

}  // namespace megamoe::simd
