// SPDX-License-Identifier: Apache-2.0
// megamoe/router/gating.hpp — the router's gating linear z = x * W^T, forward and backward.
//
// As the reference's RouterGatingLinearFunction: x and W are cast to the router dtype L inside the
// product (fp32 by default, fp64 on request), the logits are L, and the backward computes
// dx = dz * W and dW = dz^T * x in L before casting back to the parameters' types.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>

#include <string>

namespace megamoe::router {

namespace detail {
inline std::string shape_text(Eigen::Index rows, Eigen::Index cols) {
  // Built piece by piece: GCC 12 gives a false -Wrestrict on "literal" + std::string at -O3.
  std::string text = "[";
  text += std::to_string(rows);
  text += ", ";
  text += std::to_string(cols);
  text += "]";
  return text;
}
}  // namespace detail

/// Throws `input_error` naming `what` unless `m` is [rows, cols].
template <class Derived>
void require_shape(Eigen::DenseBase<Derived> const& m, Eigen::Index rows, Eigen::Index cols,
                   char const* what) {
  if (m.rows() != rows || m.cols() != cols)
    throw input_error(std::string(what) + " has shape " + detail::shape_text(m.rows(), m.cols()) +
                      ", expected " + detail::shape_text(rows, cols));
}

/// logits[T,E] = x[T,H] * W[E,H]^T in L.
template <class L, class X, class W>
void gating_forward(Eigen::MatrixBase<X> const& x, Eigen::MatrixBase<W> const& weight,
                    row_matrix<L>& logits) {
  if (x.cols() != weight.cols())
    throw input_error("router input has shape " + detail::shape_text(x.rows(), x.cols()) +
                      " but the router weight is " +
                      detail::shape_text(weight.rows(), weight.cols()) +
                      " (the hidden sizes differ)");
  logits.resize(x.rows(), weight.rows());
  logits.noalias() = x.template cast<L>() * weight.template cast<L>().transpose();
}

/// dx[T,H] = dz * W and dW[E,H] = dz^T * x, computed in L and stored in the parameters' types.
template <class L, class X, class W, class GX, class GW>
void gating_backward(row_matrix<L> const& grad_logits, Eigen::MatrixBase<X> const& x,
                     Eigen::MatrixBase<W> const& weight, GX& grad_x, GW& grad_weight) {
  grad_x.resize(x.rows(), x.cols());
  grad_weight.resize(weight.rows(), weight.cols());
  grad_x = (grad_logits * weight.template cast<L>()).template cast<typename GX::Scalar>();
  grad_weight =
      (grad_logits.transpose() * x.template cast<L>()).template cast<typename GW::Scalar>();
}

}  // namespace megamoe::router
