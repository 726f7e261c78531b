// SPDX-License-Identifier: Apache-2.0
// Start-up rules: each value rule, fed values that break it and only it, reports exactly its id;
// and the catalogue that both the static_asserts and the start-up check print from is consistent.
#include <megamoe/config/config.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/policy/error.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace mm = megamoe;

namespace {

/// A valid configuration to break one field at a time.
mm::config_values valid_values() {
  mm::config_values v;
  v.shape = {64, 128, 8, 0};
  v.world_size = 8;
  return v;
}

struct breaking_case {
  int rule;
  char const* what;
  std::function<void(mm::config_values&)> change;
};

std::vector<breaking_case> const& breaking_cases() {
  using mm::router::score_function;
  static std::vector<breaking_case> const cases{
      {1, "missing experts", [](auto& v) { v.shape.experts = 0; }},
      {1, "negative hidden", [](auto& v) { v.shape.hidden = -5; }},
      {1, "negative shared_ffn", [](auto& v) { v.shape.shared_ffn = -2; }},
      {2, "k above experts", [](auto& v) { v.router->top_k = 9; }},
      {2, "k zero", [](auto& v) { v.router->top_k = 0; }},
      {3, "ep 3 of 8 experts",
       [](auto& v) {
         v.parallel.ep = 3;
         v.world_size = 3;
       }},
      {4, "3 groups of 8 experts",
       [](auto& v) {
         v.router->num_groups = 3;
         v.router->group_top_k = 1;
       }},
      {4, "group top-k without groups", [](auto& v) { v.router->group_top_k = 1; }},
      {5, "group top-k above groups",
       [](auto& v) {
         v.router->top_k = 8;
         v.router->num_groups = 4;
         v.router->group_top_k = 5;
       }},
      {5, "group top-k zero", [](auto& v) { v.router->num_groups = 4; }},
      {6, "k below group top-k",
       [](auto& v) {
         v.router->num_groups = 4;
         v.router->group_top_k = 3;
       }},
      {7, "bias with softmax", [](auto& v) { v.router->expert_bias = true; }},
      {8, "k 1 softmax after top-k", [](auto& v) { v.router->top_k = 1; }},
      {9, "capacity with sinkhorn",
       [](auto& v) {
         v.router->sinkhorn = true;
         v.router->capacity_factor = 1.0;
       }},
      {10, "pad without capacity", [](auto& v) { v.router->pad_to_capacity = true; }},
      {11, "router padding with fp32", [](auto& v) { v.router->pad_for_quantization = true; }},
      {11, "multiple 32 with blockwise fp8",
       [](auto& v) {
         v.precision = mm::precision::fp8_blockwise::value;
         v.router->pad_for_quantization = true;
         v.router->quantization_multiple = 32;
       }},
      {12, "router padding with all_gather",
       [](auto& v) {
         v.precision = mm::precision::mxfp8::value;
         v.router->pad_for_quantization = true;
         v.dispatch = mm::dispatch::dispatcher::all_gather;
       }},
      {13, "hierarchical at ep 1",
       [](auto& v) { v.dispatch = mm::dispatch::dispatcher::hierarchical; }},
      {14, "expert bias at etp 2",
       [](auto& v) {
         v.expert.bias = true;
         v.parallel.etp = 2;
       }},
      {15, "shared gate without shared expert",
       [](auto& v) { v.expert.shared_expert_gate = true; }},
      {16, "cp zero", [](auto& v) { v.parallel.cp = 0; }},
      {16, "ep negative", [](auto& v) { v.parallel.ep = -3; }},
      {17, "world 6 with tp 4",
       [](auto& v) {
         v.parallel.tp = 4;
         v.parallel.etp = 1;
         v.world_size = 6;
       }},
      {17, "world 8 with tp 3", [](auto& v) { v.parallel.tp = 3; }},
      {18, "world 8 with ep 8 etp 2",
       [](auto& v) {
         v.parallel.ep = 8;
         v.parallel.etp = 2;
       }},
      {19, "local dispatch with ep 2",
       [](auto& v) {
         v.dispatch = mm::dispatch::dispatcher::local;
         v.parallel.ep = 2;
       }},
      {25, "sinkhorn with aux loss",
       [](auto& v) {
         v.router->sinkhorn = true;
         v.router->aux_loss_coeff = 1e-2;
       }},
      {26, "capacity factor zero", [](auto& v) { v.router->capacity_factor = 0.0; }},
      {26, "negative z-loss", [](auto& v) { v.router->z_loss_coeff = -1e-3; }},
      {26, "jitter 1", [](auto& v) { v.router->input_jitter_eps = 1.0; }},
      {26, "bias rate zero", [](auto& v) { v.router->bias_update_rate = 0.0; }},
      {30, "quantized activations with bf16",
       [](auto& v) {
         v.precision = mm::precision::bf16::value;
         v.memory.quantized_activations = true;
       }},
      {30, "quantized weights with fp32", [](auto& v) { v.memory.quantized_weights = true; }},
      {31, "k 3 from one group of 2 experts",
       [](auto& v) {
         v.router->top_k = 3;
         v.router->num_groups = 4;
         v.router->group_top_k = 1;
       }},
      {32, "hierarchical at etp 2",
       [](auto& v) {
         v.dispatch = mm::dispatch::dispatcher::hierarchical;
         v.parallel.ep = 2;
         v.parallel.etp = 2;
       }},
      {33, "overlap at etp 2",
       [](auto& v) {
         v.dispatch = mm::dispatch::dispatcher::all_to_all;
         v.overlap_chunks = 2;
         v.parallel.ep = 2;
         v.parallel.etp = 2;
       }},
      {55, "fp8 wire under mxfp8",
       [](auto& v) {
         v.dispatch = mm::dispatch::dispatcher::all_to_all;
         v.fp8_wire = true;
         v.precision = mm::precision::mxfp8::value;
       }},
      {55, "fp8 wire under mxfp8 at etp 2, wgrad from rowwise",
       [](auto& v) {
         v.dispatch = mm::dispatch::dispatcher::all_to_all;
         v.fp8_wire = true;
         v.precision = mm::precision::wgrad_from_rowwise<mm::precision::mxfp8>::value;
         v.parallel.ep = 2;
         v.parallel.etp = 2;
       }},
      {56, "wgrad from rowwise under nvfp4",
       [](auto& v) {
         v.precision = mm::precision::nvfp4::value;
         v.precision.wgrad_from_rowwise = true;
       }},
      {55, "fp8 wire at etp 2",
       [](auto& v) {
         v.dispatch = mm::dispatch::dispatcher::all_to_all;
         v.fp8_wire = true;
         v.precision = mm::precision::fp8_tensorwise<mm::precision::current>::value;
         v.parallel.ep = 2;
         v.parallel.etp = 2;
       }},
      {37, "amx with fp32", [](auto& v) { v.expert.backend = mm::expert::gemm_backend::amx; }},
      {37, "amx with fp64",
       [](auto& v) {
         v.expert.backend = mm::expert::gemm_backend::amx;
         v.precision = mm::precision::fp64::value;
       }},
      {37, "avx512_bf16 with fp32",
       [](auto& v) { v.expert.backend = mm::expert::gemm_backend::avx512_bf16; }},
      {38, "ffn 128 over etp 3",
       [](auto& v) {
         v.parallel.etp = 3;
         v.world_size = 3;
       }},
      {39, "no layers", [](auto& v) { v.model.layers = 0; }},
      {39, "negative dense ffn", [](auto& v) { v.model.dense_ffn = -4; }},
      {39, "epsilon zero", [](auto& v) { v.model.norm_epsilon = 0.0; }},
      {39, "vocabulary padded to multiples of 0", [](auto& v) { v.model.vocab_multiple = 0; }},
      {40, "6 heads of hidden 64",
       [](auto& v) {
         v.model.heads = 6;
         v.model.query_groups = 6;
       }},
      {41, "head size 1",
       [](auto& v) {
         v.model.heads = 64;
         v.model.query_groups = 64;
       }},
      {42, "3 query groups of 8 heads",
       [](auto& v) {
         v.model.heads = 8;
         v.model.query_groups = 3;
       }},
      {44, "every other layer dense without a dense width",
       [](auto& v) {
         v.model.layers = 4;
         v.model.moe_layers.every = 2;
         v.model.dense_ffn = 0;
       }},
      {44, "a 0 in the pattern without a dense width",
       [](auto& v) {
         v.model.layers = 2;
         v.model.moe_layers = {0, 2, {1, 0}};
         v.model.dense_ffn = 0;
       }},
      {45, "moe_layer_freq zero", [](auto& v) { v.model.moe_layers.every = 0; }},
      {45, "pattern of 3 for 4 layers",
       [](auto& v) {
         v.model.layers = 4;
         v.model.moe_layers = {0, 3, {1, 1, 1}};
       }},
      {45, "pattern entry 2",
       [](auto& v) {
         v.model.layers = 2;
         v.model.moe_layers = {0, 2, {1, 2}};
       }},
      {47, "TP 2 of one query group",
       [](auto& v) {
         v.parallel.tp = 2;
         v.model.heads = 4;
         v.model.query_groups = 1;
       }},
      {48, "TP 2 of a dense FFN of 5",
       [](auto& v) {
         v.parallel.tp = 2;
         v.model.layers = 4;
         v.model.moe_layers.every = 2;
         v.model.dense_ffn = 5;
       }},
      {57, "MLA with an odd positional part",
       [](auto& v) {
         v.model.mla = {0, 4, 8, 3, 8};
       }},
      {57, "MLA sizes without a latent rank",
       [](auto& v) {
         v.model.mla = {8, 0, 8, 4, 8};
       }},
      {58, "MTP with negative depths", [](auto& v) { v.model.mtp_num_layers = -1; }},
      {58, "MTP with a negative loss scale",
       [](auto& v) {
         v.model.mtp_num_layers = 1;
         v.model.mtp_loss_scaling_factor = -0.1;
       }},
      {57, "MLA with 2 query groups of 4 heads",
       [](auto& v) {
         v.model.heads = 4;
         v.model.query_groups = 2;
         v.model.mla = {8, 4, 8, 4, 8};
       }},
      {27, "runtime router not given", [](auto& v) { v.router.reset(); }},
      {27, "dynamic hidden", [](auto& v) { v.shape.hidden = mm::dynamic; }},
      {27, "dynamic ep", [](auto& v) { v.parallel.ep = mm::dynamic; }},
  };
  return cases;
}

}  // namespace

