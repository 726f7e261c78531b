// SPDX-License-Identifier: Apache-2.0
// Sinkhorn balancing (router/sinkhorn.hpp): the kernel against the reference's loop written out
// plainly in double (rows and columns of the result sum to 1/rows and 1/cols), its error after
// too many iterations, and Sinkhorn selection: training picks the top-k of the balanced cost, eval
// of the probs, the probs are softmax (k > 1) or sigmoid (k = 1) of the logits, and the backward
// matches central differences in double with the selection held.
#include <megamoe/core/error.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/router/plan.hpp>
#include <megamoe/router/sinkhorn.hpp>

#include "support/routing_inputs.hpp"

#include "reference/router_reference.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mr = megamoe::router;
namespace mk = megamoe::router::kernels;
namespace ref = megamoe::reference;

namespace {

using megamoe::testing::separated_logits;

using matrix = mm::row_matrix<double>;

/// The reference's loop, one line per step: exp, then rows and columns rescaled until the mean
/// change of the column scales is at most 1e-4.
ref::table plain_sinkhorn(ref::table cost) {
  std::size_t const rows = cost.size(), cols = cost[0].size();
  for (auto& row : cost)
    for (double& x : row) x = std::exp(x);
  std::vector<double> d0(rows, 1.0), d1(cols, 1.0), d1_old(cols, 1.0);
  double error = 1e9;
  while (error > 1e-4) {
    for (std::size_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (std::size_t c = 0; c < cols; ++c) sum += d1[c] * cost[r][c];
      d0[r] = (1.0 / static_cast<double>(rows)) / (sum + 1e-8);
    }
    for (std::size_t c = 0; c < cols; ++c) {
      double sum = 0;
      for (std::size_t r = 0; r < rows; ++r) sum += d0[r] * cost[r][c];
      d1[c] = (1.0 / static_cast<double>(cols)) / (sum + 1e-8);
    }
    error = 0;
    for (std::size_t c = 0; c < cols; ++c) error += std::abs(d1_old[c] - d1[c]);
    error /= static_cast<double>(cols);
    d1_old = d1;
  }
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) cost[r][c] *= d1[c] * d0[r];
  return cost;
}

matrix random_logits(int rows, int cols, std::uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  matrix z(rows, cols);
  for (Eigen::Index i = 0; i < z.size(); ++i) z.data()[i] = scale * normal(rng);
  return z;
}

ref::table to_table(matrix const& m) {
  ref::table t(static_cast<std::size_t>(m.rows()));
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c) t[static_cast<std::size_t>(r)].push_back(m(r, c));
  return t;
}

TEST(Sinkhorn, KernelIsTheReferencesLoop) {
  int const rows = 12, cols = 5;
  matrix const z = random_logits(rows, cols, 1);
  matrix cost = z;
  std::vector<double> row_scale(rows), col_scale(cols), col_old(cols);
  mk::sinkhorn(cost.data(), rows, cols, row_scale.data(), col_scale.data(), col_old.data());
  auto const want = plain_sinkhorn(to_table(z));
  for (int r = 0; r < rows; ++r) {
    double row_sum = 0;
    for (int c = 0; c < cols; ++c) {
      EXPECT_NEAR(cost(r, c), want[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)],
                  1e-15);
      row_sum += cost(r, c);
    }
    EXPECT_NEAR(row_sum, 1.0 / rows, 1e-3 / rows) << "row " << r;
  }
  // The columns were rescaled last: each sums to 1/cols up to the eps in the division.
  for (int c = 0; c < cols; ++c) EXPECT_NEAR(cost.col(c).sum(), 1.0 / cols, 1e-7) << "column " << c;
}

TEST(Sinkhorn, KernelGivesUpAfterMaxIterations) {
  int const rows = 6, cols = 3;
  std::vector<double> row_scale(rows), col_scale(cols), col_old(cols);
  // Equal logits are balanced after one round; unequal ones are not.
  matrix even = matrix::Zero(rows, cols);
  EXPECT_NO_THROW(mk::sinkhorn(even.data(), rows, cols, row_scale.data(), col_scale.data(),
                               col_old.data(), 1e-4, 1));
  EXPECT_NEAR(even(0, 0), 1.0 / (rows * cols), 1e-7);  // up to the eps of 1e-8
  matrix uneven = random_logits(rows, cols, 2, 3.0);
  try {
    mk::sinkhorn(uneven.data(), rows, cols, row_scale.data(), col_scale.data(), col_old.data(),
                 1e-4, 1);
    FAIL() << "one iteration balanced uneven logits";
  } catch (mm::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("did not converge in 1 iterations"), std::string::npos)
        << e.what();
  }
}

