// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. The router's reductions over real process groups against one rank holding all
// the tokens. Every rank makes the same global batch (S positions x B sequences); TPxCP ranks split
// the positions (sequence parallelism), DP ranks split the sequences. Checked, in double precision:
//   - aux, seq-aux and z losses reduced over TPxCP: their sum over the group equals the one-rank
//     losses on the DP shard, and each rank's logit gradients are those rows of the one-rank
//     gradient (so with TPxCP = 1 each DP rank's aux loss is the one-rank loss on its own shard);
//   - global-aux loss (counts over TPxDPxCP, running mean over two micro-batches) and the
//     aux-loss-free bias update at the end of the global batch equal the one-rank results on all
//     tokens.
//
// With --nan-on-rank R, rank R's logits hold a NaN: every rank must stop with an error, none may
// hang in a reduction.
//
//   mpiexec -n 4 megamoe_router_mpi_tests --tp 2 [--nan-on-rank R]
#include "support/sequence_shard.hpp"

#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/router/router.hpp>

#include <boost/mpi/collectives/all_reduce.hpp>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mr = megamoe::router;

namespace {

using matrix = mm::row_matrix<double>;
constexpr int positions = 8, sequences = 4, experts = 8;

/// Logit of (position s, sequence b, expert e) in micro-batch m: the same on every rank.
double logit(int m, int s, int b, int e) {
  return std::sin(1.3 * s + 2.1 * b + 0.7 * e + 0.37 * m + 0.11 * s * e) * 2.0 + 0.05 * e;
}
double objective_weight(int s, int b, int e) {
  return std::cos(0.9 * s - 1.7 * b + 0.4 * e);
}

using shard = mm::testing::sequence_shard;
using mm::testing::row_in;

/// Logits (or weights) of a shard in the token order t = s*B + b of that shard.
template <class F>
matrix table(shard const& sh, F&& value) {
  return mm::testing::shard_table<double>(sh, experts, value);
}

struct tally {
  int failures = 0, checks = 0;
  void close(std::string const& what, double mine, double expected) {
    ++checks;
    if (std::abs(mine - expected) > 1e-12 + 1e-10 * std::abs(expected)) {
      ++failures;
      std::cerr << what << ": " << mine << " vs one rank " << expected << "\n";
    }
  }
};

mr::settings settings_of(int k, mr::score_function score) {
  mr::settings s;
  s.top_k = k;
  s.score = score;
  s.dtype = mr::logits_dtype::fp64;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    auto const& world = env.world();
    mm::parallel::degrees d;
    int nan_on_rank = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string const key = argv[i];
      int const value = std::stoi(argv[i + 1]);
      if (key == "--tp")
        d.tp = value;
      else if (key == "--cp")
        d.cp = value;
      else if (key == "--nan-on-rank")
        nan_on_rank = value;
      else
        throw mm::input_error("unknown argument " + key);
    }
    d.etp = 1;
    d.ep = 1;
    mm::parallel::process_groups const groups(world, d);
    auto const& tp_cp = groups.tp_cp();
    auto const& dp = groups.dp();
    if (positions % tp_cp.size() != 0 || sequences % dp.size() != 0)
      throw mm::input_error("the test batch does not split over this layout");
    shard const dp_shard{0, positions, dp.rank() * (sequences / dp.size()), sequences / dp.size()};
    shard const mine{tp_cp.rank() * (positions / tp_cp.size()), positions / tp_cp.size(),
                     dp_shard.first_sequence, dp_shard.num_sequences};
    shard const everything{0, positions, 0, sequences};
    mr::reduction_groups<mm::parallel::communicator_sum, mm::parallel::communicator_sum> const
        reduce{mm::parallel::communicator_sum(tp_cp),
               mm::parallel::communicator_sum(groups.tp_dp_cp())};
    tally result;
    auto group_sum = [](boost::mpi::communicator const& c, double x) {
      return boost::mpi::all_reduce(c, x, std::plus<double>());
    };

