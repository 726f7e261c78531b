// SPDX-License-Identifier: Apache-2.0
// describe(): every choice, defaults included and marked, under the reference's field names.
#include <megamoe/config/config.hpp>
#include <megamoe/config/describe.hpp>
#include <megamoe/config/resolve.hpp>

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace mm = megamoe;
using json = nlohmann::ordered_json;

namespace {
using small_shape = mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>;

int count_lines_with(std::string const& text, std::string const& needle) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
  return n;
}
}  // namespace

TEST(Describe, EverySlotAndFieldIsPresentAndDefaultsAreListed) {
  auto const d = mm::describe<mm::make_config<small_shape>>();
  std::vector<std::string> slots;
  int fields = 0, shape_fields = 0;
  for (auto const& [slot, value] : d.json.items()) {
    if (slot == "defaults") continue;
    slots.push_back(slot);
    fields += static_cast<int>(value.size());
    if (slot == "shape") shape_fields = static_cast<int>(value.size());
    EXPECT_TRUE(value.contains("policy")) << slot;
  }
  EXPECT_EQ(slots, (std::vector<std::string>{"shape", "router", "dispatch", "expert", "precision",
                                             "parallel", "memory", "model"}));
  // Only the shape was given, so every other field is a default; the text marks the same ones.
  EXPECT_EQ(static_cast<int>(d.json["defaults"].size()), fields - shape_fields);
  EXPECT_EQ(count_lines_with(d.text, "(default)"), fields - shape_fields);
  EXPECT_EQ(count_lines_with(d.text, " = "), fields);
  EXPECT_EQ(d.json["router"]["moe_router_topk"], 2);
  EXPECT_EQ(d.json["router"]["moe_router_score_function"], "softmax");
  EXPECT_EQ(d.json["router"]["moe_router_load_balancing_type"], "none");
  EXPECT_EQ(d.json["dispatch"]["moe_token_dispatcher_type"], "local");
  EXPECT_EQ(d.json["precision"]["recipe"], "fp32");
  EXPECT_EQ(d.json["shape"]["num_moe_experts"], 8);
}

TEST(Describe, RouterFieldsUseReferenceNames) {
  using cfg = mm::make_config<
      small_shape,
      mm::router::top_k<4, mm::router::softmax_before_topk, mm::router::topk_scaling_factor<2.5>,
                        mm::router::aux_loss<1e-2>, mm::router::z_loss<1e-3>,
                        mm::router::capacity<1.25, mm::router::drop_position>,
                        mm::router::pad_to_capacity, mm::router::dtype<double>>>;
  auto const r = mm::describe<cfg>().json["router"];
  EXPECT_EQ(r["policy"], "top_k");
  EXPECT_EQ(r["moe_router_topk"], 4);
  EXPECT_EQ(r["moe_router_score_function"], "softmax");
  EXPECT_EQ(r["moe_router_pre_softmax"], true);
  EXPECT_EQ(r["moe_router_topk_scaling_factor"], 2.5);
  EXPECT_EQ(r["moe_router_load_balancing_type"], "aux_loss");
  EXPECT_EQ(r["moe_aux_loss_coeff"], 1e-2);
  EXPECT_EQ(r["moe_z_loss_coeff"], 1e-3);
  EXPECT_EQ(r["moe_expert_capacity_factor"], 1.25);
  EXPECT_EQ(r["moe_token_drop_policy"], "position");
  EXPECT_EQ(r["moe_pad_expert_input_to_capacity"], true);
  EXPECT_EQ(r["moe_router_dtype"], "fp64");
  EXPECT_TRUE(r["moe_router_num_groups"].is_null());
}

TEST(Describe, LossListsAndSinkhorn) {
  using list = mm::make_config<
      small_shape, mm::router::top_k<2, mm::router::global_aux_loss<3e-3>,
                                     mm::router::aux_loss<1e-2>, mm::router::seq_aux_loss<2e-3>>>;
  auto const r = mm::describe<list>().json["router"];
  EXPECT_EQ(r["moe_router_load_balancing_type"],
            json({"aux_loss", "seq_aux_loss", "global_aux_loss"}));
  EXPECT_EQ(r["moe_aux_loss_coeff"], json({1e-2, 2e-3, 3e-3}));
  using sink = mm::make_config<small_shape, mm::router::top_k<1, mm::router::sinkhorn>>;
  EXPECT_EQ(mm::describe<sink>().json["router"]["moe_router_load_balancing_type"], "sinkhorn");
}

