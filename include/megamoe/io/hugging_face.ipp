// SPDX-License-Identifier: Apache-2.0
// megamoe/io/hugging_face.ipp — the definitions behind hugging_face.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/core/bf16.hpp>
#include <megamoe/io/files.hpp>
#include <megamoe/io/hugging_face.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace megamoe::io::hugging_face {

MEGAMOE_DECL std::optional<architecture> parse_architecture(std::string const& name) {
  for (auto a : {architecture::mixtral, architecture::qwen3_moe, architecture::deepseek_v3})
    if (name == architecture_name(a) || name == architecture_class(a)) return a;
  return std::nullopt;
}

MEGAMOE_DECL char const* architecture_name(architecture a) noexcept {
  switch (a) {
    case architecture::mixtral: return "mixtral";
    case architecture::qwen3_moe: return "qwen3_moe";
    case architecture::deepseek_v3: return "deepseek_v3";
  }
  return "?";
}

MEGAMOE_DECL char const* architecture_class(architecture a) noexcept {
  switch (a) {
    case architecture::mixtral: return "MixtralForCausalLM";
    case architecture::qwen3_moe: return "Qwen3MoeForCausalLM";
    case architecture::deepseek_v3: return "DeepseekV3ForCausalLM";
  }
  return "?";
}

MEGAMOE_DECL std::vector<int> moe_layer_pattern(nlohmann::json const& freq, int layers) {
  std::vector<int> pattern(static_cast<std::size_t>(std::max(0, layers)), 0);
  if (freq.is_number_integer() && freq.get<int>() > 0) {
    for (int i = 0; i < layers; ++i) pattern[static_cast<std::size_t>(i)] = i % freq.get<int>() == 0;
    return pattern;
  }
  if (freq.is_array() && std::ssize(freq) == layers) {
    for (int i = 0; i < layers; ++i) {
      auto const& v = freq[static_cast<std::size_t>(i)];
      if (!v.is_number_integer() || (v.get<int>() != 0 && v.get<int>() != 1))
        throw input_error("moe_layer_freq " + freq.dump() + " holds other values than 0 and 1");
      pattern[static_cast<std::size_t>(i)] = v.get<int>();
    }
    return pattern;
  }
  throw input_error("moe_layer_freq " + freq.dump() + " is neither a positive integer nor a list of " +
                    std::to_string(layers) + " layers");
}

namespace detail {

// --- Reading a configuration's fields -------------------------------------------------------

/// Reads fields of one JSON object; a missing or mistyped required field throws, naming it.
struct fields {
  nlohmann::json const& j;
  std::string where;  // "the model configuration" or "config.json"

  [[nodiscard]] bool has(char const* key) const { return j.contains(key) && !j.at(key).is_null(); }
  [[nodiscard]] std::int64_t integer(char const* key) const {
    if (!has(key) || !j.at(key).is_number_integer())
      throw input_error(where + ": " + key + " is missing or not an integer" +
                        (j.contains(key) ? " (" + j.at(key).dump() + ")" : std::string()));
    return j.at(key).get<std::int64_t>();
  }
  [[nodiscard]] std::int64_t integer_or(char const* key, std::int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }
  [[nodiscard]] double number_or(char const* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j.at(key).is_number())
      throw input_error(where + ": " + key + " is not a number (" + j.at(key).dump() + ")");
    return j.at(key).get<double>();
  }
  [[nodiscard]] bool flag_or(char const* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j.at(key).is_boolean())
      throw input_error(where + ": " + key + " is not true or false (" + j.at(key).dump() + ")");
    return j.at(key).get<bool>();
  }
  [[nodiscard]] std::string text_or(char const* key, std::string fallback) const {
    if (!has(key)) return fallback;
    if (!j.at(key).is_string())
      throw input_error(where + ": " + key + " is not a string (" + j.at(key).dump() + ")");
    return j.at(key).get<std::string>();
  }
  [[nodiscard]] std::string shown(char const* key) const {
    return j.contains(key) ? j.at(key).dump() : std::string("not set");
  }
};

/// The sizes a conversion plan needs, from megamoe's model configuration.
struct dims {
  architecture arch = architecture::mixtral;
  std::int64_t layers = 0, hidden = 0, heads = 0, groups = 0, head = 0, vocabulary = 0;
  std::int64_t experts = 0, expert_ffn = 0, dense_ffn = 0, shared_ffn = 0, mtp = 0;
  bool qk_norm = false, mla = false, expert_bias = false;
  std::int64_t q_rank = 0, kv_rank = 0, nope = 0, rope = 0, value = 0;  // MLA
  std::vector<int> pattern;
};

inline dims dims_of(nlohmann::json const& model, architecture a) {
  fields const m{model, "the model configuration"};
  dims d;
  d.arch = a;
  d.layers = m.integer("num_layers");
  d.hidden = m.integer("hidden_size");
  d.heads = m.integer("num_attention_heads");
  if (d.layers < 1 || d.hidden < 1 || d.heads < 1 || d.hidden % d.heads != 0)
    throw input_error("the model configuration: num_layers, hidden_size and num_attention_heads (" +
                      m.shown("num_layers") + ", " + m.shown("hidden_size") + ", " +
                      m.shown("num_attention_heads") + ") do not make a model");
  d.groups = m.integer_or("num_query_groups", d.heads);
  d.head = d.hidden / d.heads;
  d.vocabulary = m.integer("vocab_size");
  d.experts = m.integer("num_moe_experts");
  d.expert_ffn = m.integer("moe_ffn_hidden_size");
  d.dense_ffn = m.integer_or("ffn_hidden_size", 0);
  d.shared_ffn = m.integer_or("moe_shared_expert_intermediate_size", 0);
  d.mtp = m.integer_or("mtp_num_layers", 0);
  d.qk_norm = m.flag_or("qk_layernorm", false);
  d.mla = m.flag_or("multi_latent_attention", false);
  d.expert_bias = m.flag_or("moe_router_enable_expert_bias", false);
  if (d.mla) {
    d.q_rank = m.integer_or("q_lora_rank", 0);
    d.kv_rank = m.integer("kv_lora_rank");
    d.nope = m.integer("qk_head_dim");
    d.rope = m.integer("qk_pos_emb_head_dim");
    d.value = m.integer("v_head_dim");
  }
  if (d.groups < 1 || d.heads % d.groups != 0)
    throw input_error("the model configuration: num_query_groups " + m.shown("num_query_groups") +
                      " does not divide num_attention_heads");
  d.pattern = moe_layer_pattern(model.contains("moe_layer_freq") ? model.at("moe_layer_freq")
                                                                  : nlohmann::json(1),
                                static_cast<int>(d.layers));
  return d;
}