/// settings with Sinkhorn on and top-k k.
mr::settings sinkhorn_settings(int k) {
  mr::settings s;
  s.top_k = k;
  s.sinkhorn = true;
  return s;
}

TEST(SinkhornSelection, TrainingSelectsOnTheBalancedCostEvalOnTheProbs) {
  int const T = 16, E = 4;
  // Every token prefers experts 0 and 1: balancing must move choices to 2 and 3.
  matrix z(T, E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) z(t, e) = (e < 2 ? 0.6 : 0.0) + 0.05 * ((t * 7 + e * 3) % 5);
  auto const balanced = plain_sinkhorn(to_table(z));
  for (int k : {1, 2}) {
    auto const s = sinkhorn_settings(k);
    mr::with_plan(s, [&]<mr::route_plan P>() {
      if constexpr (!P.sinkhorn) {
        ADD_FAILURE() << "not a Sinkhorn plan";
      } else {
        EXPECT_EQ(P.normalize, k > 1);
        mr::sinkhorn_selection<double, double> selection;
        mm::row_matrix<int> indices(T, k);
        matrix probs(T, k);
        for (auto mode : {mr::pass::training, mr::pass::eval}) {
          selection.template forward<P>(z, k, mode, indices, probs);
          int moved_to_2_or_3 = 0;
          for (int t = 0; t < T; ++t) {
            std::vector<double> zt(z.row(t).data(), z.row(t).data() + E), act(E);
            if (k > 1) {
              act = ref::softmax_of(zt);
            } else {
              for (int e = 0; e < E; ++e)
                act[static_cast<std::size_t>(e)] = 1.0 / (1.0 + std::exp(-z(t, e)));
            }
            auto const want = mode == mr::pass::eval
                                  ? ref::largest(act, k)
                                  : ref::largest(balanced[static_cast<std::size_t>(t)], k);
            for (int i = 0; i < k; ++i) {
              EXPECT_EQ(indices(t, i), want[static_cast<std::size_t>(i)]) << "token " << t;
              EXPECT_NEAR(probs(t, i), act[static_cast<std::size_t>(indices(t, i))], 1e-15);
              moved_to_2_or_3 += indices(t, i) >= 2;
            }
          }
          if (mode == mr::pass::training) {
            EXPECT_GT(moved_to_2_or_3, T * k / 4) << "k " << k;
          } else {
            EXPECT_EQ(moved_to_2_or_3, 0) << "k " << k;  // the probs favour 0 and 1
          }
        }
      }
    });
  }
}

/// The selection's backward under plan P against central differences of its forward.
template <mr::route_plan P>
void expect_backward(int k) {
  int const T = 8, E = 6;
  matrix const z = separated_logits(T, E, 4);
  std::mt19937 rng(8);
  std::normal_distribution<double> normal;
  matrix upstream(T, E);
  for (Eigen::Index i = 0; i < upstream.size(); ++i) upstream.data()[i] = normal(rng);
  mm::mask_matrix kept(T, k);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < k; ++i) kept(t, i) = (t + i) % 4 == 3 ? 0 : 1;
  mr::sinkhorn_selection<double, double> selection;
  mm::row_matrix<int> indices(T, k), moved(T, k);
  matrix probs(T, k);
  auto objective = [&](matrix const& logits) {
    selection.template forward<P>(logits, k, mr::pass::training, moved, probs);
    EXPECT_EQ(moved, indices) << "a central difference moved a choice";
    double f = 0;
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i)
        if (kept(t, i)) f += upstream(t, moved(t, i)) * probs(t, i);
    return f;
  };
  selection.template forward<P>(z, k, mr::pass::training, indices, probs);
  matrix grad = matrix::Zero(T, E);
  selection.template backward<P>(upstream, indices, kept, grad);
  double const h = 1e-6;
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      matrix plus = z, minus = z;
      plus(t, e) += h;
      minus(t, e) -= h;
      double const numeric = (objective(plus) - objective(minus)) / (2 * h);
      EXPECT_NEAR(grad(t, e), numeric, 1e-8 + 1e-6 * std::abs(numeric))
          << "k " << k << " token " << t << " expert " << e;
    }
  EXPECT_GT(grad.cwiseAbs().maxCoeff(), 1e-3);
}

TEST(SinkhornSelection, BackwardMatchesCentralDifferences) {
  for (int k : {1, 2, 3}) {
    mr::with_plan(sinkhorn_settings(k), [&]<mr::route_plan P>() {
      if constexpr (!P.sinkhorn) {
        ADD_FAILURE() << "not a Sinkhorn plan";
      } else {
        expect_backward<P>(k);
      }
    });
  }
}

}  // namespace
