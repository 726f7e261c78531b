// SPDX-License-Identifier: Apache-2.0
// megamoe/router/plan.hpp — the choices a router's per-token loops depend on, as a compile-time
// value, so that no loop over tokens branches on the configuration.
//
// A router fixed in the type (router::top_k<...>, router::aux_loss_free<...>) carries its plan as a
// template argument. The run-time router (router::runtime, from_megatron) picks its plan once per
// call among the plans the reference allows (`with_plan`: one switch, then a kernel templated on
// the plan). What a plan leaves out (the numbers: k, coefficients, the capacity factor) is read
// outside the per-token loops.
#pragma once

#include <megamoe/router/tags.hpp>

#include <boost/mp11/algorithm.hpp>

#include <array>
#include <cstddef>
#include <utility>

namespace megamoe::router {

/// Whether capacity is applied: fixed in the type (off / on), or decided per call (the run-time
/// router; capacity works per expert, outside the per-token loops).
enum class capacity_choice { off, on, per_call };

/// The structural choices of routing.
struct route_plan {
  score_function score = score_function::softmax_after_topk;
  bool sinkhorn = false;     // Sinkhorn selection (score unused: softmax for k > 1, else sigmoid)
  bool group_limit = false;  // group-limited top-k
  bool expert_bias = false;  // the aux-loss-free bias in the selection score
  bool normalize = false;    // sigmoid family: renormalise over the k selected (k > 1); Sinkhorn:
                             // softmax (k > 1) rather than sigmoid
  capacity_choice capacity = capacity_choice::per_call;

  /// Softmax scores (the aux losses' scores follow the same family).
  [[nodiscard]] constexpr bool softmax_family() const noexcept {
    return score == score_function::softmax_after_topk ||
           score == score_function::softmax_before_topk;
  }
  friend constexpr bool operator==(route_plan const&, route_plan const&) = default;
};

/// The plan of `s`; capacity per call, or fixed from `s` when `capacity_fixed`.
constexpr route_plan plan_of(settings const& s, bool capacity_fixed = false) {
  route_plan p;
  p.capacity = !capacity_fixed                 ? capacity_choice::per_call
               : s.capacity_factor.has_value() ? capacity_choice::on
                                               : capacity_choice::off;
  if (s.sinkhorn) {
    p.sinkhorn = true;
    p.normalize = s.top_k > 1;
    return p;
  }
  p.score = s.score;
  p.group_limit = s.num_groups != 0 || s.group_top_k != 0;
  bool const sigmoid_family =
      s.score == score_function::sigmoid || s.score == score_function::sqrtsoftplus;
  p.expert_bias = sigmoid_family && s.expert_bias;
  p.normalize = sigmoid_family && s.top_k > 1;
  return p;
}

namespace detail {
/// Every plan the run-time router may take (capacity per call): softmax after / before top-k with
/// or without group limits; sigmoid and sqrtsoftplus with or without group limits, expert bias and
/// renormalisation; Sinkhorn with softmax or sigmoid. Expert bias with softmax is R007.
constexpr auto runtime_plans = [] {
  std::array<route_plan, 22> plans{};
  std::size_t n = 0;
  for (auto score : {score_function::softmax_after_topk, score_function::softmax_before_topk})
    for (bool groups : {false, true}) {
      route_plan p;
      p.score = score;
      p.group_limit = groups;
      plans[n++] = p;
    }
  for (auto score : {score_function::sigmoid, score_function::sqrtsoftplus})
    for (bool groups : {false, true})
      for (bool bias : {false, true})
        for (bool normalize : {false, true}) {
          route_plan p;
          p.score = score;
          p.group_limit = groups;
          p.expert_bias = bias;
          p.normalize = normalize;
          plans[n++] = p;
        }
  for (bool normalize : {false, true}) {
    route_plan p;
    p.sinkhorn = true;
    p.normalize = normalize;
    plans[n++] = p;
  }
  return plans;
}();
}  // namespace detail

/// Calls `f.template operator()<P>()` with the plan of `s` (capacity per call): one switch per
/// call over the plans the reference allows.
template <class F>
decltype(auto) with_plan(settings const& s, F&& f) {
  constexpr auto& plans = detail::runtime_plans;
  route_plan const wanted = plan_of(s);
  std::size_t index = 0;
  while (index + 1 < plans.size() && !(plans[index] == wanted)) ++index;
  return boost::mp11::mp_with_index<plans.size()>(index, [&](auto i) -> decltype(auto) {
    return std::forward<F>(f).template operator()<plans[decltype(i)::value]>();
  });
}

}  // namespace megamoe::router