// --- The plan --------------------------------------------------------------------------------

enum class split { whole, halves, query_groups };

/// One megamoe tensor and the architecture's tensors it becomes.
struct entry {
  std::string megamoe;
  std::vector<std::int64_t> shape;  // megamoe's (the reference's) shape
  split how = split::whole;
  std::vector<std::string> parts;   // one (whole), gate and up (halves), q k v (query_groups)
  std::vector<std::string> copies;  // names that hold the same tensor again
};

using shape_type = std::vector<std::int64_t>;

inline std::string shape_text(shape_type const& s) { return nlohmann::json(s).dump(); }

class planner {
 public:
  explicit planner(dims const& d) : d_(d) {}

  std::vector<entry> plan() {
    auto const H = d_.hidden, V = d_.vocabulary;
    add("embedding.word_embeddings.weight", {V, H}, "model.embed_tokens.weight");
    for (std::int64_t i = 0; i < d_.layers; ++i)
      layer("decoder.layers." + std::to_string(i) + ".", "model.layers." + std::to_string(i) + ".",
            d_.pattern[static_cast<std::size_t>(i)] == 1);
    add("decoder.final_layernorm.weight", {H}, "model.norm.weight");
    add("output_layer.weight", {V, H}, "lm_head.weight");
    // Multi-token prediction (DeepSeek-V3): layer L + k, its block of the last layer's kind.
    for (std::int64_t k = 0; k < d_.mtp; ++k) {
      std::string const mm = "mtp.layers." + std::to_string(k) + ".";
      std::string const hf = "model.layers." + std::to_string(d_.layers + k) + ".";
      out_.front().copies.push_back(hf + "embed_tokens.weight");
      add(mm + "enorm.weight", {H}, hf + "enorm.weight");
      add(mm + "hnorm.weight", {H}, hf + "hnorm.weight");
      add(mm + "eh_proj.weight", {H, 2 * H}, hf + "eh_proj.weight");
      layer(mm + "transformer_layer.", hf, d_.pattern.back() == 1);
      add(mm + "final_layernorm.weight", {H}, hf + "shared_head.norm.weight");
      head_copies_.push_back(hf + "shared_head.head.weight");
    }
    for (auto& e : out_)
      if (e.megamoe == "output_layer.weight") e.copies = head_copies_;
    return std::move(out_);
  }

 private:
  void add(std::string megamoe, shape_type shape, std::string part) {
    out_.push_back({std::move(megamoe), std::move(shape), split::whole, {std::move(part)}, {}});
  }
  /// A gated FFN: linear_fc1 [2F, H] as gate and up, linear_fc2 [H, F] as down.
  void ffn(std::string const& mm, std::string const& hf, std::int64_t width, char const* gate,
           char const* up, char const* down, std::string const& suffix = "") {
    auto const H = d_.hidden;
    out_.push_back({mm + "linear_fc1.weight" + suffix,
                    {2 * width, H},
                    split::halves,
                    {hf + gate + ".weight", hf + up + ".weight"},
                    {}});
    add(mm + "linear_fc2.weight" + suffix, {H, width}, hf + down + ".weight");
  }

  void layer(std::string const& mm, std::string const& hf, bool moe) {
    auto const H = d_.hidden, n = d_.heads, G = d_.groups, dh = d_.head;
    add(mm + "input_layernorm.weight", {H}, hf + "input_layernorm.weight");
    std::string const a = mm + "self_attention.", s = hf + "self_attn.";
    if (d_.mla) {
      auto const q_width = n * (d_.nope + d_.rope);
      if (d_.q_rank > 0) {
        add(a + "linear_q_down_proj.weight", {d_.q_rank, H}, s + "q_a_proj.weight");
        if (d_.qk_norm) add(a + "q_layernorm.weight", {d_.q_rank}, s + "q_a_layernorm.weight");
        add(a + "linear_q_up_proj.weight", {q_width, d_.q_rank}, s + "q_b_proj.weight");
      } else {
        add(a + "linear_q_proj.weight", {q_width, H}, s + "q_proj.weight");
      }
      add(a + "linear_kv_down_proj.weight", {d_.kv_rank + d_.rope, H},
          s + "kv_a_proj_with_mqa.weight");
      if (d_.qk_norm) add(a + "kv_layernorm.weight", {d_.kv_rank}, s + "kv_a_layernorm.weight");
      add(a + "linear_kv_up_proj.weight", {n * (d_.nope + d_.value), d_.kv_rank},
          s + "kv_b_proj.weight");
      add(a + "linear_proj.weight", {H, n * d_.value}, s + "o_proj.weight");
    } else {
      out_.push_back({a + "linear_qkv.weight",
                      {(n + 2 * G) * dh, H},
                      split::query_groups,
                      {s + "q_proj.weight", s + "k_proj.weight", s + "v_proj.weight"},
                      {}});
      if (d_.qk_norm) {
        add(a + "q_layernorm.weight", {dh}, s + "q_norm.weight");
        add(a + "k_layernorm.weight", {dh}, s + "k_norm.weight");
      }
      add(a + "linear_proj.weight", {H, n * dh}, s + "o_proj.weight");
    }
    add(mm + "pre_mlp_layernorm.weight", {H}, hf + "post_attention_layernorm.weight");
    bool const mixtral = d_.arch == architecture::mixtral;
    if (!moe) {
      ffn(mm + "mlp.", hf + "mlp.", d_.dense_ffn, "gate_proj", "up_proj", "down_proj");
      return;
    }
    std::string const block = hf + (mixtral ? "block_sparse_moe." : "mlp.");
    add(mm + "mlp.router.weight", {d_.experts, H}, block + "gate.weight");
    if (d_.expert_bias)
      add(mm + "mlp.router.expert_bias", {d_.experts}, block + "gate.e_score_correction_bias");
    for (std::int64_t e = 0; e < d_.experts; ++e) {
      std::string const expert = block + "experts." + std::to_string(e) + ".";
      if (mixtral)
        ffn(mm + "mlp.experts.", expert, d_.expert_ffn, "w1", "w3", "w2", std::to_string(e));
      else
        ffn(mm + "mlp.experts.", expert, d_.expert_ffn, "gate_proj", "up_proj", "down_proj",
            std::to_string(e));
    }
    if (d_.shared_ffn > 0)
      ffn(mm + "mlp.shared_experts.", block + "shared_experts.", d_.shared_ffn, "gate_proj",
          "up_proj", "down_proj");
  }

