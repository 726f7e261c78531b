// SPDX-License-Identifier: Apache-2.0
// ep_layer_bench — forward + backward of one MoE layer over EP ranks (run under mpiexec; EP = the
// number of ranks, ETP = 1), two dispatchers alternating in one run.
//
//   mpiexec -n 2 build/benchmarks/ep_layer_bench --compare overlap --shape A [--rounds 11]
//   MEGAMOE_RANKS_PER_NODE=2 mpiexec -n 8 build/benchmarks/ep_layer_bench --compare hierarchical
//       --shape B
//   mpiexec -n 4 build/benchmarks/ep_layer_bench --compare shared_memory --shape A
//   MEGAMOE_RANKS_PER_NODE=2 mpiexec -n 4 build/benchmarks/ep_layer_bench
//       --compare hierarchical_shared_memory --shape C
//   mpiexec -n 4 build/benchmarks/ep_layer_bench --compare shared_memory_overlap --shape C
//   mpiexec -n 4 build/benchmarks/ep_layer_bench --compare fp8_wire --shape C
//
// --compare overlap: all_to_all (blocking) against all_to_all_overlap<4> (exchanges in pieces of
// local experts, overlapped with expert compute). --compare hierarchical: all_to_all against the
// node-aware dispatcher (nodes from MEGAMOE_RANKS_PER_NODE or shared memory). --compare
// shared_memory: all_to_all against the shared-memory dispatcher (one node). --compare
// hierarchical_shared_memory: hierarchical<> against hierarchical<shared_memory> (exchange B
// through the node's window). --compare shared_memory_overlap: shared_memory against
// shared_memory_overlap<4> (the dispatches' pulls in pieces of local experts, overlapped with
// their compute; the fraction of rank 0's rows pulled while experts computed is reported).
// --compare fp8_wire: all_to_all against fp8_wire<all_to_all> (the forward's token rows as FP8
// codes), both under fp8_tensorwise<current>; fp8_wire_mxfp8 the same under
// wgrad_from_rowwise<mxfp8> (codes and E8M0 block scales) (the other comparisons run fp32). Each
// rank holds tokens/EP of the shape's tokens (random, seeded per rank); both layers start from the
// same weights. A round times `--iters` steps of each variant, alternating which goes first; a
// step's time is the slowest rank's. Reported: per variant the median, min and max over rounds, and
// the median and range of the per-round ratio (second / first). Bytes: what one dispatch sends from
// each rank to other ranks (token rows and probs), summed over ranks, in total and across nodes;
// for the flat dispatchers also a training step's (forward dispatch and combine, backward's two).
// Before timing, the first step's outputs are compared: equal bit for bit (overlap,
// shared_memory, shared_memory_overlap, hierarchical_shared_memory, fp8_wire) or within 1e-4
// relative (hierarchical), else exit 1. rank 0 prints one JSON line.
#include "standard_shapes.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/dispatch/hierarchical.hpp>
#include <megamoe/dispatch/shared_memory.hpp>
#include <megamoe/model/moe_layer.hpp>
#include <megamoe/model/moe_wire.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/precision/operands.hpp>

#include <mpi.h>
#include <CLI/CLI.hpp>
#include <boost/mpi/collectives/all_gather.hpp>
#include <boost/mpi/collectives/all_reduce.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace mm = megamoe;