TEST(Describe, AuxLossFreeGroupsAndBias) {
  using cfg = mm::make_config<
      mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<32>>,
      mm::router::aux_loss_free<8, mm::router::group_limit<8, 4>, mm::router::expert_bias<2e-3>>>;
  auto const r = mm::describe<cfg>().json["router"];
  EXPECT_EQ(r["policy"], "aux_loss_free");
  EXPECT_EQ(r["moe_router_score_function"], "sigmoid");
  EXPECT_EQ(r["moe_router_enable_expert_bias"], true);
  EXPECT_EQ(r["moe_router_bias_update_rate"], 2e-3);
  EXPECT_EQ(r["moe_router_num_groups"], 8);
  EXPECT_EQ(r["moe_router_group_topk"], 4);
}

TEST(Describe, DispatcherNamesFollowTheReference) {
  auto dispatcher = [](auto cfg) {
    return mm::describe<decltype(cfg)>().json["dispatch"]["moe_token_dispatcher_type"];
  };
  using ep2 = mm::parallel::mapping<mm::parallel::ep<2>>;
  EXPECT_EQ(dispatcher(mm::make_config<small_shape, ep2, mm::dispatch::all_gather>{}), "allgather");
  EXPECT_EQ(dispatcher(mm::make_config<small_shape, ep2, mm::dispatch::all_to_all>{}), "alltoall");
  EXPECT_EQ(dispatcher(mm::make_config<small_shape, ep2>{}), "alltoall");
  EXPECT_EQ(dispatcher(mm::make_config<small_shape>{}), "local");
  EXPECT_EQ(
      dispatcher(
          mm::make_config<small_shape, mm::parallel::mapping<mm::parallel::ep<mm::dynamic>>>{}),
      "decided at start-up");
  EXPECT_EQ(dispatcher(mm::make_config<small_shape, ep2, mm::dispatch::hierarchical<>>{}),
            "hierarchical");
  // The inside-node exchange is named only when it is the shared window.
  using shared_node = mm::dispatch::hierarchical<mm::dispatch::shared_memory>;
  auto const shared =
      mm::describe<mm::make_config<small_shape, ep2, shared_node>>().json["dispatch"];
  EXPECT_EQ(shared["moe_token_dispatcher_type"], "hierarchical");
  EXPECT_EQ(shared["intra_node"], "shared_memory");
  using mpi_node = mm::make_config<small_shape, ep2, mm::dispatch::hierarchical<>>;
  EXPECT_FALSE(mm::describe<mpi_node>().json["dispatch"].contains("intra_node"));
  // FP8 codes on the forward wire, under the reference's name.
  using fp8_current = mm::precision::fp8_tensorwise<mm::precision::current>;
  auto const wire =
      mm::describe<mm::make_config<small_shape, ep2, mm::dispatch::fp8_wire<>, fp8_current>>()
          .json["dispatch"];
  EXPECT_EQ(wire["moe_token_dispatcher_type"], "alltoall");
  EXPECT_EQ(wire["moe_dispatch_fwd_dtype"], "fp8");
  EXPECT_FALSE(mm::describe<mpi_node>().json["dispatch"].contains("moe_dispatch_fwd_dtype"));
}