  dims const& d_;
  std::vector<entry> out_;
  std::vector<std::string> head_copies_;
};

/// The shapes of an entry's parts.
inline std::vector<shape_type> part_shapes(entry const& e, dims const& d) {
  switch (e.how) {
    case split::whole: return {e.shape};
    case split::halves: return {{e.shape[0] / 2, e.shape[1]}, {e.shape[0] / 2, e.shape[1]}};
    case split::query_groups: {
      auto const H = d.hidden, dh = d.head;
      return {{d.heads * dh, H}, {d.groups * dh, H}, {d.groups * dh, H}};
    }
  }
  return {};
}

/// Splits megamoe's tensor into the entry's parts.
inline std::vector<tensor> split_tensor(entry const& e, dims const& d, tensor const& t) {
  auto const shapes = part_shapes(e, d);
  std::vector<tensor> parts;
  for (auto const& s : shapes) parts.push_back({s, {}});
  auto const cols = static_cast<std::size_t>(e.shape.size() == 2 ? e.shape[1] : 1);
  auto rows_of = [&](std::int64_t first, std::int64_t count, tensor& into) {
    auto const* from = t.values.data() + static_cast<std::size_t>(first) * cols;
    into.values.insert(into.values.end(), from, from + static_cast<std::size_t>(count) * cols);
  };
  switch (e.how) {
    case split::whole: parts[0].values = t.values; break;
    case split::halves:
      rows_of(0, e.shape[0] / 2, parts[0]);
      rows_of(e.shape[0] / 2, e.shape[0] / 2, parts[1]);
      break;
    case split::query_groups: {
      auto const per_group = d.heads / d.groups, dh = d.head, block = (per_group + 2) * dh;
      for (std::int64_t g = 0; g < d.groups; ++g) {
        rows_of(g * block, per_group * dh, parts[0]);
        rows_of(g * block + per_group * dh, dh, parts[1]);
        rows_of(g * block + (per_group + 1) * dh, dh, parts[2]);
      }
      break;
    }
  }
  return parts;
}

/// Joins the entry's parts into megamoe's tensor (split_tensor's inverse).
inline tensor join_tensors(entry const& e, dims const& d, std::vector<tensor const*> const& parts) {
  tensor t{e.shape, {}};
  auto const cols = static_cast<std::size_t>(e.shape.size() == 2 ? e.shape[1] : 1);
  auto rows_of = [&](tensor const& from, std::int64_t first, std::int64_t count) {
    auto const* p = from.values.data() + static_cast<std::size_t>(first) * cols;
    t.values.insert(t.values.end(), p, p + static_cast<std::size_t>(count) * cols);
  };
  switch (e.how) {
    case split::whole: t.values = parts[0]->values; break;
    case split::halves:
      t.values = parts[0]->values;
      t.values.insert(t.values.end(), parts[1]->values.begin(), parts[1]->values.end());
      break;
    case split::query_groups: {
      auto const per_group = d.heads / d.groups, dh = d.head;
      for (std::int64_t g = 0; g < d.groups; ++g) {
        rows_of(*parts[0], g * per_group * dh, per_group * dh);
        rows_of(*parts[1], g * dh, dh);
        rows_of(*parts[2], g * dh, dh);
      }
      break;
    }
  }
  return t;
}

/// Whether megamoe's tensor is training state rather than the model: Adam's moments, the FP8
/// recipes' amax histories.
inline bool training_state(std::string const& name) {
  return name.rfind("optimizer.", 0) == 0 || name.find("fp8_delayed_state") != std::string::npos;
}

inline std::map<std::string, tensor*> by_name(named_tensors& tensors, std::string const& what) {
  std::map<std::string, tensor*> out;
  for (auto& [name, t] : tensors)
    if (!out.emplace(name, &t).second) throw input_error(what + " holds " + name + " twice");
  return out;
}

// --- Refusals ----------------------------------------------------------------------------------

[[noreturn]] inline void refuse(architecture a, fields const& m, char const* option, std::string const& why) {
  throw input_error(std::string(architecture_class(a)) + " cannot compute this model: " + option +
                    " is " + m.shown(option) + " (" + why + ")");
}

