// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec with one rank per EP rank of the file: one reference-vector file of kind
// `dispatch` (the reference's all-to-all and all-gather dispatchers, TP = ETP = 1). Each rank
// routes its own logits, runs both dispatchers on its own tokens and checks its entry of `ranks`:
// routing, splits, the count exchange, permutation 1, the rows it received (by source rank), the
// expert input rows after permutation 2 and their probs, and the combined output of the fake
// expert y = x * (1 + global expert) * prob. Rows are identified by their hidden vectors, which are
// distinct in the files. Rank 0 prints the summary line of ARCHITECTURE §7.
//
//   mpiexec -n 4 megamoe_dispatch_vectors_mpi d01_ep4_e8_k2   (folder: MEGAMOE_REFERENCE_VECTORS)
#include "vectors/object_fields.hpp"
#include "vectors/tensor_json.hpp"
#include "vectors/vector_file.hpp"

#include <megamoe/dispatch/all_gather.hpp>
#include <megamoe/dispatch/all_to_all.hpp>
#include <megamoe/dispatch/shared_memory.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/router/router.hpp>

#include <boost/mpi/collectives/all_reduce.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mv = megamoe::vectors;

namespace {

using fmatrix = mm::row_matrix<float>;
using imatrix = mm::row_matrix<std::int64_t>;

std::filesystem::path vector_folder() {
  if (char const* dir = std::getenv("MEGAMOE_REFERENCE_VECTORS")) return dir;
  return MEGAMOE_DEFAULT_REFERENCE_VECTORS;
}

template <class T>
imatrix column(std::span<T const> values) {
  imatrix m(static_cast<Eigen::Index>(values.size()), 1);
  for (std::size_t i = 0; i < values.size(); ++i) m(static_cast<Eigen::Index>(i), 0) = values[i];
  return m;
}

/// (source rank, source token) of a hidden row, found among every rank's tokens.
std::pair<int, int> identify(std::vector<fmatrix> const& hidden, float const* row) {
  for (std::size_t r = 0; r < hidden.size(); ++r)
    for (Eigen::Index t = 0; t < hidden[r].rows(); ++t)
      if (std::equal(row, row + hidden[r].cols(), &hidden[r](t, 0)))
        return {static_cast<int>(r), static_cast<int>(t)};
  throw mv::mismatch("a dispatched row matches no token of any rank");
}

/// The fake expert of the file: y = x * (1 + global expert) * prob, row by row.
void fake_expert(fmatrix& rows, std::span<std::int64_t const> per_expert, int first_expert,
                 std::vector<float> const& probs) {
  Eigen::Index row = 0;
  for (std::size_t l = 0; l < per_expert.size(); ++l)
    for (std::int64_t i = 0; i < per_expert[l]; ++i, ++row)
      rows.row(row) *= (1.0F + static_cast<float>(first_expert + static_cast<int>(l))) *
                       probs[static_cast<std::size_t>(row)];
}

mv::check_result check(mv::vector_file& file, mm::parallel::environment& env) {
  auto const& world = env.world();
  mv::comparer cmp;
  mv::object_fields config(file.take("config"), "config");
  int const EP = config.take("ep_size").get<int>();
  int const E = config.take("num_experts").get<int>();
  int const L = config.take("num_local_experts").get<int>();
  int const T = config.take("num_tokens_per_rank").get<int>();
  int const k = config.take("topk").get<int>();
  int const H = config.take("hidden").get<int>();
  if (config.take("tp_size").get<int>() != 1) throw mv::mismatch("only TP = 1 files are known");
  if (config.take("score_function").get<std::string>() != "softmax")
    throw mv::mismatch("only softmax routing is known");
  bool const pre_softmax = config.take("pre_softmax").get<bool>();
  config.require_all_handled();
  if (world.size() != EP)
    throw mv::mismatch("run under mpiexec -n " + std::to_string(EP) + " (got " +
                       std::to_string(world.size()) + " ranks)");
  if (E != EP * L) throw mv::mismatch("config: E != EP * L");

  mm::parallel::degrees d;
  d.ep = EP;
  d.etp = 1;
  mm::parallel::process_groups const groups(world, d);
  mm::dispatch::expert_groups const experts(groups, E);
  int const first = experts.first_expert();
  mm::thread_pool pool(1);

  // Inputs: read on every rank, agreed on before any collective (a malformed entry on one rank
  // must not leave the others waiting).
  auto const& ranks = file.take("ranks");
  std::vector<fmatrix> hidden(static_cast<std::size_t>(EP));
  fmatrix logits;
  mm::parallel::check_on_every_rank(world, [&] {
    if (static_cast<int>(ranks.size()) != EP) throw mv::mismatch("ranks: one entry per EP rank");
    for (int r = 0; r < EP; ++r) {
      hidden[static_cast<std::size_t>(r)] =
          mv::matrix_of<float>(ranks[static_cast<std::size_t>(r)].at("hidden"), "hidden");
      if (hidden[static_cast<std::size_t>(r)].rows() != T ||
          hidden[static_cast<std::size_t>(r)].cols() != H)
        throw mv::mismatch("hidden: not [T, H]");
    }
    logits =
        mv::matrix_of<float>(ranks[static_cast<std::size_t>(world.rank())].at("logits"), "logits");
    if (logits.rows() != T || logits.cols() != E) throw mv::mismatch("logits: not [T, E]");
  });
  fmatrix const& x = hidden[static_cast<std::size_t>(world.rank())];

  // Everything collective first.
  mm::router::settings s;
  s.top_k = k;
  s.score = pre_softmax ? mm::router::score_function::softmax_before_topk
                        : mm::router::score_function::softmax_after_topk;
  mm::router::topk_router<float, float> router(s, E);
  auto const& routing = router.route(logits, {T, 1});

  mm::dispatch::all_to_all_dispatcher<float, float> a2a_dispatcher(experts, H);
  a2a_dispatcher.plan(pool, routing.routing_map, 0);
  int const N = a2a_dispatcher.expert_rows();
  fmatrix a2a_rows(N, H);
  std::vector<float> a2a_probs(static_cast<std::size_t>(N));
  a2a_dispatcher.dispatch(pool, x.data(), a2a_rows.data(), routing.probs, a2a_probs.data());
  auto const received = a2a_dispatcher.received_rows_in_expert_order();
  fmatrix const a2a_input = a2a_rows;
  fake_expert(a2a_rows, a2a_dispatcher.tokens_per_local_expert(), first, a2a_probs);
  fmatrix a2a_out(T, H);
  a2a_dispatcher.combine(pool, a2a_rows.data(), a2a_out.data());

  // The shared-memory dispatcher moves the same rows: bit for bit all_to_all's.
  mm::dispatch::shared_memory_dispatcher<float, float> shm_dispatcher(experts, H);
  shm_dispatcher.plan(pool, routing.routing_map, 0);
  fmatrix shm_rows(shm_dispatcher.expert_rows(), H);
  std::vector<float> shm_probs(static_cast<std::size_t>(shm_dispatcher.expert_rows()));
  shm_dispatcher.dispatch(pool, x.data(), shm_rows.data(), routing.probs, shm_probs.data());
  fmatrix const shm_input = shm_rows;
  fake_expert(shm_rows, shm_dispatcher.tokens_per_local_expert(), first, shm_probs);
  fmatrix shm_out(T, H);
  shm_dispatcher.combine(pool, shm_rows.data(), shm_out.data());

  mm::dispatch::all_gather_dispatcher<float, float> ag_dispatcher(experts, H);
  ag_dispatcher.plan(pool, routing.routing_map, 0);
  int const Ng = ag_dispatcher.expert_rows();
  fmatrix ag_rows(Ng, H);
  std::vector<float> ag_probs(static_cast<std::size_t>(Ng));
  ag_dispatcher.dispatch(pool, x.data(), ag_rows.data(), routing.probs, ag_probs.data());
  fmatrix const ag_input = ag_rows;
  fake_expert(ag_rows, ag_dispatcher.tokens_per_local_expert(), first, ag_probs);
  fmatrix ag_out(T, H);
  ag_dispatcher.combine(pool, ag_rows.data(), ag_out.data());

  // Then the comparisons, on each rank alone.
  mv::object_fields entry(ranks[static_cast<std::size_t>(world.rank())],
                          "ranks[" + std::to_string(world.rank()) + "]");
  if (entry.take("rank").get<int>() != world.rank()) throw mv::mismatch("ranks out of order");
  entry.take("hidden");
  entry.take("logits");
  cmp.close("probs", routing.probs, mv::matrix_of<float>(entry.take("probs"), "probs"), 1e-5, 1e-7);
  cmp.exact("routing_map", routing.routing_map.cast<int>(),
            mv::matrix_of<int>(entry.take("routing_map"), "routing_map"));
  {
    auto const& dispatcher = a2a_dispatcher;
    mv::object_fields a2a(entry.take("alltoall"), entry.where() + ".alltoall");
    cmp.exact(
        "num_local_tokens_per_expert_all_ranks",
        column(dispatcher.global_counts()).reshaped<Eigen::RowMajor>(EP, E),
        mv::matrix_of<std::int64_t>(file.take("num_local_tokens_per_expert_all_ranks"), "counts"));
    // Permutation 2's chunk order; the restore order is its inverse.
    auto const order = dispatcher.chunk_order();
    imatrix restore(static_cast<Eigen::Index>(order.size()), 1);
    for (std::size_t p = 0; p < order.size(); ++p)
      restore(order[p], 0) = static_cast<std::int64_t>(p);
    cmp.exact("sort_input_by_local_experts", column(order),
              mv::matrix_of<std::int64_t>(file.take("sort_input_by_local_experts"), "sort"));
    cmp.exact("restore_output_by_local_experts", restore,
              mv::matrix_of<std::int64_t>(file.take("restore_output_by_local_experts"), "restore"));
    cmp.exact("input_splits", column(dispatcher.send_splits()),
              mv::matrix_of<std::int64_t>(a2a.take("input_splits"), "input_splits"));
    cmp.exact("output_splits", column(dispatcher.recv_splits()),
              mv::matrix_of<std::int64_t>(a2a.take("output_splits"), "output_splits"));
    imatrix per_source(EP, L);
    for (int j = 0; j < EP; ++j)
      for (int l = 0; l < L; ++l)
        per_source(j, l) = dispatcher.global_counts()[static_cast<std::size_t>(j * E + first + l)];
    cmp.exact("num_global_tokens_per_local_expert", per_source,
              mv::matrix_of<std::int64_t>(a2a.take("num_global_tokens_per_local_expert"), "n"));
    cmp.exact("tokens_per_local_expert", column(dispatcher.tokens_per_local_expert()),
              mv::matrix_of<std::int64_t>(a2a.take("tokens_per_local_expert"), "tpl"));
    auto const& p1 = dispatcher.send_rows().permutation();
    cmp.exact("permute1_sorted_indices", column(std::span<int const>(p1.source_token)),
              mv::matrix_of<std::int64_t>(a2a.take("permute1_sorted_indices"), "p1"));
    cmp.exact("permute1_row_expert", column(std::span<int const>(p1.row_expert)),
              mv::matrix_of<std::int64_t>(a2a.take("permute1_row_expert"), "p1e"));
    // Received rows, before permutation 2: by source rank, then local expert.
    imatrix got_received(static_cast<Eigen::Index>(received.size()), 3);
    Eigen::Index row = 0;
    for (int j = 0; j < EP; ++j)
      for (int l = 0; l < L; ++l)
        for (std::int64_t i = 0; i < per_source(j, l); ++i, ++row) {
          auto const [src, token] =
              identify(hidden, &a2a_input(received[static_cast<std::size_t>(row)], 0));
          got_received.row(row) << src, token, first + l;
        }
    cmp.exact("received_rows_src_rank_token_expert", got_received,
              mv::matrix_of<std::int64_t>(a2a.take("received_rows_src_rank_token_expert"), "rr"));
    imatrix got_input(N, 3);
    row = 0;
    for (int l = 0; l < L; ++l)
      for (std::int64_t i = 0;
           i < dispatcher.tokens_per_local_expert()[static_cast<std::size_t>(l)]; ++i, ++row) {
        auto const [src, token] = identify(hidden, &a2a_input(row, 0));
        got_input.row(row) << src, token, first + l;
      }
    cmp.exact(
        "expert_input_rows_src_rank_token_expert", got_input,
        mv::matrix_of<std::int64_t>(a2a.take("expert_input_rows_src_rank_token_expert"), "ei"));
    cmp.close("expert_input_probs",
              Eigen::Map<fmatrix const>(a2a_probs.data(), static_cast<Eigen::Index>(N), 1),
              mv::matrix_of<float>(a2a.take("expert_input_probs"), "eip"), 1e-6, 1e-7);
    cmp.close("alltoall output", a2a_out, mv::matrix_of<float>(a2a.take("output"), "output"), 1e-5,
              1e-6);
    a2a.require_all_handled();
    cmp.close("shared_memory expert input rows", shm_input, a2a_input, 0.0, 0.0);
    cmp.close("shared_memory expert input probs",
              Eigen::Map<fmatrix const>(shm_probs.data(), static_cast<Eigen::Index>(N), 1),
              Eigen::Map<fmatrix const>(a2a_probs.data(), static_cast<Eigen::Index>(N), 1), 0.0,
              0.0);
    cmp.close("shared_memory output", shm_out, a2a_out, 0.0, 0.0);
  }
  {
    auto const& dispatcher = ag_dispatcher;
    mv::object_fields ag(entry.take("allgather"), entry.where() + ".allgather");
    cmp.exact("allgather tokens_per_local_expert", column(dispatcher.tokens_per_local_expert()),
              mv::matrix_of<std::int64_t>(ag.take("tokens_per_local_expert"), "tpl"));
    imatrix global_token(Ng, 1), expert(Ng, 1);
    for (int j = 0; j < Ng; ++j) {
      auto const [src, token] = identify(hidden, &ag_input(j, 0));
      global_token(j, 0) = src * T + token;
      expert(j, 0) = first + dispatcher.gathered_rows().row_expert(j);
      if (dispatcher.gathered_rows().source_token(j) != global_token(j, 0))
        throw mv::mismatch("allgather: a row's bookkeeping does not match its data");
    }
    cmp.exact("expert_input_rows_global_token", global_token,
              mv::matrix_of<std::int64_t>(ag.take("expert_input_rows_global_token"), "gt"));
    cmp.exact("expert_input_rows_expert", expert,
              mv::matrix_of<std::int64_t>(ag.take("expert_input_rows_expert"), "ge"));
    cmp.close("allgather expert_input_probs",
              Eigen::Map<fmatrix const>(ag_probs.data(), static_cast<Eigen::Index>(Ng), 1),
              mv::matrix_of<float>(ag.take("expert_input_probs"), "eip"), 1e-6, 1e-7);
    cmp.close("allgather output", ag_out, mv::matrix_of<float>(ag.take("output"), "output"), 1e-5,
              1e-6);
    ag.require_all_handled();
  }
  entry.require_all_handled();
  return {cmp.worst(), cmp.fields()};
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    auto const& world = env.world();
    std::string const stem = argc > 1 ? argv[1] : "";
    auto const path = vector_folder() / (stem + ".json");
    std::string failure;
    mv::check_result result;
    try {
      std::ifstream in(path);
      if (!in) throw mv::mismatch("cannot read " + path.string());
      mv::vector_file file(path, nlohmann::json::parse(in));
      if (file.kind() != "dispatch") throw mv::mismatch("not a file of kind dispatch");
      result = check(file, env);
      auto const unchecked = file.unchecked();
      if (!unchecked.empty()) throw mv::mismatch("field not checked: " + unchecked.front());
    } catch (std::exception const& e) {
      failure = e.what();
    }
    // Every rank reports; the job passes when all of them do.
    int const failed = boost::mpi::all_reduce(world, failure.empty() ? 0 : 1, std::plus<int>());
    double const worst =
        boost::mpi::all_reduce(world, result.worst_rel_err, boost::mpi::maximum<double>());
    if (!failure.empty())
      std::cout << "reference_vectors " << stem << ": FAILED on rank " << world.rank() << ", "
                << failure << std::endl;
    if (world.rank() == 0 && failed == 0) {
      char line[256];
      std::snprintf(line, sizeof line, "reference_vectors %s: ok, fields=%d, worst_rel_err=%.3g",
                    stem.c_str(), result.fields, worst);
      std::cout << line << std::endl;
    }
    return failed == 0 ? 0 : 1;
  });
}