TEST(Describe, PrecisionRecipes) {
  auto p = [](auto recipe) {
    return mm::describe<mm::make_config<small_shape, decltype(recipe)>>().json["precision"];
  };
  EXPECT_EQ(p(mm::precision::bf16{})["bf16"], true);
  auto const delayed = p(mm::precision::fp8_tensorwise<mm::precision::delayed>{});
  EXPECT_EQ(delayed["fp8"], "hybrid");
  EXPECT_EQ(delayed["fp8_recipe"], "delayed");
  EXPECT_EQ(delayed["fp8_amax_history_len"], 1);
  EXPECT_EQ(delayed["fp8_amax_compute_algo"], "most_recent");
  EXPECT_EQ(delayed["fp8_margin"], 0);
  EXPECT_EQ(p(mm::precision::fp8_tensorwise<mm::precision::current>{})["fp8_recipe"], "tensorwise");
  EXPECT_EQ(p(mm::precision::fp8_blockwise{})["quantization_padding_multiple"], 16);
  EXPECT_EQ(p(mm::precision::mxfp8{})["quantization_padding_multiple"], 32);
  EXPECT_FALSE(p(mm::precision::mxfp8{}).contains("wgrad_from_rowwise"));
  auto const requantized = p(mm::precision::wgrad_from_rowwise<mm::precision::mxfp8>{});
  EXPECT_EQ(requantized["policy"], "wgrad_from_rowwise<mxfp8>");
  EXPECT_EQ(requantized["fp8_recipe"], "mxfp8");
  EXPECT_EQ(requantized["wgrad_from_rowwise"], true);
  auto const fp4 = p(mm::precision::nvfp4{});
  EXPECT_EQ(fp4["fp4_recipe"], "nvfp4");
  EXPECT_EQ(fp4["quantization_padding_multiple"], 128);
  EXPECT_TRUE(fp4["fp8"].is_null());
  EXPECT_EQ(p(mm::precision::fp64{})["params_dtype"], "fp64");
}

TEST(Describe, StartUpValuesSayWhatIsLeftOpen) {
  using cfg = mm::make_config<mm::shape<mm::hidden<mm::dynamic>, mm::ffn<128>, mm::experts<8>>,
                              mm::router::runtime, mm::memory::recompute<mm::memory::moe_act>>;
  auto const d = mm::describe<cfg>().json;
  EXPECT_EQ(d["shape"]["hidden_size"], "dynamic");
  EXPECT_EQ(d["router"]["settings"], "read at start-up");
  EXPECT_EQ(d["memory"]["recompute_granularity"], "selective");
  EXPECT_EQ(d["memory"]["recompute_modules"], json({"moe_act"}));
  EXPECT_EQ(d["parallel"]["data_parallel_size"], "from the world size");
  EXPECT_EQ(d["parallel"]["cp_comm_type"], "p2p");  // the reference's default
  using gathered = mm::make_config<
      mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>,
      mm::parallel::mapping<mm::parallel::cp<2>,
                            mm::parallel::cp_comm<mm::parallel::cp_comm_type::all_gather>>>;
  EXPECT_EQ(mm::describe<gathered>().json["parallel"]["cp_comm_type"], "all_gather");
}

// A run-time router given the settings of a static router describes exactly as that router does.
TEST(Describe, RuntimeRouterDescribesAsTheStaticOne) {
  using fixed = mm::router::top_k<4, mm::router::sigmoid, mm::router::expert_bias<>,
                                  mm::router::seq_aux_loss<1e-3>>;
  using static_cfg = mm::make_config<small_shape, fixed>;
  using runtime_cfg = mm::make_config<small_shape, mm::router::runtime>;
  auto const from_type = mm::resolve<static_cfg>({.world_size = 1});
  auto const from_startup = mm::resolve<runtime_cfg>({.router = fixed::value, .world_size = 1});
  auto a = mm::describe(from_type).json;
  auto b = mm::describe(from_startup).json;
  EXPECT_EQ(b["router"]["policy"], "runtime");
  a["router"].erase("policy");
  b["router"].erase("policy");
  a["defaults"] = b["defaults"] = nullptr;
  EXPECT_EQ(a, b);
}

