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
// --variant shared_memory: the shared-memory dispatcher in the layer, bit for bit (ETP <= 2), at
//   one node, also with two micro-batches in flight (park / restore); --nodes 2 (emulated) must
//   fail with R054 on every rank.
// --variant shared_memory_overlap: shared_memory_overlap<pieces> (2 or 4) in the layer, as
//   shared_memory (bit for bit all_to_all's up to ETP 2), in min(pieces, local experts) pieces.
// --variant shared_memory_overlap_alone: as shared_memory_alone below, with the dispatches through
//   forward and backward and a stand-in expert per piece that checks its rows are all there when
//   it starts and runs on the pool after 20 ms, so the waiting thread pulls the next piece
//   meanwhile; dy's rows are checked after NaN overwrote what the dispatch before left.
// --variant hierarchical_shared_memory: hierarchical<shared_memory> (exchange B through the node's
//   window), for each emulated node count given: against all_to_all as hierarchical is, bit for
//   bit against hierarchical<> (the same sums in the same order), with two micro-batches in flight
//   as well.
// --variant hierarchical_shared_memory_alone: hierarchical<shared_memory> against hierarchical<>
//   without a layer, as shared_memory_alone below, at the last node count given.
// --variant shared_memory_alone: the shared-memory dispatcher against the all-to-all dispatcher
//   without a layer, so that a rank can hold no tokens: three micro-batches of growing size
//   (the window grows twice), each planned, dispatched with probs and combined, then set aside;
//   then restored in reverse for dy's dispatch, a repeated dispatch (two of one kind in a row)
//   and combine_grad; every other exchange on the window's own expert rows (combined in place),
//   and the tokens of the others waiting in the window (token_rows(), as the layer keeps them).
//   Every row, prob, output and gradient bit for bit.
//
// --variant fp8_wire: dispatch::fp8_wire<Base> (all_to_all; fp8_wire_overlap: all_to_all_overlap<2,
//   0>) against Base under the same recipe (--precision fp8_delayed, fp8_current,
//   mxfp8_wgrad_from_rowwise or blockwise_wgrad_from_rowwise, the last with all_to_all alone),
//   over three training steps whose inputs grow (delayed scaling's scales change between them):
//   outputs, input gradients and every parameter gradient bit for bit, Base's token bytes times
//   the wire's row bytes over 4 H (codes, and block scales) on the wire; --memory moe_layer
//   recomputes the layer (the codes' dispatch again in backward); --expect-empty 1: some rank's
//   experts receive no row in some step (a first dispatch with nothing to receive included).
//
//   mpiexec -n 8 megamoe_dispatch_equivalence_mpi_tests --ep 8 --nodes 1,2,4 --experts 64
//       --top-k 8 [--tp 2] [--precision fp32] [--router pad] [--fewer-at 4]
//   mpiexec -n 2 megamoe_dispatch_equivalence_mpi_tests --variant overlap --pieces 4 --ep 2
#include "support/tally.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/dispatch/all_to_all.hpp>
#include <megamoe/dispatch/dispatcher.hpp>
#include <megamoe/dispatch/hierarchical.hpp>
#include <megamoe/dispatch/shared_memory.hpp>
#include <megamoe/model/moe_layer.hpp>
#include <megamoe/model/moe_wire.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/precision/operands.hpp>

#include <boost/mpi/collectives/all_gather.hpp>
#include <boost/mpi/collectives/all_reduce.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace mm = megamoe;
namespace mr = megamoe::router;
namespace md = megamoe::dispatch;

