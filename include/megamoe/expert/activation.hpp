// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/activation.hpp — the expert activations with the routing prob, one row at a time.
//
// The reference applies the prob after the activation and before fc2 (docs/spec §5):
//   ap = act(h) * p,   h = x W1^T + b1 (fc1's output, [W1] per row, W1 = 2F for SwiGLU).
// SwiGLU splits h into the gate half (first F) and the linear half (last F), as the reference's
// torch.chunk(h, 2, -1). GELU is the exact (erf) form, the reference's default F.gelu.
// Every kernel works on Eigen arrays so that exp and erf vectorize; the scalar type is a template
// parameter, so fp64 runs the same code. SwiGLU in fp32 runs on 16-lane AVX-512 where the CPU has
// it (the library itself is built for any x86-64, so Eigen's own packets are narrower).
#pragma once

#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/vector_math.hpp>
#include <megamoe/expert/tags.hpp>

#include <type_traits>

#include <unsupported/Eigen/SpecialFunctions>

namespace megamoe::expert {

namespace detail {
template <class T>
using row_array = Eigen::Array<T, 1, Eigen::Dynamic>;
template <class T>
using row_view = Eigen::Map<row_array<T>>;
template <class T>
using const_row_view = Eigen::Map<row_array<T> const>;

#if MEGAMOE_VECTOR_MATH_AVX512
// GCC 12's _mm512_reduce_add_ps starts from _mm512_undefined_ps(), which -Wmaybe-uninitialized
// reports once inlined; the value is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
/// SwiGLU forward of one fp32 row on AVX-512 (activation<swiglu>::forward's formula).
MEGAMOE_AVX512_TARGET inline void swiglu_forward_avx512(float const* h, float p, float* ap,
                                                        int ffn) {
  __m512 const one = _mm512_set1_ps(1.0f), prob = _mm512_set1_ps(p);
  for (int j = 0; j < ffn; j += 16) {
    __mmask16 const m = simd::lanes(ffn - j);
    __m512 const g = _mm512_maskz_loadu_ps(m, h + j);
    __m512 const lin = _mm512_maskz_loadu_ps(m, h + ffn + j);
    __m512 const silu =
        _mm512_div_ps(g, _mm512_add_ps(one, simd::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(ap + j, m, _mm512_mul_ps(_mm512_mul_ps(silu, lin), prob));
  }
}
/// SwiGLU backward of one fp32 row on AVX-512 (activation<swiglu>::backward's formula).
MEGAMOE_AVX512_TARGET inline float swiglu_backward_avx512(float const* h, float const* dap, float p,
                                                          float* dh, int ffn) {
  __m512 const one = _mm512_set1_ps(1.0f), prob = _mm512_set1_ps(p);
  __m512 grad_p = _mm512_setzero_ps();
  for (int j = 0; j < ffn; j += 16) {
    __mmask16 const m = simd::lanes(ffn - j);
    __m512 const g = _mm512_maskz_loadu_ps(m, h + j);
    __m512 const lin = _mm512_maskz_loadu_ps(m, h + ffn + j);
    __m512 const grad = _mm512_maskz_loadu_ps(m, dap + j);
    __m512 const sigma =
        _mm512_div_ps(one, _mm512_add_ps(one, simd::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    __m512 const gs = _mm512_mul_ps(g, sigma);
    grad_p = _mm512_fmadd_ps(_mm512_mul_ps(grad, gs), lin, grad_p);
    __m512 const gp = _mm512_mul_ps(grad, prob);
    _mm512_mask_storeu_ps(dh + ffn + j, m, _mm512_mul_ps(gp, gs));
    __m512 const slope = _mm512_fmadd_ps(g, _mm512_sub_ps(one, sigma), one);
    _mm512_mask_storeu_ps(dh + j, m,
                          _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(gp, lin), sigma), slope));
  }
  return _mm512_reduce_add_ps(grad_p);
}
#pragma GCC diagnostic pop
#endif
}  // namespace detail

/// The activation `A`, forward and backward on one row of fc1's output: forward_row<Wide> and
/// backward_row<Wide>, where a caller over many rows asks avx512<T>() once and passes the answer
/// as `Wide` (an activation without such a kernel ignores it); forward and backward ask for
/// their one row.
template <activation_function A>
struct activation_rows;

template <activation_function A>
struct activation : activation_rows<A> {
  using rows = activation_rows<A>;
  template <class T>
  static void forward(T const* h, T p, T* ap, int ffn) {
    if (rows::template avx512<T>()) return rows::template forward_row<true>(h, p, ap, ffn);
    rows::template forward_row<false>(h, p, ap, ffn);
  }
  template <class T>
  static T backward(T const* h, T const* dap, T p, T* dh, int ffn) {
    if (rows::template avx512<T>()) return rows::template backward_row<true>(h, dap, p, dh, ffn);
    return rows::template backward_row<false>(h, dap, p, dh, ffn);
  }
};

template <>
struct activation_rows<activation_function::swiglu> {
  /// Whether this CPU runs the AVX-512 kernel for T (fp32, where built).
  template <class T>
  static bool avx512() noexcept {
#if MEGAMOE_VECTOR_MATH_AVX512
    if constexpr (std::is_same_v<T, float>) return cpu().use_avx512();
#endif
    return false;
  }
  /// ap[F] = silu(h[:F]) * h[F:] * p.
  template <bool Wide, class T>
  static void forward_row(T const* h, T p, T* ap, int ffn) {
#if MEGAMOE_VECTOR_MATH_AVX512
    if constexpr (Wide && std::is_same_v<T, float>)
      return detail::swiglu_forward_avx512(h, p, ap, ffn);
#endif
    detail::const_row_view<T> gate(h, ffn), linear(h + ffn, ffn);
    detail::row_view<T>(ap, ffn) = gate / (T(1) + (-gate).exp()) * linear * p;
  }
  /// Given dap = d(loss)/d(ap), writes dh[2F] and returns d(loss)/dp.
  template <bool Wide, class T>
  static T backward_row(T const* h, T const* dap, T p, T* dh, int ffn) {
#if MEGAMOE_VECTOR_MATH_AVX512
    if constexpr (Wide && std::is_same_v<T, float>)
      return detail::swiglu_backward_avx512(h, dap, p, dh, ffn);
#endif
    detail::const_row_view<T> gate(h, ffn), linear(h + ffn, ffn), grad(dap, ffn);
    detail::row_view<T> sigma(dh, ffn), grad_linear(dh + ffn, ffn);
    sigma = (T(1) + (-gate).exp()).inverse();
    T const grad_p = (grad * gate * sigma * linear).sum();
    grad_linear = grad * p * gate * sigma;
    // silu'(g) = s (1 + g (1 - s)); written over the sigmoid it reads, element by element.
    sigma = grad * p * linear * sigma * (T(1) + gate * (T(1) - sigma));
    return grad_p;
  }
};

template <>
struct activation_rows<activation_function::gelu> {
  template <class T>
  static bool avx512() noexcept {
    return false;
  }
  template <bool, class T>
  static void forward_row(T const* h, T p, T* ap, int ffn) {
    detail::const_row_view<T> x(h, ffn);
    detail::row_view<T>(ap, ffn) = T(0.5) * x * (T(1) + (x * T(M_SQRT1_2)).erf()) * p;
  }
  template <bool, class T>
  static T backward_row(T const* h, T const* dap, T p, T* dh, int ffn) {
    detail::const_row_view<T> x(h, ffn), grad(dap, ffn);
    detail::row_view<T> cdf(dh, ffn);
    cdf = T(0.5) * (T(1) + (x * T(M_SQRT1_2)).erf());
    T const grad_p = (grad * x * cdf).sum();
    // gelu'(x) = Phi(x) + x phi(x), phi the standard normal density.
    T const inv_sqrt_2pi = T(0.5 * M_2_SQRTPI * M_SQRT1_2);
    cdf = grad * p * (cdf + x * (T(-0.5) * x.square()).exp() * inv_sqrt_2pi);
    return grad_p;
  }
};

template <>
struct activation_rows<activation_function::squared_relu> {
  template <class T>
  static bool avx512() noexcept {
    return false;
  }
  template <bool, class T>
  static void forward_row(T const* h, T p, T* ap, int ffn) {
    detail::const_row_view<T> x(h, ffn);
    detail::row_view<T>(ap, ffn) = x.max(T(0)).square() * p;
  }
  template <bool, class T>
  static T backward_row(T const* h, T const* dap, T p, T* dh, int ffn) {
    detail::const_row_view<T> x(h, ffn), grad(dap, ffn);
    T const grad_p = (grad * x.max(T(0)).square()).sum();
    detail::row_view<T>(dh, ffn) = grad * p * T(2) * x.max(T(0));
    return grad_p;
  }
};

}  // namespace megamoe::expert