/// The checks every architecture makes of megamoe's configuration.
inline void check_common(architecture a, fields const& m) {
  if (m.text_or("normalization", "RMSNorm") != "RMSNorm")
    refuse(a, m, "normalization", "its norms are RMSNorms");
  if (m.text_or("activation", "swiglu") != "swiglu")
    refuse(a, m, "activation", "its FFNs are SwiGLU");
  if (!m.flag_or("gated_linear_unit", true))
    refuse(a, m, "gated_linear_unit", "its FFNs are gated");
  if (m.flag_or("add_bias_linear", false)) refuse(a, m, "add_bias_linear", "its linears have no bias");
  if (m.text_or("position_embedding_type", "rope") != "rope")
    refuse(a, m, "position_embedding_type", "it rotates positions (RoPE)");
  if (m.flag_or("moe_shared_expert_gate", false))
    refuse(a, m, "moe_shared_expert_gate", "its shared expert has no gate");
  if (m.integer("num_moe_experts") < 2)
    refuse(a, m, "num_moe_experts", "a model of one expert is a dense model");
}

/// Mixtral's and Qwen3-MoE's router: softmax scores, no bias, no groups, no scaling.
inline void check_softmax_router(architecture a, fields const& m) {
  if (m.text_or("moe_router_score_function", "softmax") != "softmax")
    refuse(a, m, "moe_router_score_function", "its router scores by softmax");
  if (m.flag_or("moe_router_enable_expert_bias", false))
    refuse(a, m, "moe_router_enable_expert_bias", "its router has no expert bias");
  if (m.integer_or("moe_router_num_groups", 1) > 1)
    refuse(a, m, "moe_router_num_groups", "its router does not limit groups");
  if (m.number_or("moe_router_topk_scaling_factor", 1.0) != 1.0)
    refuse(a, m, "moe_router_topk_scaling_factor", "its router does not scale the probabilities");
  if (m.integer_or("moe_shared_expert_intermediate_size", 0) != 0)
    refuse(a, m, "moe_shared_expert_intermediate_size", "it has no shared expert");
  if (m.integer_or("mtp_num_layers", 0) != 0)
    refuse(a, m, "mtp_num_layers", "it has no multi-token prediction");
  if (m.flag_or("multi_latent_attention", false))
    refuse(a, m, "multi_latent_attention", "its attention is grouped-query attention");
}

}  // namespace detail

MEGAMOE_DECL nlohmann::ordered_json config_of(nlohmann::json const& model, architecture a,
                                              dtype stored, std::optional<std::int64_t> eos,
                                              std::int64_t max_positions) {
  using namespace detail;
  fields const m{model, "the model configuration"};
  check_common(a, m);
  auto const d = dims_of(model, a);
  auto const k = m.integer("moe_router_topk");
  double const aux = m.number_or("moe_aux_loss_coeff", 0.0);
  bool const pre_softmax = m.flag_or("moe_router_pre_softmax", false);
  std::vector<int> dense_layers;
  for (std::int64_t i = 0; i < d.layers; ++i)
    if (d.pattern[static_cast<std::size_t>(i)] == 0) dense_layers.push_back(static_cast<int>(i));
  if (!dense_layers.empty() && d.dense_ffn <= 0)
    refuse(a, m, "ffn_hidden_size", "dense layers need a width");
  nlohmann::ordered_json c;
  c["architectures"] = {architecture_class(a)};
  c["model_type"] = architecture_name(a);
  c["vocab_size"] = d.vocabulary;
  c["hidden_size"] = d.hidden;
  c["num_hidden_layers"] = d.layers;
  c["num_attention_heads"] = d.heads;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = max_positions;
  c["initializer_range"] = 0.02;
  c["rms_norm_eps"] = m.number_or("layernorm_epsilon", 1e-5);
  c["rope_theta"] = m.number_or("rotary_base", 10000.0);
  c["rope_scaling"] = nullptr;
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["use_cache"] = true;
  c["tie_word_embeddings"] = false;
  c["torch_dtype"] = stored == dtype::bf16 ? "bfloat16" : "float32";
  c["bos_token_id"] = nullptr;
  c["eos_token_id"] = eos ? nlohmann::ordered_json(*eos) : nlohmann::ordered_json(nullptr);
  c["num_experts_per_tok"] = k;
  switch (a) {
    case architecture::mixtral:
      check_softmax_router(a, m);
      if (d.qk_norm) refuse(a, m, "qk_layernorm", "it does not norm queries and keys");
      if (!dense_layers.empty()) refuse(a, m, "moe_layer_freq", "every layer of it is MoE");
      if (pre_softmax)
        refuse(a, m, "moe_router_pre_softmax",
               "it renormalizes the chosen experts' softmax probabilities");
      c["num_key_value_heads"] = d.groups;
      c["head_dim"] = d.head;
      c["intermediate_size"] = d.expert_ffn;
      c["num_local_experts"] = d.experts;
      c["sliding_window"] = nullptr;
      c["output_router_logits"] = false;
      c["router_aux_loss_coef"] = aux;
      c["router_jitter_noise"] = m.number_or("moe_input_jitter_eps", 0.0);
      break;
    case architecture::qwen3_moe:
      check_softmax_router(a, m);
      if (!d.qk_norm) refuse(a, m, "qk_layernorm", "it norms every query and key head");
      c["num_key_value_heads"] = d.groups;
      c["head_dim"] = d.head;
      c["intermediate_size"] = dense_layers.empty() ? d.expert_ffn : d.dense_ffn;
      c["moe_intermediate_size"] = d.expert_ffn;
      c["num_experts"] = d.experts;
      c["norm_topk_prob"] = !pre_softmax;
      c["decoder_sparse_step"] = 1;
      c["mlp_only_layers"] = dense_layers;
      c["output_router_logits"] = false;
      c["router_aux_loss_coef"] = aux;
      c["use_sliding_window"] = false;
      c["sliding_window"] = nullptr;
      c["max_window_layers"] = d.layers;
      break;
    case architecture::deepseek_v3: {
      if (!d.mla)
        refuse(a, m, "multi_latent_attention", "its attention is multi-head latent attention");
      if (!d.qk_norm) refuse(a, m, "qk_layernorm", "it norms the query and key-value latents");
      if (m.number_or("layernorm_epsilon", 1e-5) != 1e-6)
        refuse(a, m, "layernorm_epsilon",
               "its q_a_layernorm and kv_a_layernorm fix their epsilon at 1e-6, and megamoe's "
               "norms share one");
      std::int64_t first_dense = 0;
      while (first_dense < d.layers && d.pattern[static_cast<std::size_t>(first_dense)] == 0)
        ++first_dense;
      if (std::ssize(dense_layers) != first_dense)
        refuse(a, m, "moe_layer_freq", "its dense layers are the first ones only");
      if (d.shared_ffn <= 0 || d.shared_ffn % d.expert_ffn != 0)
        refuse(a, m, "moe_shared_expert_intermediate_size",
               "its shared experts are a whole number of routed experts' widths, at least one");
      if (m.text_or("moe_router_score_function", "softmax") != "sigmoid")
        refuse(a, m, "moe_router_score_function", "its router scores by sigmoid");
      if (!d.expert_bias)
        refuse(a, m, "moe_router_enable_expert_bias",
               "its router chooses with the expert bias (noaux_tc)");
      if (pre_softmax) refuse(a, m, "moe_router_pre_softmax", "its router scores by sigmoid");
      auto const groups = m.integer_or("moe_router_num_groups", 1);
      auto const group_topk = m.integer_or("moe_router_group_topk", 1);
      if (groups > 1 && (group_topk < 1 || k % group_topk != 0 || k / group_topk != 2))
        refuse(a, m, "moe_router_group_topk",
               "its group scores add each group's top 2 experts, the reference's its top "
               "moe_router_topk / moe_router_group_topk, so their quotient must be 2");
      c["num_key_value_heads"] = d.heads;
      c["intermediate_size"] = dense_layers.empty() ? d.expert_ffn : d.dense_ffn;
      c["moe_intermediate_size"] = d.expert_ffn;
      c["n_routed_experts"] = d.experts;
      c["n_shared_experts"] = d.shared_ffn / d.expert_ffn;
      c["first_k_dense_replace"] = first_dense;
      c["moe_layer_freq"] = 1;
      c["n_group"] = groups;
      c["topk_group"] = groups > 1 ? group_topk : 1;
      c["routed_scaling_factor"] = m.number_or("moe_router_topk_scaling_factor", 1.0);
      c["scoring_func"] = "sigmoid";
      c["topk_method"] = "noaux_tc";
      c["norm_topk_prob"] = k > 1;  // the reference normalizes sigmoid scores for top-k above 1
      c["q_lora_rank"] =
          d.q_rank > 0 ? nlohmann::ordered_json(d.q_rank) : nlohmann::ordered_json(nullptr);
      c["kv_lora_rank"] = d.kv_rank;
      c["qk_nope_head_dim"] = d.nope;
      c["qk_rope_head_dim"] = d.rope;
      c["v_head_dim"] = d.value;
      c["head_dim"] = d.rope;
      c["rope_interleave"] = true;
      c["num_nextn_predict_layers"] = d.mtp;
      c["aux_loss_alpha"] = aux;
      c["seq_aux"] = m.text_or("moe_router_load_balancing_type", "") == "seq_aux_loss";
      c["ep_size"] = 1;
      break;
    }
  }
  return c;
}

