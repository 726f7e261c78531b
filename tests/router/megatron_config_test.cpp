// SPDX-License-Identifier: Apache-2.0
// Reading a router from Megatron-Core fields (router/megatron_config.hpp): each field lands in its
// `router::settings` member (score function and pre-softmax, group limits and their deprecated
// device form, capacity, padding, dtype, jitter, the sizes), combinations the rules refuse carry
// their rule id, and malformed, unknown or inconsistent fields are input errors.
#include <megamoe/core/error.hpp>
#include <megamoe/policy/error.hpp>
#include <megamoe/router/megatron_config.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <utility>

namespace mm = megamoe;
namespace mr = megamoe::router;

namespace {

/// The rule id of the config_error from_megatron throws, -1 for an input_error, 0 for none.
int error_of(nlohmann::json const& j) {
  try {
    mr::from_megatron(j);
  } catch (mm::config_error const& e) {
    return e.rule_id();
  } catch (mm::input_error const&) {
    return -1;
  }
  return 0;
}

/// Eight experts, top-2: the smallest valid file.
nlohmann::json minimal() {
  return {{"num_moe_experts", 8}, {"moe_router_topk", 2}};
}

/// `j` with `key` set to `value`.
nlohmann::json with(nlohmann::json j, char const* key, nlohmann::json value) {
  j[key] = std::move(value);
  return j;
}

TEST(MegatronConfig, ReadsFieldsAndRefusesWhatCannotWork) {
  nlohmann::json j = {{"num_moe_experts", 8},
                      {"moe_router_topk", 2},
                      {"moe_router_load_balancing_type", {"aux_loss", "global_aux_loss"}},
                      {"moe_aux_loss_coeff", {1e-2, 0.0}},
                      {"moe_z_loss_coeff", 1e-3},
                      {"moe_expert_capacity_factor", -1.0}};
  auto const c = mr::from_megatron(j);
  EXPECT_EQ(c.router.aux_loss_coeff, 1e-2);
  EXPECT_EQ(c.router.global_aux_loss_coeff, 0.0);
  EXPECT_FALSE(c.router.capacity_factor);
  EXPECT_EQ(c.router.z_loss_coeff, 1e-3);

  auto rule_of = [](nlohmann::json const& bad) {
    try {
      mr::from_megatron(bad);
    } catch (mm::config_error const& e) {
      return e.rule_id();
    } catch (mm::input_error const&) {
      return -1;
    }
    return 0;
  };
  auto changed = [&](char const* key, nlohmann::json value) {
    auto copy = j;
    copy[key] = std::move(value);
    return copy;
  };
  EXPECT_EQ(rule_of(changed("moe_router_enable_expert_bias", true)), 7);
  EXPECT_EQ(rule_of(changed("moe_router_topk", 1)), 8);
  EXPECT_EQ(rule_of(changed("moe_router_topk", 9)), 2);
  EXPECT_EQ(rule_of(changed("moe_aux_loss_coeff", 1e-2)), -1);  // a list needs a list
  EXPECT_EQ(rule_of(changed("moe_router_load_balancing_type", "quantile_balancing")), -1);
  EXPECT_EQ(rule_of(changed("moe_unknown_field", 1)), -1);
  EXPECT_EQ(rule_of(changed("moe_router_dtype", "bf16")), -1);
  auto sinkhorn_with_aux = changed("moe_router_load_balancing_type", "sinkhorn");
  sinkhorn_with_aux["moe_aux_loss_coeff"] = 1e-2;
  EXPECT_EQ(rule_of(sinkhorn_with_aux), 25);
}

TEST(MegatronConfig, DefaultsAreTheReferencesDefaults) {
  auto const c = mr::from_megatron({{"num_moe_experts", 8}});
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.hidden_size, 0);
  EXPECT_EQ(c.router.top_k, 2);
  EXPECT_EQ(c.router.score, mr::score_function::softmax_after_topk);
  // moe_router_load_balancing_type defaults to "aux_loss" with coefficient 0: present, but off.
  ASSERT_TRUE(c.router.aux_loss_coeff.has_value());
  EXPECT_EQ(*c.router.aux_loss_coeff, 0.0);
  EXPECT_FALSE(mr::any_aux_loss(c.router));
  EXPECT_FALSE(c.router.seq_aux_loss_coeff || c.router.global_aux_loss_coeff);
  EXPECT_FALSE(c.router.z_loss_coeff || c.router.capacity_factor || c.router.input_jitter_eps ||
               c.router.topk_scaling_factor);
  EXPECT_EQ(c.router.num_groups, 0);
  EXPECT_EQ(c.router.group_top_k, 0);
  EXPECT_FALSE(c.router.expert_bias || c.router.sinkhorn || c.router.pad_to_capacity ||
               c.router.pad_for_quantization);
  EXPECT_EQ(c.router.bias_update_rate, 1e-3);
  EXPECT_EQ(c.router.token_drop_policy, mr::drop_policy::probs);
  EXPECT_EQ(c.router.dtype, mr::logits_dtype::fp32);
  EXPECT_FALSE(c.seq_length || c.micro_batch_size || c.num_tokens || c.num_microbatches ||
               c.expert_capacity);
}

