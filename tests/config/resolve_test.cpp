// SPDX-License-Identifier: Apache-2.0
// Start-up completion of configuration types: dynamic values, run-time routers, and the same rule
// ids.
#include <megamoe/config/config.hpp>
#include <megamoe/config/resolve.hpp>

#include "support/rule_of.hpp"

#include <gtest/gtest.h>

namespace mm = megamoe;

namespace {
using megamoe::testing::rule_of;
using open_config =
    mm::make_config<mm::shape<mm::hidden<mm::dynamic>, mm::ffn<128>, mm::experts<64>>,
                    mm::router::aux_loss_free<8, mm::router::group_limit<8, 4>>,
                    mm::parallel::mapping<mm::parallel::ep<mm::dynamic>>>;
static_assert(mm::rules::check<open_config>());

}  // namespace

TEST(Resolve, FillsWhatTheTypeLeftOpen) {
  auto const v = mm::resolve<open_config>({.hidden = 256, .ep = 8, .world_size = 16});
  EXPECT_EQ(v.shape.hidden, 256);
  EXPECT_EQ(v.shape.experts, 64);
  EXPECT_EQ(v.parallel.ep, 8);
  EXPECT_EQ(v.parallel.etp, 1);  // ETP follows TP
  EXPECT_EQ(v.world_size, 16);
  EXPECT_TRUE(mm::rules::broken(v).empty());
}

TEST(Resolve, StartUpValuesGoThroughTheSameRules) {
  EXPECT_EQ(rule_of([] { mm::resolve<open_config>({.hidden = 256, .ep = 6, .world_size = 6}); }),
            3);
  EXPECT_EQ(rule_of([] { mm::resolve<open_config>({.hidden = 256, .ep = 8, .world_size = 12}); }),
            18);
  EXPECT_EQ(rule_of([] { mm::resolve<open_config>({.hidden = 256, .world_size = 8}); }), 27);
  EXPECT_EQ(rule_of([] { mm::resolve<open_config>({.hidden = 0, .ep = 8, .world_size = 8}); }), 1);
  EXPECT_EQ(rule_of([] { mm::resolve<open_config>({.hidden = 8, .ep = 8, .world_size = -8}); }),
            17);
}

TEST(Resolve, AGivenValueMustAgreeWithTheType) {
  EXPECT_THROW(mm::resolve<open_config>({.hidden = 256, .ffn = 512, .ep = 8, .world_size = 8}),
               mm::input_error);
  EXPECT_NO_THROW(mm::resolve<open_config>({.hidden = 256, .ffn = 128, .ep = 8, .world_size = 8}));
}

TEST(Resolve, EtpFollowsTpUnlessGiven) {
  using cfg =
      mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<64>, mm::experts<8>>,
                      mm::parallel::mapping<mm::parallel::tp<mm::dynamic>, mm::parallel::ep<2>>>;
  EXPECT_EQ(mm::values_of<cfg>().parallel.etp, mm::dynamic);
  EXPECT_EQ(mm::resolve<cfg>({.tp = 2, .world_size = 8}).parallel.etp, 2);
  EXPECT_EQ(mm::resolve<cfg>({.tp = 2, .etp = 1, .world_size = 8}).parallel.etp, 1);
}

TEST(Resolve, RuntimeRouterIsCheckedWithTheRouterRules) {
  using cfg =
      mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<64>, mm::experts<8>>, mm::router::runtime>;
  mm::router::settings s;
  s.top_k = 4;
  EXPECT_NO_THROW(mm::resolve<cfg>({.router = s, .world_size = 1}));
  EXPECT_EQ(rule_of([] { mm::resolve<cfg>({.world_size = 1}); }), 27);
  s.top_k = 9;
  EXPECT_EQ(rule_of([&] { mm::resolve<cfg>({.router = s, .world_size = 1}); }), 2);
  s.top_k = 1;
  EXPECT_EQ(rule_of([&] { mm::resolve<cfg>({.router = s, .world_size = 1}); }), 8);
  s.score = mm::router::score_function::softmax_before_topk;
  EXPECT_NO_THROW(mm::resolve<cfg>({.router = s, .world_size = 1}));
  s.expert_bias = true;
  EXPECT_EQ(rule_of([&] { mm::resolve<cfg>({.router = s, .world_size = 1}); }), 7);
}

