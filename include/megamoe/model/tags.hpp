// SPDX-License-Identifier: Apache-2.0
// megamoe/model/tags.hpp — the model slot (tags only): the decoder around the MoE layers.
//
//   model::decoder<model::layers<4>, model::heads<4>, model::vocabulary<256>,
//                  model::dense_ffn<512>, model::moe_layer_freq<2>>        MoE in layers 0 and 2
//   model::decoder<model::layers<4>, model::heads<8>, model::moe_layer_pattern<0, 1, 1, 1>, ...>
//   model::decoder<>                          every size left to start-up (megamoe::dynamic)
//
// Options come in any order, each kind at most once. Sizes may be `dynamic` and are then given at
// start-up (startup_values), where the same rules run with the same ids. query_groups follows
// heads unless given (as ETP follows TP). The names follow the reference's TransformerConfig
// (`num_layers`, `num_attention_heads`, `num_query_groups`, `ffn_hidden_size`, `moe_layer_freq`,
// `vocab_size`, `layernorm_epsilon`, `rotary_base`, `qk_layernorm`, `multi_latent_attention`
// with `q_lora_rank`, `kv_lora_rank`, `qk_head_dim`, `qk_pos_emb_head_dim`, `v_head_dim`,
// `mtp_num_layers`, `mtp_loss_scaling_factor`).
#pragma once

#include <megamoe/policy/policy.hpp>

#include <array>
#include <cstdint>
#include <string_view>

namespace megamoe::model {

/// The kind of the `model` slot.
struct kind {};

/// The most layers an explicit MoE layer pattern may list.
inline constexpr int max_pattern_layers = 256;

/// Which layers are MoE layers: every `every`-th (layer i when i % every == 0, the reference's
/// integer `moe_layer_freq`), or, when `length` > 0, the explicit list `moe[0, length)` of 1 (MoE)
/// and 0 (dense), the reference's list form.
struct layer_pattern {
  int every = 1;
  int length = 0;
  std::array<std::int8_t, max_pattern_layers> moe{};

  [[nodiscard]] constexpr bool is_list() const noexcept { return length > 0; }
  /// Whether layer i (0-based) is an MoE layer.
  [[nodiscard]] constexpr bool is_moe(int layer) const noexcept {
    if (is_list()) return layer >= 0 && layer < length && moe[static_cast<std::size_t>(layer)] != 0;
    return every > 0 && layer % every == 0;
  }
  friend constexpr bool operator==(layer_pattern const&, layer_pattern const&) = default;
};

/// Multi-head latent attention's sizes (the reference's names); kv_lora_rank 0: none (the
/// decoder's attention is causal_attention).
struct mla_settings {
  int q_lora_rank = 0;  // 0: the queries through one projection (linear_q_proj)
  int kv_lora_rank = 0;
  int qk_head_dim = 0;          // a head's query/key elements without position
  int qk_pos_emb_head_dim = 0;  // a head's rotated query/key elements
  int v_head_dim = 0;

  [[nodiscard]] constexpr bool enabled() const noexcept { return kv_lora_rank > 0; }
  friend constexpr bool operator==(mla_settings const&, mla_settings const&) = default;
};

/// The decoder's choices as plain values. `dynamic` marks a size decided at start-up.
struct settings {
  int layers = dynamic;        // num_layers
  int heads = dynamic;         // num_attention_heads
  int query_groups = dynamic;  // num_query_groups (follows heads unless given)
  int vocabulary = dynamic;    // vocab_size
  int dense_ffn = dynamic;     // ffn_hidden_size of the dense layers (0 when every layer is MoE)
  layer_pattern moe_layers{};
  double norm_epsilon = 1e-5;  // layernorm_epsilon (RMSNorm)
  double rope_base = 10000.0;  // rotary_base
  bool qk_layernorm = false;   // qk_layernorm: RMSNorm per query and key head (MLA: of latents)
  int vocab_multiple = 128;    // make_vocab_size_divisible_by (times TP: the padded vocabulary)
  mla_settings mla{};          // multi_latent_attention and its sizes
  int mtp_num_layers = 0;      // mtp_num_layers: multi-token prediction depths (0: none)
  double mtp_loss_scaling_factor = 0.1;  // mtp_loss_scaling_factor

