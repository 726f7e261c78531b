// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. The MoE layer on a folded parallel mapping against one rank with
// dispatch::local on the same global tokens.
//
// Every rank makes the same global batch (S positions x B sequences). DP ranks split the sequences;
// the TP x CP ranks of a DP replica split its positions (sequence parallelism). The one-rank layer
// runs each DP replica's micro-batch in turn (its gradients accumulate). Checked on every rank:
//   - its output rows and input-gradient rows equal the one-rank rows of its tokens;
//   - the sum over TP x CP of its router losses equals the one-rank losses of its replica;
//   - after `reduce_gradients`, every parameter gradient it holds (experts: its ETP shard of its
//     local experts) equals the one-rank gradient / (DP*CP);
//   - with the aux-loss-free router, the expert bias after `finish_global_batch` equals one rank's;
//   - each rank holds exactly its share of the expert weights: (E/EP) * (1/ETP) of them.
// Tolerance: 1e-9 relative in fp64, 1e-5 of the tensor's largest entry in fp32.
//
//   mpiexec -n 8 megamoe_layer_mpi_tests --tp 2 --ep 8 --etp 1 --dispatcher all_to_all
//       [--precision fp32|fp8_current|mxfp8] [--router aux|plain|capacity|pad|seq_aux] [--skew
//       one_rank|few_experts]
//       [--memory moe_layer] [--bad-input-on-rank R] [--nan-on-rank R]
#include "support/sequence_shard.hpp"
#include "support/tally.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/dispatch/hierarchical.hpp>
#include <megamoe/dispatch/shared_memory.hpp>
#include <megamoe/model/moe_layer.hpp>
#include <megamoe/parallel/gradients.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/precision/operands.hpp>

#include <boost/mpi/collectives/all_reduce.hpp>

#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mr = megamoe::router;

namespace {

constexpr int hidden = 16, ffn = 24, experts = 8, shared_ffn = 8;

template <class Dispatch, class Precision, class Parallel, class Memory = mm::memory::keep_all>
using layer_config = mm::make_config<
    mm::shape<mm::hidden<hidden>, mm::ffn<ffn>, mm::experts<experts>, mm::shared_ffn<shared_ffn>>,
    mr::runtime, Dispatch, mm::expert::mlp<mm::expert::swiglu, mm::expert::shared_expert_gate>,
    Precision, Parallel, Memory>;
using dynamic_mapping =
    mm::parallel::mapping<mm::parallel::tp<mm::dynamic>, mm::parallel::cp<mm::dynamic>,
                          mm::parallel::etp<mm::dynamic>, mm::parallel::ep<mm::dynamic>>;

struct options {
  mm::parallel::degrees degrees;
  std::string dispatcher = "all_to_all", precision = "fp64", router = "aux", skew = "none";
  std::string memory = "keep_all";
  int bad_input_on_rank = -1, nan_on_rank = -1;
  int positions = 8, sequences = 4;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const key = argv[i], value = argv[i + 1];
    if (key == "--tp")
      o.degrees.tp = std::stoi(value);
    else if (key == "--cp")
      o.degrees.cp = std::stoi(value);
    else if (key == "--etp")
      o.degrees.etp = std::stoi(value);
    else if (key == "--ep")
      o.degrees.ep = std::stoi(value);
    else if (key == "--dispatcher")
      o.dispatcher = value;
    else if (key == "--precision")
      o.precision = value;
    else if (key == "--router")
      o.router = value;
    else if (key == "--skew")
      o.skew = value;
    else if (key == "--memory")
      o.memory = value;
    else if (key == "--bad-input-on-rank")
      o.bad_input_on_rank = std::stoi(value);
    else if (key == "--nan-on-rank")
      o.nan_on_rank = std::stoi(value);
    else if (key == "--positions")
      o.positions = std::stoi(value);
    else if (key == "--sequences")
      o.sequences = std::stoi(value);
    else
      throw mm::input_error("unknown argument " + key);
  }
  return o;
}

mr::settings router_settings(std::string const& kind) {
  mr::settings s;
  s.top_k = 2;
  s.score = mr::score_function::softmax_after_topk;
  if (kind == "aux") {
    s.aux_loss_coeff = 1e-2;
    s.z_loss_coeff = 1e-3;
  } else if (kind == "seq_aux") {
    s.score = mr::score_function::sigmoid;
    s.seq_aux_loss_coeff = 1e-2;
  } else if (kind == "capacity") {  // dropping: needs each rank's tokens to be a whole replica
    s.score = mr::score_function::softmax_before_topk;
    s.aux_loss_coeff = 1e-2;
    s.capacity_factor = 0.75;
  } else if (kind == "pad") {
    s.score = mr::score_function::softmax_before_topk;
    s.capacity_factor = 1.0;
    s.pad_to_capacity = true;
  } else if (kind == "bias") {  // aux-loss-free: the expert bias moves with the global counts
    s.score = mr::score_function::sigmoid;
    s.expert_bias = true;
    s.bias_update_rate = 1e-2;
  } else if (kind != "plain") {
    throw mm::input_error("unknown router kind " + kind);
  }
  return s;
}