namespace {

using mm::testing::tally;

constexpr int hidden = 16, ffn = 12;

template <class Dispatch, class Precision, class Memory = mm::memory::keep_all, int Hidden = hidden>
using layer_config = mm::make_config<
    mm::shape<mm::hidden<Hidden>, mm::ffn<ffn>, mm::experts<mm::dynamic>>, mr::runtime, Dispatch,
    mm::expert::mlp<mm::expert::swiglu>, Precision,
    mm::parallel::mapping<mm::parallel::tp<mm::dynamic>, mm::parallel::etp<mm::dynamic>,
                          mm::parallel::ep<mm::dynamic>>,
    Memory>;

struct options {
  mm::parallel::degrees degrees;
  std::vector<int> nodes{1};
  int experts = 8, top_k = 2, tokens = 24, fewer_at = 0, pieces = 2;
  std::string precision = "fp64", router = "aux", variant = "hierarchical", memory = "keep_all";
  bool expect_empty = false;  // fp8_wire: some rank's experts receive no row in some step
};

options parse(int argc, char** argv) {
  options o;
  o.degrees.etp = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const key = argv[i], value = argv[i + 1];
    if (key == "--tp") {
      o.degrees.tp = std::stoi(value);
    } else if (key == "--etp") {
      o.degrees.etp = std::stoi(value);
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
    } else if (key == "--memory") {
      o.memory = value;
    } else if (key == "--expect-empty") {
      o.expect_empty = value == "1";
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
mm::row_matrix<T> tokens_of(int rank, int count, double phase, int width = hidden) {
  mm::row_matrix<T> x(count, width);
  for (int t = 0; t < count; ++t)
    for (int h = 0; h < width; ++h)
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
  constexpr bool shared = Dispatch::value == mm::dispatch::dispatcher::shared_memory;
  constexpr bool node_window = mm::dispatch::intra_node_shared<Dispatch>();
  bool const exact = shared ? o.degrees.etp <= 2 : hier_layer::overlapped;
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
  if constexpr (node_window) {  // bit for bit hierarchical<>'s
    mm::moe_layer<layer_config<mm::dispatch::hierarchical<>, Precision>> twin(groups, 0, given);
    twin.initialize(5);
    mm::row_matrix<scalar> const y_twin = twin.forward(ctx, x, S, B).y;
    mm::row_matrix<scalar> const dx_twin = twin.backward(ctx, dy);
    auto same = [&](std::string const& what, auto const& got, auto const& ref) {
      for (Eigen::Index r = 0; r < ref.rows(); ++r)
        for (Eigen::Index c = 0; c < ref.cols(); ++c)
          result.close(what + ", against hierarchical<>", got(r, c), ref(r, c), 1.0, 0.0);
    };
    same("output" + at, y_hier, y_twin);
    same("input gradient" + at, dx_hier, dx_twin);
    std::map<std::string, mm::row_matrix<scalar>, std::less<>> twin_grads;
    twin.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
      twin_grads.emplace(std::string(name), grad);
    });
    hier.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
      if (auto const it = twin_grads.find(name); it != twin_grads.end())
        same(std::string(name) + at, grad, it->second);
    });
    result.close("node window allocated once" + at, hier.dispatcher().window_allocations(), 1, 1.0,
                 0.0);
  }
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
  if constexpr (shared) {
    auto const counts = hier.dispatcher().chunks().counts();
    auto const flat_counts = flat.dispatcher().global_counts();
    for (std::size_t i = 0; i < counts.size(); ++i)
      result.close("count table", static_cast<double>(counts[i]),
                   static_cast<double>(flat_counts[i]), 1.0, 0.0);
    result.close("shared window allocated once", hier.dispatcher().window_allocations(), 1, 1.0,
                 0.0);
  }
  if constexpr (hier_layer::overlapped) {
    int const pieces = hier.dispatcher().overlap_pieces();
    result.close("overlap pieces", pieces, o.pieces == 0 ? 1 : std::min(o.pieces, local), 1.0, 0.0);
  } else if constexpr (!shared) {
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
  if constexpr (shared || node_window) {
    // Two micro-batches in flight (last: the checks above read the last plan), in a pipeline's
    // order: park sets each input aside (out of the window, where the next forward's input goes),
    // then both backwards in reverse.
    auto const x2 = tokens_of<scalar>(world.rank(), o.tokens, 4.0);
    auto const dy2 = tokens_of<scalar>(world.rank(), o.tokens, 5.0);
    auto pipelined = [&](auto& layer) {
      std::vector<mm::row_matrix<scalar>> got;
      got.emplace_back(layer.forward(ctx, x, S, B).y);
      layer.park(1);
      got.emplace_back(layer.forward(ctx, x2, S, B).y);
      layer.park(2);
      layer.restore(2);
      got.emplace_back(layer.backward(ctx, dy2));
      layer.restore(1);
      got.emplace_back(layer.backward(ctx, dy));
      return got;
    };
    auto const in_flight = pipelined(hier);
    auto const in_flight_flat = pipelined(flat);
    std::string const names[] = {"output, first in flight", "output, second in flight",
                                 "input gradient, second in flight",
                                 "input gradient, first in flight"};
    for (std::size_t i = 0; i < in_flight.size(); ++i)
      compare(names[i] + at, in_flight[i], in_flight_flat[i]);
  }
  return result.failures;
}

