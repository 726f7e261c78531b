// SPDX-License-Identifier: Apache-2.0
// megamoe/optim/adamw_kernels.hpp — the element loops of distributed_adamw: the sum of squared
// gradients and the AdamW update of a contiguous run of elements, portable and (fp32) AVX-512.
//
// The update runs in the parameters' precision (fp32 for fp32, as fused Adam does; its divisions
// and square roots in fp64 cost more than the memory traffic), the squares are summed in fp64.
// Both paths do the same operations in the same order (no fused multiply-add; squares summed in 8
// lanes, lane j taking elements j, j+8, ..., the lanes added in order), so they give the same bits
// and the choice of path never changes a run (the library's own flags give the portable loop no
// FMA to fuse with; a -march=native build may fuse it).
//
// Moments kept in BF16 (the reference's precision-aware optimizer, --exp-avg-dtype bf16) are read
// exactly into fp32, updated in fp32 and rounded to nearest even when stored; the parameter's
// update uses the fp32 moments of this step, before their rounding, as the reference's fused Adam
// does.
#pragma once

#include <megamoe/core/bf16.hpp>
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/vector_math.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace megamoe::optim::kernels {

/// One step's constants: clip factor, betas, bias corrections, epsilon, weight decay, learning
/// rate.
struct adamw_step {
  double clip, beta1, beta2, c1, c2, eps, weight_decay, lr;
};

/// What the update leaves in the gradient it read: the gradient, or zero (the update and the
/// next step's gradient zeroing in one pass over memory).
enum class gradient_after { kept, zeroed };

/// The update's gradient operand: writable where it is zeroed.
template <gradient_after After, class T>
using gradient_pointer = std::conditional_t<After == gradient_after::zeroed, T*, T const*>;

namespace detail {

/// A moment as the update's arithmetic type T, and back to its storage type S.
template <class T, class S>
T load_moment(S x) {
  if constexpr (std::is_same_v<S, bfloat16>)
    return static_cast<T>(static_cast<float>(x));
  else
    return static_cast<T>(x);
}
template <class S, class T>
S store_moment(T x) {
  if constexpr (std::is_same_v<S, bfloat16>)
    return bfloat16(static_cast<float>(x));
  else
    return static_cast<S>(x);
}

template <class T>
double squares_portable(T const* g, std::int64_t n) {
  double lane[8] = {};
  for (std::int64_t i = 0; i < n; ++i) {
    double const x = static_cast<double>(g[i]);
    lane[i % 8] += x * x;
  }
  double sum = 0.0;
  for (double l : lane) sum += l;
  return sum;
}

/// p -= lr (m^ / (sqrt(v^) + eps) + wd p), m and v updated, for n elements, in the arithmetic
/// of T (fp32 for fp32 parameters, as the reference's fused Adam; fp64 for fp64); the moments
/// stored as SM and SV.
template <gradient_after After = gradient_after::kept, class T, class SM, class SV>
void update_portable(T* p, gradient_pointer<After, T> grad, SM* m, SV* v, std::int64_t n,
                     adamw_step const& s, bool decay) {
  T const clip = static_cast<T>(s.clip), b1 = static_cast<T>(s.beta1), b2 = static_cast<T>(s.beta2),
          one_b1 = static_cast<T>(1.0 - s.beta1), one_b2 = static_cast<T>(1.0 - s.beta2),
          c1 = static_cast<T>(s.c1), c2 = static_cast<T>(s.c2), eps = static_cast<T>(s.eps),
          wd = static_cast<T>(decay ? s.weight_decay : 0.0), lr = static_cast<T>(s.lr);
  for (std::int64_t i = 0; i < n; ++i) {
    T const g = clip * grad[i];
    T const mi = b1 * load_moment<T>(m[i]) + one_b1 * g;
    T const vi = b2 * load_moment<T>(v[i]) + one_b2 * g * g;
    m[i] = store_moment<SM>(mi);
    v[i] = store_moment<SV>(vi);
    p[i] = p[i] - lr * ((mi / c1) / (std::sqrt(vi / c2) + eps) + wd * p[i]);
    if constexpr (After == gradient_after::zeroed) grad[i] = T(0);
  }
}

#if MEGAMOE_VECTOR_MATH_AVX512

// GCC 12's unmasked conversions and square root start from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports once they are inlined; the value is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The update's arithmetic in its rounding forms: builtins the compiler never fuses into a
// multiply-add (the plain intrinsics are vector operators, which -ffp-contract=fast may fuse), so
// each operation rounds as the portable loop's does.
constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
MEGAMOE_AVX512_TARGET inline __m512 mul(__m512 a, __m512 b) {
  return _mm512_mul_round_ps(a, b, nearest);
}
MEGAMOE_AVX512_TARGET inline __m512 add(__m512 a, __m512 b) {
  return _mm512_add_round_ps(a, b, nearest);
}
MEGAMOE_AVX512_TARGET inline __m512 sub(__m512 a, __m512 b) {
  return _mm512_sub_round_ps(a, b, nearest);
}
MEGAMOE_AVX512_TARGET inline __m512 div(__m512 a, __m512 b) {
  return _mm512_div_round_ps(a, b, nearest);
}

/// A constant of the step on every lane, rounded to fp32 as the portable loop rounds it.
MEGAMOE_AVX512_TARGET inline __m512 broadcast(double x) {
  return _mm512_set1_ps(static_cast<float>(x));
}

MEGAMOE_AVX512_TARGET inline double squares_avx512(float const* g, std::int64_t n) {
  __m512d acc = _mm512_setzero_pd();
  for (std::int64_t i = 0; i < n; i += 8) {
    auto const mask = static_cast<__mmask8>(n - i >= 8 ? 0xFF : (1u << (n - i)) - 1u);
    __m512d const x = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_maskz_loadu_ps(mask, g + i)));
    acc = _mm512_add_round_pd(acc, _mm512_mul_round_pd(x, x, nearest), nearest);
  }
  alignas(64) double lane[8];
  _mm512_store_pd(lane, acc);
  double sum = 0.0;
  for (double l : lane) sum += l;
  return sum;
}