MEGAMOE_DECL std::vector<std::pair<std::string, std::vector<std::int64_t>>> model_tensor_shapes(
    nlohmann::json const& model, architecture a) {
  using namespace detail;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  for (auto const& e : planner(dims_of(model, a)).plan()) out.emplace_back(e.megamoe, e.shape);
  return out;
}

MEGAMOE_DECL named_tensors to_hugging_face(nlohmann::json const& model, architecture a,
                                           named_tensors megamoe) {
  using namespace detail;
  (void)config_of(model, a, dtype::f32, std::nullopt, 0);  // its refusals
  auto const d = dims_of(model, a);
  auto const plan = planner(d).plan();
  auto named = by_name(megamoe, "the model");
  for (auto it = named.begin(); it != named.end();)
    it = training_state(it->first) ? named.erase(it) : std::next(it);
  named_tensors out;
  for (auto const& e : plan) {
    auto const it = named.find(e.megamoe);
    if (it == named.end())
      throw input_error("the model has no " + e.megamoe + ", which " + architecture_class(a) +
                        " of this configuration holds");
    tensor const& t = *it->second;
    if (t.shape != e.shape)
      throw input_error(e.megamoe + " is " + shape_text(t.shape) + ", the configuration's " +
                        shape_text(e.shape));
    auto parts = split_tensor(e, d, t);
    for (std::size_t p = 0; p < parts.size(); ++p) out.emplace_back(e.parts[p], std::move(parts[p]));
    for (auto const& copy : e.copies) out.emplace_back(copy, t);
    named.erase(it);
  }
  if (!named.empty())
    throw input_error(named.begin()->first + " has no place in " + architecture_class(a) + " (" +
                      std::to_string(named.size()) + " tensor(s) left over)");
  return out;
}

MEGAMOE_DECL architecture architecture_of(nlohmann::json const& config) {
  if (!config.is_object()) throw input_error("config.json is not a JSON object");
  // The class names decide where a config lists them; model_type where it does not.
  if (config.contains("architectures") && config["architectures"].is_array()) {
    for (auto const& name : config["architectures"])
      if (name.is_string())
        if (auto const a = parse_architecture(name.get<std::string>())) return *a;
  } else if (config.contains("model_type") && config["model_type"].is_string()) {
    if (auto const a = parse_architecture(config["model_type"].get<std::string>())) return *a;
  }
  throw input_error("config.json: the architecture " +
                    (config.contains("architectures") ? config["architectures"].dump()
                                                      : config.value("model_type", "(none)")) +
                    " is not one megamoe converts (MixtralForCausalLM, Qwen3MoeForCausalLM, "
                    "DeepseekV3ForCausalLM)");
}

