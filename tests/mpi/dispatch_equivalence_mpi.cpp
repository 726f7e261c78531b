// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. A dispatcher against the flat all-to-all on the same process groups and
// tokens: outputs, input gradients and every parameter gradient must agree.
//
// --variant hierarchical: the node-aware dispatcher, for each emulated node count given
// (MEGAMOE_RANKS_PER_NODE = world / nodes):
//   - results differ only in the order of additions: 1e-12 relative in fp64, 1e-5 of the largest
//     entry in fp32;
//   - the token rows it sends across nodes equal the distinct (token, other node) pairs of this
//     rank's routing map, counted here from the map and the rank table; all_to_all's equal the
//     (token, expert on another node) pairs; summed over ranks, hierarchical never sends more, and
//     with --fewer-at M strictly fewer at M nodes.
// --variant overlap: all_to_all_overlap<pieces, 0> (2 or 4, no minimum piece size): bit for bit
//   the same results, in min(pieces, local experts) pieces; --pieces 0: all_to_all_overlap<2> with
//   its default minimum piece (1 MiB per rank), which these small exchanges stay below: one piece.
//
//   mpiexec -n 8 megamoe_dispatch_equivalence_mpi_tests --ep 8 --nodes 1,2,4 --experts 64
//       --top-k 8 [--tp 2] [--precision fp32] [--router pad] [--fewer-at 4]
//   mpiexec -n 2 megamoe_dispatch_equivalence_mpi_tests --variant overlap --pieces 4 --ep 2
#include "support/tally.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/model/moe_layer.hpp>
#include <megamoe/parallel/process_groups.hpp>

#include <boost/mpi/collectives/all_gather.hpp>
#include <boost/mpi/collectives/all_reduce.hpp>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mr = megamoe::router;

namespace {

using mm::testing::tally;

constexpr int hidden = 16, ffn = 12;

template <class Dispatch, class Precision>
using layer_config = mm::make_config<
    mm::shape<mm::hidden<hidden>, mm::ffn<ffn>, mm::experts<mm::dynamic>>, mr::runtime, Dispatch,
    mm::expert::mlp<mm::expert::swiglu>, Precision,
    mm::parallel::mapping<mm::parallel::tp<mm::dynamic>, mm::parallel::etp<mm::dynamic>,
                          mm::parallel::ep<mm::dynamic>>>;

struct options {
  mm::parallel::degrees degrees;
  std::vector<int> nodes{1};
  int experts = 8, top_k = 2, tokens = 24, fewer_at = 0, pieces = 2;
  std::string precision = "fp64", router = "aux", variant = "hierarchical";
};

options parse(int argc, char** argv) {
  options o;
  o.degrees.etp = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const key = argv[i], value = argv[i + 1];
    if (key == "--tp") {
      o.degrees.tp = std::stoi(value);
    } else if (key == "--ep") {
      o.degrees.ep = std::stoi(value);
    } else if (key == "--nodes") {
      o.nodes.clear();
      std::stringstream list(value);
      for (std::string n; std::getline(list, n, ',');) o.nodes.push_back(std::stoi(n));
    } else if (key == "--experts") {
      o.experts = std::stoi(value);
    } else if (key == "--top-k") {
      o.top_k = std::stoi(value);
    } else if (key == "--tokens") {
      o.tokens = std::stoi(value);
    } else if (key == "--fewer-at") {
      o.fewer_at = std::stoi(value);
    } else if (key == "--precision") {
      o.precision = value;
    } else if (key == "--router") {
      o.router = value;
    } else if (key == "--variant") {
      o.variant = value;
    } else if (key == "--pieces") {
      o.pieces = std::stoi(value);
    } else {
      throw mm::input_error("unknown argument " + key);
    }
  }
  return o;
}

mr::settings router_settings(options const& o) {
  mr::settings s;
  s.top_k = o.top_k;
  s.score = mr::score_function::softmax_before_topk;
  if (o.router == "aux") {
    s.aux_loss_coeff = 1e-2;
    s.z_loss_coeff = 1e-3;
  } else if (o.router == "pad") {
    s.capacity_factor = 1.0;
    s.pad_to_capacity = true;
  } else {
    throw mm::input_error("unknown router kind " + o.router);
  }
  return s;
}

