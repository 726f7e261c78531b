// SPDX-License-Identifier: Apache-2.0
// dispatch_bench — the token exchange of one MoE layer over EP ranks (run under mpiexec; EP = the
// number of ranks, ETP = 1), against raw MPI_Alltoallv on the same buffer sizes in the same run.
//
//   mpiexec -n 4 build/benchmarks/dispatch_bench --dispatcher all_to_all|all_gather|shared_memory
//       --shape C [--iters N]
//   MEGAMOE_RANKS_PER_NODE=2 mpiexec -n 4 build/benchmarks/dispatch_bench
//       --dispatcher hierarchical|hierarchical_shared_memory --shape C
//
// Each rank routes T tokens of hidden size H (softmax top-k over E experts, random logits from a
// fixed seed), then times `dispatch` (tokens and probs to the experts' ranks, permutations
// included) and `combine` (back, summed per token). Raw baseline: MPI_Alltoallv with exactly the
// per-destination row counts the dispatcher moves (tokens and probs), in both directions. Times are
// the slowest rank's, median over the timed iterations. Bytes count what leaves a rank for another
// rank (the permutations' local copies are not counted), against the theoretical
// T*k*H*(EP-1)/EP elements per direction of a uniform routing. The combine of an identity expert
// must give k*x for every token (dropless): otherwise exit 1. An unknown choice exits 2.
// shared_memory runs as the MoE layer runs it: the tokens wait in its window (token_rows(), the
// layer's input copy, made before timing as raw MPI's send rows are), and the expert rows are its
// window's own (combined in place).
// hierarchical (exchange B by MPI) and hierarchical_shared_memory (exchange B through the node's
// window) are timed against the same raw exchange as all_to_all: the rows all_to_all would send,
// the same job done flat; their bytes are those rows' too.
// The limit of any exchange on one machine is one memcpy of the bytes a rank sends (timed in the
// same run, each rank copying its own token bytes); the JSON reports it, and Open MPI's
// single-copy mechanism for shared memory as configured (raw MPI's transport). rank 0 prints one
// JSON line.
#include <megamoe/dispatch/all_gather.hpp>
#include <megamoe/dispatch/all_to_all.hpp>
#include <megamoe/dispatch/hierarchical.hpp>
#include <megamoe/dispatch/shared_memory.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/router/router.hpp>

#include <mpi.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace mm = megamoe;

namespace {

struct shape {
  int tokens, hidden, experts, top_k;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Seconds of `f` on the slowest rank.
template <class F>
double timed(boost::mpi::communicator const& world, F&& f) {
  world.barrier();
  auto const start = std::chrono::steady_clock::now();
  f();
  double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double slowest = 0.0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_Comm(world));
  return slowest;
}

/// Raw MPI_Alltoallv of `rows` rows per destination (and the mirrored receive counts), `width`
/// floats per row, into buffers the caller keeps.
struct raw_exchange {
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  std::vector<float> send, recv;

  raw_exchange(boost::mpi::communicator const& world, std::vector<std::int64_t> const& rows,
               int width) {
    int const n = world.size();
    send_counts.resize(static_cast<std::size_t>(n));
    recv_counts.resize(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j)
      send_counts[static_cast<std::size_t>(j)] =
          static_cast<int>(rows[static_cast<std::size_t>(j)] * width);
    MPI_Alltoall(send_counts.data(), 1, MPI_INT, recv_counts.data(), 1, MPI_INT, MPI_Comm(world));
    auto displs = [](std::vector<int> const& counts) {
      std::vector<int> d(counts.size(), 0);
      for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
      return d;
    };
    send_displs = displs(send_counts);
    recv_displs = displs(recv_counts);
    send.assign(static_cast<std::size_t>(send_displs.back() + send_counts.back()), 1.0F);
    recv.assign(static_cast<std::size_t>(recv_displs.back() + recv_counts.back()), 0.0F);
  }
  void forward(boost::mpi::communicator const& world) {
    MPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), MPI_FLOAT, recv.data(),
                  recv_counts.data(), recv_displs.data(), MPI_FLOAT, MPI_Comm(world));
  }
  void backward(boost::mpi::communicator const& world) {
    MPI_Alltoallv(recv.data(), recv_counts.data(), recv_displs.data(), MPI_FLOAT, send.data(),
                  send_counts.data(), send_displs.data(), MPI_FLOAT, MPI_Comm(world));
  }
};

