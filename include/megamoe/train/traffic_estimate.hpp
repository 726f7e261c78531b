// SPDX-License-Identifier: Apache-2.0
// megamoe/train/traffic_estimate.hpp — the bytes a training step sends on each process group,
// measured (parallel/traffic.hpp counts every collective's) beside the volume the layout implies,
// for --profile.
#pragma once

#include <megamoe/core/parameter.hpp>
#include <megamoe/parallel/pipeline_schedule.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/train/trainer.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

namespace megamoe::train {

/// --profile's traffic: per group of more than one rank, the bytes rank 0 sent per training step
/// and, where the layout fixes it, the volume it implies (parallel/traffic.hpp counts the same
/// way), per micro-batch: TP's sequence-parallel gathers and reduce-scatters of N / TP rows
/// (four per attention and per dense FFN, two for the embedding and two for the output layer, each
/// sending (TP - 1) N / TP rows) and the output layer's per-row statistics (2 doubles per row
/// from each rank); CP's key/value exchange, 2 (CP - 1) X per layer with all_gather and
/// (3 CP - 2) X with p2p (X: a rank's keys and values); per step the gradients' all-reduce and
/// the distributed optimizer's all-gather of the parameters, 3 (P - 1) / P of their bytes, over
/// TP x DP x CP for the replicated ones (with the step's logged sums: 6 + experts x MoE layers
/// doubles), DP x CP for the TP shards and EDP for the experts'; PP's activations and gradients
/// between the stages and the logged sums over them, and with multi-token prediction the
/// embedding table stage 0 sends to the last stage's copy per step (the copy's gradient comes
/// back). All of it for this rank's layers (its pipeline chunks'; the output layer's chunk runs
/// each MTP depth's layer, its embedding lookup and its pass of the output layer too). The
/// expert-parallel exchange follows the routing and has no implied volume.
template <class Model, std::size_t D, std::size_t E>
nlohmann::ordered_json group_traffic(parallel::process_groups const& groups, Model& model,
                                     train_settings const& s,
                                     std::span<parallel::pipeline_op const> ops,
                                     std::span<char const> repeats,
                                     std::array<double, D> const& decoder_bytes,
                                     std::array<double, E> const& expert_bytes, int steps) {
  using scalar = typename Model::scalar;
  double const bytes = sizeof(scalar);
  // Elements per kind they are reduced and gathered as (weights held as codes are gathered in
  // fp32 from the optimizer's shards, one tensor at a time, as the others all at once).
  std::array<double, parameter_kinds> elements{};
  for (auto const& p : model.numbered_parameters())
    elements[static_cast<std::size_t>(reduced_as(p.kind))] += static_cast<double>(p.grad.size());
  using kind = parameter_kind;
  auto of = [&](kind k) { return elements[static_cast<std::size_t>(k)]; };
  auto const& m = model.model_settings();
  int const cp = groups.cp().size(), tp = groups.tp().size(), H = model.hidden_size();
  double const rows = static_cast<double>(s.seq_length) / cp * s.micro_batch;  // N
  // A row's keys and values on this rank: per query group of grouped-query attention, per head
  // of MLA (keys of its two parts, values of their own width).
  double const kv = m.mla.enabled()
                        ? static_cast<double>(m.heads) / tp *
                              (m.mla.qk_head_dim + m.mla.qk_pos_emb_head_dim + m.mla.v_head_dim)
                        : 2.0 * m.query_groups / tp * (H / m.heads);
  double const x = rows * kv * bytes;
  bool const p2p = Model::cp_comm == parallel::cp_comm_type::p2p;
  double const per_layer = p2p ? (3.0 * cp - 2.0) * x : 2.0 * (cp - 1.0) * x;
  // Over this rank's passes in the schedule (a backward that repeats its forward runs the
  // forward's collectives again): per chunk pass, two sequence-parallel collectives per attention
  // and dense FFN and one for the embedding and for the output layer each way, the output layer's
  // row statistics in forward, and CP's exchange per layer, (CP - 1) X of it in forward.
  auto const& pipeline = model.pipeline();
  int const pp_rank = model.pipeline_rank(), V = pipeline.vpp();
  constexpr int depths = Model::mtp_depths;
  double sequence_ops = 0.0, head_forwards = 0.0, cp_bytes = 0.0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    int const v = ops[i].chunk, stage = pipeline.stage(pp_rank, v);
    int const first = pipeline.first_layer(stage);
    bool const embeds = model.chunk_embeds(v), head = model.chunk_has_head(v);
    int L = pipeline.layers(stage), dense = 0;
    for (int l = first; l < first + L; ++l) dense += model.is_moe(l) ? 0 : 1;
    if (head)
      for (int k = 0; k < depths; ++k, ++L) dense += model.is_moe(model.layers() + k) ? 0 : 1;
    bool const forward = ops[i].kind == parallel::pipeline_op::forward;
    double const passes = forward ? 1.0 : 1.0 + repeats[i];  // backward (and its repeat)
    double const forwards = forward ? 1.0 : repeats[i];
    sequence_ops += passes * (2.0 * (L + dense) + (embeds ? 1 : 0) + (head ? 1 + 2 * depths : 0));
    head_forwards += head ? forwards * (1 + depths) : 0.0;
    double const cp_forward = (cp - 1.0) * x;
    cp_bytes += L * (forwards * cp_forward + (forward ? 0.0 : per_layer - cp_forward));
  }
  double const tp_bytes = sequence_ops * (tp - 1.0) * rows / tp * H * bytes +
                          head_forwards * (tp - 1.0) * rows * 2.0 * sizeof(double);
  bool const embeds = model.chunk_embeds(0), has_head = model.chunk_has_head(V - 1);
  auto replicated = [&](double n, int ranks) { return 3.0 * n * bytes * (ranks - 1) / ranks; };
  int const P = groups.tp_dp_cp().size();
  double const logged = 6.0 + static_cast<double>(model.values().shape.experts) *
                                  static_cast<double>(model.moe_layer_count());
  auto const all_reduced = [&](double n, int ranks) {
    return 2.0 * n * sizeof(double) * (ranks - 1) / ranks;
  };
  double const logged_bytes = all_reduced(logged, P);
  // PP: per micro-batch, an activation sent from every chunk but the last virtual stage and a
  // gradient from every chunk but the first, N / TP rows each; the logged sums over the stages.
  int const sends = V - (has_head ? 1 : 0) + V - (embeds ? 1 : 0);
  double const table = depths > 0 && groups.pp().size() > 1 && (embeds || has_head)
                           ? static_cast<double>(model.embedding_table().size()) * bytes
                           : 0.0;
  double const pp_bytes = sends * s.micro_batches * rows / tp * H * bytes + table +
                          all_reduced(logged, groups.pp().size());
  nlohmann::ordered_json out;
  auto report = [&](char const* name, int ranks, double total, std::optional<double> implied) {
    if (ranks < 2) return;
    out[name]["bytes_per_step"] = total / steps;
    if (implied) out[name]["implied"] = *implied;
  };
  using dg = parallel::decoder_group;
  using eg = parallel::expert_group;
  for (std::size_t g = 0; g < D; ++g) {
    auto const group = static_cast<dg>(g);
    std::optional<double> implied;
    if (group == dg::tp) implied = tp_bytes;
    if (group == dg::cp) implied = cp_bytes;
    if (group == dg::pp) implied = pp_bytes;
    if (group == dg::tp_dp_cp) implied = replicated(of(kind::dense), P) + logged_bytes;
    if (group == dg::dp_cp) implied = replicated(of(kind::tensor_parallel), groups.dp_cp().size());
    report(parallel::process_groups::decoder_names[g], groups.get(group).size(),
           decoder_bytes[g], implied);
  }
  for (std::size_t g = 0; g < E; ++g) {
    auto const group = static_cast<eg>(g);
    std::optional<double> implied;
    if (group == eg::dp) implied = replicated(of(kind::expert), groups.expert_dp().size());
    report(parallel::process_groups::expert_names[g], groups.get(group).size(), expert_bytes[g],
           implied);
  }
  return out;
}

}  // namespace megamoe::train