/// This rank's tokens: different on every rank.
template <class T>
mm::row_matrix<T> tokens_of(int rank, int count, double phase) {
  mm::row_matrix<T> x(count, hidden);
  for (int t = 0; t < count; ++t)
    for (int h = 0; h < hidden; ++h)
      x(t, h) = static_cast<T>(std::sin(0.37 * t + 1.3 * rank + 0.21 * h + phase) +
                               0.1 * std::cos(0.05 * t * h));
  return x;
}

/// One node count: both dispatchers on the same tokens; returns this rank's mismatches.
template <class Dispatch, class Precision>
int compare_at(mm::parallel::environment& env, options const& o, int nodes, tally& result,
               std::int64_t (&rows)[2]) {
  using hier_layer = mm::moe_layer<layer_config<Dispatch, Precision>>;
  using flat_layer = mm::moe_layer<layer_config<mm::dispatch::all_to_all, Precision>>;
  using scalar = typename hier_layer::scalar;
  bool const fp64 = std::is_same_v<scalar, double>;
  bool const exact = hier_layer::overlapped;
  double const rtol = exact ? 0.0 : fp64 ? 1e-12 : 1e-5;
  auto const& world = env.world();
  int const per_node = world.size() / nodes;
  setenv("MEGAMOE_RANKS_PER_NODE", std::to_string(per_node).c_str(), 1);

  mm::parallel::process_groups const groups(world, o.degrees);
  mm::startup_values given;
  given.experts = o.experts;
  given.router = router_settings(o);
  mm::context ctx(1);
  hier_layer hier(groups, 0, given);
  flat_layer flat(groups, 0, given);
  hier.initialize(5);
  flat.initialize(5);

  auto const x = tokens_of<scalar>(world.rank(), o.tokens, 0.0);
  auto const dy = tokens_of<scalar>(world.rank(), o.tokens, 2.0);
  int const S = o.tokens / 2, B = 2;
  mm::row_matrix<scalar> const y_hier = hier.forward(ctx, x, S, B).y;
  mm::row_matrix<scalar> const dx_hier = hier.backward(ctx, dy);
  mm::row_matrix<scalar> const y_flat = flat.forward(ctx, x, S, B).y;
  mm::row_matrix<scalar> const dx_flat = flat.backward(ctx, dy);

  auto compare = [&](std::string const& what, auto const& got, auto const& ref) {
    double const scale = fp64 ? 1.0 : std::max(1e-30, double(ref.cwiseAbs().maxCoeff()));
    for (Eigen::Index r = 0; r < ref.rows(); ++r)
      for (Eigen::Index c = 0; c < ref.cols(); ++c) {
        double const e = ref(r, c);
        result.close(what, got(r, c), e, fp64 ? std::max(1.0, std::abs(e)) : scale, rtol);
      }
  };
  std::string const at = " (" + std::to_string(nodes) + " nodes)";
  compare("output" + at, y_hier, y_flat);
  compare("input gradient" + at, dx_hier, dx_flat);
  std::map<std::string, mm::row_matrix<scalar>, std::less<>> flat_grads;
  flat.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
    flat_grads.emplace(std::string(name), grad);
  });
  hier.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
    auto const it = flat_grads.find(name);
    if (it == flat_grads.end())
      result.close(std::string(name) + " missing", 1.0, 0.0, 1.0, 0.0);
    else
      compare(std::string(name) + at, grad, it->second);
  });

  // The node of every expert, from the EP group's world ranks and the emulated node size.
  auto const& ep = groups.ep();
  std::vector<int> world_of_ep;
  boost::mpi::all_gather(ep, world.rank(), world_of_ep);
  int const local = o.experts / ep.size();
  auto const node_of_expert = [&](int e) {
    return world_of_ep[static_cast<std::size_t>(e / local)] / per_node;
  };
  int const my_node = world.rank() / per_node;
  if constexpr (exact) {
    int const pieces = hier.dispatcher().overlap_pieces();
    result.close("overlap pieces", pieces, o.pieces == 0 ? 1 : std::min(o.pieces, local), 1.0, 0.0);
  } else {
    auto const& map = hier.router().output().routing_map;
    std::int64_t pairs = 0, expert_pairs = 0;
    if (o.router == "aux") {  // dropless: the rows are the routing map's entries
      for (Eigen::Index t = 0; t < map.rows(); ++t) {
        std::set<int> remote;
        for (int e = 0; e < o.experts; ++e)
          if (map(t, e) != 0 && node_of_expert(e) != my_node) {
            remote.insert(node_of_expert(e));
            ++expert_pairs;
          }
        pairs += static_cast<std::int64_t>(remote.size());
      }
      auto const& traffic = hier.dispatcher().traffic();
      result.close("inter-node token rows" + at, static_cast<double>(traffic.inter_node_rows),
                   static_cast<double>(pairs), 1.0, 0.0);
      result.close("inter-node token bytes" + at,
                   static_cast<double>(traffic.inter_node_bytes()) -
                       static_cast<double>(traffic.inter_node_meta_bytes),
                   static_cast<double>(pairs * hidden * std::int64_t{sizeof(scalar)}), 1.0, 0.0);
      std::int64_t flat_remote = 0;
      auto const splits = flat.dispatcher().send_splits();
      for (int j = 0; j < ep.size(); ++j)
        if (world_of_ep[static_cast<std::size_t>(j)] / per_node != my_node)
          flat_remote += splits[static_cast<std::size_t>(j)];
      result.close("all_to_all inter-node token rows" + at, static_cast<double>(flat_remote),
                   static_cast<double>(expert_pairs), 1.0, 0.0);
    }
    rows[0] = boost::mpi::all_reduce(world, pairs, std::plus<std::int64_t>());
    rows[1] = boost::mpi::all_reduce(world, expert_pairs, std::plus<std::int64_t>());
  }
  return result.failures;
}