MEGAMOE_DECL nlohmann::json model_of(nlohmann::json const& config) {
  using namespace detail;
  auto const a = architecture_of(config);
  fields const c{config, "config.json"};
  auto refuse_field = [&](char const* field, std::string const& why) {
    throw input_error(std::string("config.json: megamoe cannot compute this ") +
                      architecture_class(a) + ": " + field + " is " + c.shown(field) + " (" + why +
                      ")");
  };
  if (c.text_or("hidden_act", "silu") != "silu")
    refuse_field("hidden_act", "megamoe's FFNs are SwiGLU");
  if (c.flag_or("attention_bias", false)) refuse_field("attention_bias", "no linear has a bias");
  // RoPE's base: transformers 5 writes rope_parameters, earlier ones rope_theta (and
  // rope_scaling); only the default, unscaled kind is megamoe's.
  double theta = a == architecture::mixtral ? 1e6 : 1e4;  // the architectures' defaults
  if (config.contains("rope_parameters") && !config["rope_parameters"].is_null()) {
    auto const& rope = config["rope_parameters"];
    if (!rope.is_object() || rope.value("rope_type", std::string("default")) != "default" ||
        !rope.contains("rope_theta") || !rope["rope_theta"].is_number())
      refuse_field("rope_parameters", "megamoe's RoPE is the default kind, of a given base");
    theta = rope["rope_theta"].get<double>();
  } else {
    if (c.has("rope_scaling")) {
      auto const& scaling = config["rope_scaling"];
      if (!scaling.is_object() ||
          scaling.value("rope_type", scaling.value("type", std::string())) != "default")
        refuse_field("rope_scaling", "megamoe's RoPE is unscaled");
    }
    theta = c.number_or("rope_theta", theta);
  }
  auto const L = c.integer("num_hidden_layers"), H = c.integer("hidden_size"),
             heads = c.integer("num_attention_heads"), k = c.integer("num_experts_per_tok");
  if (L < 1 || H < 1 || heads < 1 || H % heads != 0)
    refuse_field("num_attention_heads", "it must divide hidden_size");
  nlohmann::json m;
  m["vocab_size"] = c.integer("vocab_size");
  m["hidden_size"] = H;
  m["num_layers"] = L;
  m["num_attention_heads"] = heads;
  m["layernorm_epsilon"] = c.number_or("rms_norm_eps", 1e-6);
  m["rotary_base"] = theta;
  m["normalization"] = "RMSNorm";
  m["activation"] = "swiglu";
  m["gated_linear_unit"] = true;
  m["add_bias_linear"] = false;
  m["position_embedding_type"] = "rope";
  m["moe_shared_expert_gate"] = false;
  m["moe_router_topk"] = k;
  std::vector<int> pattern(static_cast<std::size_t>(L), 1);
  auto grouped_query_attention = [&](bool qk_norm) {
    auto const groups = c.integer_or("num_key_value_heads", heads);
    if (c.integer_or("head_dim", H / heads) != H / heads)
      refuse_field("head_dim", "megamoe's heads are hidden_size / num_attention_heads wide");
    m["num_query_groups"] = groups;
    m["kv_channels"] = H / heads;
    m["qk_layernorm"] = qk_norm;
    m["moe_router_score_function"] = "softmax";
    m["moe_router_enable_expert_bias"] = false;
    m["moe_router_num_groups"] = nullptr;
    m["moe_router_group_topk"] = nullptr;
    m["moe_router_topk_scaling_factor"] = nullptr;
    m["moe_shared_expert_intermediate_size"] = nullptr;
  };
  switch (a) {
    case architecture::mixtral:
      if (c.has("sliding_window")) refuse_field("sliding_window", "megamoe's attention is full");
      grouped_query_attention(false);
      m["num_moe_experts"] = c.integer("num_local_experts");
      m["moe_ffn_hidden_size"] = c.integer("intermediate_size");
      m["moe_router_pre_softmax"] = false;
      break;
    case architecture::qwen3_moe: {
      if (c.flag_or("use_sliding_window", false))
        refuse_field("use_sliding_window", "megamoe's attention is full");
      grouped_query_attention(true);
      // transformers 5 writes num_local_experts, earlier ones num_experts.
      m["num_moe_experts"] = c.has("num_experts") ? c.integer("num_experts")
                                                  : c.integer("num_local_experts");
      m["moe_ffn_hidden_size"] = c.integer("moe_intermediate_size");
      m["moe_router_pre_softmax"] = !c.flag_or("norm_topk_prob", false);
      auto const step = c.integer_or("decoder_sparse_step", 1);
      if (step < 1) refuse_field("decoder_sparse_step", "it must be positive");
      std::set<std::int64_t> dense;
      if (c.has("mlp_only_layers")) {
        if (!config["mlp_only_layers"].is_array())
          refuse_field("mlp_only_layers", "it must be a list of layers");
        for (auto const& v : config["mlp_only_layers"]) {
          if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= L)
            refuse_field("mlp_only_layers", "it must list layers of the model");
          dense.insert(v.get<std::int64_t>());
        }
      }
      for (std::int64_t i = 0; i < L; ++i)
        pattern[static_cast<std::size_t>(i)] = !dense.contains(i) && (i + 1) % step == 0;
      break;
    }
    case architecture::deepseek_v3: {
      if (c.number_or("rms_norm_eps", 1e-6) != 1e-6)
        refuse_field("rms_norm_eps",
                     "its latent norms fix their epsilon at 1e-6, and megamoe's norms share one");
      if (!c.flag_or("rope_interleave", true))
        refuse_field("rope_interleave",
                     "megamoe's MLA rotates the pairs of the weights' interleaved layout");
      if (c.text_or("scoring_func", "sigmoid") != "sigmoid")
        refuse_field("scoring_func", "its router scores by sigmoid");
      if (c.text_or("topk_method", "noaux_tc") != "noaux_tc")
        refuse_field("topk_method", "megamoe's sigmoid router chooses as noaux_tc");
      if (c.integer_or("moe_layer_freq", 1) != 1)
        refuse_field("moe_layer_freq", "megamoe reads DeepSeek-V3's layer kinds from "
                                       "first_k_dense_replace alone");
      if (!c.has("norm_topk_prob") || c.flag_or("norm_topk_prob", false) != (k > 1))
        refuse_field("norm_topk_prob", "megamoe's sigmoid router normalizes exactly when "
                                       "num_experts_per_tok is above 1");
      auto const groups = c.integer("n_group"), group_topk = c.integer("topk_group");
      if (groups > 1 && (group_topk < 1 || k % group_topk != 0 || k / group_topk != 2))
        refuse_field("topk_group", "its group scores add each group's top 2 experts, megamoe's "
                                   "its top num_experts_per_tok / topk_group");
      auto const shared = c.integer("n_shared_experts");
      if (shared < 1)
        refuse_field("n_shared_experts", "megamoe's DeepSeek-V3 has at least one shared expert");
      auto const width = c.integer("moe_intermediate_size");
      if (c.has("num_key_value_heads") && c.integer("num_key_value_heads") != heads)
        refuse_field("num_key_value_heads", "MLA has a key and value per head");
      m["multi_latent_attention"] = true;
      m["qk_layernorm"] = true;
      if (!config.contains("q_lora_rank"))  // null: the queries' one projection
        refuse_field("q_lora_rank", "a DeepSeek-V3 config.json gives it, or null");
      m["q_lora_rank"] = c.integer_or("q_lora_rank", 0);
      m["kv_lora_rank"] = c.integer("kv_lora_rank");
      m["qk_head_dim"] = c.integer("qk_nope_head_dim");
      m["qk_pos_emb_head_dim"] = c.integer("qk_rope_head_dim");
      m["v_head_dim"] = c.integer("v_head_dim");
      m["num_moe_experts"] = c.integer("n_routed_experts");
      m["moe_ffn_hidden_size"] = width;
      m["moe_shared_expert_intermediate_size"] = shared * width;
      m["moe_router_score_function"] = "sigmoid";
      m["moe_router_pre_softmax"] = false;
      m["moe_router_enable_expert_bias"] = true;
      m["moe_router_num_groups"] = groups > 1 ? nlohmann::json(groups) : nlohmann::json(nullptr);
      m["moe_router_group_topk"] = groups > 1 ? nlohmann::json(group_topk) : nlohmann::json(nullptr);
      if (!c.has("routed_scaling_factor"))
        refuse_field("routed_scaling_factor", "a DeepSeek-V3 config.json gives it");
      double const scaling = c.number_or("routed_scaling_factor", 1.0);
      m["moe_router_topk_scaling_factor"] =
          scaling == 1.0 ? nlohmann::json(nullptr) : nlohmann::json(scaling);
      auto const first_dense = c.integer("first_k_dense_replace");
      for (std::int64_t i = 0; i < L; ++i) pattern[static_cast<std::size_t>(i)] = i >= first_dense;
      if (auto const mtp = c.integer_or("num_nextn_predict_layers", 0); mtp > 0)
        m["mtp_num_layers"] = mtp;
      break;
    }
  }
  m["moe_layer_freq"] = pattern;
  if (std::find(pattern.begin(), pattern.end(), 0) != pattern.end())
    m["ffn_hidden_size"] = c.integer("intermediate_size");
  return m;
}

