// SPDX-License-Identifier: Apache-2.0
// A plain MoE layer under a precision recipe, in double precision: every expert GEMM multiplies
// the dequantized operands the layer itself quantized (the same codes), one row at a time; the
// router, the activation and the prob multiply are the plain reference's (moe_reference.hpp). What
// this checks is everything around the codes: which copy each GEMM reads, per-expert grouping,
// padding, the combine, the activation backward and the router backward.
#pragma once

#include "reference/moe_reference.hpp"

#include <cstddef>
#include <vector>

namespace megamoe::reference {

/// One expert's dequantized GEMM operands, each in its tensor's own layout [rows][cols], except
/// the wgrad copies, given transposed with the token dimension last ([cols][padded rows]).
struct expert_operands {
  mat x_row;                                  // [n][H]   fc1 fprop input
  mat w1_row, w1_col;                         // [W1][H]  fc1 weight for fprop and for dgrad
  mat h;                                      // [n][W1]  fc1 output as kept for backward
  mat ap_row;                                 // [n][F]   fc2 fprop input (act(h) * p)
  mat w2_row, w2_col;                         // [H][F]
  mat g2_row;                                 // [n][H]   fc2 output gradient for dgrad
  mat g1_row;                                 // [n][W1]  fc1 output gradient for dgrad
  mat g2_col_t, ap_col_t, g1_col_t, x_col_t;  // wgrad copies, [cols][n']
};

/// The rows of the layer's permutation: row j of expert e (local numbering) is token
/// source_token[j] with prob row_prob[j].
struct recipe_rows {
  std::vector<int> source_token, row_expert;
  std::vector<double> row_prob;
};

struct recipe_result {
  mat y;                  // [T][H]
  moe_gradients grad;     // router, fc1, fc2, x, probs
  mat h_fprop;            // [N][W1] fc1's product from the dequantized operands (before BF16)
  mat dh;                 // [N][W1] the activation backward's output (before quantization)
  router_result routing;  // the plain router's choice, to compare with the layer's
};

/// c = a b^T for a [m][k], b [n][k].
inline mat times_transposed_all(mat const& a, mat const& b) {
  mat c = zeros(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < b.size(); ++j) {
      double sum = 0.0;
      for (std::size_t k = 0; k < a[i].size(); ++k) sum += a[i][k] * b[j][k];
      c[i][j] = sum;
    }
  return c;
}

/// Forward and backward of the objective sum(y .* dy) + loss_scale * losses with the layer's
/// operands `ops[e]` (dy enters through them); `router_weight` [E][H] and the inputs as the layer
/// saw them.
inline recipe_result recipe_forward_backward(expert::activation_function activation,
                                             mat const& router_weight, router::settings const& s,
                                             std::vector<float> const& expert_bias, mat const& x,
                                             int B, double loss_scale, recipe_rows const& rows,
                                             std::vector<expert_operands> const& ops) {
  std::size_t const T = x.size(), H = x[0].size(), E = router_weight.size();
  std::size_t const N = rows.source_token.size();
  recipe_result r;
  mat const z = start_routing(router_weight, s, expert_bias, x, B, r.routing, r.grad);
  auto& g = r.grad;
  r.y = zeros(T, H);
  r.h_fprop.resize(N);
  r.dh.resize(N);
  std::vector<std::size_t> index_in_expert(N);
  std::vector<std::size_t> seen(E, 0);
  for (std::size_t j = 0; j < N; ++j)
    index_in_expert[j] = seen[static_cast<std::size_t>(rows.row_expert[j])]++;
  for (std::size_t j = 0; j < N; ++j) {
    auto const e = static_cast<std::size_t>(rows.row_expert[j]);
    auto const t = static_cast<std::size_t>(rows.source_token[j]);
    std::size_t const i = index_in_expert[j];
    auto const& o = ops[e];
    double const p = rows.row_prob[j];
    r.h_fprop[j] = times(o.w1_row, o.x_row[i]);
    vec const y = times(o.w2_row, o.ap_row[i]);
    for (std::size_t c = 0; c < H; ++c) r.y[t][c] += y[c];
    // Backward: d(ap) from the dgrad copies, the activation from the kept h.
    vec const dap = times_transposed(o.w2_col, o.g2_row[i]);
    vec const a = act(activation, o.h[i]);
    double dp = 0.0;
    for (std::size_t f = 0; f < dap.size(); ++f) dp += dap[f] * a[f];
    g.probs[t][e] = dp;
    vec da = dap;
    for (double& v : da) v *= p;
    r.dh[j] = act_backward(activation, o.h[i], da);
    vec const dx = times_transposed(o.w1_col, o.g1_row[i]);
    for (std::size_t c = 0; c < H; ++c) g.x[t][c] += dx[c];
  }
  for (std::size_t e = 0; e < E; ++e) {
    g.fc2.push_back(times_transposed_all(ops[e].g2_col_t, ops[e].ap_col_t));
    g.fc1.push_back(times_transposed_all(ops[e].g1_col_t, ops[e].x_col_t));
  }
  router_backward(z, s, B, expert_bias, x, router_weight, loss_scale, g);
  return r;
}

}  // namespace megamoe::reference
