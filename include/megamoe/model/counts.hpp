// SPDX-License-Identifier: Apache-2.0
// megamoe/model/counts.hpp — what a model configuration costs: its parameters and the model FLOPs
// of one token, from its values alone (no model is built), so that `describe` can report them
// before a job starts.
#pragma once

#include <megamoe/config/values.hpp>
#include <megamoe/expert/tags.hpp>

#include <cstdint>

namespace megamoe {

/// One layer's attention weights: grouped-query attention's linear_qkv and linear_proj (and QK
/// layernorm's two weights), or MLA's five (or four) linears and, with qk_layernorm, its latents'
/// norms (model/mla.hpp).
constexpr std::int64_t attention_parameter_count(config_values const& v) {
  std::int64_t const H = v.shape.hidden, n = v.model.heads;
  auto const& a = v.model.mla;
  if (a.enabled()) {
    std::int64_t const rq = a.q_lora_rank, rkv = a.kv_lora_rank, dr = a.qk_pos_emb_head_dim;
    std::int64_t const q = n * (a.qk_head_dim + dr);                 // query columns
    std::int64_t const norms = v.model.qk_layernorm ? rq + rkv : 0;  // [rq] (if any), [rkv]
    std::int64_t const queries = rq > 0 ? rq * H + q * rq : q * H;
    return queries + (rkv + dr) * H + n * (a.qk_head_dim + a.v_head_dim) * rkv +
           H * n * a.v_head_dim + norms;
  }
  std::int64_t const kv = H / n * v.model.query_groups;  // key (or value) width
  std::int64_t total = 2 * H * H + 2 * kv * H;           // qkv [H + 2 kv, H], proj [H, H]
  if (v.model.qk_layernorm) total += 2 * (H / n);        // q and k norms [d]
  return total;
}

/// One token's attention forward FLOPs in a sequence of `seq`: the projections, then q.k and p.v
/// over the causal half.
constexpr double attention_forward_flops(config_values const& v, int seq) {
  double const H = v.shape.hidden, n = v.model.heads, causal = (seq + 1) / 2.0;
  auto const& a = v.model.mla;
  if (a.enabled()) {
    double const rq = a.q_lora_rank, rkv = a.kv_lora_rank, dr = a.qk_pos_emb_head_dim;
    double const q = n * (a.qk_head_dim + dr);
    double const products = (rq > 0 ? rq * H + q * rq : q * H) + (rkv + dr) * H +
                            n * (a.qk_head_dim + a.v_head_dim) * rkv + H * n * a.v_head_dim;
    return 2.0 * products + 2.0 * n * (a.qk_head_dim + dr + a.v_head_dim) * causal;
  }
  double const kv = H / n * v.model.query_groups;  // key (or value) width
  return 2.0 * (2.0 * H + 2.0 * kv) * H + 2.0 * 2.0 * H * causal;
}

/// One layer's parameters past attention's: its two RMSNorms and the MoE layer (router, every
/// routed expert, the shared expert and its gate) or the dense SwiGLU FFN.
constexpr std::int64_t layer_parameter_count(config_values const& v, bool moe) {
  std::int64_t const H = v.shape.hidden, E = v.shape.experts;
  std::int64_t const F = v.shape.ffn, Fs = v.shape.shared_ffn, Fd = v.model.dense_ffn;
  std::int64_t const W1 = expert::fc1_width(v.expert.activation, 1);
  std::int64_t total = 2 * H + attention_parameter_count(v);  // norms, attention
  if (moe) {
    total += E * H;                 // router
    total += E * (W1 + 1) * F * H;  // fc1 [W1 F, H] and fc2 [H, F] per expert
    if (v.expert.bias) total += E * (W1 * F + H);
    if (Fs > 0) total += (W1 + 1) * Fs * H + (v.expert.shared_expert_gate ? H : 0);
  } else {
    total += 3 * Fd * H;  // SwiGLU: gate, linear, out
  }
  return total;
}

/// Parameters of the whole model (one copy of each, whatever the layout): the token embedding,
/// per layer layer_parameter_count, the final RMSNorm and the output layer (not tied to the
/// embedding); per multi-token prediction depth its enorm, hnorm and final RMSNorms, eh_proj
/// [H, 2H] and one layer of the last decoder layer's kind (the embedding and output layer are
/// shared). Every size must be resolved.
constexpr std::int64_t parameter_count(config_values const& v) {
  std::int64_t const H = v.shape.hidden, V = v.model.vocabulary;
  std::int64_t total = 2 * V * H + H;  // embedding, output layer, final norm
  for (int i = 0; i < v.model.layers; ++i) total += layer_parameter_count(v, v.model.is_moe(i));
  bool const last_moe = v.model.is_moe(v.model.layers - 1);
  total += std::int64_t{v.model.mtp_num_layers} *
           (3 * H + 2 * H * H + layer_parameter_count(v, last_moe));
  return total;
}

/// One layer's forward FLOPs per token past the norms: attention, and the MoE layer's router
/// and k routed FFNs (and a shared expert) or the dense FFN.
constexpr double layer_forward_flops(config_values const& v, int seq, bool moe) {
  double const H = v.shape.hidden;
  double const W1 = expert::fc1_width(v.expert.activation, 1);
  int const k = v.router ? v.router->top_k : 0;
  double forward = attention_forward_flops(v, seq);
  if (moe) {
    forward += 2.0 * H * v.shape.experts;  // router
    forward += 2.0 * k * (W1 + 1.0) * H * v.shape.ffn;
    if (v.shape.shared_ffn > 0) forward += 2.0 * (W1 + 1.0) * H * v.shape.shared_ffn;
  } else {
    forward += 2.0 * 3.0 * H * v.model.dense_ffn;  // SwiGLU: gate, linear, out
  }
  return forward;
}

/// Model FLOPs of one token's forward + backward (3x forward) in a sequence of `seq`: the matrix
/// products (2 per multiply-add) of attention (projections, and q.k and p.v over the causal half),
/// the routed experts' k FFNs (and a shared expert), the dense FFNs, the router and the output
/// layer; per multi-token prediction depth its eh_proj, its layer and the output layer again.
/// The usual "model FLOPs" count: no recomputation, no elementwise work.
constexpr double flops_per_token(config_values const& v, int seq) {
  double const H = v.shape.hidden, V = v.model.vocabulary;
  double forward = 2.0 * H * V;  // output layer
  for (int i = 0; i < v.model.layers; ++i)
    forward += layer_forward_flops(v, seq, v.model.is_moe(i));
  bool const last_moe = v.model.is_moe(v.model.layers - 1);
  forward += v.model.mtp_num_layers *
             (2.0 * 2.0 * H * H + layer_forward_flops(v, seq, last_moe) + 2.0 * H * V);
  return 3.0 * forward;
}

}  // namespace megamoe