/// Token values: the same function on every rank. Feature 0 is 1, so that the router weight's
/// column 0 can steer tokens (the skews).
double input_value(int s, int b, int h) {
  return h == 0 ? 1.0 : std::sin(0.7 * s + 1.9 * b + 0.31 * h + 0.05 * s * h);
}
double grad_value(int s, int b, int h) {
  return std::cos(1.1 * s - 0.6 * b + 0.23 * h);
}

using shard = mm::testing::sequence_shard;
using mm::testing::row_in;

template <class T, class F>
mm::row_matrix<T> table(shard const& sh, F&& value) {
  return mm::testing::shard_table<T>(sh, hidden, value);
}

using mm::testing::tally;

/// Sets router column 0 (the constant feature) so that the skew's experts win every token.
template <class Layer>
void apply_skew(Layer& layer, std::string const& skew) {
  if (skew == "none") return;
  layer.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    if (name.find("router.weight") == std::string_view::npos) return;
    for (int e = 0; e < experts; ++e) {
      bool favoured = false;
      if (skew == "one_rank")
        favoured = e < 2;  // the first EP rank's experts (EP <= 4)
      else if (skew == "few_experts")
        favoured = e == 1 || e == 6;
      else
        throw mm::input_error("unknown skew " + skew);
      value(e, 0) = favoured ? 4.0 : -4.0;
    }
  });
}

