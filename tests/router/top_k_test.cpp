// SPDX-License-Identifier: Apache-2.0
// Selecting experts (router/top_k.hpp): top-k over a row against a full sort with ties to the lower
// index, group-limited top-k against the plain statement of tests/reference/router_reference.hpp
// (and one case worked by hand), and the top-k routing of each score function under its plan:
// indices and probs against the spec's formulas, the backward against central differences in
// double with entries dropped by capacity contributing nothing.
#include <megamoe/core/tensor.hpp>
#include <megamoe/router/plan.hpp>
#include <megamoe/router/top_k.hpp>

#include "support/routing_inputs.hpp"

#include "reference/router_reference.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mr = megamoe::router;
namespace mk = megamoe::router::kernels;
namespace ref = megamoe::reference;

namespace {

using megamoe::testing::separated_logits;

/// Values from a set of five, so that ties are common; every seventh is -inf (a masked expert).
std::vector<double> tied_values(int n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 4);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = 0.25 * pick(rng);
  for (std::size_t i = 3; i < v.size(); i += 7) v[i] = -std::numeric_limits<double>::infinity();
  return v;
}

TEST(TopK, MatchesAFullSortWithTiesToTheLowerIndex) {
  for (std::uint32_t seed = 0; seed < 60; ++seed) {
    int const n = 1 + static_cast<int>(seed % 17);
    auto const values = tied_values(n, seed);
    std::vector<float> const as_float(values.begin(), values.end());
    for (int k = 1; k <= n; ++k) {
      std::vector<int> out(static_cast<std::size_t>(k), -1), out_float(out);
      mk::top_k(std::span<double const>(values), k, out.data());
      mk::top_k(std::span<float const>(as_float), k, out_float.data());
      auto const want = ref::largest(values, k);
      EXPECT_EQ(out, want) << "n " << n << " k " << k << " seed " << seed;
      EXPECT_EQ(out_float, want) << "n " << n << " k " << k << " seed " << seed;
    }
  }
  // By hand: the equal 2s keep index order, the 5 comes first.
  std::vector<double> const row{2.0, 1.0, 5.0, 2.0, 2.0};
  std::vector<int> out(3);
  mk::top_k(std::span<double const>(row), 3, out.data());
  EXPECT_EQ(out, (std::vector<int>{2, 0, 3}));
}

/// group_limited_top_k on one row with the scratch sizes its comment asks for.
template <class T>
std::vector<int> group_limited(std::vector<T> const& values, int k, int groups, int group_top_k) {
  std::size_t const n = values.size();
  std::vector<int> out(static_cast<std::size_t>(k), -1);
  std::vector<T> masked(n), group_scores(static_cast<std::size_t>(groups));
  std::vector<int> scratch(
      std::max(n / static_cast<std::size_t>(groups), static_cast<std::size_t>(groups)));
  mk::group_limited_top_k(std::span<T const>(values), k, groups, group_top_k, out.data(),
                          masked.data(), group_scores.data(), scratch.data());
  return out;
}

TEST(TopK, GroupLimitedSelectionMatchesThePlainStatement) {
  struct limits {
    int experts, groups, group_top_k, k;
  };
  for (limits const l : {limits{8, 4, 2, 2}, limits{16, 4, 2, 4}, limits{12, 3, 1, 3},
                         limits{32, 8, 4, 8}, limits{6, 2, 2, 6}}) {
    mr::settings s;
    s.top_k = l.k;
    s.num_groups = l.groups;
    s.group_top_k = l.group_top_k;
    for (std::uint32_t seed = 0; seed < 40; ++seed) {
      auto values = tied_values(l.experts, 1000 + seed);
      for (auto& v : values) v = std::isinf(v) ? 0.125 : v;  // every group has k finite scores
      EXPECT_EQ(group_limited(values, l.k, l.groups, l.group_top_k), ref::choose(values, s))
          << l.experts << " experts in " << l.groups << " groups, seed " << seed;
    }
  }
  // By hand: 8 experts in groups of 2, k = 4 from 2 groups, so each group scores its best 2.
  // Group sums 0.875, 1.0, 0.875, 0.875: group 1 and (ties to the lower index) group 0 stay, and
  // the plain top-4 (0, 4, 2, 3) loses expert 4.
  std::vector<double> const row{0.875, 0.0, 0.5, 0.5, 0.75, 0.125, 0.4375, 0.4375};
  EXPECT_EQ(group_limited(row, 4, 4, 2), (std::vector<int>{0, 2, 3, 1}));
}

