// SPDX-License-Identifier: Apache-2.0
// A deliberately plain MoE layer in double precision, written from the spec (docs/spec §4, §5, §7)
// and sharing no code with include/megamoe/expert or model: one token at a time, one of its experts
// at a time, every product a loop. The routing comes from the plain router of router_reference.hpp;
// the gradient of the routing probs with respect to the logits (attached losses included) is taken
// by central differences of that router, which is exact here because the objective is linear in the
// probs and the top-k choice does not move for a step of 1e-6.
#pragma once

#include "reference/router_reference.hpp"

#include <megamoe/core/tensor.hpp>
#include <megamoe/expert/tags.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

namespace megamoe::reference {

using vec = std::vector<double>;
using mat = std::vector<vec>;  // [rows][cols]

/// Every weight of the layer, stored [out][in] like the reference's linears.
struct moe_weights {
  expert::activation_function activation = expert::activation_function::swiglu;
  mat router;                  // [E][H]
  std::vector<mat> fc1, fc2;   // [E][W1][H], [E][H][F]
  mat fc1_bias, fc2_bias;      // [E][W1], [E][H] (empty without biases)
  mat shared_fc1, shared_fc2;  // [W1s][H], [H][Fs] (empty without a shared expert)
  vec gate;                    // [H] (empty without a gate)
};

inline mat zeros(std::size_t rows, std::size_t cols) {
  return mat(rows, vec(cols, 0.0));
}
inline double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

/// act(h) for one row of fc1's output.
inline vec act(expert::activation_function a, vec const& h) {
  using expert::activation_function;
  std::size_t const F = a == activation_function::swiglu ? h.size() / 2 : h.size();
  vec out(F);
  for (std::size_t f = 0; f < F; ++f) {
    double const x = h[f];
    if (a == activation_function::swiglu) out[f] = x * sigmoid(x) * h[F + f];
    if (a == activation_function::gelu) out[f] = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    if (a == activation_function::squared_relu) out[f] = x > 0 ? x * x : 0.0;
  }
  return out;
}

/// d(loss)/dh given d(loss)/d(act(h)).
inline vec act_backward(expert::activation_function a, vec const& h, vec const& da) {
  using expert::activation_function;
  std::size_t const F = da.size();
  vec dh(h.size(), 0.0);
  for (std::size_t f = 0; f < F; ++f) {
    double const x = h[f];
    if (a == activation_function::swiglu) {
      double const s = sigmoid(x);
      dh[f] = da[f] * h[F + f] * (s + x * s * (1.0 - s));
      dh[F + f] = da[f] * x * s;
    }
    if (a == activation_function::gelu) {
      double const pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
      dh[f] = da[f] * (0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * pdf);
    }
    if (a == activation_function::squared_relu) dh[f] = da[f] * (x > 0 ? 2.0 * x : 0.0);
  }
  return dh;
}

inline vec times(mat const& w, vec const& x) {  // w [out][in] times x [in]
  vec y(w.size(), 0.0);
  for (std::size_t o = 0; o < w.size(); ++o)
    for (std::size_t i = 0; i < x.size(); ++i) y[o] += w[o][i] * x[i];
  return y;
}
inline vec times_transposed(mat const& w, vec const& y) {  // w^T y
  vec x(w[0].size(), 0.0);
  for (std::size_t o = 0; o < w.size(); ++o)
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += w[o][i] * y[o];
  return x;
}
inline void add_outer(mat& g, vec const& a, vec const& b, double scale = 1.0) {  // g += s a b^T
  for (std::size_t o = 0; o < a.size(); ++o)
    for (std::size_t i = 0; i < b.size(); ++i) g[o][i] += scale * a[o] * b[i];
}

/// One MLP (fc1, act, times p, fc2 and its bias times p) on one token.
struct mlp_trace {
  vec h, a, y;
};
inline mlp_trace mlp_forward(expert::activation_function activation, mat const& fc1, mat const& fc2,
                             vec const* b1, vec const* b2, vec const& x, double p) {
  mlp_trace r;
  r.h = times(fc1, x);
  if (b1)
    for (std::size_t i = 0; i < r.h.size(); ++i) r.h[i] += (*b1)[i];
  r.a = act(activation, r.h);
  vec ap = r.a;
  for (double& v : ap) v *= p;
  r.y = times(fc2, ap);
  if (b2)
    for (std::size_t i = 0; i < r.y.size(); ++i) r.y[i] += p * (*b2)[i];
  return r;
}

/// Gradients of every weight, the input and the probs.
struct moe_gradients {
  mat router;
  std::vector<mat> fc1, fc2;
  mat fc1_bias, fc2_bias, shared_fc1, shared_fc2;
  vec gate;
  mat x;      // [T][H]
  mat probs;  // [T][E]: d(objective)/d(probs), the upstream gradient of the router
};

struct moe_result {
  mat y;  // [T][H]
  router_result routing;
  moe_gradients grad;
};

/// The router's forward for the plain layers: logits z = x Wr^T (returned), the routing, and the
/// router / input / prob gradients set to zero.
inline mat start_routing(mat const& router_weight, router::settings const& s,
                         std::vector<float> const& expert_bias, mat const& x, int B,
                         router_result& routing, moe_gradients& g) {
  std::size_t const T = x.size(), H = x[0].size(), E = router_weight.size();
  mat z(T, vec(E, 0.0));
  for (std::size_t t = 0; t < T; ++t) z[t] = times(router_weight, x[t]);
  router_memory memory;
  routing = route(z, s, B, expert_bias, {}, memory);
  g.router = zeros(E, H);
  g.x = zeros(T, H);
  g.probs = zeros(T, E);
  return z;
}

/// Router: d/dz of sum(g.probs .* probs(z)) + loss_scale * losses(z), by central differences,
/// added into g.router and g.x.
inline void router_backward(mat const& z, router::settings const& s, int B,
                            std::vector<float> const& expert_bias, mat const& x,
                            mat const& router_weight, double loss_scale, moe_gradients& g) {
  std::size_t const T = x.size(), H = x[0].size(), E = router_weight.size();
  auto objective = [&](mat const& logits) {
    router_memory fresh;
    auto const rr = route(logits, s, B, expert_bias, {}, fresh);
    double total = 0.0;
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t e = 0; e < E; ++e) total += g.probs[t][e] * rr.probs[t][e];
    for (auto const& l : {rr.aux_loss, rr.seq_aux_loss, rr.global_aux_loss, rr.z_loss})
      if (l) total += loss_scale * *l;
    return total;
  };
  double const step = 1e-6;
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t e = 0; e < E; ++e) {
      mat zp = z, zm = z;
      zp[t][e] += step;
      zm[t][e] -= step;
      double const dz = (objective(zp) - objective(zm)) / (2 * step);
      for (std::size_t i = 0; i < H; ++i) {
        g.router[e][i] += dz * x[t][i];
        g.x[t][i] += dz * router_weight[e][i];
      }
    }
}

