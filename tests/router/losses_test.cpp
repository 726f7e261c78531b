// SPDX-License-Identifier: Apache-2.0
// The losses a router attaches (router/losses.hpp), apart from the router: the aux, seq-aux and
// global-aux losses of each score family and the z-loss against the plain statement of
// tests/reference/router_reference.hpp (with padding, over two micro-batches), the token totals of
// a group of ranks, the global-aux average counting training passes only, and every backward
// (together and term by term) against central differences in double.
#include <megamoe/core/tensor.hpp>
#include <megamoe/router/expert_bias.hpp>
#include <megamoe/router/groups.hpp>
#include <megamoe/router/losses.hpp>
#include <megamoe/router/output.hpp>
#include <megamoe/router/plan.hpp>

#include "support/identical_ranks.hpp"
#include "support/routing_inputs.hpp"

#include "reference/router_reference.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace mm = megamoe;
namespace mr = megamoe::router;
namespace ref = megamoe::reference;

namespace {

using megamoe::testing::separated_logits;

using matrix = mm::row_matrix<double>;

ref::table to_table(matrix const& m) {
  ref::table t(static_cast<std::size_t>(m.rows()));
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c) t[static_cast<std::size_t>(r)].push_back(m(r, c));
  return t;
}

using megamoe::testing::identical_ranks;

struct loss_case {
  char const* name;
  mr::settings settings;
  bool padding = false;
};

std::vector<loss_case> loss_cases() {
  using sf = mr::score_function;
  std::vector<loss_case> cases;
  for (bool padding : {false, true}) {
    for (auto [name, score, k] :
         {std::tuple{"softmax_after_topk", sf::softmax_after_topk, 2},
          std::tuple{"softmax_before_topk", sf::softmax_before_topk, 3},
          std::tuple{"sigmoid", sf::sigmoid, 3}, std::tuple{"sqrtsoftplus", sf::sqrtsoftplus, 2}}) {
      mr::settings s;
      s.top_k = k;
      s.score = score;
      s.aux_loss_coeff = 0.1;
      s.seq_aux_loss_coeff = 0.2;
      s.global_aux_loss_coeff = 0.3;
      s.z_loss_coeff = 0.05;
      cases.push_back({name, s, padding});
    }
  }
  return cases;
}

class AttachedLosses : public ::testing::TestWithParam<loss_case> {
 protected:
  static constexpr int seq = 4, batch = 2, experts = 6, tokens = seq * batch;

  void SetUp() override {
    auto const& c = GetParam();
    valid_.assign(tokens, 1);
    for (int t = 0; t < tokens; ++t)
      if (c.padding && t % 5 == 3) valid_[static_cast<std::size_t>(t)] = 0;
    state_.global_tokens_per_expert.assign(experts, 0.0);
  }
  [[nodiscard]] int valid_tokens() const {
    return static_cast<int>(std::count(valid_.begin(), valid_.end(), 1));
  }
  [[nodiscard]] std::vector<bool> padding_flags() const {
    std::vector<bool> flags;
    if (GetParam().padding)
      for (auto v : valid_) flags.push_back(v == 0);
    return flags;
  }
  /// Runs `f.template operator()<P>()` under the case's plan.
  template <class F>
  void planned(F&& f) {
    mr::with_plan(GetParam().settings, [&]<mr::route_plan P>() {
      if constexpr (P.sinkhorn) {
        ADD_FAILURE() << "Sinkhorn takes no aux losses";
      } else {
        f.template operator()<P>();
      }
    });
  }
  template <mr::route_plan P, class Groups = mr::reduction_groups<>>
  mr::loss_values aux(matrix const& z, mr::pass mode, Groups const& groups = {}) {
    mr::loss_values out;
    losses_.template forward_aux<P>(z, valid_, GetParam().padding, {seq, batch},
                                    GetParam().settings, mode, groups, state_, out);
    return out;
  }

  std::vector<std::uint8_t> valid_;
  mr::router_state state_;
  mr::attached_losses<double, double> losses_;
};

void expect_loss(char const* what, std::optional<mr::attached_loss> const& mine,
                 std::optional<double> const& theirs, std::optional<double> coeff) {
  ASSERT_TRUE(mine.has_value()) << what;
  ASSERT_TRUE(theirs.has_value()) << what;
  EXPECT_NEAR(mine->value, *theirs, 1e-13 * std::abs(*theirs)) << what;
  EXPECT_NEAR(mine->unscaled, *theirs / *coeff, 1e-13 * std::abs(*theirs / *coeff)) << what;
}

