// SPDX-License-Identifier: Apache-2.0
// Router policies and their options (router/tags.hpp) as plain values: the defaults of
// `router::settings` (the reference's), what each policy starts from (top_k: softmax after top-k;
// aux_loss_free: sigmoid with the expert bias), that every option writes its own fields and nothing
// else whatever the order, and the policies' names. tests/static/config_static.cpp checks the
// options together and the configuration around them.
#include <megamoe/router/tags.hpp>

#include <gtest/gtest.h>

#include <string_view>

namespace mr = megamoe::router;

namespace {

/// top_k<2>'s settings with one change.
template <class Change>
constexpr mr::settings top2_with(Change change) {
  mr::settings s;
  s.top_k = 2;
  change(s);
  return s;
}

// Every option against the one field it writes.
static_assert(mr::top_k<2, mr::softmax_before_topk>::value == top2_with([](mr::settings& s) {
                s.score = mr::score_function::softmax_before_topk;
              }));
static_assert(mr::top_k<2, mr::sigmoid>::value ==
              top2_with([](mr::settings& s) { s.score = mr::score_function::sigmoid; }));
static_assert(mr::top_k<2, mr::sqrtsoftplus>::value ==
              top2_with([](mr::settings& s) { s.score = mr::score_function::sqrtsoftplus; }));
static_assert(mr::top_k<2, mr::softmax_after_topk>::value == mr::top_k<2>::value);
static_assert(mr::top_k<2, mr::topk_scaling_factor<2.5>>::value ==
              top2_with([](mr::settings& s) { s.topk_scaling_factor = 2.5; }));
static_assert(mr::top_k<2, mr::group_limit<4, 2>>::value == top2_with([](mr::settings& s) {
                s.num_groups = 4;
                s.group_top_k = 2;
              }));
static_assert(mr::top_k<2, mr::aux_loss<1e-2>>::value ==
              top2_with([](mr::settings& s) { s.aux_loss_coeff = 1e-2; }));
static_assert(mr::top_k<2, mr::seq_aux_loss<1e-3>>::value ==
              top2_with([](mr::settings& s) { s.seq_aux_loss_coeff = 1e-3; }));
static_assert(mr::top_k<2, mr::global_aux_loss<1e-4>>::value ==
              top2_with([](mr::settings& s) { s.global_aux_loss_coeff = 1e-4; }));
static_assert(mr::top_k<2, mr::sinkhorn>::value ==
              top2_with([](mr::settings& s) { s.sinkhorn = true; }));
static_assert(mr::top_k<2, mr::z_loss<1e-3>>::value ==
              top2_with([](mr::settings& s) { s.z_loss_coeff = 1e-3; }));
static_assert(mr::top_k<2, mr::expert_bias<>>::value ==
              top2_with([](mr::settings& s) { s.expert_bias = true; }));
static_assert(mr::top_k<2, mr::expert_bias<0.01>>::value == top2_with([](mr::settings& s) {
                s.expert_bias = true;
                s.bias_update_rate = 0.01;
              }));
static_assert(mr::top_k<2, mr::capacity<1.25>>::value ==
              top2_with([](mr::settings& s) { s.capacity_factor = 1.25; }));
static_assert(mr::top_k<2, mr::capacity<0.5, mr::drop_position>>::value ==
              top2_with([](mr::settings& s) {
                s.capacity_factor = 0.5;
                s.token_drop_policy = mr::drop_policy::position;
              }));
static_assert(mr::top_k<2, mr::pad_to_capacity>::value ==
              top2_with([](mr::settings& s) { s.pad_to_capacity = true; }));
static_assert(mr::top_k<2, mr::pad_for_quantization<>>::value ==
              top2_with([](mr::settings& s) { s.pad_for_quantization = true; }));
static_assert(mr::top_k<2, mr::pad_for_quantization<32>>::value == top2_with([](mr::settings& s) {
                s.pad_for_quantization = true;
                s.quantization_multiple = 32;
              }));
static_assert(mr::top_k<2, mr::dtype<double>>::value ==
              top2_with([](mr::settings& s) { s.dtype = mr::logits_dtype::fp64; }));
static_assert(mr::top_k<2, mr::dtype<float>>::value == mr::top_k<2>::value);
static_assert(mr::top_k<2, mr::input_jitter<0.01>>::value ==
              top2_with([](mr::settings& s) { s.input_jitter_eps = 0.01; }));

// Any order, the same settings.
static_assert(mr::top_k<4, mr::z_loss<1e-3>, mr::sqrtsoftplus, mr::capacity<2.0>,
                        mr::group_limit<8, 4>>::value ==
              mr::top_k<4, mr::group_limit<8, 4>, mr::capacity<2.0>, mr::sqrtsoftplus,
                        mr::z_loss<1e-3>>::value);

TEST(RouterSettings, DefaultsAreTheReferences) {
  constexpr mr::settings s;
  EXPECT_EQ(s.top_k, 2);
  EXPECT_EQ(s.score, mr::score_function::softmax_after_topk);
  EXPECT_FALSE(s.topk_scaling_factor || s.aux_loss_coeff || s.seq_aux_loss_coeff ||
               s.global_aux_loss_coeff || s.z_loss_coeff || s.capacity_factor ||
               s.input_jitter_eps);
  EXPECT_EQ(s.num_groups, 0);
  EXPECT_EQ(s.group_top_k, 0);
  EXPECT_FALSE(s.sinkhorn || s.expert_bias || s.pad_to_capacity || s.pad_for_quantization);
  EXPECT_EQ(s.bias_update_rate, 1e-3);
  EXPECT_EQ(s.token_drop_policy, mr::drop_policy::probs);
  EXPECT_EQ(s.quantization_multiple, 0);
  EXPECT_EQ(s.dtype, mr::logits_dtype::fp32);
  // One field apart is not equal.
  mr::settings other = s;
  other.bias_update_rate = 2e-3;
  EXPECT_FALSE(other == s);
}

TEST(RouterPolicies, StartFromTheirOwnDefaults) {
  constexpr auto top = mr::top_k<3>::value;
  EXPECT_EQ(mr::top_k<3>::k, 3);
  EXPECT_EQ(top.top_k, 3);
  EXPECT_EQ(top.score, mr::score_function::softmax_after_topk);
  EXPECT_FALSE(top.expert_bias);
  mr::settings with_three;
  with_three.top_k = 3;
  EXPECT_TRUE(top == with_three);  // nothing else set

  constexpr auto bias_free = mr::aux_loss_free<8>::value;
  EXPECT_EQ(mr::aux_loss_free<8>::k, 8);
  EXPECT_EQ(bias_free.score, mr::score_function::sigmoid);
  EXPECT_TRUE(bias_free.expert_bias);
  EXPECT_EQ(bias_free.bias_update_rate, 1e-3);
  // Its options override the defaults it starts from.
  constexpr auto sqrt_bias = mr::aux_loss_free<4, mr::sqrtsoftplus, mr::expert_bias<5e-3>>::value;
  EXPECT_EQ(sqrt_bias.score, mr::score_function::sqrtsoftplus);
  EXPECT_TRUE(sqrt_bias.expert_bias);
  EXPECT_EQ(sqrt_bias.bias_update_rate, 5e-3);

  EXPECT_EQ(mr::top_k<2>::name, std::string_view("top_k"));
  EXPECT_EQ(mr::aux_loss_free<2>::name, std::string_view("aux_loss_free"));
  EXPECT_EQ(mr::runtime::name, std::string_view("runtime"));
  EXPECT_TRUE(mr::runtime::is_runtime);
  EXPECT_EQ(mr::drop_probs::value, mr::drop_policy::probs);
  EXPECT_EQ(mr::drop_position::value, mr::drop_policy::position);
}

}  // namespace