template <class Dispatch, class Precision>
int run(mm::parallel::environment& env, options const& o) {
  auto const& world = env.world();
  tally result;
  result.against = "all_to_all";
  if constexpr (mm::moe_layer<layer_config<Dispatch, Precision>>::overlapped ||
                Dispatch::value == mm::dispatch::dispatcher::shared_memory) {
    std::int64_t rows[2] = {0, 0};
    compare_at<Dispatch, Precision>(env, o, o.nodes.back(), result, rows);
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
  return result.finish(
      world,
      std::string(Dispatch::name) + (md::intra_node_shared<Dispatch>() ? "<shared_memory> " : " ") +
          o.precision + " router " + o.router + " on " + std::to_string(world.size()) + " ranks",
      "all equal all_to_all's");
}

/// This rank's routing of `count` tokens: top_k distinct experts per token, different on every rank
/// and micro-batch, some experts left empty on some ranks; probs in (0, 1).
template <class T>
std::pair<mm::mask_matrix, mm::row_matrix<T>> routing_of(int rank, int count, int micro,
                                                         options const& o) {
  mm::mask_matrix map = mm::mask_matrix::Zero(count, o.experts);
  mm::row_matrix<T> probs = mm::row_matrix<T>::Zero(count, o.experts);
  for (int t = 0; t < count; ++t)
    for (int c = 0, e = (t * 7 + rank * 3 + micro * 5) % o.experts; c < o.top_k;
         ++c, e = (e + 1 + (t + c) % 3) % o.experts) {
      while (map(t, e) != 0) e = (e + 1) % o.experts;
      map(t, e) = 1;
      probs(t, e) = static_cast<T>(0.1 + 0.8 * std::abs(std::sin(0.3 * t + e + rank)));
    }
  return {std::move(map), std::move(probs)};
}

/// Where each local expert's rows start, and the end: [L + 1].
std::vector<int> row_starts(std::span<std::int64_t const> per_expert) {
  std::vector<int> start(per_expert.size() + 1, 0);
  for (std::size_t l = 0; l < per_expert.size(); ++l)
    start[l + 1] = start[l] + static_cast<int>(per_expert[l]);
  return start;
}

/// Runs `expert` as a task on the pool after 20 ms, so that its caller waits meanwhile (and its
/// wait hook pulls the next piece while the task works on this one).
template <class Expert>
void on_pool_after_waiting(mm::thread_pool& pool, Expert const& expert) {
  pool.run(1, [&](int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    expert();
  });
}

/// Flat: the reference dispatcher; Shared: the one under test, whose window grows.
template <class T, class Flat, class Shared>
int dispatchers_alone(mm::parallel::environment& env, options const& o, char const* against,
                      std::string const& what) {
  auto const& world = env.world();
  tally result;
  result.against = against;
  if (world.size() % o.nodes.back() != 0)
    throw mm::parallel::agreed_input_error("--nodes does not divide the world");
  setenv("MEGAMOE_RANKS_PER_NODE", std::to_string(world.size() / o.nodes.back()).c_str(), 1);
  mm::parallel::process_groups const groups(world, o.degrees);
  mm::dispatch::expert_groups const experts(groups, o.experts);
  constexpr bool overlapped = requires {
    requires Shared::overlapped;
  };
  Flat flat(experts, hidden);
  Shared shared = [&] {
    if constexpr (overlapped)
      return Shared(experts, hidden, o.pieces);
    else
      return Shared(experts, hidden);
  }();
  mm::stage_times times;
  std::int64_t pulled_in_backward = 0;  // rows dy's dispatches pulled while experts computed
  // shared_memory keeps tokens and expert rows in its window; hierarchical<shared_memory> does not.
  constexpr bool rows_in_window = requires {
    shared.expert_output_rows();
  };
  mm::thread_pool pool(2);
  auto same = [&](std::string const& what, T const* got, T const* ref, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i)
      result.close(what, static_cast<double>(got[i]), static_cast<double>(ref[i]), 1.0, 0.0);
  };
  constexpr int micro_batches = 3;
  using matrix = mm::row_matrix<T>;
  std::vector<int> tokens(micro_batches);
  std::vector<mm::row_matrix<T>> probs(micro_batches);
  for (int m = 0; m < micro_batches; ++m) {
    // Rank 1 holds no tokens; the others more in each micro-batch.
    tokens[m] = world.rank() == 1 ? 0 : o.tokens * (m + 1);
    auto [map, p] = routing_of<T>(world.rank(), tokens[m], m, o);
    probs[m] = p;
    flat.plan(pool, map, 0);
    shared.plan(pool, map, 0);
    int const N = flat.expert_rows();
    result.close("expert rows", shared.expert_rows(), N, 1.0, 0.0);
    matrix const x = tokens_of<T>(world.rank(), tokens[m], m);
    matrix rows_flat(N, hidden), rows_own(N, hidden), out_flat(tokens[m], hidden),
        out_shared(tokens[m], hidden);
    // Odd micro-batches use the window's own expert rows (combined in place).
    bool const in_place = rows_in_window && m % 2 == 1;
    T* rows_shared = rows_own.data();
    std::vector<T> row_probs_flat(N), row_probs_shared(N);
    T const* from = x.data();
    if constexpr (rows_in_window) {
      if (in_place) {
        rows_shared = shared.expert_output_rows();
      } else {  // the tokens wait in the window
        T* waiting = shared.token_rows();
        std::copy_n(x.data(), x.size(), waiting);
        from = waiting;
      }
    }
    flat.dispatch(pool, x.data(), rows_flat.data(), probs[m], row_probs_flat.data());
    std::string const at = " (micro-batch " + std::to_string(m) + (in_place ? ", in place)" : ")");
    // A stand-in expert: each row scaled by its prob and its place.
    auto expert = [&](T* rows, int begin, int end) {
      for (int r = begin; r < end; ++r) {
        T const scale = row_probs_flat[static_cast<std::size_t>(r)] * static_cast<T>(1 + r % 5);
        for (int h = 0; h < hidden; ++h) rows[std::ptrdiff_t{r} * hidden + h] *= scale;
      }
    };
    if constexpr (overlapped) {
      auto const start = row_starts(shared.tokens_per_local_expert());
      shared.forward(pool, times, from, rows_shared, probs[m], row_probs_shared.data(), rows_shared,
                     out_shared.data(), [&](int first, int last) {
                       int const begin = start[first], end = start[last];
                       same("rows when their piece starts" + at,
                            rows_shared + std::ptrdiff_t{begin} * hidden,
                            rows_flat.data() + std::ptrdiff_t{begin} * hidden,
                            std::int64_t{end - begin} * hidden);
                       same("probs when their piece starts" + at, row_probs_shared.data() + begin,
                            row_probs_flat.data() + begin, end - begin);
                       on_pool_after_waiting(pool, [&] { expert(rows_shared, begin, end); });
                     });
      expert(rows_flat.data(), 0, N);
      flat.combine(pool, rows_flat.data(), out_flat.data());
    } else {
      shared.dispatch(pool, from, rows_shared, probs[m], row_probs_shared.data());
      same("dispatched rows" + at, rows_shared, rows_flat.data(), rows_flat.size());
      same("dispatched probs" + at, row_probs_shared.data(), row_probs_flat.data(), N);
      expert(rows_flat.data(), 0, N);
      expert(rows_shared, 0, N);
      flat.combine(pool, rows_flat.data(), out_flat.data());
      shared.combine(pool, rows_shared, out_shared.data());
    }
    same("combined tokens" + at, out_shared.data(), out_flat.data(), out_flat.size());
    flat.park(static_cast<std::uint64_t>(m));
    shared.park(static_cast<std::uint64_t>(m));
  }
  int const allocations = shared.window_allocations();
  if constexpr (rows_in_window)
    result.close("window allocations (growing twice)", allocations, 3, 1.0, 0.0);
  else  // sized by the node's largest need, which may stay within the first quarter's margin
    result.close("window grown", allocations >= 2 ? 1.0 : 0.0, 1.0, 1.0, 0.0);
  for (int m = micro_batches - 1; m >= 0; --m) {
    flat.restore(static_cast<std::uint64_t>(m));
    shared.restore(static_cast<std::uint64_t>(m));
    int const N = flat.expert_rows();
    matrix const dy = tokens_of<T>(world.rank(), tokens[m], 7.0 + m);
    matrix grad_flat(N, hidden), grad_own(N, hidden);
    bool const in_place = rows_in_window && m % 2 == 0;
    T* grad_shared = grad_own.data();
    if constexpr (rows_in_window)
      if (in_place) grad_shared = shared.expert_output_rows();
    flat.dispatch(pool, dy.data(), grad_flat.data());
    shared.dispatch(pool, dy.data(), grad_shared);
    std::string const at =
        " (backward, micro-batch " + std::to_string(m) + (in_place ? ", in place)" : ")");
    // The stand-in expert's backward: rows scaled by their place, the probs' gradients their sums.
    std::vector<T> grad_row_probs(N), grad_row_probs_flat(N);
    auto expert_backward = [&](T* rows, T* row_probs, int begin, int end) {
      for (int r = begin; r < end; ++r) {
        auto const scale = static_cast<T>(0.5 + r % 3);
        T sum = 0;
        for (int h = 0; h < hidden; ++h) sum += rows[std::ptrdiff_t{r} * hidden + h] *= scale;
        row_probs[r] = sum;
      }
    };
    matrix dx_flat = tokens_of<T>(world.rank(), tokens[m], 3.0), dx_shared = dx_flat;
    matrix grad_probs_flat = matrix::Zero(tokens[m], o.experts),
           grad_probs_shared = grad_probs_flat;
    if constexpr (overlapped) {  // the dispatch above and the backward's: two in a row
      // What the first left is overwritten (allowed between a dispatch and the next), so that the
      // backward's pieces are checked on rows it pulled itself.
      std::fill_n(grad_shared, grad_flat.size(), std::numeric_limits<T>::quiet_NaN());
      auto const start = row_starts(shared.tokens_per_local_expert());
      std::int64_t const pulled_before = shared.rows_pulled_while_computing();
      shared.backward(pool, times, dy.data(), grad_shared, grad_row_probs.data(), dx_shared.data(),
                      grad_probs_shared, [&](int first, int last) {
                        int const begin = start[first], end = start[last];
                        same("gradient rows when their piece starts" + at,
                             grad_shared + std::ptrdiff_t{begin} * hidden,
                             grad_flat.data() + std::ptrdiff_t{begin} * hidden,
                             std::int64_t{end - begin} * hidden);
                        on_pool_after_waiting(pool, [&] {
                          expert_backward(grad_shared, grad_row_probs.data(), begin, end);
                        });
                      });
      pulled_in_backward += shared.rows_pulled_while_computing() - pulled_before;
      expert_backward(grad_flat.data(), grad_row_probs_flat.data(), 0, N);
    } else {
      shared.dispatch(pool, dy.data(), grad_shared);  // twice in a row: fenced between
      same("dispatched gradient rows" + at, grad_shared, grad_flat.data(), grad_flat.size());
      expert_backward(grad_flat.data(), grad_row_probs_flat.data(), 0, N);
      expert_backward(grad_shared, grad_row_probs.data(), 0, N);
      shared.combine_grad(pool, grad_shared, grad_row_probs.data(), dx_shared.data(),
                          grad_probs_shared);
    }
    flat.combine_grad(pool, grad_flat.data(), grad_row_probs_flat.data(), dx_flat.data(),
                      grad_probs_flat);
    same("input gradient" + at, dx_shared.data(), dx_flat.data(), dx_flat.size());
    same("prob gradients" + at, grad_probs_shared.data(), grad_probs_flat.data(),
         grad_probs_flat.size());
  }
  result.close("window allocations after restoring", shared.window_allocations(), allocations, 1.0,
               0.0);
  if constexpr (overlapped) {  // the pieces after the first arrived while the experts waited
    std::int64_t const pulled = boost::mpi::all_reduce(world, shared.rows_pulled_while_computing(),
                                                       std::plus<std::int64_t>());
    result.close("rows pulled while experts computed, summed over ranks, above 0",
                 pulled > 0 ? 1.0 : 0.0, 1.0, 1.0, 0.0);
    result.close("rows of dy pulled while experts computed, summed over ranks, above 0",
                 boost::mpi::all_reduce(world, pulled_in_backward, std::plus<std::int64_t>()) > 0
                     ? 1.0
                     : 0.0,
                 1.0, 1.0, 0.0);
    result.close(
        "rows pulled while experts computed, at most the rows pulled",
        shared.rows_pulled_while_computing() <= shared.rows_pulled_overlapped() ? 1.0 : 0.0, 1.0,
        1.0, 0.0);
    result.close("overlap pieces", shared.overlap_pieces(),
                 std::min(o.pieces, experts.local_experts()), 1.0, 0.0);
  }
  return result.finish(world,
                       what + " alone, " + o.precision + ", etp " + std::to_string(o.degrees.etp) +
                           " on " + std::to_string(world.size()) + " ranks (rank 1 without tokens)",
                       (std::string("all equal ") + against + "'s").c_str());
}