/// 16 moments (the first `count`) as fp32, and back, in their storage type.
MEGAMOE_AVX512_TARGET inline __m512 load_moments(float const* p, int count) {
  return _mm512_maskz_loadu_ps(simd::lanes(count), p);
}
MEGAMOE_AVX512_TARGET inline __m512 load_moments(bfloat16 const* p, int count) {
  return simd::load_bf16(&p->bits, count);
}
MEGAMOE_AVX512_TARGET inline void store_moments(float* p, int count, __m512 x) {
  _mm512_mask_storeu_ps(p, simd::lanes(count), x);
}
MEGAMOE_AVX512_TARGET inline void store_moments(bfloat16* p, int count, __m512 x) {
  simd::store_bf16(&p->bits, count, x);
}

template <gradient_after After = gradient_after::kept, class SM = float, class SV = float>
MEGAMOE_AVX512_TARGET inline void update_avx512(float* p, gradient_pointer<After, float> grad,
                                                SM* m, SV* v, std::int64_t n, adamw_step const& s,
                                                bool decay) {
  __m512 const clip = broadcast(s.clip), b1 = broadcast(s.beta1), b2 = broadcast(s.beta2),
               one_b1 = broadcast(1.0 - s.beta1), one_b2 = broadcast(1.0 - s.beta2),
               c1 = broadcast(s.c1), c2 = broadcast(s.c2), eps = broadcast(s.eps),
               wd = broadcast(decay ? s.weight_decay : 0.0), lr = broadcast(s.lr);
  for (std::int64_t i = 0; i < n; i += 16) {
    int const count = static_cast<int>(std::min<std::int64_t>(n - i, 16));
    __mmask16 const mask = simd::lanes(count);
    __m512 const g = mul(clip, _mm512_maskz_loadu_ps(mask, grad + i));
    __m512 const mi = add(mul(b1, load_moments(m + i, count)), mul(one_b1, g));
    __m512 const vi = add(mul(b2, load_moments(v + i, count)), mul(mul(one_b2, g), g));
    store_moments(m + i, count, mi);
    store_moments(v + i, count, vi);
    __m512 const pi = _mm512_maskz_loadu_ps(mask, p + i);
    __m512 const root = _mm512_sqrt_round_ps(div(vi, c2), nearest);
    __m512 const step = add(div(div(mi, c1), add(root, eps)), mul(wd, pi));
    _mm512_mask_storeu_ps(p + i, mask, sub(pi, mul(lr, step)));
    if constexpr (After == gradient_after::zeroed)
      _mm512_mask_storeu_ps(grad + i, mask, _mm512_setzero_ps());
  }
}

#pragma GCC diagnostic pop

#endif

}  // namespace detail

/// Sum of g[i]^2 over n elements, in double.
template <class T>
double sum_of_squares(T const* g, std::int64_t n) {
#if MEGAMOE_VECTOR_MATH_AVX512
  if constexpr (std::is_same_v<T, float>)
    if (cpu().use_avx512()) return detail::squares_avx512(g, n);
#endif
  return detail::squares_portable(g, n);
}

/// One AdamW step of n elements: values p, gradients, moments m and v (stored as SM and SV);
/// `decay` applies weight decay; the gradients are left as `After` says.
template <gradient_after After = gradient_after::kept, class T, class SM, class SV>
void adamw_update(T* p, gradient_pointer<After, T> grad, SM* m, SV* v, std::int64_t n,
                  adamw_step const& s, bool decay) {
#if MEGAMOE_VECTOR_MATH_AVX512
  if constexpr (std::is_same_v<T, float> && !std::is_same_v<SM, double> &&
                !std::is_same_v<SV, double>)
    if (cpu().use_avx512()) return detail::update_avx512<After>(p, grad, m, v, n, s, decay);
#endif
  detail::update_portable<After>(p, grad, m, v, n, s, decay);
}

}  // namespace megamoe::optim::kernels