TEST(RuleCatalog, IdsAreSequentialAndMessagesCarryTheirId) {
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < mm::rule_catalog.size(); ++i) {
    auto const& r = mm::rule_catalog[i];
    EXPECT_EQ(r.id, static_cast<int>(i) + 1);
    char prefix[32];
    std::snprintf(prefix, sizeof prefix, "megamoe[R%03d]: ", r.id);
    EXPECT_EQ(r.message.substr(0, 15), prefix) << r.message;
    EXPECT_TRUE(names.insert(r.name).second) << "duplicate name " << r.name;
  }
  for (auto const& r : mm::rules::value_rules)
    EXPECT_EQ(mm::rule(r.which).id, static_cast<int>(r.which));
}

TEST(ValueRules, TheBaseConfigurationIsValid) {
  EXPECT_TRUE(mm::rules::broken(valid_values()).empty());
  EXPECT_NO_THROW(mm::rules::require_valid(valid_values()));
}

// MLA sizes its heads itself: 6 heads of hidden 64 (R040 without MLA) and q_lora_rank 0 are
// valid.
TEST(ValueRules, LatentAttentionHeadsNeedNotDivideTheHiddenSize) {
  auto v = valid_values();
  v.model.heads = 6;
  v.model.query_groups = 6;
  EXPECT_EQ(mm::rules::broken(v), std::vector<int>{40});
  v.model.mla = {0, 4, 8, 4, 8};
  EXPECT_TRUE(mm::rules::broken(v).empty());
}

