// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. Context-parallel causal attention with the world as the CP group against one
// rank's attention over the whole sequences, in double: each rank holds chunks r and 2 CP - 1 - r
// of every sequence; its output rows, its input gradient and the weight gradients summed over the
// group equal the whole attention's (1e-12), for both key/value exchanges (p2p ring, all_gather),
// multi-head and grouped-query attention, with and without QK layernorm. Multi-head latent
// attention likewise, and with the world as its tensor-parallel group: the sum of the ranks'
// outputs and input gradients equals the whole attention's, each rank's gradients of its heads'
// up-projection rows and linear_proj columns equal those slices, and the replicated down
// projections' and norms' gradients summed over the ranks equal the whole's.
//
//   mpiexec -n 3 megamoe_attention_mpi
#include "support/tally.hpp"

#include <megamoe/core/random.hpp>
#include <megamoe/model/attention.hpp>
#include <megamoe/model/mla.hpp>
#include <megamoe/parallel/environment.hpp>

#include <boost/mpi/collectives/all_reduce.hpp>

#include <map>
#include <string>

namespace mm = megamoe;
using comm_type = mm::parallel::cp_comm_type;

namespace {

using matrix = mm::row_matrix<double>;

matrix random_matrix(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed, double scale) {
  matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = scale * mm::standard_normal(seed, static_cast<std::uint64_t>(i));
  return m;
}

/// This rank's rows of [S*B, cols] (t = s*B + b): chunks r and 2 CP - 1 - r of length L.
matrix my_rows(matrix const& all, int rank, int cp, int L, int B) {
  matrix mine(2 * L * B, all.cols());
  int const chunks[2] = {rank, 2 * cp - 1 - rank};
  for (int i = 0; i < 2; ++i)
    mine.middleRows(i * L * B, L * B) = all.middleRows(chunks[i] * L * B, L * B);
  return mine;
}

template <bool QkNorm, comm_type Comm>
void check(boost::mpi::communicator const& world, mm::testing::tally& result, int heads, int groups,
           std::string const& what) {
  mm::thread_pool pool(1);
  mm::expert::executor<double> exec(pool);
  int const cp = world.size(), r = world.rank(), L = 3, B = 2, S = 2 * cp * L, H = 4 * heads;
  using attention = mm::causal_attention<double, QkNorm, Comm>;
  attention whole(H, heads, groups), part(H, heads, groups);
  part.set_context_parallel(world);
  std::uint64_t seed = 100;
  std::map<std::string, matrix> weights;
  whole.for_each_parameter("a", [&](std::string const& name, auto value, auto) {
    weights[name] = random_matrix(value.rows(), value.cols(), ++seed, 0.5);
    if (name.ends_with("layernorm.weight")) weights[name].array() += 1.0;
    value = weights[name];
  });
  part.for_each_parameter(
      "a", [&](std::string const& name, auto value, auto) { value = weights.at(name); });
  matrix const x = random_matrix(S * B, H, 1, 1.0), R = random_matrix(S * B, H, 2, 1.0);
  matrix y(S * B, H), dx(S * B, H);
  whole.forward(exec, {x.data(), x.rows(), x.cols()}, S, B, {y.data(), y.rows(), y.cols()});
  whole.backward(exec, {R.data(), R.rows(), R.cols()}, {dx.data(), dx.rows(), dx.cols()});

  matrix const x_mine = my_rows(x, r, cp, L, B), R_mine = my_rows(R, r, cp, L, B);
  matrix y_mine(2 * L * B, H), dx_mine(2 * L * B, H);
  part.forward(exec, {x_mine.data(), x_mine.rows(), H}, 2 * L, B,
               {y_mine.data(), y_mine.rows(), H});
  part.backward(exec, {R_mine.data(), R_mine.rows(), H}, {dx_mine.data(), dx_mine.rows(), H});
  auto compare = [&](std::string const& name, matrix const& mine, matrix const& expected) {
    double const scale = std::max(1.0, expected.cwiseAbs().maxCoeff());
    for (Eigen::Index i = 0; i < mine.size(); ++i)
      result.close(what + name, mine.data()[i], expected.data()[i], scale, 1e-12);
  };
  compare(" output", y_mine, my_rows(y, r, cp, L, B));
  compare(" input gradient", dx_mine, my_rows(dx, r, cp, L, B));
  std::map<std::string, matrix> expected;
  whole.for_each_parameter(
      "a", [&](std::string const& name, auto, auto grad) { expected[name] = grad; });
  part.for_each_parameter("a", [&](std::string const& name, auto, auto grad) {
    matrix sum = grad;
    boost::mpi::all_reduce(world, grad.data(), static_cast<int>(grad.size()), sum.data(),
                           std::plus<double>());
    compare(" gradient of " + name, sum, expected.at(name));
  });
  // A second forward and backward (buffers reused) gives the same output.
  matrix again(2 * L * B, H);
  part.forward(exec, {x_mine.data(), x_mine.rows(), H}, 2 * L, B, {again.data(), again.rows(), H});
  compare(" output again", again, y_mine);
}

matrix all_reduced(boost::mpi::communicator const& world, matrix const& mine) {
  matrix sum = mine;
  boost::mpi::all_reduce(world, mine.data(), static_cast<int>(mine.size()), sum.data(),
                         std::plus<double>());
  return sum;
}

/// MLA over the world as its CP group (`tensor_parallel` false) or as its TP group, against one
/// rank's MLA over the whole sequences and heads.
template <comm_type Comm>
void check_mla(boost::mpi::communicator const& world, mm::testing::tally& result,
               bool tensor_parallel, int q_lora_rank, std::string const& what) {
  mm::thread_pool pool(1);
  mm::expert::executor<double> exec(pool);
  int const n = world.size(), r = world.rank(), L = 3, B = 2, H = 8, heads = 2 * n;
  int const S = tensor_parallel ? 2 * L : 2 * n * L, local = tensor_parallel ? S : 2 * L;
  mm::mla_dims const dims{.q_lora_rank = q_lora_rank,
                          .kv_lora_rank = 4,
                          .qk_head_dim = 3,
                          .qk_pos_emb_head_dim = 4,
                          .v_head_dim = 5};
  using attention = mm::latent_attention<double, true, Comm>;  // the latents normed
  attention whole(H, heads, dims), part(H, heads, dims, 1e4, 1e-5, tensor_parallel ? n : 1);
  if (!tensor_parallel) part.set_context_parallel(world);
  // This rank's part of a weight under TP: its heads' rows of the up projections (or of
  // linear_q_proj) and their columns of linear_proj; the rest is replicated.
  auto sharded = [&](std::string const& name) {
    return tensor_parallel &&
           (name.ends_with("up_proj.weight") || name.ends_with(".linear_q_proj.weight") ||
            name.ends_with(".linear_proj.weight"));
  };
  auto slice = [&](std::string const& name, matrix const& w) -> matrix {
    if (!sharded(name)) return w;
    if (name.ends_with(".linear_proj.weight"))
      return w.middleCols(r * (w.cols() / n), w.cols() / n);
    return w.middleRows(r * (w.rows() / n), w.rows() / n);
  };
  std::uint64_t seed = 300;
  std::map<std::string, matrix> weights;
  whole.for_each_parameter("a", [&](std::string const& name, auto value, auto) {
    weights[name] = random_matrix(value.rows(), value.cols(), ++seed, 0.5);
    if (name.ends_with("layernorm.weight")) weights[name].array() += 1.0;
    value = weights[name];
  });
  part.for_each_parameter("a", [&](std::string const& name, auto value, auto) {
    value = slice(name, weights.at(name));
  });
  matrix const x = random_matrix(S * B, H, 3, 1.0), R = random_matrix(S * B, H, 4, 1.0);
  matrix y(S * B, H), dx(S * B, H);
  whole.forward(exec, {x.data(), x.rows(), x.cols()}, S, B, {y.data(), y.rows(), y.cols()});
  whole.backward(exec, {R.data(), R.rows(), R.cols()}, {dx.data(), dx.rows(), dx.cols()});
  auto mine = [&](matrix const& all) { return tensor_parallel ? all : my_rows(all, r, n, L, B); };
  matrix const x_mine = mine(x), R_mine = mine(R);
  matrix y_mine(local * B, H), dx_mine(local * B, H);
  part.forward(exec, {x_mine.data(), x_mine.rows(), H}, local, B,
               {y_mine.data(), y_mine.rows(), H});
  part.backward(exec, {R_mine.data(), R_mine.rows(), H}, {dx_mine.data(), dx_mine.rows(), H});
  auto compare = [&](std::string const& name, matrix const& got, matrix const& expected) {
    double const scale = std::max(1.0, expected.cwiseAbs().maxCoeff());
    for (Eigen::Index i = 0; i < got.size(); ++i)
      result.close(what + name, got.data()[i], expected.data()[i], scale, 1e-12);
  };
  if (tensor_parallel) {
    compare(" output", all_reduced(world, y_mine), y);
    compare(" input gradient", all_reduced(world, dx_mine), dx);
  } else {
    compare(" output", y_mine, mine(y));
    compare(" input gradient", dx_mine, mine(dx));
  }
  std::map<std::string, matrix> expected;
  whole.for_each_parameter(
      "a", [&](std::string const& name, auto, auto grad) { expected[name] = grad; });
  part.for_each_parameter("a", [&](std::string const& name, auto, auto grad) {
    matrix const g = grad;
    if (sharded(name))
      compare(" gradient of " + name, g, slice(name, expected.at(name)));
    else
      compare(" gradient of " + name, all_reduced(world, g), expected.at(name));
  });
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    auto const& world = env.world();
    mm::testing::tally result;
    check<false, comm_type::p2p>(world, result, 2, 2, "p2p, multi-head");
    check<false, comm_type::p2p>(world, result, 4, 2, "p2p, grouped");
    check<true, comm_type::p2p>(world, result, 4, 1, "p2p, one group, QK layernorm");
    check<false, comm_type::all_gather>(world, result, 2, 2, "all_gather, multi-head");
    check<true, comm_type::all_gather>(world, result, 4, 2, "all_gather, grouped, QK layernorm");
    check_mla<comm_type::p2p>(world, result, false, 6, "MLA, p2p");
    check_mla<comm_type::all_gather>(world, result, false, 0,
                                     "MLA without q_lora_rank, all_gather");
    check_mla<comm_type::p2p>(world, result, true, 6, "MLA, tensor-parallel");
    check_mla<comm_type::p2p>(world, result, true, 0, "MLA without q_lora_rank, tensor-parallel");
    return result.finish(world,
                         "context-parallel attention and MLA, tensor-parallel MLA over " +
                             std::to_string(world.size()) + " ranks (p2p, all_gather)",
                         "all equal the whole attention");
  });
}
