// SPDX-License-Identifier: Apache-2.0
// Hugging Face conversion: the fused tensors split as the architectures lay them out (checked
// against the layouts written out here), export then import giving the same bits, config.json
// giving back the model's fields, every refusal naming its field, and folders read from F32, BF16
// and F16 files with and without an index.
#include <megamoe/io/hugging_face.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace hf = megamoe::io::hugging_face;
namespace mio = megamoe::io;

namespace {

/// A small Mixtral-like model configuration as a checkpoint records it.
nlohmann::json mixtral_model() {
  return {{"activation", "swiglu"},
          {"add_bias_linear", false},
          {"gated_linear_unit", true},
          {"hidden_size", 8},
          {"num_layers", 2},
          {"num_attention_heads", 4},
          {"num_query_groups", 2},
          {"kv_channels", 2},
          {"ffn_hidden_size", 0},
          {"moe_ffn_hidden_size", 6},
          {"num_moe_experts", 3},
          {"moe_router_topk", 2},
          {"moe_layer_freq", 1},
          {"vocab_size", 11},
          {"layernorm_epsilon", 1e-5},
          {"rotary_base", 1e6},
          {"normalization", "RMSNorm"},
          {"position_embedding_type", "rope"},
          {"qk_layernorm", false},
          {"moe_router_score_function", "softmax"},
          {"moe_router_pre_softmax", false},
          {"moe_router_enable_expert_bias", false},
          {"moe_router_num_groups", nullptr},
          {"moe_router_group_topk", nullptr},
          {"moe_router_topk_scaling_factor", nullptr},
          {"moe_shared_expert_intermediate_size", nullptr},
          {"moe_shared_expert_gate", false},
          {"moe_aux_loss_coeff", 0.01}};
}

nlohmann::json qwen3_model() {
  auto m = mixtral_model();
  m["qk_layernorm"] = true;
  m["moe_layer_freq"] = nlohmann::json::array({0, 1});
  m["ffn_hidden_size"] = 10;
  return m;
}

nlohmann::json deepseek_model() {
  auto m = mixtral_model();
  m["num_layers"] = 3;
  m["num_query_groups"] = 4;
  m["moe_layer_freq"] = nlohmann::json::array({0, 1, 1});
  m["ffn_hidden_size"] = 10;
  m["num_moe_experts"] = 4;
  m["multi_latent_attention"] = true;
  m["qk_layernorm"] = true;
  m["q_lora_rank"] = 5;
  m["kv_lora_rank"] = 3;
  m["qk_head_dim"] = 2;
  m["qk_pos_emb_head_dim"] = 2;
  m["v_head_dim"] = 3;
  m["layernorm_epsilon"] = 1e-6;
  m["moe_router_score_function"] = "sigmoid";
  m["moe_router_enable_expert_bias"] = true;
  m["moe_router_num_groups"] = 2;
  m["moe_router_group_topk"] = 1;
  m["moe_router_topk_scaling_factor"] = 2.5;
  m["moe_shared_expert_intermediate_size"] = 6;
  m["mtp_num_layers"] = 1;
  return m;
}

/// Every tensor of `model` under `a`, element j of the n-th tensor holding 1000 n + j.
hf::named_tensors numbered(nlohmann::json const& model, hf::architecture a) {
  hf::named_tensors out;
  for (auto const& [name, shape] : hf::model_tensor_shapes(model, a)) {
    std::int64_t count = 1;
    for (auto d : shape) count *= d;
    std::vector<float> values(static_cast<std::size_t>(count));
    for (std::int64_t j = 0; j < count; ++j)
      values[static_cast<std::size_t>(j)] = static_cast<float>(1000 * std::ssize(out) + j);
    out.emplace_back(name, hf::tensor{shape, std::move(values)});
  }
  return out;
}

std::map<std::string, hf::tensor> by_name(hf::named_tensors const& t) {
  return {t.begin(), t.end()};
}

/// Rows [first, first + count) of a [rows, cols] tensor.
std::vector<float> rows_of(hf::tensor const& t, std::int64_t first, std::int64_t count) {
  auto const cols = t.shape.size() == 2 ? t.shape[1] : 1;
  return {t.values.begin() + first * cols, t.values.begin() + (first + count) * cols};
}

void expect_refused(nlohmann::json const& model, hf::architecture a, std::string const& field) {
  try {
    (void)hf::config_of(model, a, mio::dtype::f32, std::nullopt, 64);
    ADD_FAILURE() << hf::architecture_name(a) << " took a model it should refuse for " << field;
  } catch (megamoe::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(HuggingFace, MixtralSplitsQkvByGroupAndFc1IntoGateAndUp) {
  auto const model = mixtral_model();
  auto const mine = numbered(model, hf::architecture::mixtral);
  auto const theirs = by_name(hf::to_hugging_face(model, hf::architecture::mixtral, mine));
  auto const ours = by_name(mine);
  // linear_qkv: 2 groups of (2 query heads + key + value) x 2 rows.
  auto const& qkv = ours.at("decoder.layers.1.self_attention.linear_qkv.weight");
  auto const& q = theirs.at("model.layers.1.self_attn.q_proj.weight");
  auto const& k = theirs.at("model.layers.1.self_attn.k_proj.weight");
  auto const& v = theirs.at("model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<std::int64_t>{8, 8}));
  EXPECT_EQ(k.shape, (std::vector<std::int64_t>{4, 8}));
  for (int g = 0; g < 2; ++g) {
    EXPECT_EQ(rows_of(q, 4 * g, 4), rows_of(qkv, 8 * g, 4)) << "group " << g;
    EXPECT_EQ(rows_of(k, 2 * g, 2), rows_of(qkv, 8 * g + 4, 2)) << "group " << g;
    EXPECT_EQ(rows_of(v, 2 * g, 2), rows_of(qkv, 8 * g + 6, 2)) << "group " << g;
  }
  auto const& fc1 = ours.at("decoder.layers.0.mlp.experts.linear_fc1.weight2");
  EXPECT_EQ(theirs.at("model.layers.0.block_sparse_moe.experts.2.w1.weight").values,
            rows_of(fc1, 0, 6));
  EXPECT_EQ(theirs.at("model.layers.0.block_sparse_moe.experts.2.w3.weight").values,
            rows_of(fc1, 6, 6));
  EXPECT_EQ(theirs.at("model.layers.0.block_sparse_moe.experts.2.w2.weight").values,
            ours.at("decoder.layers.0.mlp.experts.linear_fc2.weight2").values);
  EXPECT_EQ(theirs.at("lm_head.weight").values, ours.at("output_layer.weight").values);
  EXPECT_EQ(theirs.at("model.layers.1.post_attention_layernorm.weight").values,
            ours.at("decoder.layers.1.pre_mlp_layernorm.weight").values);
}

TEST(HuggingFace, EveryArchitectureRoundTripsBitForBit) {
  for (auto [model, arch] : {std::pair{mixtral_model(), hf::architecture::mixtral},
                             std::pair{qwen3_model(), hf::architecture::qwen3_moe},
                             std::pair{deepseek_model(), hf::architecture::deepseek_v3}}) {
    SCOPED_TRACE(hf::architecture_name(arch));
    auto const mine = numbered(model, arch);
    auto const config = hf::config_of(model, arch, mio::dtype::f32, 2, 64);
    auto const theirs = hf::to_hugging_face(model, arch, mine);
    auto const back = hf::from_hugging_face(nlohmann::json::parse(config.dump()), theirs).tensors;
    ASSERT_EQ(back.size(), mine.size());
    auto const original = by_name(mine);
    for (auto const& [name, t] : back) {
      ASSERT_TRUE(original.contains(name)) << name;
      EXPECT_EQ(t.shape, original.at(name).shape) << name;
      EXPECT_EQ(t.values, original.at(name).values) << name;
    }
    // config.json gives back every field of the model it records.
    auto const fields = hf::model_of(nlohmann::json::parse(config.dump()));
    for (auto const& [key, value] : fields.items()) {
      if (key == "moe_layer_freq")
        EXPECT_EQ(hf::moe_layer_pattern(value, model["num_layers"].get<int>()),
                  hf::moe_layer_pattern(model[key], model["num_layers"].get<int>()));
      else if (model.contains(key))
        EXPECT_EQ(value, model[key]) << key;
      else
        ADD_FAILURE() << key << " is not a field of the model";
    }
  }
}

TEST(HuggingFace, DeepSeekNamesItsLatentsRouterBiasAndPredictionLayer) {
  auto const model = deepseek_model();
  auto const theirs =
      by_name(hf::to_hugging_face(model, hf::architecture::deepseek_v3,
                                  numbered(model, hf::architecture::deepseek_v3)));
  for (char const* name :
       {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.self_attn.q_a_proj.weight",
        "model.layers.1.self_attn.q_a_layernorm.weight", "model.layers.1.self_attn.q_b_proj.weight",
        "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.1.self_attn.kv_a_layernorm.weight", "model.layers.1.self_attn.kv_b_proj.weight",
        "model.layers.2.mlp.gate.e_score_correction_bias", "model.layers.2.mlp.experts.3.up_proj.weight",
        "model.layers.2.mlp.shared_experts.down_proj.weight", "model.layers.3.eh_proj.weight",
        "model.layers.3.enorm.weight", "model.layers.3.hnorm.weight",
        "model.layers.3.shared_head.norm.weight", "model.layers.3.mlp.gate.weight"})
    EXPECT_TRUE(theirs.contains(name)) << name;
  EXPECT_EQ(theirs.at("model.layers.3.embed_tokens.weight").values,
            theirs.at("model.embed_tokens.weight").values);
  EXPECT_EQ(theirs.at("model.layers.3.shared_head.head.weight").values,
            theirs.at("lm_head.weight").values);
  auto const config = hf::config_of(model, hf::architecture::deepseek_v3, mio::dtype::bf16, 2, 64);
  EXPECT_EQ(config["first_k_dense_replace"], 1);
  EXPECT_EQ(config["n_shared_experts"], 1);
  EXPECT_EQ(config["n_group"], 2);
  EXPECT_EQ(config["topk_group"], 1);
  EXPECT_EQ(config["routed_scaling_factor"], 2.5);
  EXPECT_EQ(config["num_nextn_predict_layers"], 1);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_EQ(config["eos_token_id"], 2);
}

TEST(HuggingFace, ExportRefusesWhatTheArchitectureComputesDifferently) {
  using hf::architecture;
  auto with = [](nlohmann::json m, char const* key, nlohmann::json value) {
    m[key] = std::move(value);
    return m;
  };
  auto const mixtral = mixtral_model(), qwen3 = qwen3_model(), deepseek = deepseek_model();
  for (auto a : {architecture::mixtral, architecture::qwen3_moe}) {
    auto const base = a == architecture::mixtral ? mixtral : qwen3;
    expect_refused(with(base, "normalization", "LayerNorm"), a, "normalization");
    expect_refused(with(base, "activation", "gelu"), a, "activation");
    expect_refused(with(base, "add_bias_linear", true), a, "add_bias_linear");
    expect_refused(with(base, "moe_shared_expert_gate", true), a, "moe_shared_expert_gate");
    expect_refused(with(base, "num_moe_experts", 1), a, "num_moe_experts");
    expect_refused(with(base, "moe_router_score_function", "sigmoid"), a,
                   "moe_router_score_function");
    expect_refused(with(base, "moe_router_enable_expert_bias", true), a,
                   "moe_router_enable_expert_bias");
    expect_refused(with(base, "moe_router_num_groups", 2), a, "moe_router_num_groups");
    expect_refused(with(base, "moe_router_topk_scaling_factor", 2.0), a,
                   "moe_router_topk_scaling_factor");
    expect_refused(with(base, "moe_shared_expert_intermediate_size", 6), a,
                   "moe_shared_expert_intermediate_size");
    expect_refused(with(base, "mtp_num_layers", 1), a, "mtp_num_layers");
    expect_refused(deepseek, a, "moe_router_score_function");
  }
  expect_refused(qwen3, architecture::mixtral, "qk_layernorm");
  expect_refused(with(with(mixtral, "moe_layer_freq", nlohmann::json::array({1, 0})),
                      "ffn_hidden_size", 10),
                 architecture::mixtral, "moe_layer_freq");
  expect_refused(with(mixtral, "moe_router_pre_softmax", true), architecture::mixtral,
                 "moe_router_pre_softmax");
  expect_refused(mixtral, architecture::qwen3_moe, "qk_layernorm");
  expect_refused(with(qwen3, "ffn_hidden_size", 0), architecture::qwen3_moe, "ffn_hidden_size");
  expect_refused(qwen3, architecture::deepseek_v3, "multi_latent_attention");
  expect_refused(with(deepseek, "qk_layernorm", false), architecture::deepseek_v3, "qk_layernorm");
  expect_refused(with(deepseek, "layernorm_epsilon", 1e-5), architecture::deepseek_v3,
                 "layernorm_epsilon");
  expect_refused(with(deepseek, "moe_layer_freq", nlohmann::json::array({1, 0, 1})),
                 architecture::deepseek_v3, "moe_layer_freq");
  expect_refused(with(deepseek, "moe_shared_expert_intermediate_size", 4),
                 architecture::deepseek_v3, "moe_shared_expert_intermediate_size");
  expect_refused(with(deepseek, "moe_shared_expert_intermediate_size", nullptr),
                 architecture::deepseek_v3, "moe_shared_expert_intermediate_size");
  expect_refused(with(deepseek, "moe_router_score_function", "softmax"), architecture::deepseek_v3,
                 "moe_router_score_function");
  expect_refused(with(deepseek, "moe_router_enable_expert_bias", false), architecture::deepseek_v3,
                 "moe_router_enable_expert_bias");
  expect_refused(with(deepseek, "moe_router_group_topk", 2), architecture::deepseek_v3,
                 "moe_router_group_topk");
  // Training-only settings do not block an export; they go where the architecture has a field.
  auto const trained = hf::config_of(with(with(mixtral, "moe_expert_capacity_factor", 1.5),
                                          "moe_input_jitter_eps", 0.01),
                                     architecture::mixtral, mio::dtype::f32, std::nullopt, 64);
  EXPECT_EQ(trained["router_jitter_noise"], 0.01);
  EXPECT_EQ(trained["router_aux_loss_coef"], 0.01);
}

TEST(HuggingFace, ImportRefusesUnmatchedMissingAndMisshapenTensors) {
  auto const model = mixtral_model();
  auto const config =
      nlohmann::json::parse(hf::config_of(model, hf::architecture::mixtral, mio::dtype::f32, 2, 64).dump());
  auto const theirs =
      hf::to_hugging_face(model, hf::architecture::mixtral, numbered(model, hf::architecture::mixtral));
  auto fails_with = [&](nlohmann::json const& c, hf::named_tensors t, std::string const& text) {
    try {
      (void)hf::from_hugging_face(c, std::move(t));
      ADD_FAILURE() << "imported; expected an error with " << text;
    } catch (megamoe::input_error const& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  auto extra = theirs;
  extra.emplace_back("model.layers.0.block_sparse_moe.experts.3.w1.weight", extra.back().second);
  fails_with(config, extra, "model.layers.0.block_sparse_moe.experts.3.w1.weight is not a tensor");
  auto missing = theirs;
  std::erase_if(missing, [](auto const& t) { return t.first == "model.layers.1.self_attn.k_proj.weight"; });
  fails_with(config, missing, "the folder has no model.layers.1.self_attn.k_proj.weight");
  auto misshapen = theirs;
  for (auto& [name, t] : misshapen)
    if (name == "model.norm.weight") t.shape = {4, 2};
  fails_with(config, misshapen, "model.norm.weight is [4,2], config.json's [8]");
  auto twice = theirs;
  twice.push_back(twice.front());
  fails_with(config, twice, "holds model.embed_tokens.weight twice");
  auto other = config;
  other["architectures"] = {"LlamaForCausalLM"};
  other["model_type"] = "llama";
  fails_with(other, theirs, "is not one megamoe converts");
  for (auto [key, value] : {std::pair<char const*, nlohmann::json>{"hidden_act", "gelu"},
                            {"sliding_window", 4096},
                            {"rope_scaling", {{"type", "yarn"}}},
                            {"attention_bias", true},
                            {"head_dim", 4}}) {
    auto c = config;
    c[key] = value;
    fails_with(c, theirs, key);
  }
  // transformers 5 writes RoPE's base into rope_parameters.
  auto v5 = config;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  EXPECT_EQ(hf::model_of(v5)["rotary_base"], 5e5);
  v5["rope_parameters"]["rope_type"] = "yarn";
  fails_with(v5, theirs, "rope_parameters");
  // A tied model: the output layer from the embedding.
  auto tied_config = config;
  tied_config["tie_word_embeddings"] = true;
  auto tied = theirs;
  std::erase_if(tied, [](auto const& t) { return t.first == "lm_head.weight"; });
  auto const back = by_name(hf::from_hugging_face(tied_config, tied).tensors);
  EXPECT_EQ(back.at("output_layer.weight").values, back.at("embedding.word_embeddings.weight").values);
}

TEST(HuggingFace, DeepSeekImportRefusesWhatMegamoeComputesDifferently) {
  auto const model = deepseek_model();
  auto const config = nlohmann::json::parse(
      hf::config_of(model, hf::architecture::deepseek_v3, mio::dtype::f32, 2, 64).dump());
  for (auto [key, value] : {std::pair<char const*, nlohmann::json>{"rms_norm_eps", 1e-5},
                            {"rope_interleave", false},
                            {"scoring_func", "softmax"},
                            {"topk_method", "greedy"},
                            {"norm_topk_prob", false},
                            {"n_shared_experts", 0},
                            {"topk_group", 2}}) {
    auto c = config;
    c[key] = value;
    try {
      (void)hf::model_of(c);
      ADD_FAILURE() << key << " " << value.dump() << " imported";
    } catch (megamoe::input_error const& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  // An MTP copy of the embedding that differs from it.
  auto theirs = hf::to_hugging_face(model, hf::architecture::deepseek_v3,
                                    numbered(model, hf::architecture::deepseek_v3));
  for (auto& [name, t] : theirs)
    if (name == "model.layers.3.embed_tokens.weight") t.values[0] += 1.0f;
  EXPECT_THROW((void)hf::from_hugging_face(config, theirs), megamoe::input_error);
  // transformers saves no prediction layer: without any of its tensors the import leaves MTP out.
  std::erase_if(theirs, [](auto const& t) { return t.first.starts_with("model.layers.3."); });
  auto const without = hf::from_hugging_face(config, theirs);
  EXPECT_FALSE(without.model.contains("mtp_num_layers"));
  EXPECT_EQ(without.notes.size(), 1u);
  for (auto const& [name, t] : without.tensors) EXPECT_FALSE(name.starts_with("mtp.")) << name;
  // Some of them there: the rest are missing.
  auto some = hf::to_hugging_face(model, hf::architecture::deepseek_v3,
                                  numbered(model, hf::architecture::deepseek_v3));
  std::erase_if(some, [](auto const& t) { return t.first == "model.layers.3.enorm.weight"; });
  EXPECT_THROW((void)hf::from_hugging_face(config, some), megamoe::input_error);
}

TEST(HuggingFace, FoldersReadFromF32Bf16AndF16FilesWithAndWithoutIndex) {
  namespace fs = std::filesystem;
  auto const dir = fs::temp_directory_path() / "megamoe_hf_folder_test";
  fs::remove_all(dir);
  hf::named_tensors tensors{{"a", {{2, 2}, {1.0f, -2.0f, 0.5f, 3.0f}}},
                            {"b", {{3}, {0.25f, 1e-3f, -7.0f}}}};
  nlohmann::ordered_json const config = {{"model_type", "mixtral"}};
  // Two shards (one tensor each) with an index, as BF16: values a BF16 holds come back exactly.
  auto const files = hf::write_folder(dir, config, tensors, mio::dtype::bf16, 8);
  EXPECT_EQ(files.size(), 4u);  // two shards, the index, config.json
  auto f = hf::read_folder(dir);
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].second.values, tensors[0].second.values);
  EXPECT_EQ(f.tensors[1].second.values[0], 0.25f);
  EXPECT_EQ(f.tensors[1].second.values[1], megamoe::round_to_bf16(1e-3f));
  EXPECT_EQ(f.config["model_type"], "mixtral");
  EXPECT_THROW((void)hf::write_folder(dir, config, tensors, mio::dtype::f32, 8), megamoe::input_error)
      << "a folder that is not empty";
  fs::remove_all(dir);
  // F16 in one file without an index: 1, -2, 2^-24 (the smallest subnormal), infinity.
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "mixtral"})";
  std::vector<std::uint16_t> const half{0x3c00, 0xc000, 0x0001, 0x7c00};
  mio::write_safetensors(dir / "weights.safetensors",
                         std::vector<mio::tensor_bytes>{{"h", mio::dtype::f16, {4},
                                                         std::as_bytes(std::span(half))}});
  f = hf::read_folder(dir);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].second.values,
            (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24), INFINITY}));
  // A dtype megamoe does not import.
  std::vector<std::int32_t> const ints{1, 2};
  mio::write_safetensors(dir / "weights.safetensors",
                         std::vector<mio::tensor_bytes>{{"i", mio::dtype::i32, {2},
                                                         std::as_bytes(std::span(ints))}});
  EXPECT_THROW((void)hf::read_folder(dir), megamoe::input_error);
  fs::remove_all(dir);
}
