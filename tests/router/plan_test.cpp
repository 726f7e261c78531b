// SPDX-License-Identifier: Apache-2.0
// Routing plans (router/plan.hpp): every valid router setting has its plan among the run-time
// router's, `with_plan` runs exactly that plan's kernel, and a router whose plan is in its type
// refuses settings of another plan.
#include <megamoe/config/rules.hpp>
#include <megamoe/router/plan.hpp>
#include <megamoe/router/router.hpp>

#include <gtest/gtest.h>

#include <algorithm>

namespace mm = megamoe;
namespace mr = megamoe::router;

namespace {

TEST(RoutePlan, EveryValidSettingRunsItsOwnPlan) {
  int valid = 0;
  for (auto score :
       {mr::score_function::softmax_after_topk, mr::score_function::softmax_before_topk,
        mr::score_function::sigmoid, mr::score_function::sqrtsoftplus})
    for (bool sinkhorn : {false, true})
      for (bool groups : {false, true})
        for (bool bias : {false, true})
          for (int k : {1, 2, 4}) {
            mr::settings s;
            s.top_k = k;
            s.score = score;
            s.sinkhorn = sinkhorn;
            s.expert_bias = bias;
            if (groups) {
              s.num_groups = 4;
              s.group_top_k = k == 1 ? 1 : 2;
            }
            mm::config_values v;
            v.shape = {64, 64, 16, 0};
            v.router = s;
            if (!mm::rules::broken(v).empty()) continue;
            ++valid;
            auto const want = mr::plan_of(s);
            auto const& plans = mr::detail::runtime_plans;
            EXPECT_NE(std::find(plans.begin(), plans.end(), want), plans.end());
            mr::route_plan ran{};
            mr::with_plan(s, [&]<mr::route_plan P>() { ran = P; });
            EXPECT_EQ(ran, want);
            EXPECT_EQ(ran.sinkhorn, sinkhorn);
            EXPECT_EQ(ran.group_limit, groups && !sinkhorn);
            EXPECT_EQ(ran.normalize, k > 1 && (sinkhorn || !ran.softmax_family()));
          }
  EXPECT_GT(valid, 30);
}

TEST(RoutePlan, TheTypesPlanIsTheOnlyOneItTakes) {
  using policy = mr::aux_loss_free<4, mr::group_limit<4, 2>>;
  constexpr auto plan = mr::plan_of(policy::value, true);
  static_assert(plan.score == mr::score_function::sigmoid && plan.group_limit && plan.expert_bias &&
                plan.normalize && plan.capacity == mr::capacity_choice::off);
  static_assert(
      std::is_same_v<mr::router_of<policy>, mr::topk_router<float, float, mr::fixed_plan<plan>>>);
  EXPECT_NO_THROW(mr::make_router<policy>(16));
  auto other = policy::value;
  other.score = mr::score_function::sqrtsoftplus;
  EXPECT_THROW(mr::router_of<policy>(other, 16), mm::input_error);
  auto with_capacity = policy::value;
  with_capacity.capacity_factor = 1.5;
  EXPECT_THROW(mr::router_of<policy>(with_capacity, 16), mm::input_error);
  // The run-time router takes either.
  EXPECT_NO_THROW(mr::topk_router<float>(other, 16));
  EXPECT_NO_THROW(mr::topk_router<float>(with_capacity, 16));
}

}  // namespace