template <class Dispatch, class Precision>
int run(mm::parallel::environment& env, options const& o) {
  auto const& world = env.world();
  tally result;
  result.against = "all_to_all";
  if constexpr (mm::moe_layer<layer_config<Dispatch, Precision>>::overlapped) {
    std::int64_t rows[2] = {0, 0};
    compare_at<Dispatch, Precision>(env, o, 1, result, rows);
  } else
    for (int nodes : o.nodes) {
      if (nodes < 1 || world.size() % nodes != 0)
        throw mm::parallel::agreed_input_error("--nodes " + std::to_string(nodes) +
                                               " does not divide the world");
      std::int64_t rows[2] = {0, 0};
      compare_at<Dispatch, Precision>(env, o, nodes, result, rows);
      if (o.router == "aux") {
        result.close("hierarchical sends no more across nodes than all_to_all (" +
                         std::to_string(nodes) + " nodes)",
                     static_cast<double>(std::max<std::int64_t>(0, rows[0] - rows[1])), 0.0, 1.0,
                     0.0);
        if (nodes == o.fewer_at)
          result.close("hierarchical sends fewer rows across nodes than all_to_all",
                       rows[0] < rows[1] ? 0.0 : 1.0, 0.0, 1.0, 0.0);
      }
      if (world.rank() == 0 && o.router == "aux")
        std::cout << "hierarchical vs all_to_all, " << nodes << " node(s) of "
                  << world.size() / nodes << " ranks: inter-node token rows " << rows[0] << " vs "
                  << rows[1] << "\n";
    }
  return result.finish(world,
                       std::string(Dispatch::name) + " " + o.precision + " router " + o.router +
                           " on " + std::to_string(world.size()) + " ranks",
                       "all equal all_to_all's");
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    options o;
    mm::parallel::check_on_every_rank(env.world(), [&] { o = parse(argc, argv); });
    if (o.variant == "overlap") {
      if (o.precision == "fp32") {
        if (o.pieces == 4)
          return run<mm::dispatch::all_to_all_overlap<4, 0>, mm::precision::fp32>(env, o);
        return run<mm::dispatch::all_to_all_overlap<2, 0>, mm::precision::fp32>(env, o);
      }
      if (o.pieces == 4)
        return run<mm::dispatch::all_to_all_overlap<4, 0>, mm::precision::fp64>(env, o);
      if (o.pieces == 0)
        return run<mm::dispatch::all_to_all_overlap<2>, mm::precision::fp64>(env, o);
      return run<mm::dispatch::all_to_all_overlap<2, 0>, mm::precision::fp64>(env, o);
    }
    if (o.precision == "fp32")
      return run<mm::dispatch::hierarchical<>, mm::precision::fp32>(env, o);
    return run<mm::dispatch::hierarchical<>, mm::precision::fp64>(env, o);
  });
}