// R033 holds the all-to-all's pieces alone: shared_memory_overlap pulls rows of any ETP index.
TEST(ValueRules, SharedMemoryOverlapAtEtpTwoIsValid) {
  auto v = valid_values();
  v.dispatch = mm::dispatch::dispatcher::shared_memory;
  v.overlap_chunks = 2;
  v.parallel.ep = 2;
  v.parallel.etp = 2;
  EXPECT_TRUE(mm::rules::broken(v).empty());
  v.dispatch = mm::dispatch::dispatcher::all_to_all;
  EXPECT_EQ(mm::rules::broken(v), std::vector<int>{33});
}

// R055: FP8 codes on the wire under either per-tensor FP8 recipe, or MXFP8 and blockwise FP8 with
// the wgrad copies made from the rowwise codes, at ETP 1.
TEST(ValueRules, Fp8WireUnderPerTensorFp8IsValid) {
  namespace mp = mm::precision;
  auto v = valid_values();
  v.dispatch = mm::dispatch::dispatcher::all_to_all;
  v.fp8_wire = true;
  v.parallel.ep = 2;
  v.parallel.etp = 1;
  for (auto const& recipe :
       {mp::fp8_tensorwise<mp::delayed>::value, mp::fp8_tensorwise<mp::current>::value}) {
    v.precision = recipe;
    EXPECT_TRUE(mm::rules::broken(v).empty());
  }
  for (auto const& recipe : {mp::wgrad_from_rowwise<mp::mxfp8>::value,
                             mp::wgrad_from_rowwise<mp::fp8_blockwise>::value}) {
    v.precision = recipe;
    EXPECT_TRUE(mm::rules::broken(v).empty());
  }
  v.precision = mp::fp8_blockwise::value;
  EXPECT_EQ(mm::rules::broken(v), std::vector<int>{55});
  v.precision = mp::nvfp4::value;
  v.precision.wgrad_from_rowwise = true;  // R056, and no codes made at the source either
  EXPECT_EQ(mm::rules::broken(v), (std::vector<int>{55, 56}));
}