TEST_P(AttachedLosses, MatchThePlainStatementOverTwoMicroBatches) {
  auto const& c = GetParam();
  auto const& s = c.settings;
  planned([&]<mr::route_plan P>() {
    ref::router_memory memory;
    for (std::uint32_t m = 0; m < 2; ++m) {
      matrix const z = separated_logits(tokens, experts, 10 + m);
      auto const out = aux<P>(z, mr::pass::training);
      mr::loss_values z_out;
      losses_.forward_z(z, valid_, valid_tokens(), *s.z_loss_coeff, 1, z_out);
      auto const want = ref::route(to_table(z), s, batch, {}, padding_flags(), memory);
      SCOPED_TRACE(std::string(c.name) + (c.padding ? " padding" : "") + " micro-batch " +
                   std::to_string(m));
      expect_loss("aux_loss", out.aux_loss, want.aux_loss, s.aux_loss_coeff);
      expect_loss("seq_aux_loss", out.seq_aux_loss, want.seq_aux_loss, s.seq_aux_loss_coeff);
      expect_loss("global_aux_loss", out.global_aux_loss, want.global_aux_loss,
                  s.global_aux_loss_coeff);
      expect_loss("z_loss", z_out.z_loss, want.z_loss, s.z_loss_coeff);
      EXPECT_FALSE(out.z_loss);
      EXPECT_FALSE(z_out.aux_loss);
      // The aux losses' own map: k experts per valid token, none for padding.
      for (int t = 0; t < tokens; ++t)
        EXPECT_EQ(losses_.aux_routing_map().row(t).template cast<int>().sum(),
                  valid_[static_cast<std::size_t>(t)] ? s.top_k : 0);
    }
    EXPECT_EQ(state_.global_aux_steps, 2);
  });
}

TEST_P(AttachedLosses, GlobalAuxAverageCountsTrainingPassesOnly) {
  planned([&]<mr::route_plan P>() {
    matrix const first = separated_logits(tokens, experts, 20);
    matrix const second = separated_logits(tokens, experts, 21);
    // A recompute as the very first pass still counts (there is nothing to average yet).
    auto const alone = aux<P>(first, mr::pass::recompute);
    EXPECT_EQ(state_.global_aux_steps, 1);
    auto const counts_after_first = state_.global_tokens_per_expert;
    auto const trained = aux<P>(second, mr::pass::training);
    EXPECT_EQ(state_.global_aux_steps, 2);
    // Recomputing the second micro-batch gives its losses again and changes no running sum.
    auto const again = aux<P>(second, mr::pass::recompute);
    EXPECT_EQ(state_.global_aux_steps, 2);
    EXPECT_EQ(again.global_aux_loss->value, trained.global_aux_loss->value);
    EXPECT_EQ(again.aux_loss->value, trained.aux_loss->value);
    // The average of the two passes' counts: summed over experts, k per valid token each time.
    double total = 0;
    for (double x : state_.global_tokens_per_expert) total += x;
    EXPECT_EQ(total, 2.0 * GetParam().settings.top_k * valid_tokens());
    double first_total = 0;
    for (double x : counts_after_first) first_total += x;
    EXPECT_EQ(first_total, 1.0 * GetParam().settings.top_k * valid_tokens());
    EXPECT_GT(alone.global_aux_loss->value, 0.0);
  });
}

TEST_P(AttachedLosses, AGroupOfIdenticalRanksHalvesEveryLoss) {
  auto const& s = GetParam().settings;
  planned([&]<mr::route_plan P>() {
    matrix const z = separated_logits(tokens, experts, 30);
    auto const one = aux<P>(z, mr::pass::training);
    state_.global_tokens_per_expert.assign(experts, 0.0);
    state_.global_aux_steps = 0;
    // Counts doubled and the token total doubled: T_tot^2 grows by 4, the counts by 2.
    auto const two = aux<P>(z, mr::pass::training,
                            mr::reduction_groups<identical_ranks, identical_ranks>{{2}, {2}});
    EXPECT_NEAR(two.aux_loss->value, one.aux_loss->value / 2, 1e-15);
    EXPECT_NEAR(two.seq_aux_loss->value, one.seq_aux_loss->value / 2, 1e-15);
    EXPECT_NEAR(two.global_aux_loss->value, one.global_aux_loss->value / 2, 1e-15);
    mr::loss_values z_one, z_two;
    losses_.forward_z(z, valid_, valid_tokens(), *s.z_loss_coeff, 1, z_one);
    losses_.forward_z(z, valid_, valid_tokens(), *s.z_loss_coeff, 2, z_two);
    EXPECT_NEAR(z_two.z_loss->value, z_one.z_loss->value / 2, 1e-15);
    EXPECT_EQ(z_two.z_loss->unscaled, z_one.z_loss->unscaled);  // the logged mean is the same
  });
}