/// dispatch::fp8_wire<Base> against Base, both under Precision. Block-scaled rows are 160 wide:
/// five MXFP8 blocks, or a blockwise block and a partial one.
template <class Base, class Precision, class Memory>
int wire_run(mm::parallel::environment& env, options const& o) {
  constexpr int H = mm::precision::format_of(Precision::value, mm::precision::operand_role::input,
                                             mm::precision::operand_usage::rowwise)
                                .scale == mm::precision::scale_kind::per_tensor
                        ? hidden
                        : 160;
  using wire_layer = mm::moe_layer<layer_config<md::fp8_wire<Base>, Precision, Memory, H>>;
  using base_layer = mm::moe_layer<layer_config<Base, Precision, Memory, H>>;
  static_assert(wire_layer::fp8_wire && !base_layer::fp8_wire);
  auto const& world = env.world();
  tally result;
  result.against = Base::name.data();  // a literal: terminated
  mm::parallel::process_groups const groups(world, o.degrees);
  mm::startup_values given;
  given.experts = o.experts;
  given.router = router_settings(o);
  mm::context ctx(1);
  wire_layer wire(groups, 0, given);
  base_layer base(groups, 0, given);
  wire.initialize(5);
  base.initialize(5);
  auto same = [&](std::string const& what, auto const& got, auto const& ref) {
    for (Eigen::Index r = 0; r < ref.rows(); ++r)
      for (Eigen::Index c = 0; c < ref.cols(); ++c)
        result.close(what, got(r, c), ref(r, c), 1.0, 0.0);
  };
  int const S = o.tokens / 2, B = 2;
  std::int64_t wire_bytes = 0, base_bytes = 0;
  int empty = 0;  // steps in which this rank's experts received no row
  for (int step = 0; step < 3; ++step) {
    std::string const at = " (step " + std::to_string(step) + ")";
    // Every fifth feature 1e-4 as large: FP8 subnormals within a row's block, normal numbers
    // along the tokens, so requantizing the rowwise codes differs from quantizing the values.
    mm::row_matrix<float> x =
        tokens_of<float>(world.rank(), o.tokens, 0.5 * step, H) * static_cast<float>(1 + 3 * step);
    for (int h = 0; h < H; h += 5) x.col(h) *= 1e-4F;
    auto const dy = tokens_of<float>(world.rank(), o.tokens, 2.0 + step, H);
    wire.zero_grad();
    base.zero_grad();
    mm::row_matrix<float> const y_wire = wire.forward(ctx, x, S, B).y;
    wire_bytes += wire.dispatcher().token_bytes_sent();
    empty += wire.dispatcher().expert_rows() == 0 ? 1 : 0;
    mm::row_matrix<float> const dx_wire = wire.backward(ctx, dy);
    mm::row_matrix<float> const y_base = base.forward(ctx, x, S, B).y;
    base_bytes += base.dispatcher().token_bytes_sent();
    mm::row_matrix<float> const dx_base = base.backward(ctx, dy);
    same("output" + at, y_wire, y_base);
    same("input gradient" + at, dx_wire, dx_base);
    std::map<std::string, mm::row_matrix<float>, std::less<>> base_grads;
    base.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
      base_grads.emplace(std::string(name), grad);
    });
    wire.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
      auto const it = base_grads.find(name);
      if (it == base_grads.end())
        result.close(std::string(name) + " missing", 1.0, 0.0, 1.0, 0.0);
      else
        same(std::string(name) + at, grad, it->second);
    });
  }
  // Delayed scaling's histories and scales after three steps.
  std::vector<float> wire_state, base_state;
  wire.for_each_persistent_state([&](auto const& state) {
    wire_state.insert(wire_state.end(), state.values.begin(), state.values.end());
  });
  base.for_each_persistent_state([&](auto const& state) {
    base_state.insert(base_state.end(), state.values.begin(), state.values.end());
  });
  result.close("persistent state entries", static_cast<double>(wire_state.size()),
               static_cast<double>(base_state.size()), 1.0, 0.0);
  for (std::size_t i = 0; i < std::min(wire_state.size(), base_state.size()); ++i)
    result.close("persistent state", wire_state[i], base_state[i], 1.0, 0.0);
  // Base sends H floats per row, the wire a row of codes (and block scales).
  auto const row_bytes =
      static_cast<std::int64_t>(wire_layer::operands_type::wire_row_bytes(wire.hidden_size()));
  result.close("token bytes on the wire, per row",
               static_cast<double>(wire_bytes * 4 * wire.hidden_size()),
               static_cast<double>(base_bytes * row_bytes), 1.0, 0.0);
  result.close("dispatcher's code row bytes",
               static_cast<double>(wire.dispatcher().code_row_bytes()),
               static_cast<double>(row_bytes), 1.0, 0.0);
  auto const all_bytes = boost::mpi::all_reduce(world, wire_bytes, std::plus<std::int64_t>());
  result.close("codes crossed the wire", all_bytes > 0 ? 1.0 : 0.0, 1.0, 1.0, 0.0);
  if constexpr (wire_layer::overlapped)
    result.close("overlap pieces", wire.dispatcher().overlap_pieces(),
                 std::min(2, o.experts / o.degrees.ep), 1.0, 0.0);
  auto const all_base_bytes = boost::mpi::all_reduce(world, base_bytes, std::plus<std::int64_t>());
  int const all_empty = boost::mpi::all_reduce(world, empty, std::plus<int>());
  if (o.expect_empty)
    result.close("some rank's experts received no row", all_empty > 0 ? 1.0 : 0.0, 1.0, 1.0, 0.0);
  if (world.rank() == 0)
    std::cout << "fp8_wire: token bytes sent over 3 steps, all ranks: codes " << all_bytes << ", "
              << Base::name << " " << all_base_bytes << "; ranks x steps without expert rows "
              << all_empty << "\n";
  return result.finish(world,
                       std::string("fp8_wire<") + std::string(Base::name) + "> " + o.precision +
                           " router " + o.router + " memory " + o.memory + " on " +
                           std::to_string(world.size()) + " ranks",
                       "all equal the codes made after the dispatch");
}