TEST(Describe, TheModelSlotUsesReferenceNames) {
  namespace md = mm::model;
  using cfg =
      mm::make_config<small_shape,
                      md::decoder<md::layers<6>, md::heads<8>, md::vocabulary<512>,
                                  md::dense_ffn<256>, md::moe_layer_freq<3>, md::rope_base<5e5>>>;
  auto const m = mm::describe<cfg>().json["model"];
  EXPECT_EQ(m["policy"], "decoder");
  EXPECT_EQ(m["num_layers"], 6);
  EXPECT_EQ(m["num_attention_heads"], 8);
  EXPECT_EQ(m["num_query_groups"], 8);
  EXPECT_EQ(m["kv_channels"], 8);
  EXPECT_EQ(m["ffn_hidden_size"], 256);
  EXPECT_EQ(m["moe_layer_freq"], 3);
  EXPECT_EQ(m["vocab_size"], 512);
  EXPECT_EQ(m["rotary_base"], 5e5);
  EXPECT_EQ(m["qk_layernorm"], false);
  EXPECT_EQ(m["layernorm_epsilon"], 1e-5);
  using listed =
      mm::make_config<small_shape,
                      md::decoder<md::layers<3>, md::heads<mm::dynamic>, md::dense_ffn<96>,
                                  md::moe_layer_pattern<1, 0, 1>, md::qk_layernorm<>>>;
  auto const l = mm::describe<listed>().json["model"];
  EXPECT_EQ(l["moe_layer_freq"], json::array({1, 0, 1}));
  EXPECT_EQ(l["qk_layernorm"], true);
  EXPECT_EQ(l["num_attention_heads"], "dynamic");
  EXPECT_EQ(l["num_query_groups"], "dynamic");
  EXPECT_EQ(l["vocab_size"], "dynamic");
  EXPECT_FALSE(m.contains("multi_latent_attention"));  // MLA's keys only when it is chosen
  EXPECT_FALSE(m.contains("q_lora_rank"));
  using latent =
      mm::make_config<small_shape, md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<64>,
                                               md::multi_latent_attention<24, 16, 12, 8, 10>>>;
  auto const a = mm::describe<latent>().json["model"];
  EXPECT_EQ(a["multi_latent_attention"], true);
  EXPECT_EQ(a["q_lora_rank"], 24);
  EXPECT_EQ(a["kv_lora_rank"], 16);
  EXPECT_EQ(a["qk_head_dim"], 12);
  EXPECT_EQ(a["qk_pos_emb_head_dim"], 8);
  EXPECT_EQ(a["v_head_dim"], 10);
  EXPECT_FALSE(a.contains("mtp_num_layers"));  // MTP's keys only when it is chosen
  using predicting =
      mm::make_config<small_shape, md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<64>,
                                               md::multi_token_prediction<3, 0.25>>>;
  auto const p = mm::describe<predicting>().json["model"];
  EXPECT_EQ(p["mtp_num_layers"], 3);
  EXPECT_EQ(p["mtp_loss_scaling_factor"], 0.25);
}

// The flat form holds every field of every slot once, at the top level, as the reference's flat
// TransformerConfig does: no two slots share a field name.
TEST(Describe, TheFlatFormHoldsEveryFieldOnce) {
  namespace md = mm::model;
  using cfg = mm::make_config<small_shape, mm::precision::mxfp8,
                              mm::router::top_k<2, mm::router::pad_for_quantization<>>,
                              md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<256>>>;
  auto const d = mm::describe(mm::resolve<cfg>({.world_size = 4}));
  std::size_t fields = 0;
  for (auto const& [slot, value] : d.json.items()) {
    if (slot == "defaults") continue;
    fields += value.size() - 1;  // all but "policy"
    for (auto const& [field, v] : value.items())
      if (field != "policy") {
        EXPECT_EQ(d.flat[field], v) << slot << "." << field;
      }
    EXPECT_EQ(d.flat["policies"][slot], value["policy"]);
  }
  EXPECT_EQ(d.flat.size(), fields + 2);  // + policies, defaults
  EXPECT_EQ(d.flat["defaults"], d.json["defaults"]);
  for (char const* key :
       {"num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
        "moe_ffn_hidden_size", "num_moe_experts", "moe_router_topk", "moe_layer_freq", "vocab_size",
        "tensor_model_parallel_size", "context_parallel_size", "pipeline_model_parallel_size",
        "expert_model_parallel_size", "expert_tensor_parallel_size", "cp_comm_type"})
    EXPECT_TRUE(d.flat.contains(key)) << key;
  EXPECT_EQ(d.flat["quantization_padding_multiple"], 32);
  EXPECT_EQ(d.flat["moe_router_padding_multiple"], "recipe");
  EXPECT_EQ(d.flat["data_parallel_size"], 4);
}