MEGAMOE_DECL imported_model from_hugging_face(nlohmann::json const& given, named_tensors hf) {
  using namespace detail;
  auto const a = architecture_of(given);
  auto config = given;
  std::vector<std::string> notes;
  if (a == architecture::deepseek_v3 && config.value("num_nextn_predict_layers", 0) > 0) {
    std::string const first = "model.layers." + std::to_string(config.value("num_hidden_layers", 0)) + ".";
    if (std::none_of(hf.begin(), hf.end(), [&](auto const& t) { return t.first.starts_with(first); })) {
      notes.push_back("config.json names " + config["num_nextn_predict_layers"].dump() +
                      " prediction layer(s), the folder holds no tensor of them: imported without "
                      "multi-token prediction");
      config["num_nextn_predict_layers"] = 0;
    }
  }
  auto const model = model_of(config);
  auto const d = dims_of(model, a);
  auto const plan = planner(d).plan();
  auto named = by_name(hf, "the folder");
  // Rotary frequencies some checkpoints hold: derived from rope_theta, not weights.
  for (auto it = named.begin(); it != named.end();)
    it = it->first.ends_with("rotary_emb.inv_freq") ? named.erase(it) : std::next(it);
  bool const tied = config.value("tie_word_embeddings", false) && !named.contains("lm_head.weight");
  named_tensors out;
  auto take = [&](std::string const& name, shape_type const& shape) -> tensor const& {
    std::string const source = tied && name == "lm_head.weight" ? "model.embed_tokens.weight" : name;
    auto const it = named.find(source);
    if (it == named.end()) throw input_error("the folder has no " + name);
    if (it->second->shape != shape)
      throw input_error(name + " is " + shape_text(it->second->shape) + ", config.json's " +
                        shape_text(shape));
    return *it->second;
  };
  std::set<std::string> used;
  for (auto const& e : plan) {
    auto const shapes = part_shapes(e, d);
    std::vector<tensor const*> parts;
    for (std::size_t p = 0; p < e.parts.size(); ++p) {
      parts.push_back(&take(e.parts[p], shapes[p]));
      used.insert(e.parts[p]);
    }
    auto joined = join_tensors(e, d, parts);
    for (auto const& copy : e.copies) {
      auto const& again = take(copy, e.shape);
      if (std::memcmp(again.values.data(), joined.values.data(),
                      joined.values.size() * sizeof(float)) != 0)
        throw input_error(copy + " differs from " + e.parts.front() +
                          ": megamoe holds one of them for both");
      used.insert(copy);
    }
    out.emplace_back(e.megamoe, std::move(joined));
  }
  for (auto const& name : used) named.erase(name);
  if (!named.empty())
    throw input_error(named.begin()->first + " is not a tensor of " + architecture_class(a) +
                      " as config.json describes it (" + std::to_string(named.size()) +
                      " tensor(s) unmatched)");
  return {model, std::move(out), std::move(notes)};
}