TEST(MegatronConfig, ScoreFunctionsAndPreSoftmax) {
  auto score_of = [](nlohmann::json j) { return mr::from_megatron(j).router.score; };
  EXPECT_EQ(score_of(with(minimal(), "moe_router_score_function", "softmax")),
            mr::score_function::softmax_after_topk);
  EXPECT_EQ(score_of(with(with(minimal(), "moe_router_score_function", "softmax"),
                          "moe_router_pre_softmax", true)),
            mr::score_function::softmax_before_topk);
  EXPECT_EQ(score_of(with(minimal(), "moe_router_score_function", "sigmoid")),
            mr::score_function::sigmoid);
  EXPECT_EQ(score_of(with(minimal(), "moe_router_score_function", "sqrtsoftplus")),
            mr::score_function::sqrtsoftplus);
  EXPECT_EQ(error_of(with(minimal(), "moe_router_score_function", "tanh")), -1);
  EXPECT_EQ(error_of(with(minimal(), "moe_router_pre_softmax", 1)), -1);  // must be a boolean
}

TEST(MegatronConfig, GroupLimitsScalingBiasAndDtype) {
  auto sigmoid = with(minimal(), "moe_router_score_function", "sigmoid");
  auto const grouped = mr::from_megatron(
      with(with(sigmoid, "moe_router_num_groups", 4), "moe_router_group_topk", 2));
  EXPECT_EQ(grouped.router.num_groups, 4);
  EXPECT_EQ(grouped.router.group_top_k, 2);
  // The deprecated device limit: groups = EP, group top-k = the device count.
  auto const devices = mr::from_megatron(
      with(with(sigmoid, "moe_router_topk_limited_devices", 2), "expert_model_parallel_size", 4));
  EXPECT_EQ(devices.router.num_groups, 4);
  EXPECT_EQ(devices.router.group_top_k, 2);
  // Groups without a group top-k are R005 (the missing count reads as -1).
  EXPECT_EQ(error_of(with(sigmoid, "moe_router_num_groups", 4)), 5);

  // A scaling factor of 0 (or null) means none, as the reference's truthiness test.
  EXPECT_FALSE(mr::from_megatron(with(sigmoid, "moe_router_topk_scaling_factor", 0.0))
                   .router.topk_scaling_factor);
  EXPECT_EQ(mr::from_megatron(with(sigmoid, "moe_router_topk_scaling_factor", 2.5))
                .router.topk_scaling_factor,
            2.5);

  auto const bias = mr::from_megatron(with(with(sigmoid, "moe_router_enable_expert_bias", true),
                                           "moe_router_bias_update_rate", 0.01));
  EXPECT_TRUE(bias.router.expert_bias);
  EXPECT_EQ(bias.router.bias_update_rate, 0.01);

  EXPECT_EQ(mr::from_megatron(with(minimal(), "moe_router_dtype", "fp64")).router.dtype,
            mr::logits_dtype::fp64);
  EXPECT_EQ(mr::from_megatron(with(minimal(), "moe_router_dtype", nullptr)).router.dtype,
            mr::logits_dtype::fp32);
  EXPECT_EQ(
      mr::from_megatron(with(minimal(), "moe_input_jitter_eps", 0.01)).router.input_jitter_eps,
      0.01);
  EXPECT_EQ(mr::from_megatron(with(minimal(), "moe_z_loss_coeff", 1e-3)).router.z_loss_coeff, 1e-3);
}