template <class Config, class OneRankConfig>
int run(mm::parallel::environment& env, options const& o) {
  using scalar = typename mm::moe_layer<Config>::scalar;
  double const rtol = std::is_same_v<scalar, double> ? 1e-9 : 1e-5;
  auto const& world = env.world();
  mm::parallel::process_groups const groups(world, o.degrees);
  auto const& l = groups.layout();
  auto const& tp_cp = groups.tp_cp();
  auto const& dp = groups.dp();
  if (o.positions % tp_cp.size() != 0 || o.sequences % dp.size() != 0)
    throw mm::parallel::agreed_input_error("the test batch does not split over this layout");
  mm::startup_values given;
  given.router = router_settings(o.router);
  int const replica_sequences = o.sequences / dp.size();

  mm::context ctx(1);
  mm::moe_layer<Config> layer(groups, 3, given);
  layer.initialize(11);
  apply_skew(layer, o.skew);
  mm::moe_layer<OneRankConfig> one(3, given);
  one.initialize(11);
  apply_skew(one, o.skew);

  tally result;
  // Each rank's expert weights: its share and no more.
  std::size_t expert_bytes = 0, one_expert_bytes = 0;
  layer.for_each_parameter([&](std::string_view, auto value, auto, mm::parameter_kind kind) {
    if (kind == mm::parameter_kind::expert) expert_bytes += value.size() * sizeof(scalar);
  });
  one.for_each_parameter([&](std::string_view, auto value, auto, mm::parameter_kind kind) {
    if (kind == mm::parameter_kind::expert) one_expert_bytes += value.size() * sizeof(scalar);
  });
  result.close("expert weight bytes", static_cast<double>(expert_bytes),
               static_cast<double>(one_expert_bytes) / (l.ep * l.etp), 1.0, 0.0);

  shard const replica{0, o.positions, dp.rank() * replica_sequences, replica_sequences};
  shard const mine{tp_cp.rank() * (o.positions / tp_cp.size()), o.positions / tp_cp.size(),
                   replica.first_sequence, replica.num_sequences};

  // The mapped layer: one micro-batch per rank.
  auto x = table<scalar>(mine, input_value);
  if (world.rank() == o.bad_input_on_rank) x.conservativeResize(x.rows(), hidden + 1);
  if (world.rank() == o.nan_on_rank) x(1, 2) = std::nan("");
  auto const out = layer.forward(ctx, x, mine.num_positions, mine.num_sequences);
  // The shared window is sized by the configuration's bound, not by this step's routing.
  if constexpr (requires { layer.dispatcher().window_expert_rows(); })
    result.close("window expert rows at the bound",
                 layer.dispatcher().window_expert_rows() >= layer.expert_rows_bound(0) ? 1.0 : 0.0,
                 1.0, 1.0, 0.0);
  mm::row_matrix<scalar> const y = out.y;
  auto const losses = out.losses;
  mm::row_matrix<scalar> const dx = layer.backward(ctx, table<scalar>(mine, grad_value));
  mm::parallel::reduce_gradients(groups, layer);
  layer.finish_global_batch();

  // One rank: every DP replica in turn (this rank's replica is compared row by row).
  mm::row_matrix<scalar> y_ref, dx_ref;
  mr::loss_values losses_ref;
  for (int d = 0; d < dp.size(); ++d) {
    shard const r{0, o.positions, d * replica_sequences, replica_sequences};
    auto const ref =
        one.forward(ctx, table<scalar>(r, input_value), r.num_positions, r.num_sequences);
    if (d == dp.rank()) {
      y_ref = ref.y;
      losses_ref = ref.losses;
    }
    mm::row_matrix<scalar> const g = one.backward(ctx, table<scalar>(r, grad_value));
    if (d == dp.rank()) dx_ref = g;
  }

  one.finish_global_batch();
  auto const& bias = layer.router().state().expert_bias;
  auto const& bias_ref = one.router().state().expert_bias;
  result.close("expert bias entries", static_cast<double>(bias.size()),
               static_cast<double>(bias_ref.size()), 1.0, 0.0);
  for (std::size_t e = 0; e < std::min(bias.size(), bias_ref.size()); ++e)
    result.close("expert bias " + std::to_string(e), bias[e], bias_ref[e], 1.0, 0.0);

  auto compare_rows = [&](char const* what, mm::row_matrix<scalar> const& got,
                          mm::row_matrix<scalar> const& ref) {
    double const scale = std::is_same_v<scalar, double> ? 1.0 : ref.cwiseAbs().maxCoeff();
    for (int t = 0; t < mine.tokens(); ++t)
      for (int h = 0; h < hidden; ++h) {
        double const expected = ref(row_in(replica, mine, t), h);
        result.close(std::string(what) + " token " + std::to_string(t), got(t, h), expected,
                     std::is_same_v<scalar, double> ? std::max(1.0, std::abs(expected)) : scale,
                     rtol);
      }
  };
  compare_rows("output", y, y_ref);
  compare_rows("input gradient", dx, dx_ref);

  auto sum = [&](double v) { return boost::mpi::all_reduce(tp_cp, v, std::plus<double>()); };
  auto compare_loss = [&](char const* what, auto const& mine_loss, auto const& ref_loss) {
    if (mine_loss.has_value() != ref_loss.has_value()) {
      result.close(std::string(what) + " present", 1.0, 0.0, 1.0, 0.0);
      return;
    }
    if (!ref_loss) return;
    result.close(what, sum(mine_loss->value), ref_loss->value,
                 std::max(1e-3, std::abs(ref_loss->value)), rtol);
  };
  compare_loss("aux loss", losses.aux_loss, losses_ref.aux_loss);
  compare_loss("seq aux loss", losses.seq_aux_loss, losses_ref.seq_aux_loss);
  compare_loss("z loss", losses.z_loss, losses_ref.z_loss);

  // Gradients: one rank's / (DP*CP), sliced to this rank's ETP shard.
  std::map<std::string, mm::row_matrix<scalar>, std::less<>> reference;
  one.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
    reference.emplace(std::string(name), grad / static_cast<scalar>(l.dp * l.cp));
  });
  int const Fl = layer.local_ffn(), offset = layer.ffn_offset();
  std::size_t visited = 0;
  layer.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
    ++visited;
    auto const it = reference.find(name);
    if (it == reference.end()) {
      result.close(std::string(name) + " has no one-rank twin", 1.0, 0.0, 1.0, 0.0);
      return;
    }
    auto const& full = it->second;
    bool const fc1 = name.find("mlp.experts.linear_fc1.weight") != std::string_view::npos;
    bool const fc2 = name.find("mlp.experts.linear_fc2.weight") != std::string_view::npos;
    double const scale = std::is_same_v<scalar, double> ? 1.0 : full.cwiseAbs().maxCoeff();
    for (Eigen::Index r = 0; r < grad.rows(); ++r)
      for (Eigen::Index c = 0; c < grad.cols(); ++c) {
        Eigen::Index fr = r, fc = c;
        if (fc1) fr = r < Fl ? offset + r : ffn + offset + (r - Fl);
        if (fc2) fc = offset + c;
        double const ref = full(fr, fc);
        result.close(std::string(name), grad(r, c), ref,
                     std::is_same_v<scalar, double> ? std::max(1.0, std::abs(ref)) : scale, rtol);
      }
  });
  int const local_parameters = 1 + 2 * (experts / l.ep) + 3;
  result.close("parameters visited", static_cast<double>(visited), local_parameters, 1.0, 0.0);

  std::ostringstream headline;
  headline << "moe_layer " << o.dispatcher << " " << o.precision << " router " << o.router
           << " skew " << o.skew << " memory " << o.memory << " on " << world.size()
           << " ranks (tp " << l.tp << " cp " << l.cp << " dp " << l.dp << " | etp " << l.etp
           << " ep " << l.ep << " edp " << l.edp << ")";
  return result.finish(world, headline.str(), "all equal the one-rank results");
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    options o;
    mm::parallel::check_on_every_rank(env.world(), [&] { o = parse(argc, argv); });
    using local = mm::dispatch::local;
    using one_rank = mm::parallel::mapping<>;
    if (o.memory == "moe_layer") {  // the whole layer, exchanges included, again in backward
      using P = mm::precision::fp64;
      using M = mm::memory::recompute<mm::memory::moe_layer>;
      if (o.dispatcher == "shared_memory")  // the input kept in the window, dispatched twice
        return run<layer_config<mm::dispatch::shared_memory, P, dynamic_mapping, M>,
                   layer_config<local, P, one_rank>>(env, o);
      if (o.dispatcher ==
          "shared_memory_overlap")  // backward's dispatch in pieces after a whole one
        return run<layer_config<mm::dispatch::shared_memory_overlap<2>, P, dynamic_mapping, M>,
                   layer_config<local, P, one_rank>>(env, o);
      if (o.dispatcher == "hierarchical_shared_memory")  // two dispatches in a row in the window
        return run<layer_config<mm::dispatch::hierarchical<mm::dispatch::shared_memory>, P,
                                dynamic_mapping, M>,
                   layer_config<local, P, one_rank>>(env, o);
      return run<layer_config<mm::dispatch::all_to_all, P, dynamic_mapping, M>,
                 layer_config<local, P, one_rank>>(env, o);
    }
    if (o.dispatcher == "local") {  // experts on every rank (EP = 1), tokens still sharded
      using P = mm::precision::fp64;
      return run<layer_config<local, P, dynamic_mapping>, layer_config<local, P, one_rank>>(env, o);
    }
    if (o.precision == "fp64") {
      using P = mm::precision::fp64;
      if (o.dispatcher == "hierarchical")
        return run<layer_config<mm::dispatch::hierarchical<>, P, dynamic_mapping>,
                   layer_config<local, P, one_rank>>(env, o);
      if (o.dispatcher == "all_gather")
        return run<layer_config<mm::dispatch::all_gather, P, dynamic_mapping>,
                   layer_config<local, P, one_rank>>(env, o);
      if (o.dispatcher == "shared_memory")
        return run<layer_config<mm::dispatch::shared_memory, P, dynamic_mapping>,
                   layer_config<local, P, one_rank>>(env, o);
      return run<layer_config<mm::dispatch::all_to_all, P, dynamic_mapping>,
                 layer_config<local, P, one_rank>>(env, o);
    }
    // Recipes on all-to-all with DP = 1: each expert sees the same rows as on one rank, and the
    // per-tensor amaxes are reduced over the ETP shards and the shared expert's sequence shards,
    // so the codes are the same. (With DP > 1 an expert quantizes all replicas' rows at once,
    // which one rank running the replicas in turn does not.)
    if (o.precision == "fp8_current") {
      using P = mm::precision::fp8_tensorwise<mm::precision::current>;
      return run<layer_config<mm::dispatch::all_to_all, P, dynamic_mapping>,
                 layer_config<local, P, one_rank>>(env, o);
    }
    if (o.precision == "mxfp8") {
      using P = mm::precision::mxfp8;
      return run<layer_config<mm::dispatch::all_to_all, P, dynamic_mapping>,
                 layer_config<local, P, one_rank>>(env, o);
    }
    if (o.precision != "fp32")
      throw mm::parallel::agreed_input_error("--precision fp64, fp32, fp8_current or mxfp8");
    using P = mm::precision::fp32;
    if (o.dispatcher == "all_gather")
      return run<layer_config<mm::dispatch::all_gather, P, dynamic_mapping>,
                 layer_config<local, P, one_rank>>(env, o);
    return run<layer_config<mm::dispatch::all_to_all, P, dynamic_mapping>,
               layer_config<local, P, one_rank>>(env, o);
  });
}