TEST(ValueRules, EachBrokenValueReportsExactlyItsRule) {
  std::set<int> covered;
  for (auto const& c : breaking_cases()) {
    auto v = valid_values();
    c.change(v);
    EXPECT_EQ(mm::rules::broken(v), std::vector<int>{c.rule}) << c.what;
    try {
      mm::rules::require_valid(v);
      ADD_FAILURE() << c.what << ": no error";
    } catch (mm::config_error const& e) {
      EXPECT_EQ(e.rule_id(), c.rule) << c.what;
      EXPECT_EQ(std::string(e.what()).rfind(std::string(mm::rule(c.rule).message), 0), 0u);
    }
    covered.insert(c.rule);
  }
  for (auto const& r : mm::rules::value_rules)
    EXPECT_TRUE(covered.count(static_cast<int>(r.which)))
        << "no case breaks R" << static_cast<int>(r.which);
}

TEST(ValueRules, SeveralBrokenRulesAreAllNamed) {
  auto v = valid_values();
  v.parallel.ep = 3;
  v.router->expert_bias = true;
  v.world_size = 3;
  EXPECT_EQ(mm::rules::broken(v), (std::vector<int>{3, 7}));
  try {
    mm::rules::require_valid(v);
    ADD_FAILURE() << "no error";
  } catch (mm::config_error const& e) {
    EXPECT_EQ(e.rule_id(), 3);
    EXPECT_NE(std::string(e.what()).find("megamoe[R007]"), std::string::npos) << e.what();
  }
}

TEST(ValueRules, DynamicValuesPassUntilResolved) {
  // The compile-time check sees `dynamic` and lets the rule wait for start-up.
  auto v = valid_values();
  v.shape.experts = mm::dynamic;
  v.parallel.ep = mm::dynamic;
  v.router->top_k = 64;
  EXPECT_TRUE(mm::rules::top_k_within_experts(v));
  EXPECT_TRUE(mm::rules::ep_divides_experts(v));
  EXPECT_EQ(mm::rules::broken(v), std::vector<int>{27});
  v.shape.experts = 32;
  v.parallel.ep = 8;
  EXPECT_EQ(mm::rules::broken(v), std::vector<int>{2});
}

// The compile-time check and the start-up check read the same predicates: a configuration type's
// values pass at start-up exactly when the type passes `check`.
TEST(ValueRules, ValuesOfCheckedTypesPassAtStartUp) {
  using cfg1 = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<8>>>;
  using cfg2 = mm::make_config<
      mm::shape<mm::hidden<64>, mm::ffn<128>, mm::experts<16>, mm::shared_ffn<64>>,
      mm::router::aux_loss_free<4, mm::router::group_limit<4, 2>,
                                mm::router::pad_for_quantization<>>,
      mm::expert::mlp<mm::expert::shared_expert_gate>, mm::precision::nvfp4,
      mm::parallel::mapping<mm::parallel::ep<4>, mm::parallel::tp<2>, mm::parallel::etp<1>>,
      mm::dispatch::hierarchical<>>;
  static_assert(mm::rules::check<cfg1>() && mm::rules::check<cfg2>());
  auto v1 = mm::values_of<cfg1>();
  auto v2 = mm::values_of<cfg2>();
  v1.world_size = 1;
  v2.world_size = 16;
  EXPECT_TRUE(mm::rules::broken(v1).empty());
  EXPECT_TRUE(mm::rules::broken(v2).empty());
  v2.world_size = 10;  // 10 is a multiple of tp=2 but not of etp*ep = 4
  EXPECT_EQ(mm::rules::broken(v2), std::vector<int>{18});
}

// Code outside config/ names rules by `rules::id`; each name is the catalogue's name of its number.
TEST(RuleCatalog, NamedIdsAreTheCatalogueEntries) {
  EXPECT_EQ(mm::rule(mm::rules::id::shape_sizes_valid).name, "shape_sizes_valid");
  EXPECT_EQ(mm::rule(mm::rules::id::etp_divides_ffn).id, 38);
  EXPECT_EQ(mm::rule(mm::rules::id::moe_layer_pattern_valid).name, "moe_layer_pattern_valid");
  EXPECT_EQ(static_cast<std::size_t>(mm::rules::id::mtp_valid), mm::rule_catalog.size());
  mm::config_error const e(mm::rules::id::pipeline_stages_divide_layers, "PP 3");
  EXPECT_EQ(e.rule_id(), 36);
  EXPECT_EQ(e.which(), mm::rules::id::pipeline_stages_divide_layers);
  EXPECT_EQ(std::string(e.what()).rfind("megamoe[R036]: ", 0), 0u);
}