/// Open MPI's single-copy mechanism for shared-memory messages, as the environment sets it.
std::string single_copy_mechanism() {
  for (char const* name :
       {"OMPI_MCA_btl_vader_single_copy_mechanism", "OMPI_MCA_btl_sm_single_copy_mechanism"})
    if (char const* value = std::getenv(name)) return value;
  return "default";
}

/// Whether a dispatcher moves token rows to experts (measured against the all-to-all's splits),
/// rather than gathering every token everywhere.
template <class Dispatcher>
constexpr bool sends_rows =
    !std::is_same_v<Dispatcher, mm::dispatch::all_gather_dispatcher<float, float>>;

template <class Dispatcher>
int run(boost::mpi::communicator const& world, mm::parallel::process_groups const& groups,
        std::string const& name, std::string const& shape_name, shape const& s, int iters,
        int warmup) {
  int const EP = world.size(), me = world.rank();
  int const T = s.tokens, H = s.hidden, E = s.experts;
  mm::dispatch::expert_groups const experts(groups, E);
  mm::thread_pool pool(1);

  std::mt19937 gen(1234u + static_cast<unsigned>(me));
  std::normal_distribution<float> normal;
  mm::row_matrix<float> logits(T, E), x(T, H);
  for (Eigen::Index i = 0; i < logits.size(); ++i) logits.data()[i] = normal(gen);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = normal(gen);
  mm::router::settings settings;
  settings.top_k = s.top_k;
  mm::router::topk_router<float, float> router(settings, E);
  auto const& routing = router.route(logits, {T, 1});

  Dispatcher dispatcher(experts, H);
  dispatcher.plan(pool, routing.routing_map, 0);
  int const N = dispatcher.expert_rows();
  mm::row_matrix<float> rows(std::max(N, 1), H), out(T, H);
  std::vector<float> row_probs(static_cast<std::size_t>(std::max(N, 1)));

  // The expert rows: the shared-memory dispatcher's own, in its window, as the layer uses them
  // (combined in place).
  auto expert_rows = [&] {
    if constexpr (requires { dispatcher.expert_output_rows(); })
      return dispatcher.expert_output_rows();
    else
      return rows.data();
  };
  // The tokens: the shared-memory dispatcher's wait in its window, where the layer keeps its input
  // (the copy of x there stands for the layer's input copy, which every dispatcher's layer makes).
  auto tokens = [&]() -> float const* {
    if constexpr (requires { dispatcher.token_rows(); }) {
      float* waiting = dispatcher.token_rows();
      std::copy_n(x.data(), x.size(), waiting);
      return waiting;
    } else {
      return x.data();
    }
  };
  // Identity expert: every token comes back k times.
  dispatcher.dispatch(pool, tokens(), expert_rows(), routing.probs, row_probs.data());
  dispatcher.combine(pool, expert_rows(), out.data());
  double const err = (out - static_cast<float>(s.top_k) * x).cwiseAbs().maxCoeff();
  double const worst = boost::mpi::all_reduce(world, err, boost::mpi::maximum<double>());

  // Rows this rank sends to each rank (tokens; probs ride along with one float per row).
  std::vector<std::int64_t> rows_to(static_cast<std::size_t>(EP), 0);
  double extra_bytes = 0.0;  // what besides token and prob rows leaves the rank
  if constexpr (sends_rows<Dispatcher>) {
    if constexpr (requires { dispatcher.chunks(); }) {
      auto const splits = dispatcher.chunks().send_splits();
      std::copy(splits.begin(), splits.end(), rows_to.begin());
    } else if constexpr (requires { dispatcher.send_splits(); }) {
      auto const splits = dispatcher.send_splits();
      std::copy(splits.begin(), splits.end(), rows_to.begin());
    } else {  // hierarchical: the routing map's entries per EP rank, all_to_all's rows
      int const L = E / EP;
      for (int t = 0; t < T; ++t)
        for (int e = 0; e < E; ++e)
          rows_to[static_cast<std::size_t>(e / L)] += routing.routing_map(t, e) != 0 ? 1 : 0;
    }
  } else {
    std::fill(rows_to.begin(), rows_to.end(), T);         // every token to every rank
    extra_bytes = static_cast<double>(T) * E * (EP - 1);  // the routing map (one byte per entry)
  }
  double token_bytes = 0.0, prob_bytes = 0.0;
  int const prob_width = sends_rows<Dispatcher> ? 1 : E;  // all-gather moves whole prob rows
  for (int j = 0; j < EP; ++j)
    if (j != me) {
      token_bytes += static_cast<double>(rows_to[static_cast<std::size_t>(j)]) * H * 4;
      prob_bytes += static_cast<double>(rows_to[static_cast<std::size_t>(j)]) * prob_width * 4;
    }
  double const theoretical = static_cast<double>(T) * s.top_k * H * (EP - 1) / EP * 4;
  double const mean_token_bytes =
      boost::mpi::all_reduce(world, token_bytes, std::plus<double>()) / EP;
  double const mean_all_bytes =
      boost::mpi::all_reduce(world, token_bytes + prob_bytes + extra_bytes, std::plus<double>()) /
      EP;

  raw_exchange raw_tokens(world, rows_to, H), raw_probs(world, rows_to, prob_width);
  // One memcpy of this rank's outgoing token bytes.
  std::vector<float> copy_from(static_cast<std::size_t>(token_bytes / 4) + 1, 1.0F),
      copy_to(copy_from.size(), 0.0F);
  std::vector<double> plan_s, dispatch_s, combine_s, raw_forward_s, raw_backward_s, copy_s;
  for (int i = 0; i < warmup + iters; ++i) {
    double const p = timed(world, [&] { dispatcher.plan(pool, routing.routing_map, 0); });
    float const* from = tokens();
    double const d = timed(world, [&] {
      dispatcher.dispatch(pool, from, expert_rows(), routing.probs, row_probs.data());
    });
    double const c = timed(world, [&] { dispatcher.combine(pool, expert_rows(), out.data()); });
    double const rf = timed(world, [&] {
      raw_tokens.forward(world);
      raw_probs.forward(world);
    });
    double const rb = timed(world, [&] { raw_tokens.backward(world); });
    double const mc = timed(world, [&] {
      std::memcpy(copy_to.data(), copy_from.data(), copy_from.size() * sizeof(float));
    });
    if (i < warmup) continue;
    copy_s.push_back(mc);
    plan_s.push_back(p);
    dispatch_s.push_back(d);
    combine_s.push_back(c);
    raw_forward_s.push_back(rf);
    raw_backward_s.push_back(rb);
  }
  if (me == 0) {
    nlohmann::ordered_json j;
    j["dispatcher"] = name;
    j["ep"] = EP;
    j["shape"] = shape_name;
    j["tokens_per_rank"] = T;
    j["hidden"] = H;
    j["experts"] = E;
    j["top_k"] = s.top_k;
    j["token_bytes_per_direction"] = mean_token_bytes;
    j["theoretical_bytes"] = theoretical;
    j["bytes_ratio"] = mean_token_bytes / theoretical;
    j["all_bytes_per_direction"] = mean_all_bytes;
    j["plan_ms"] = 1e3 * median(plan_s);
    j["dispatch_ms"] = 1e3 * median(dispatch_s);
    j["combine_ms"] = 1e3 * median(combine_s);
    j["raw_dispatch_ms"] = 1e3 * median(raw_forward_s);
    j["raw_combine_ms"] = 1e3 * median(raw_backward_s);
    j["bandwidth_ratio_dispatch"] = median(raw_forward_s) / median(dispatch_s);
    j["bandwidth_ratio_combine"] = median(raw_backward_s) / median(combine_s);
    j["memcpy_ms"] = 1e3 * median(copy_s);
    j["memcpy_fraction_dispatch"] = median(copy_s) / median(dispatch_s);
    j["memcpy_fraction_combine"] = median(copy_s) / median(combine_s);
    j["single_copy_mechanism"] = single_copy_mechanism();
    j["check_max_abs_err"] = worst;
    std::cout << j.dump() << std::endl;
  }
  return worst <= 1e-5 * s.top_k ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    auto const& world = env.world();
    CLI::App app{"dispatch_bench: one MoE layer's token exchange over EP ranks"};
    std::string dispatcher = "all_to_all", shape_name = "C";
    int iters = 10, warmup = 2, tokens = 0;
    app.add_option("--dispatcher", dispatcher,
                   "all_to_all | all_gather | shared_memory | hierarchical | "
                   "hierarchical_shared_memory");
    app.add_option("--shape", shape_name, "A | B | C (BENCHMARKS.md), T tokens per rank");
    app.add_option("--tokens", tokens, "tokens per rank instead of the shape's T");
    app.add_option("--iters", iters, "timed iterations");
    app.add_option("--warmup", warmup, "untimed iterations");
    try {
      app.parse(argc, argv);
    } catch (CLI::ParseError const& e) {
      int const code = app.exit(e);
      return code == 0 ? 0 : 2;
    }
    shape s{};
    if (shape_name == "A")
      s = {4096, 1024, 8, 2};
    else if (shape_name == "B")
      s = {4096, 1024, 32, 8};
    else if (shape_name == "C")
      s = {1024, 256, 16, 4};
    else {
      if (world.rank() == 0) std::cerr << "dispatch_bench: unknown shape " << shape_name << "\n";
      return 2;
    }
    if (tokens > 0) s.tokens = tokens;
    if (s.experts % world.size() != 0 || iters < 1) {
      if (world.rank() == 0)
        std::cerr << "dispatch_bench: " << s.experts << " experts do not split over "
                  << world.size() << " ranks (or --iters < 1)\n";
      return 2;
    }
    mm::parallel::degrees d;
    d.ep = world.size();
    d.etp = 1;
    mm::parallel::process_groups const groups(world, d);
    if (dispatcher == "all_to_all")
      return run<mm::dispatch::all_to_all_dispatcher<float, float>>(world, groups, dispatcher,
                                                                    shape_name, s, iters, warmup);
    if (dispatcher == "all_gather")
      return run<mm::dispatch::all_gather_dispatcher<float, float>>(world, groups, dispatcher,
                                                                    shape_name, s, iters, warmup);
    if (dispatcher == "shared_memory")
      return run<mm::dispatch::shared_memory_dispatcher<float, float>>(
          world, groups, dispatcher, shape_name, s, iters, warmup);
    if (dispatcher == "hierarchical")
      return run<mm::dispatch::hierarchical_dispatcher<float, float>>(world, groups, dispatcher,
                                                                      shape_name, s, iters, warmup);
    if (dispatcher == "hierarchical_shared_memory")
      return run<mm::dispatch::hierarchical_dispatcher<float, float, true>>(
          world, groups, dispatcher, shape_name, s, iters, warmup);
    if (world.rank() == 0) std::cerr << "dispatch_bench: unknown dispatcher " << dispatcher << "\n";
    return 2;
  });
}