// --- topk_selection under each plan --------------------------------------------------------------

using matrix = mm::row_matrix<double>;

struct selection_case {
  char const* name;
  mr::settings settings;
  int experts = 8;
};

std::vector<selection_case> selection_cases() {
  using sf = mr::score_function;
  auto make = [](int k, sf score) {
    mr::settings s;
    s.top_k = k;
    s.score = score;
    return s;
  };
  std::vector<selection_case> cases;
  cases.push_back({"softmax_after_topk_k2", make(2, sf::softmax_after_topk)});
  auto s = make(3, sf::softmax_before_topk);
  s.topk_scaling_factor = 2.0;
  cases.push_back({"softmax_before_topk_k3_scaled", s});
  s = make(2, sf::softmax_after_topk);
  s.num_groups = 4;
  s.group_top_k = 2;
  cases.push_back({"softmax_after_topk_groups", s});
  cases.push_back({"sigmoid_k1", make(1, sf::sigmoid)});
  s = make(3, sf::sigmoid);
  s.expert_bias = true;
  s.topk_scaling_factor = 2.5;
  cases.push_back({"sigmoid_k3_bias_scaled", s});
  s = make(2, sf::sqrtsoftplus);
  s.num_groups = 4;
  s.group_top_k = 2;
  cases.push_back({"sqrtsoftplus_groups", s});
  s = make(4, sf::sigmoid);
  s.num_groups = 4;
  s.group_top_k = 2;
  s.expert_bias = true;
  cases.push_back({"sigmoid_groups_bias_e16", s, 16});
  return cases;
}

/// The selection's backward under plan P against central differences of its forward.
template <mr::route_plan P>
void expect_backward(selection_case const& c, matrix const& z, std::vector<float> const& bias,
                     matrix const& upstream, mm::mask_matrix const& kept) {
  auto const& s = c.settings;
  int const T = static_cast<int>(z.rows()), E = static_cast<int>(z.cols()), k = s.top_k;
  mr::topk_selection<double, double> selection;
  mm::row_matrix<int> indices(T, k), moved(T, k);
  matrix probs(T, k);
  auto objective = [&](matrix const& logits) {
    selection.template forward<P>(logits, bias, s, moved, probs);
    EXPECT_EQ(moved, indices) << c.name << ": a central difference moved a choice";
    double f = 0;
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i)
        if (kept(t, i)) f += upstream(t, moved(t, i)) * probs(t, i);
    return f;
  };
  selection.template forward<P>(z, bias, s, indices, probs);
  matrix grad = matrix::Zero(T, E);
  selection.template backward<P>(z, upstream, indices, kept, s, grad);
  double const h = 1e-6;
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      matrix plus = z, minus = z;
      plus(t, e) += h;
      minus(t, e) -= h;
      double const numeric = (objective(plus) - objective(minus)) / (2 * h);
      EXPECT_NEAR(grad(t, e), numeric, 1e-8 + 1e-6 * std::abs(numeric))
          << c.name << " token " << t << " expert " << e;
    }
  EXPECT_GT(grad.cwiseAbs().maxCoeff(), 1e-3) << c.name;
  // Entries all dropped by capacity give no gradient at all.
  matrix none = matrix::Zero(T, E);
  selection.template forward<P>(z, bias, s, indices, probs);
  mm::mask_matrix const dropped = mm::mask_matrix::Zero(T, k);
  selection.template backward<P>(z, upstream, indices, dropped, s, none);
  EXPECT_EQ(none.cwiseAbs().maxCoeff(), 0.0) << c.name;
}

class TopkSelection : public ::testing::TestWithParam<selection_case> {};