TEST(Resolve, AStaticRouterRejectsDifferentStartUpSettings) {
  using cfg =
      mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<64>, mm::experts<8>>, mm::router::top_k<2>>;
  mm::router::settings s;
  EXPECT_NO_THROW(mm::resolve<cfg>({.router = s, .world_size = 1}));
  s.top_k = 4;
  EXPECT_THROW(mm::resolve<cfg>({.router = s, .world_size = 1}), mm::input_error);
}

TEST(Resolve, ModelSizesLeftOpenAreGivenAtStartUpWithTheSameRules) {
  namespace md = mm::model;
  using cfg = mm::make_config<
      mm::shape<mm::hidden<64>, mm::ffn<64>, mm::experts<8>>,
      md::decoder<md::heads<mm::dynamic>, md::vocabulary<256>, md::moe_layer_freq<mm::dynamic>>>;
  static_assert(mm::rules::check<cfg>());
  EXPECT_EQ(mm::values_of<cfg>().model.query_groups, mm::dynamic);
  auto const v = mm::resolve<cfg>(
      {.world_size = 1, .layers = 4, .heads = 8, .dense_ffn = 96, .moe_layer_freq = 2});
  EXPECT_EQ(v.model.layers, 4);
  EXPECT_EQ(v.model.heads, 8);
  EXPECT_EQ(v.model.query_groups, 8);  // follows heads
  EXPECT_EQ(v.model.vocabulary, 256);
  EXPECT_TRUE(v.model.is_moe(0) && !v.model.is_moe(1) && v.model.is_moe(2));
  EXPECT_TRUE(mm::rules::model_resolved(v.model));
  EXPECT_EQ(rule_of([] { mm::resolve<cfg>({.world_size = 1, .layers = 4, .heads = 6}); }), 40);
  // A dense layer's width not given stays open (the transformer names it, R027); 0 breaks R044.
  auto const open_width =
      mm::resolve<cfg>({.world_size = 1, .layers = 4, .heads = 8, .moe_layer_freq = 2});
  EXPECT_EQ(open_width.model.dense_ffn, mm::dynamic);
  EXPECT_FALSE(mm::rules::model_resolved(open_width.model));
  EXPECT_EQ(rule_of([] {
              mm::resolve<cfg>(
                  {.world_size = 1, .layers = 4, .heads = 8, .dense_ffn = 0, .moe_layer_freq = 2});
            }),
            44);
  // Every layer MoE: the dense width is 0 without being given.
  EXPECT_EQ(mm::resolve<cfg>({.world_size = 1, .layers = 4, .heads = 8, .moe_layer_freq = 1})
                .model.dense_ffn,
            0);
  // Grouped-query attention: 2 query groups of 8 heads.
  EXPECT_EQ(mm::resolve<cfg>({.world_size = 1, .heads = 8, .query_groups = 2}).model.query_groups,
            2);
  // A size the type fixes may be given only with the same value.
  EXPECT_THROW(mm::resolve<cfg>({.world_size = 1, .vocabulary = 512}), mm::input_error);
  EXPECT_NO_THROW(mm::resolve<cfg>({.world_size = 1, .vocabulary = 256}));
  using listed = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<64>, mm::experts<8>>,
                                 md::decoder<md::layers<3>, md::moe_layer_pattern<0, 1, 1>>>;
  EXPECT_THROW(mm::resolve<listed>({.world_size = 1, .moe_layer_freq = 2}), mm::input_error);
  EXPECT_FALSE(mm::values_of<listed>().model.is_moe(0));
  EXPECT_TRUE(mm::values_of<listed>().model.is_moe(2));
}