TEST(MegatronConfig, CapacityDroppingAndPadding) {
  auto const none = mr::from_megatron(with(minimal(), "moe_expert_capacity_factor", -1.0));
  EXPECT_FALSE(none.router.capacity_factor);  // negative means dropless
  auto capacity = with(minimal(), "moe_expert_capacity_factor", 1.25);
  auto const probs = mr::from_megatron(capacity);
  EXPECT_EQ(probs.router.capacity_factor, 1.25);
  EXPECT_EQ(probs.router.token_drop_policy, mr::drop_policy::probs);
  auto const position = mr::from_megatron(with(with(capacity, "moe_token_drop_policy", "position"),
                                               "moe_pad_expert_input_to_capacity", true));
  EXPECT_EQ(position.router.token_drop_policy, mr::drop_policy::position);
  EXPECT_TRUE(position.router.pad_to_capacity);
  EXPECT_EQ(error_of(with(capacity, "moe_token_drop_policy", "random")), -1);
  // Padding without capacity is R010.
  EXPECT_EQ(error_of(with(minimal(), "moe_pad_expert_input_to_capacity", true)), 10);

  // Either name of router-side padding for quantization turns it on.
  EXPECT_TRUE(mr::from_megatron(with(minimal(), "moe_router_padding_for_quantization", true))
                  .router.pad_for_quantization);
  EXPECT_TRUE(mr::from_megatron(with(minimal(), "moe_router_padding_for_fp8", true))
                  .router.pad_for_quantization);
  EXPECT_FALSE(mr::from_megatron(with(minimal(), "moe_router_padding_for_fp8", false))
                   .router.pad_for_quantization);
}

TEST(MegatronConfig, SizesAreReadAndMustAgree) {
  auto sizes = minimal();
  sizes["hidden_size"] = 64;
  sizes["seq_length"] = 4;
  sizes["micro_batch_size"] = 2;
  sizes["num_tokens"] = 8;
  sizes["num_microbatches"] = 3;
  auto const c = mr::from_megatron(sizes);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.seq_length, 4);
  EXPECT_EQ(c.micro_batch_size, 2);
  EXPECT_EQ(c.num_tokens, 8);
  EXPECT_EQ(c.num_microbatches, 3);
  EXPECT_EQ(error_of(with(sizes, "num_tokens", 9)), -1);  // not seq_length * micro_batch_size

  // expert_capacity must be ceil(T*k/E * factor) = ceil(8 * 2 / 8 * 1.25) = 3.
  EXPECT_EQ(error_of(with(sizes, "expert_capacity", 3)), -1);  // no capacity factor
  auto capacity = with(sizes, "moe_expert_capacity_factor", 1.25);
  EXPECT_EQ(mr::from_megatron(with(capacity, "expert_capacity", 3)).expert_capacity, 3);
  EXPECT_EQ(error_of(with(capacity, "expert_capacity", 4)), -1);
}

TEST(MegatronConfig, MalformedFieldsAreInputErrors) {
  EXPECT_EQ(error_of(nlohmann::json::array({1, 2})), -1);            // not an object
  EXPECT_EQ(error_of({{"moe_router_topk", 2}}), -1);                 // no num_moe_experts
  EXPECT_EQ(error_of(with(minimal(), "moe_router_topk", 2.5)), -1);  // not an integer
  EXPECT_EQ(error_of(with(minimal(), "moe_z_loss_coeff", "big")), -1);
  EXPECT_EQ(error_of(with(minimal(), "moe_router_score_function", 3)), -1);
  EXPECT_EQ(error_of(with(minimal(), "moe_router_load_balancing_type", 3)), -1);
  // A type named twice, a list holding sinkhorn, a list of the wrong length.
  EXPECT_EQ(error_of(with(with(minimal(), "moe_router_load_balancing_type",
                               nlohmann::json::array({"aux_loss", "aux_loss"})),
                          "moe_aux_loss_coeff", nlohmann::json::array({1e-2, 1e-2}))),
            -1);
  EXPECT_EQ(error_of(with(with(minimal(), "moe_router_load_balancing_type",
                               nlohmann::json::array({"sinkhorn", "aux_loss"})),
                          "moe_aux_loss_coeff", nlohmann::json::array({0.0, 1e-2}))),
            -1);
  EXPECT_EQ(error_of(with(with(minimal(), "moe_router_load_balancing_type",
                               nlohmann::json::array({"aux_loss", "seq_aux_loss"})),
                          "moe_aux_loss_coeff", nlohmann::json::array({1e-2}))),
            -1);
  // "none" turns every loss off; "sinkhorn" alone turns Sinkhorn on.
  auto const plain = mr::from_megatron(with(minimal(), "moe_router_load_balancing_type", "none"));
  EXPECT_FALSE(plain.router.aux_loss_coeff || plain.router.sinkhorn);
  EXPECT_TRUE(mr::from_megatron(with(minimal(), "moe_router_load_balancing_type", "sinkhorn"))
                  .router.sinkhorn);
  auto const seq =
      mr::from_megatron(with(with(minimal(), "moe_router_load_balancing_type", "seq_aux_loss"),
                             "moe_aux_loss_coeff", 1e-3));
  EXPECT_EQ(seq.router.seq_aux_loss_coeff, 1e-3);
  EXPECT_FALSE(seq.router.aux_loss_coeff);
}

}  // namespace