namespace detail {

inline float from_f16_bits(std::uint16_t h) {
  std::uint32_t const sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  std::uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

inline std::vector<float> read_as_float(readable_file const& file, safetensors_entry const& t) {
  auto const count = static_cast<std::size_t>(element_count(t.shape));
  std::vector<float> out(count);
  switch (t.type) {
    case dtype::f32: file.read(t.begin, std::as_writable_bytes(std::span(out))); break;
    case dtype::bf16:
    case dtype::f16: {
      std::vector<std::uint16_t> half(count);
      file.read(t.begin, std::as_writable_bytes(std::span(half)));
      for (std::size_t i = 0; i < count; ++i)
        out[i] = t.type == dtype::bf16 ? from_bf16_bits(half[i]) : from_f16_bits(half[i]);
      break;
    }
    default:
      throw input_error(file.path().string() + ": " + t.name + " is " + dtype_name(t.type) +
                        "; megamoe imports F32, BF16 and F16 tensors");
  }
  return out;
}

inline nlohmann::json read_json(std::filesystem::path const& path) {
  std::ifstream in(path);
  if (!in) throw input_error(path.string() + " cannot be read");
  auto json = nlohmann::json::parse(in, nullptr, false);
  if (json.is_discarded() || !json.is_object())
    throw input_error(path.string() + " is not a JSON object");
  return json;
}

}  // namespace detail

MEGAMOE_DECL folder read_folder(std::filesystem::path const& path) {
  using namespace detail;
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) throw input_error(path.string() + " is not a folder");
  folder f;
  f.config = read_json(path / "config.json");
  // Which file holds each tensor: the index's weight map, or every file's own header.
  std::map<std::string, std::string> expected;
  std::vector<std::string> files;
  auto const index_path = path / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    auto const index = read_json(index_path);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw input_error(index_path.string() + " has no weight_map");
    std::set<std::string> seen;
    for (auto const& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw input_error(index_path.string() + ": " + name + " names no file of the folder");
      expected[name] = file.get<std::string>();
      if (!fs::is_regular_file(path / file.get<std::string>()))
        throw input_error(index_path.string() + " places " + name + " in " +
                          file.get<std::string>() + ", which is not in the folder");
      if (seen.insert(file.get<std::string>()).second) files.push_back(file.get<std::string>());
    }
  } else {
    for (auto const& item : fs::directory_iterator(path))
      if (item.path().extension() == ".safetensors") files.push_back(item.path().filename());
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) throw input_error(path.string() + " holds no .safetensors file");
  std::set<std::string> read;
  for (auto const& name : files) {
    readable_file const file(path / name);
    auto const header = read_safetensors_header(file);
    for (auto const& t : header.tensors) {
      if (!expected.empty()) {
        auto const it = expected.find(t.name);
        if (it == expected.end() || it->second != name)
          throw input_error((path / name).string() + " holds " + t.name + ", which " +
                            index_path.filename().string() +
                            (it == expected.end() ? " does not list" : " places in " + it->second));
      }
      if (!read.insert(t.name).second)
        throw input_error(t.name + " is in two files of " + path.string());
      f.tensors.emplace_back(t.name, tensor{t.shape, read_as_float(file, t)});
    }
  }
  for (auto const& [name, file] : expected)
    if (!read.contains(name))
      throw input_error(index_path.string() + " places " + name + " in " + file +
                        ", which does not hold it");
  return f;
}

MEGAMOE_DECL std::vector<std::filesystem::path> write_folder(std::filesystem::path const& path,
                                                             nlohmann::ordered_json const& config,
                                                             named_tensors const& tensors,
                                                             dtype stored,
                                                             std::uint64_t shard_bytes) {
  using namespace detail;
  namespace fs = std::filesystem;
  if (stored != dtype::f32 && stored != dtype::bf16)
    throw input_error(std::string("Hugging Face weights are written as F32 or BF16, not ") +
                      dtype_name(stored));
  if (fs::exists(path) && (!fs::is_directory(path) || !fs::is_empty(path)))
    throw input_error(path.string() + " exists and is not an empty folder");
  fs::create_directories(path);
  // Each tensor's bytes as stored, then the shards: in order, a new one where the next tensor
  // would pass shard_bytes.
  std::vector<std::vector<std::byte>> bytes;
  bytes.reserve(tensors.size());
  for (auto const& [name, t] : tensors) {
    auto& b = bytes.emplace_back(t.values.size() * dtype_size(stored));
    if (stored == dtype::f32) {
      std::memcpy(b.data(), t.values.data(), b.size());
    } else {
      for (std::size_t i = 0; i < t.values.size(); ++i) {
        std::uint16_t const bits = to_bf16_bits(t.values[i]);
        std::memcpy(b.data() + 2 * i, &bits, 2);
      }
    }
  }
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!shards.back().empty() && in_shard + bytes[i].size() > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes[i].size();
    total += bytes[i].size();
  }
  std::vector<fs::path> written;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    if (shards.size() == 1)
      std::snprintf(name, sizeof name, "model.safetensors");
    else
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    std::vector<tensor_bytes> list;
    for (auto i : shards[s]) {
      list.push_back({tensors[i].first, stored, tensors[i].second.shape, bytes[i]});
      weight_map[tensors[i].first] = name;
    }
    write_safetensors(path / name, list, {{"format", "pt"}});
    written.push_back(path / name);
  }
  auto write_text = [&](fs::path const& file, std::string const& text) {
    durable_file out(file);
    out.write(text);
    out.finish();
    written.push_back(file);
  };
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_text(path / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  write_text(path / "config.json", config.dump(2) + "\n");
  return written;
}

}  // namespace megamoe::io::hugging_face