TEST_P(TopkSelection, IndicesAndProbsFollowTheScoreFunction) {
  auto const& c = GetParam();
  auto const& s = c.settings;
  int const T = 10, E = c.experts, k = s.top_k;
  matrix const z = separated_logits(T, E, 5);
  std::vector<float> bias(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) bias[static_cast<std::size_t>(e)] = 0.01F * static_cast<float>(e % 3);
  mm::row_matrix<int> indices(T, k);
  matrix probs(T, k);
  mr::topk_selection<double, double> selection;
  mr::with_plan(s, [&]<mr::route_plan P>() {
    if constexpr (P.sinkhorn) {
      ADD_FAILURE() << c.name << " has a Sinkhorn plan";
    } else {
      selection.template forward<P>(z, bias, s, indices, probs);
    }
  });
  double const scale = s.topk_scaling_factor.value_or(1.0);
  for (int t = 0; t < T; ++t) {
    std::vector<double> zt(static_cast<std::size_t>(E)), selection_scores;
    for (int e = 0; e < E; ++e) zt[static_cast<std::size_t>(e)] = z(t, e);
    auto const softmax = ref::softmax_of(zt);
    if (s.score == mr::score_function::softmax_after_topk) {
      selection_scores = zt;
    } else if (s.score == mr::score_function::softmax_before_topk) {
      selection_scores = softmax;
    } else {
      for (int e = 0; e < E; ++e)
        selection_scores.push_back(ref::raw_score(s.score, zt[static_cast<std::size_t>(e)]) +
                                   (s.expert_bias ? bias[static_cast<std::size_t>(e)] : 0.0));
    }
    auto const chosen = ref::choose(selection_scores, s);
    std::vector<double> want(static_cast<std::size_t>(k));
    if (s.score == mr::score_function::softmax_after_topk) {
      std::vector<double> picked;
      for (int e : chosen) picked.push_back(zt[static_cast<std::size_t>(e)]);
      want = ref::softmax_of(picked);
    } else if (s.score == mr::score_function::softmax_before_topk) {
      for (int i = 0; i < k; ++i)
        want[static_cast<std::size_t>(i)] =
            softmax[static_cast<std::size_t>(chosen[static_cast<std::size_t>(i)])];
    } else {
      double sum = 1e-20;
      for (int e : chosen) sum += ref::raw_score(s.score, zt[static_cast<std::size_t>(e)]);
      for (int i = 0; i < k; ++i) {
        double const q = ref::raw_score(
            s.score, zt[static_cast<std::size_t>(chosen[static_cast<std::size_t>(i)])]);
        want[static_cast<std::size_t>(i)] = k > 1 ? q / sum : q;
      }
    }
    for (int i = 0; i < k; ++i) {
      EXPECT_EQ(indices(t, i), chosen[static_cast<std::size_t>(i)]) << c.name << " token " << t;
      EXPECT_NEAR(probs(t, i), want[static_cast<std::size_t>(i)] * scale, 1e-14)
          << c.name << " token " << t;
    }
  }
}

TEST_P(TopkSelection, BackwardMatchesCentralDifferences) {
  auto const& c = GetParam();
  auto const& s = c.settings;
  int const T = 6, E = c.experts, k = s.top_k;
  matrix const z = separated_logits(T, E, 9);
  std::vector<float> bias(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e)
    bias[static_cast<std::size_t>(e)] = 0.02F * static_cast<float>((e * 5) % 7) - 0.05F;
  // Upstream gradient on the dense probs [T,E]; every fifth selected entry dropped by capacity.
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  matrix upstream(T, E);
  for (Eigen::Index i = 0; i < upstream.size(); ++i) upstream.data()[i] = normal(rng);
  mm::mask_matrix kept(T, k);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < k; ++i) kept(t, i) = (t * k + i) % 5 == 4 ? 0 : 1;

  mr::with_plan(s, [&]<mr::route_plan P>() {
    if constexpr (P.sinkhorn) {
      ADD_FAILURE() << c.name << " has a Sinkhorn plan";
    } else {
      expect_backward<P>(c, z, bias, upstream, kept);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(EveryScoreFunction, TopkSelection, ::testing::ValuesIn(selection_cases()),
                         [](auto const& info) { return std::string(info.param.name); });

}  // namespace