/// Forward and backward of the layer for the objective sum(y .* dy) + loss_scale * (attached
/// losses), on x [T][H] of B sequences.
inline moe_result moe_forward_backward(moe_weights const& w, router::settings const& s,
                                       std::vector<float> const& expert_bias, mat const& x,
                                       mat const& dy, int B, double loss_scale) {
  std::size_t const T = x.size(), H = x[0].size(), E = w.router.size();
  bool const bias = !w.fc1_bias.empty();
  moe_result r;
  mat const z = start_routing(w.router, s, expert_bias, x, B, r.routing, r.grad);
  auto& g = r.grad;
  for (std::size_t e = 0; e < E; ++e) {
    g.fc1.push_back(zeros(w.fc1[e].size(), H));
    g.fc2.push_back(zeros(H, w.fc2[e][0].size()));
  }
  if (bias) {
    g.fc1_bias = zeros(E, w.fc1_bias[0].size());
    g.fc2_bias = zeros(E, H);
  }
  r.y = zeros(T, H);
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t e = 0; e < E; ++e) {
      if (!r.routing.map[t][e]) continue;
      double const p = r.routing.probs[t][e];
      auto const tr = mlp_forward(w.activation, w.fc1[e], w.fc2[e], bias ? &w.fc1_bias[e] : nullptr,
                                  bias ? &w.fc2_bias[e] : nullptr, x[t], p);
      for (std::size_t i = 0; i < H; ++i) r.y[t][i] += tr.y[i];
      // Backward of this (token, expert) pair.
      vec ap = tr.a;
      for (double& v : ap) v *= p;
      add_outer(g.fc2[e], dy[t], ap);
      vec const dap = times_transposed(w.fc2[e], dy[t]);
      double dp = 0.0;
      for (std::size_t f = 0; f < dap.size(); ++f) dp += dap[f] * tr.a[f];
      if (bias)
        for (std::size_t i = 0; i < H; ++i) {
          dp += dy[t][i] * w.fc2_bias[e][i];
          g.fc2_bias[e][i] += p * dy[t][i];
        }
      g.probs[t][e] = dp;
      vec da = dap;
      for (double& v : da) v *= p;
      vec const dh = act_backward(w.activation, tr.h, da);
      add_outer(g.fc1[e], dh, x[t]);
      if (bias)
        for (std::size_t i = 0; i < dh.size(); ++i) g.fc1_bias[e][i] += dh[i];
      vec const dx = times_transposed(w.fc1[e], dh);
      for (std::size_t i = 0; i < H; ++i) g.x[t][i] += dx[i];
    }
  }
  // Shared expert (prob 1) with its optional gate sigma(x . g).
  if (!w.shared_fc1.empty()) {
    g.shared_fc1 = zeros(w.shared_fc1.size(), H);
    g.shared_fc2 = zeros(H, w.shared_fc2[0].size());
    if (!w.gate.empty()) g.gate.assign(H, 0.0);
    for (std::size_t t = 0; t < T; ++t) {
      auto const tr =
          mlp_forward(w.activation, w.shared_fc1, w.shared_fc2, nullptr, nullptr, x[t], 1.0);
      double gate = 1.0;
      if (!w.gate.empty()) {
        double zt = 0.0;
        for (std::size_t i = 0; i < H; ++i) zt += w.gate[i] * x[t][i];
        gate = sigmoid(zt);
        double dz = 0.0;
        for (std::size_t i = 0; i < H; ++i) dz += dy[t][i] * tr.y[i];
        dz *= gate * (1.0 - gate);
        for (std::size_t i = 0; i < H; ++i) {
          g.gate[i] += dz * x[t][i];
          g.x[t][i] += dz * w.gate[i];
        }
      }
      vec dout(H);
      for (std::size_t i = 0; i < H; ++i) {
        r.y[t][i] += gate * tr.y[i];
        dout[i] = gate * dy[t][i];
      }
      add_outer(g.shared_fc2, dout, tr.a);
      vec const dh = act_backward(w.activation, tr.h, times_transposed(w.shared_fc2, dout));
      add_outer(g.shared_fc1, dh, x[t]);
      vec const dx = times_transposed(w.shared_fc1, dh);
      for (std::size_t i = 0; i < H; ++i) g.x[t][i] += dx[i];
    }
  }
  router_backward(z, s, B, expert_bias, x, w.router, loss_scale, g);
  return r;
}

}  // namespace megamoe::reference