    // 1. aux + seq-aux + z over TPxCP, against one rank on the DP shard.
    {
      auto s = settings_of(2, mr::score_function::softmax_after_topk);
      s.aux_loss_coeff = 1e-2;
      s.seq_aux_loss_coeff = 2e-2;
      s.z_loss_coeff = 1e-3;
      mr::topk_router<double, double> local(s, experts), one(s, experts);
      auto z = [](int p, int b, int e) { return logit(0, p, b, e); };
      matrix const weights_local = table(mine, objective_weight);
      matrix logits_local = table(mine, z);
      if (world.rank() == nan_on_rank) logits_local(1, 2) = std::nan("");
      auto const& out = [&]() -> mr::routing_output<double> const& {
        try {
          return local.route(logits_local, {mine.num_positions, mine.num_sequences}, {}, reduce);
        } catch (mm::input_error const& e) {
          // The router has every rank of the group throw; end the job cleanly on all of them.
          throw mm::parallel::agreed_input_error(e.what());
        }
      }();
      auto const& ref =
          one.route(table(dp_shard, z), {dp_shard.num_positions, dp_shard.num_sequences});
      result.close("aux_loss", group_sum(tp_cp, out.losses.aux_loss->value),
                   ref.losses.aux_loss->value);
      result.close("seq_aux_loss", group_sum(tp_cp, out.losses.seq_aux_loss->value),
                   ref.losses.seq_aux_loss->value);
      result.close("z_loss", group_sum(tp_cp, out.losses.z_loss->value), ref.losses.z_loss->value);
      matrix const grad = local.backward(weights_local, 0.5);
      matrix const grad_ref = one.backward(table(dp_shard, objective_weight), 0.5);
      for (int t = 0; t < mine.tokens(); ++t)
        for (int e = 0; e < experts; ++e)
          result.close("aux grad token " + std::to_string(t), grad(t, e),
                       grad_ref(row_in(dp_shard, mine, t), e));
    }

    // 2. global aux over TPxDPxCP for two micro-batches, and the expert-bias update.
    {
      auto s = settings_of(2, mr::score_function::sigmoid);
      s.global_aux_loss_coeff = 3e-2;
      s.expert_bias = true;
      s.bias_update_rate = 1e-3;
      mr::topk_router<double, double> local(s, experts), one(s, experts);
      for (int m = 0; m < 2; ++m) {
        auto z = [m](int p, int b, int e) { return logit(m + 1, p, b, e); };
        auto const& out =
            local.route(table(mine, z), {mine.num_positions, mine.num_sequences}, {}, reduce);
        auto const& ref = one.route(table(everything, z), {positions, sequences});
        result.close("global_aux_loss mb " + std::to_string(m),
                     group_sum(world, out.losses.global_aux_loss->value),
                     ref.losses.global_aux_loss->value);
        matrix const grad = local.backward(table(mine, objective_weight));
        matrix const grad_ref = one.backward(table(everything, objective_weight));
        for (int t = 0; t < mine.tokens(); ++t)
          for (int e = 0; e < experts; ++e)
            result.close("global grad token " + std::to_string(t), grad(t, e),
                         grad_ref(row_in(everything, mine, t), e));
      }
      local.state().finish_global_batch(reduce);
      one.state().finish_global_batch(mr::reduction_groups<>{});
      for (int e = 0; e < experts; ++e)
        result.close("expert_bias " + std::to_string(e),
                     local.state().expert_bias[static_cast<std::size_t>(e)],
                     one.state().expert_bias[static_cast<std::size_t>(e)]);
      bool moved = false;
      for (float b : one.state().expert_bias) moved = moved || b != 0.0F;
      result.close("bias moved", moved ? 1.0 : 0.0, 1.0);
    }

    int const failures = boost::mpi::all_reduce(world, result.failures, std::plus<int>());
    if (world.rank() == 0)
      std::cout << "router reductions on " << world.size() << " ranks (tp x cp " << tp_cp.size()
                << ", dp " << dp.size() << "): " << result.checks << " checks per rank, "
                << (failures == 0 ? "all equal the one-rank results"
                                  : std::to_string(failures) + " mismatches")
                << "\n";
    return failures == 0 ? 0 : 1;
  });
}