TEST_P(AttachedLosses, BackwardsMatchCentralDifferences) {
  auto const& c = GetParam();
  auto const& s = c.settings;
  double const scale = 0.7, h = 1e-6;
  planned([&]<mr::route_plan P>() {
    matrix const z = separated_logits(tokens, experts, 40);
    aux<P>(separated_logits(tokens, experts, 41), mr::pass::training);  // a global-aux history
    aux<P>(z, mr::pass::training);
    struct variant {
      char const* name;
      bool aux, seq, global;
    };
    for (variant const v :
         {variant{"all", true, true, true}, variant{"aux", true, false, false},
          variant{"seq_aux", false, true, false}, variant{"global_aux", false, false, true}}) {
      // Recompute passes read the global average without adding to it.
      auto value = [&](matrix const& logits) {
        auto const out = aux<P>(logits, mr::pass::recompute);
        return scale *
               ((v.aux ? out.aux_loss->value : 0.0) + (v.seq ? out.seq_aux_loss->value : 0.0) +
                (v.global ? out.global_aux_loss->value : 0.0));
      };
      aux<P>(z, mr::pass::recompute);
      matrix grad = matrix::Zero(tokens, experts);
      mr::gradient_terms terms;
      terms.aux_loss = v.aux;
      terms.seq_aux_loss = v.seq;
      terms.global_aux_loss = v.global;
      losses_.template backward_aux<P>(z, valid_, {seq, batch}, scale, terms, grad);
      for (int t = 0; t < tokens; ++t)
        for (int e = 0; e < experts; ++e) {
          matrix plus = z, minus = z;
          plus(t, e) += h;
          minus(t, e) -= h;
          double const numeric = (value(plus) - value(minus)) / (2 * h);
          EXPECT_NEAR(grad(t, e), numeric, 1e-9 + 1e-6 * std::abs(numeric))
              << c.name << " " << v.name << " token " << t << " expert " << e;
          if (!valid_[static_cast<std::size_t>(t)]) {
            EXPECT_EQ(grad(t, e), 0.0);
          }
        }
      EXPECT_GT(grad.cwiseAbs().maxCoeff(), 1e-4) << c.name << " " << v.name;
    }
    // No term selected: nothing added.
    matrix none = matrix::Constant(tokens, experts, 2.0);
    mr::gradient_terms off;
    off.aux_loss = off.seq_aux_loss = off.global_aux_loss = false;
    losses_.template backward_aux<P>(z, valid_, {seq, batch}, scale, off, none);
    EXPECT_EQ(none, matrix::Constant(tokens, experts, 2.0));

    // The z-loss.
    auto z_value = [&](matrix const& logits) {
      mr::loss_values out;
      losses_.forward_z(logits, valid_, valid_tokens(), *s.z_loss_coeff, 2, out);
      return scale * out.z_loss->value;
    };
    z_value(z);
    matrix grad = matrix::Zero(tokens, experts);
    losses_.backward_z(z, valid_, scale, grad);
    for (int t = 0; t < tokens; ++t)
      for (int e = 0; e < experts; ++e) {
        matrix plus = z, minus = z;
        plus(t, e) += h;
        minus(t, e) -= h;
        EXPECT_NEAR(grad(t, e), (z_value(plus) - z_value(minus)) / (2 * h), 1e-9)
            << c.name << " z-loss token " << t << " expert " << e;
      }
    EXPECT_GT(grad.cwiseAbs().maxCoeff(), 1e-4);
  });
}

INSTANTIATE_TEST_SUITE_P(EveryScoreFamily, AttachedLosses, ::testing::ValuesIn(loss_cases()),
                         [](auto const& info) {
                           return std::string(info.param.name) +
                                  (info.param.padding ? "_padding" : "");
                         });

TEST(AnyAuxLoss, IsOnForAPositiveCoefficientOfALoadBalancingLoss) {
  mr::settings s;
  EXPECT_FALSE(mr::any_aux_loss(s));
  s.aux_loss_coeff = 0.0;
  EXPECT_FALSE(mr::any_aux_loss(s));
  s.z_loss_coeff = 1e-3;
  EXPECT_FALSE(mr::any_aux_loss(s));  // the z-loss is no load-balancing loss
  for (auto field : {&mr::settings::aux_loss_coeff, &mr::settings::seq_aux_loss_coeff,
                     &mr::settings::global_aux_loss_coeff}) {
    mr::settings one;
    one.*field = 1e-4;
    EXPECT_TRUE(mr::any_aux_loss(one));
  }
  static_assert(mr::any_aux_loss(mr::top_k<2, mr::seq_aux_loss<1e-3>>::value));
  static_assert(!mr::any_aux_loss(mr::top_k<2, mr::z_loss<1e-3>>::value));
}

}  // namespace