  /// Whether layer i is an MoE layer.
  [[nodiscard]] constexpr bool is_moe(int layer) const noexcept { return moe_layers.is_moe(layer); }
  /// Whether any of the first `layers` layers is dense (false while layers is left to start-up
  /// and could be 1).
  [[nodiscard]] constexpr bool has_dense_layer() const noexcept {
    if (layers == dynamic || layers < 1) return false;
    if (!moe_layers.is_list()) return moe_layers.every > 1 && layers > 1;
    for (int i = 0; i < layers && i < moe_layers.length; ++i)
      if (!is_moe(i)) return true;
    return false;
  }
  friend constexpr bool operator==(settings const&, settings const&) = default;
};

namespace option {
struct layers_kind {};
struct heads_kind {};
struct query_groups_kind {};
struct vocabulary_kind {};
struct dense_ffn_kind {};
struct moe_layers_kind {};
struct norm_epsilon_kind {};
struct rope_base_kind {};
struct qk_layernorm_kind {};
struct vocab_multiple_kind {};
struct attention_kind {};
struct mtp_kind {};
using all_kinds =
    boost::mp11::mp_list<layers_kind, heads_kind, query_groups_kind, vocabulary_kind,
                         dense_ffn_kind, moe_layers_kind, norm_epsilon_kind, rope_base_kind,
                         qk_layernorm_kind, vocab_multiple_kind, attention_kind, mtp_kind>;
}  // namespace option

/// Decoder layers (`num_layers`).
template <int N>
struct layers : megamoe::detail::int_option<option::layers_kind, N> {
  static constexpr void apply(settings& s) { s.layers = N; }
};
/// Attention heads (`num_attention_heads`); they divide the hidden size (R040).
template <int N>
struct heads : megamoe::detail::int_option<option::heads_kind, N> {
  static constexpr void apply(settings& s) { s.heads = N; }
};
/// Key / value groups (`num_query_groups`); equal to heads (multi-head attention) by default.
template <int N>
struct query_groups : megamoe::detail::int_option<option::query_groups_kind, N> {
  static constexpr void apply(settings& s) { s.query_groups = N; }
};
/// Vocabulary size (`vocab_size`).
template <int N>
struct vocabulary : megamoe::detail::int_option<option::vocabulary_kind, N> {
  static constexpr void apply(settings& s) { s.vocabulary = N; }
};
/// FFN width of the dense layers (`ffn_hidden_size`), needed when any layer is dense (R044); 0
/// by default when every layer is MoE.
template <int N>
struct dense_ffn : megamoe::detail::int_option<option::dense_ffn_kind, N> {
  static constexpr void apply(settings& s) { s.dense_ffn = N; }
};
/// Layer i is an MoE layer when i % N == 0 (the reference's integer `moe_layer_freq`; default 1).
template <int N>
struct moe_layer_freq {
  using option_kind = option::moe_layers_kind;
  static constexpr void apply(settings& s) { s.moe_layers.every = N; }
};
/// One entry per layer, 1 for an MoE layer and 0 for a dense one (the reference's list form of
/// `moe_layer_freq`); its length must equal the layers (R045).
template <int... Flags>
struct moe_layer_pattern {
  using option_kind = option::moe_layers_kind;
  static constexpr void apply(settings& s) {
    s.moe_layers.every = 0;
    s.moe_layers.length = static_cast<int>(sizeof...(Flags));
    int i = 0;
    // Entries beyond max_pattern_layers are dropped; R045 reports the list as too long.
    ((i < max_pattern_layers
          ? void(s.moe_layers.moe[static_cast<std::size_t>(i)] =
                     static_cast<std::int8_t>(Flags == 0 ? 0 : (Flags == 1 ? 1 : -1)))
          : void(),
      ++i),
     ...);
  }
};
/// The RMSNorms' epsilon (`layernorm_epsilon`).
template <double Eps>
struct norm_epsilon {
  using option_kind = option::norm_epsilon_kind;
  static constexpr void apply(settings& s) { s.norm_epsilon = Eps; }
};
/// RoPE's base (`rotary_base`).
template <double Base>
struct rope_base {
  using option_kind = option::rope_base_kind;
  static constexpr void apply(settings& s) { s.rope_base = Base; }
};
/// An RMSNorm over each query head and each key head (weights [head size], one for queries and
/// one for keys, shared by the heads), applied before RoPE (`qk_layernorm`); under
/// multi_latent_attention, an RMSNorm of each compressed latent instead. A choice of the type
/// only: the attention's code is chosen at compile time.
template <bool On = true>
struct qk_layernorm {
  using option_kind = option::qk_layernorm_kind;
  static constexpr void apply(settings& s) { s.qk_layernorm = On; }
};

/// Multi-head latent attention (the reference's multi_latent_attention, model/mla.hpp) in every
/// layer instead of grouped-query attention: `q_lora_rank` (0: no query compression),
/// `kv_lora_rank`, `qk_head_dim`, `qk_pos_emb_head_dim` (even: RoPE rotates pairs) and
/// `v_head_dim`; num_query_groups stays num_attention_heads (R057). With qk_layernorm the
/// compressed query and key-value latents are RMS-normed (`q_layernorm`, `kv_layernorm`), as in
/// the reference; without it they are not.
template <int QLoraRank, int KvLoraRank, int QkHeadDim, int QkPosEmbHeadDim, int VHeadDim>
struct multi_latent_attention {
  using option_kind = option::attention_kind;
  static constexpr void apply(settings& s) {
    s.mla = {QLoraRank, KvLoraRank, QkHeadDim, QkPosEmbHeadDim, VHeadDim};
  }
};

/// Multi-token prediction (the reference's MTP, DeepSeek-V3's): `Depths` extra depths
/// (`mtp_num_layers`) after the decoder, depth k predicting the token k + 1 places ahead from
/// depth k - 1's hidden state and the embedding of the token k places ahead, through one
/// transformer layer of the last decoder layer's kind and the shared output layer; their mean
/// loss times `Scaling` (`mtp_loss_scaling_factor`) joins the objective (R058).
template <int Depths, double Scaling = 0.1>
struct multi_token_prediction {
  using option_kind = option::mtp_kind;
  static constexpr void apply(settings& s) {
    s.mtp_num_layers = Depths;
    s.mtp_loss_scaling_factor = Scaling;
  }
};

/// The vocabulary is padded to a multiple of N x TP (`make_vocab_size_divisible_by`, 128 by
/// default), which sets where the tensor-parallel ranks' parts of the embedding and output layer
/// begin; the padding's ids hold no weights and their logits are masked.
template <int N>
struct vocab_size_divisible_by {
  using option_kind = option::vocab_multiple_kind;
  static constexpr void apply(settings& s) { s.vocab_multiple = N; }
};

/// What follows from the other choices when it is not given: query_groups follows heads, and the
/// dense FFN width is 0 once the layers and the pattern show that no layer is dense.
constexpr settings with_derived(settings s, bool query_groups_given) {
  if (!query_groups_given && s.query_groups == dynamic) s.query_groups = s.heads;
  bool const pattern_known = s.moe_layers.is_list() || s.moe_layers.every != dynamic;
  if (s.dense_ffn == dynamic && s.layers != dynamic && pattern_known && !s.has_dense_layer())
    s.dense_ffn = 0;
  return s;
}

/// A decoder-only transformer: token embedding, pre-norm blocks (RMSNorm, causal attention with
/// RoPE, RMSNorm, then the configuration's MoE layer or a dense SwiGLU FFN, each with a residual),
/// a final RMSNorm and the output layer.
template <class... Options>
struct decoder {
  using policy_kind = kind;
  static constexpr std::string_view name = "decoder";

 private:
  using options = megamoe::detail::option_list<option::all_kinds, Options...>;

 public:
  static constexpr settings value = with_derived(
      megamoe::detail::apply_options<option::all_kinds, settings, Options...>(settings{}),
      options::template count<option::query_groups_kind>::value > 0);
};

}  // namespace megamoe::model