namespace {

using mm::bench::bench_shape;
using mm::bench::median;
using mm::bench::shapes;

template <class Dispatch, class Precision>
using bench_config = mm::make_config<
    mm::shape<mm::hidden<mm::dynamic>, mm::ffn<mm::dynamic>, mm::experts<mm::dynamic>>,
    mm::router::runtime, Dispatch, mm::expert::mlp<mm::expert::swiglu>, Precision,
    mm::parallel::mapping<mm::parallel::etp<1>, mm::parallel::ep<mm::dynamic>>>;

struct variant_bytes {
  double total = 0.0, inter_node = 0.0;
  double step = -1.0;  // a training step's four exchanges (flat dispatchers; else unknown)
};

/// Bytes one dispatch sends from this rank to others, in total and to other nodes.
template <class Layer>
variant_bytes bytes_of(Layer const& layer, std::vector<int> const& node_of_ep, int me, int H) {
  variant_bytes b;
  auto const& d = layer.dispatcher();
  if constexpr (requires { d.traffic(); }) {
    auto const& t = d.traffic();
    b.inter_node = static_cast<double>(t.inter_node_bytes());
    b.total = b.inter_node + static_cast<double>(t.intra_node_bytes());
  } else {
    std::span<std::int64_t const> splits;
    if constexpr (requires { d.chunks(); })
      splits = d.chunks().send_splits();
    else
      splits = d.send_splits();
    // A row: its token (FP8 codes, and block scales, on fp8_wire's wire) and its prob. A step:
    // the forward's dispatch and combine, dy's dispatch, and combine_grad with the probs'
    // gradients.
    double token_row = H * static_cast<double>(sizeof(float));
    if constexpr (Layer::fp8_wire)
      token_row = static_cast<double>(Layer::operands_type::wire_row_bytes(H));
    double const row = token_row + sizeof(float);
    double const row_step = row + 3.0 * H * sizeof(float) + sizeof(float);
    b.step = 0.0;
    for (std::size_t j = 0; j < splits.size(); ++j) {
      if (static_cast<int>(j) == me) continue;
      double const bytes = static_cast<double>(splits[j]) * row;
      b.step += static_cast<double>(splits[j]) * row_step;
      b.total += bytes;
      if (node_of_ep[j] != node_of_ep[static_cast<std::size_t>(me)]) b.inter_node += bytes;
    }
  }
  return b;
}

/// A dispatch policy's name, with its inside-node exchange when that is a shared window.
template <class D>
std::string label() {
  std::string name(D::name);
  if constexpr (mm::dispatch::intra_node_shared<D>()) name += "<shared_memory>";
  return name;
}

template <class First, class Second, class Precision = mm::precision::fp32>
int compare(mm::parallel::environment& env, std::string const& what, std::string const& shape_name,
            int rounds, int iters, int progress_us) {
  auto const& world = env.world();
  bench_shape const s = shapes.at(shape_name);
  int const EP = world.size(), T = s.tokens / EP, H = s.hidden;
  mm::parallel::degrees d;
  d.ep = EP;
  mm::parallel::process_groups const groups(world, d);
  mm::startup_values given;
  given.hidden = H;
  given.ffn = s.ffn;
  given.experts = s.experts;
  mm::router::settings r;
  r.top_k = s.top_k;
  r.aux_loss_coeff = 1e-2;
  given.router = r;
  mm::context ctx(env.num_threads());
  ctx.pool().set_wait_interval(std::chrono::microseconds(progress_us));
  mm::moe_layer<bench_config<First, Precision>> first(groups, 0, given);
  mm::moe_layer<bench_config<Second, Precision>> second(groups, 0, given);
  first.initialize(7);
  second.initialize(7);
  mm::row_matrix<float> x(T, H), dy(T, H);
  auto const seed = static_cast<std::uint64_t>(world.rank());
  for (Eigen::Index i = 0; i < x.size(); ++i) {
    x.data()[i] =
        static_cast<float>(mm::standard_normal(100 + seed, static_cast<std::uint64_t>(i)));
    dy.data()[i] =
        static_cast<float>(mm::standard_normal(200 + seed, static_cast<std::uint64_t>(i)));
  }
  auto step = [&](auto& layer) {
    auto const y = layer.forward(ctx, x, T, 1).y;
    (void)y;
    layer.backward(ctx, dy);
  };
  auto timed = [&](auto& layer) {
    world.barrier();
    auto const start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) step(layer);
    double mine =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    double slowest = 0.0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_Comm(world));
    return slowest;
  };

  // Check: the first step's outputs.
  mm::row_matrix<float> const y1 = first.forward(ctx, x, T, 1).y;
  first.backward(ctx, dy);
  mm::row_matrix<float> const y2 = second.forward(ctx, x, T, 1).y;
  second.backward(ctx, dy);
  double const scale = std::max(1e-30, double(y1.cwiseAbs().maxCoeff()));
  double const err = (y1 - y2).cwiseAbs().maxCoeff() / scale;
  double const worst = boost::mpi::all_reduce(world, err, boost::mpi::maximum<double>());
  bool const exact = what != "hierarchical";
  bool const ok = exact ? worst == 0.0 : worst <= 1e-4;

  std::vector<int> world_of_ep;
  boost::mpi::all_gather(groups.ep(), world.rank(), world_of_ep);
  std::vector<int> node_of_ep(world_of_ep.size());
  int per_node = 0;
  if (char const* text = std::getenv("MEGAMOE_RANKS_PER_NODE")) per_node = std::atoi(text);
  for (std::size_t j = 0; j < world_of_ep.size(); ++j)
    node_of_ep[j] = per_node > 0 ? world_of_ep[j] / per_node : 0;
  auto sum = [&](double v) { return boost::mpi::all_reduce(world, v, std::plus<double>()); };
  variant_bytes const b1 = bytes_of(first, node_of_ep, groups.ep().rank(), H);
  variant_bytes const b2 = bytes_of(second, node_of_ep, groups.ep().rank(), H);

  std::vector<double> t1, t2, ratio;
  step(first);  // warm-up (buffers grown, pages touched)
  step(second);
  for (int round = 0; round < rounds; ++round) {
    double a = 0.0, b = 0.0;
    if (round % 2 == 0) {
      a = timed(first);
      b = timed(second);
    } else {
      b = timed(second);
      a = timed(first);
    }
    t1.push_back(a);
    t2.push_back(b);
    ratio.push_back(b / a);
  }
  if (world.rank() == 0) {
    auto summary = [](std::vector<double> const& v) {
      nlohmann::ordered_json j;
      j["median_ms"] = 1e3 * median(v);
      j["min_ms"] = 1e3 * *std::min_element(v.begin(), v.end());
      j["max_ms"] = 1e3 * *std::max_element(v.begin(), v.end());
      return j;
    };
    nlohmann::ordered_json j;
    j["compare"] = what;
    j["shape"] = shape_name;
    j["ep"] = EP;
    j["tokens_per_rank"] = T;
    j["threads_per_rank"] = env.num_threads();
    j["ranks_per_node"] = per_node;
    j["rounds"] = rounds;
    j["iters_per_round"] = iters;
    j["progress_us"] = progress_us;
    j["precision"] = Precision::name;
    j["first"] = label<First>();
    j["second"] = label<Second>();
    j["first_step"] = summary(t1);
    j["second_step"] = summary(t2);
    j["ratio_median"] = median(ratio);
    j["ratio_min"] = *std::min_element(ratio.begin(), ratio.end());
    j["ratio_max"] = *std::max_element(ratio.begin(), ratio.end());
    j["tokens_per_s_first"] = s.tokens / median(t1);
    j["tokens_per_s_second"] = s.tokens / median(t2);
    if constexpr (requires { second.dispatcher().overlap_pieces(); })
      j["overlap_pieces"] = second.dispatcher().overlap_pieces();
    if constexpr (requires {
                    requires std::remove_cvref_t<decltype(second.dispatcher())>::overlapped;
                  })
      j["pulled_while_computing_rank0"] =
          static_cast<double>(second.dispatcher().rows_pulled_while_computing()) /
          static_cast<double>(
              std::max<std::int64_t>(1, second.dispatcher().rows_pulled_overlapped()));
    j["output_max_rel_diff"] = worst;
    j["output_check"] = ok ? "ok" : "FAILED";
    std::cout << j.dump() << std::endl;
  }
  // Collective: every rank sums the bytes.
  double const total1 = sum(b1.total), inter1 = sum(b1.inter_node);
  double const total2 = sum(b2.total), inter2 = sum(b2.inter_node);
  double const step1 = sum(b1.step), step2 = sum(b2.step);
  if (world.rank() == 0) {
    nlohmann::ordered_json j;
    j["bytes_per_dispatch"] = {{label<First>(), {{"total", total1}, {"inter_node", inter1}}},
                               {label<Second>(), {{"total", total2}, {"inter_node", inter2}}}};
    if (b1.step >= 0.0 && b2.step >= 0.0)
      j["bytes_per_step"] = {{label<First>(), step1}, {label<Second>(), step2}};
    std::cout << j.dump() << std::endl;
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    CLI::App app{"forward + backward of one MoE layer over EP ranks, two dispatchers alternating"};
    std::string what = "overlap", shape = "A";
    int rounds = 11, iters = 1, progress_us = 200;
    app.add_option("--compare", what,
                   "overlap | hierarchical | shared_memory | shared_memory_overlap | "
                   "hierarchical_shared_memory | fp8_wire | fp8_wire_mxfp8")
        ->check(CLI::IsMember({"overlap", "hierarchical", "shared_memory", "shared_memory_overlap",
                               "hierarchical_shared_memory", "fp8_wire", "fp8_wire_mxfp8"}));
    app.add_option("--shape", shape, "A | B | C")->check(CLI::IsMember({"A", "B", "C"}));
    app.add_option("--rounds", rounds, "alternating rounds")->check(CLI::PositiveNumber);
    app.add_option("--iters", iters, "steps per variant and round")->check(CLI::PositiveNumber);
    app.add_option("--progress-us", progress_us,
                   "how often the waiting main thread tests the exchanges in flight")
        ->check(CLI::PositiveNumber);
    try {
      app.parse(argc, argv);
    } catch (CLI::ParseError const& e) {
      return env.world().rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
    }
    if (what == "overlap")
      return compare<mm::dispatch::all_to_all, mm::dispatch::all_to_all_overlap<4>>(
          env, what, shape, rounds, iters, progress_us);
    if (what == "shared_memory")
      return compare<mm::dispatch::all_to_all, mm::dispatch::shared_memory>(
          env, what, shape, rounds, iters, progress_us);
    if (what == "shared_memory_overlap")
      return compare<mm::dispatch::shared_memory, mm::dispatch::shared_memory_overlap<4>>(
          env, what, shape, rounds, iters, progress_us);
    if (what == "fp8_wire")
      return compare<mm::dispatch::all_to_all, mm::dispatch::fp8_wire<>,
                     mm::precision::fp8_tensorwise<mm::precision::current>>(
          env, what, shape, rounds, iters, progress_us);
    if (what == "fp8_wire_mxfp8")
      return compare<mm::dispatch::all_to_all, mm::dispatch::fp8_wire<>,
                     mm::precision::wgrad_from_rowwise<mm::precision::mxfp8>>(
          env, what, shape, rounds, iters, progress_us);
    if (what == "hierarchical_shared_memory")
      return compare<mm::dispatch::hierarchical<>,
                     mm::dispatch::hierarchical<mm::dispatch::shared_memory>>(
          env, what, shape, rounds, iters, progress_us);
    return compare<mm::dispatch::all_to_all, mm::dispatch::hierarchical<>>(env, what, shape, rounds,
                                                                           iters, progress_us);
  });
}
