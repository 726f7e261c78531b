// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/activation.hpp — the expert activations with the routing prob, one row at a time.
//
// The reference applies the prob after the activation and before fc2 (docs/spec §5):
//   ap = act(h) * p,   h = x W1^T + b1 (fc1's output, [W1] per row, W1 = 2F for SwiGLU).
// SwiGLU splits h into the gate half (first F) and the linear half (last F), as the reference's
// torch.chunk(h, 2, -1). GELU is the exact (erf) form, the reference's default F.gelu.
// Every kernel works on Eigen arrays so that exp and erf vectorize; the scalar type is a template
// parameter, so fp64 runs the same code.
#pragma once

#include <megamoe/core/tensor.hpp>
#include <megamoe/expert/tags.hpp>

#include <unsupported/Eigen/SpecialFunctions>

namespace megamoe::expert {

namespace detail {
template <class T>
using row_array = Eigen::Array<T, 1, Eigen::Dynamic>;
template <class T>
using row_view = Eigen::Map<row_array<T>>;
template <class T>
using const_row_view = Eigen::Map<row_array<T> const>;
}  // namespace detail

/// The activation `A`, forward and backward on one row of fc1's output.
template <activation_function A>
struct activation;

template <>
struct activation<activation_function::swiglu> {
  /// ap[F] = silu(h[:F]) * h[F:] * p.
  template <class T>
  static void forward(T const* h, T p, T* ap, int ffn) {
    detail::const_row_view<T> gate(h, ffn), linear(h + ffn, ffn);
    detail::row_view<T>(ap, ffn) = gate / (T(1) + (-gate).exp()) * linear * p;
  }
  /// Given dap = d(loss)/d(ap), writes dh[2F] and returns d(loss)/dp.
  template <class T>
  static T backward(T const* h, T const* dap, T p, T* dh, int ffn) {
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
struct activation<activation_function::gelu> {
  template <class T>
  static void forward(T const* h, T p, T* ap, int ffn) {
    detail::const_row_view<T> x(h, ffn);
    detail::row_view<T>(ap, ffn) = T(0.5) * x * (T(1) + (x * T(M_SQRT1_2)).erf()) * p;
  }
  template <class T>
  static T backward(T const* h, T const* dap, T p, T* dh, int ffn) {
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
struct activation<activation_function::squared_relu> {
  template <class T>
  static void forward(T const* h, T p, T* ap, int ffn) {
    detail::const_row_view<T> x(h, ffn);
    detail::row_view<T>(ap, ffn) = x.max(T(0)).square() * p;
  }
  template <class T>
  static T backward(T const* h, T const* dap, T p, T* dh, int ffn) {
    detail::const_row_view<T> x(h, ffn), grad(dap, ffn);
    T const grad_p = (grad * x.max(T(0)).square()).sum();
    detail::row_view<T>(dh, ffn) = grad * p * T(2) * x.max(T(0));
    return grad_p;
  }
};

}  // namespace megamoe::expert