template <class Precision>
int wire_run_for(mm::parallel::environment& env, options const& o) {
  if constexpr (Precision::value.recipe == mm::precision::recipe_id::fp8_blockwise) {
    if (o.variant != "fp8_wire" || o.memory != "keep_all")
      throw mm::parallel::agreed_input_error("fp8_wire: blockwise runs the plain exchange alone");
    return wire_run<md::all_to_all, Precision, mm::memory::keep_all>(env, o);
  }
  using recompute = mm::memory::recompute<mm::memory::moe_layer>;
  if (o.variant == "fp8_wire_overlap")
    return wire_run<md::all_to_all_overlap<2, 0>, Precision, mm::memory::keep_all>(env, o);
  if (o.memory == "moe_layer") return wire_run<md::all_to_all, Precision, recompute>(env, o);
  return wire_run<md::all_to_all, Precision, mm::memory::keep_all>(env, o);
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    options o;
    mm::parallel::check_on_every_rank(env.world(), [&] { o = parse(argc, argv); });
    if (o.variant == "fp8_wire" || o.variant == "fp8_wire_overlap") {
      namespace mp = mm::precision;
      if (o.precision == "fp8_delayed")
        return wire_run_for<mp::fp8_tensorwise<mp::delayed>>(env, o);
      if (o.precision == "fp8_current")
        return wire_run_for<mp::fp8_tensorwise<mp::current>>(env, o);
      if (o.precision == "mxfp8_wgrad_from_rowwise")
        return wire_run_for<mp::wgrad_from_rowwise<mp::mxfp8>>(env, o);
      if (o.precision == "blockwise_wgrad_from_rowwise")
        return wire_run_for<mp::wgrad_from_rowwise<mp::fp8_blockwise>>(env, o);
      throw mm::parallel::agreed_input_error(
          "fp8_wire: --precision fp8_delayed, fp8_current, mxfp8_wgrad_from_rowwise or "
          "blockwise_wgrad_from_rowwise");
    }
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
    if (o.variant == "shared_memory") {  // --nodes N > 1: R054 on every rank
      if (o.precision == "fp32")
        return run<mm::dispatch::shared_memory, mm::precision::fp32>(env, o);
      return run<mm::dispatch::shared_memory, mm::precision::fp64>(env, o);
    }
    if (o.variant == "shared_memory_overlap") {
      if (o.precision == "fp32")
        return o.pieces == 4
                   ? run<mm::dispatch::shared_memory_overlap<4>, mm::precision::fp32>(env, o)
                   : run<mm::dispatch::shared_memory_overlap<2>, mm::precision::fp32>(env, o);
      return o.pieces == 4
                 ? run<mm::dispatch::shared_memory_overlap<4>, mm::precision::fp64>(env, o)
                 : run<mm::dispatch::shared_memory_overlap<2>, mm::precision::fp64>(env, o);
    }
    if (o.variant == "shared_memory_overlap_alone") {
      if (o.precision == "fp32")
        return dispatchers_alone<float, md::all_to_all_dispatcher<float, float>,
                                 md::shared_memory_dispatcher<float, float, true>>(
            env, o, "all_to_all", "shared_memory_overlap");
      return dispatchers_alone<double, md::all_to_all_dispatcher<double, double>,
                               md::shared_memory_dispatcher<double, double, true>>(
          env, o, "all_to_all", "shared_memory_overlap");
    }
    if (o.variant == "shared_memory_alone") {
      if (o.precision == "fp32")
        return dispatchers_alone<float, md::all_to_all_dispatcher<float, float>,
                                 md::shared_memory_dispatcher<float, float>>(env, o, "all_to_all",
                                                                             "shared_memory");
      return dispatchers_alone<double, md::all_to_all_dispatcher<double, double>,
                               md::shared_memory_dispatcher<double, double>>(env, o, "all_to_all",
                                                                             "shared_memory");
    }
    if (o.variant == "hierarchical_shared_memory_alone") {
      if (o.precision == "fp32")
        return dispatchers_alone<float, md::hierarchical_dispatcher<float, float>,
                                 md::hierarchical_dispatcher<float, float, true>>(
            env, o, "hierarchical<>", "hierarchical<shared_memory>");
      return dispatchers_alone<double, md::hierarchical_dispatcher<double, double>,
                               md::hierarchical_dispatcher<double, double, true>>(
          env, o, "hierarchical<>", "hierarchical<shared_memory>");
    }
    if (o.variant == "hierarchical_shared_memory") {
      if (o.precision == "fp32")
        return run<md::hierarchical<md::shared_memory>, mm::precision::fp32>(env, o);
      return run<md::hierarchical<md::shared_memory>, mm::precision::fp64>(env, o);
    }
    if (o.precision == "fp32")
      return run<mm::dispatch::hierarchical<>, mm::precision::fp32>(env, o);
    return run<mm::dispatch::hierarchical<>, mm::precision::fp64>(env, o);
  });
}
