// SPDX-License-Identifier: Apache-2.0
// megamoe-train's job (megamoe_train.cpp has its command line): the options, one configuration's
// training run and --describe, and the entry points of the presets, built in two translation units
// (megamoe_train_small.cpp, megamoe_train_other.cpp) so that the configurations compile side by
// side.
#pragma once

#include "presets.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/config/describe.hpp>
#include <megamoe/config/resolve.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/io/checkpoint.hpp>
#include <megamoe/io/safetensors.hpp>
#include <megamoe/model/counts.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/parallel/traffic.hpp>
#include <megamoe/train/checkpoint.hpp>
#include <megamoe/train/corpus.hpp>
#include <megamoe/train/report.hpp>
#include <megamoe/train/trainer.hpp>
#include <megamoe/train/upcycle.hpp>

#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/collectives/gather.hpp>
#include <boost/mpi/operations.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace megamoe::train_job {

namespace mm = megamoe;
namespace mt = megamoe::train;
namespace rt = megamoe::router;
namespace md = megamoe::model;

struct options {
  int steps = 700, micro_batch = 16, global_batch = 0, seq_len = 128;
  int tp = 1, cp = 1, etp = 0, ep = 0;                  // etp, ep 0: their defaults
  int pp = 1, vpp = 0, layers_per_virtual_stage = 0;    // vpp 0: 1, or from the layers per stage
  int first_stage_layers = -1, last_stage_layers = -1;  // -1: an even split
  std::string pipeline_layout;                          // the reference's layout text
  bool merged_schedule = false;                         // --overlap-moe-expert-parallel-comm
  int eval_interval = 0, eval_iters = 0;                // 0: steps / 4, and every held-out window
  double lr = 3e-3;
  std::uint64_t seed = 1234;
  std::string data = "/usr/share/games/fortunes", out = "megamoe-train-out", preset = "small";
  std::string precision = "fp32";
  std::string backend = "auto";  // as given; resolved_backend() says which unit runs
  // The reference's precision flags, resolved into `precision` (precision_from_reference_flags).
  bool bf16_flag = false;
  std::string fp8_format, fp8_recipe = "delayed", fp4_format, fp4_recipe = "nvfp4";
  // Layers kept in BF16 under an FP8 or FP4 recipe: the reference's --first-last-layers-bf16 (on
  // by default for nvfp4, as the reference's NVFP4 recipes keep them) with its counts, resolved
  // into `bf16_layers` (at the start, at the end).
  bool first_last_layers_bf16 = false, no_first_last_layers_bf16 = false;
  int layers_at_start_in_bf16 = 1, layers_at_end_in_bf16 = 1;
  std::array<int, 2> bf16_layers{0, 0};
  bool bf16_layers_given = false;
  // The linear weights held as the recipe's codes, their fp32 masters in the optimizer: the
  // reference's --fp8-param-gather and --fp4-param-gather, resolved into `quantized_weights`.
  bool fp8_param_gather = false, fp4_param_gather = false, quantized_weights = false;
  // Adam's moments: the reference's precision-aware optimizer flags, resolved into `moments`.
  bool precision_aware_optimizer = false;
  std::string exp_avg_dtype = "fp32", exp_avg_sq_dtype = "fp32", moments = "fp32";
  bool describe = false, profile = false;
  // Checkpoints.
  std::string save, load, upcycle;
  int save_interval = 0;
  bool no_load_optim = false, finetune = false, exit_signal_handler = false;
  // Which flags the command line gave (a resumed run takes the others from the checkpoint).
  bool steps_given = false, seed_given = false, seq_len_given = false, global_batch_given = false,
       lr_given = false, preset_given = false, micro_batch_given = false, precision_given = false,
       moments_given = false, quantized_weights_given = false;
};

/// The model's layers `bf16_layers` keeps in BF16, in order.
inline std::vector<int> layers_in_bf16(int layers, std::array<int, 2> bf16_layers) {
  std::vector<int> out;
  for (int i = 0; i < layers; ++i)
    if (i < bf16_layers[0] || i >= layers - bf16_layers[1]) out.push_back(i);
  return out;
}

/// The modules whose GEMMs read the recipe's operands, those whose weights are held as codes
/// (`quantized_weights`: all of them but shared experts), the layers kept in BF16, and what stays
/// in higher precision.
inline nlohmann::json quantized_modules(mm::config_values const& v, std::string const& precision,
                                        std::array<int, 2> bf16_layers, bool quantized_weights) {
  nlohmann::json quantized = nlohmann::json::array(), codes = nlohmann::json::array();
  auto const kept = layers_in_bf16(v.model.layers, bf16_layers);
  auto add = [&](std::string const& module, bool as_codes) {
    quantized.push_back(module);
    if (quantized_weights && as_codes) codes.push_back(module);
  };
  if (precision != "fp32")
    for (int i = 0; i < v.model.layers; ++i) {
      if (std::ranges::find(kept, i) != kept.end()) continue;
      std::string const layer = "decoder.layers." + std::to_string(i);
      add(layer + ".self_attention.linear_qkv", true);
      add(layer + ".self_attention.linear_proj", true);
      if (v.model.is_moe(i)) {
        add(layer + ".mlp.experts", true);
        if (v.shape.shared_ffn > 0) add(layer + ".mlp.shared_experts", false);
      } else {
        add(layer + ".mlp.linear_fc1", true);
        add(layer + ".mlp.linear_fc2", true);
      }
    }
  return {{"precision", precision},
          {"quantized", quantized},
          {"weights_as_codes", codes},
          {"bf16_layers", kept},
          {"higher_precision",
           {"embedding", "router", "norms", "attention softmax", "output_layer", "loss"}}};
}

inline volatile std::sig_atomic_t terminate_requested = 0;
inline void request_termination(int) {
  terminate_requested = 1;
}

/// The job's degrees: TP, CP and PP as given, ETP = --etp or TP, EP = --ep or every rank of a
/// stage's expert grid (world / (ETP PP); 1 for the dense preset).
inline mm::parallel::degrees job_degrees(int world_size, options const& o) {
  mm::parallel::degrees d;
  d.tp = o.tp;
  d.cp = o.cp;
  d.pp = o.pp;
  d.etp = o.etp > 0 ? o.etp : o.tp;
  int const per_stage = o.pp > 0 && world_size % o.pp == 0 ? world_size / o.pp : world_size;
  int const grid = d.etp > 0 && per_stage % d.etp == 0 ? per_stage / d.etp : per_stage;
  d.ep = o.ep > 0 ? o.ep : (o.preset == "dense" ? 1 : grid);
  return d;
}

/// --num-layers-per-virtual-pipeline-stage n as V = layers / (PP n), the reference's conversion.
template <class Config>
options with_virtual_stages(options o) {
  if (o.layers_per_virtual_stage == 0) return o;
  int const layers = Config::model::value.layers;
  if (o.vpp > 0)
    throw mm::input_error(
        "megamoe-train: give --vpp or --num-layers-per-virtual-pipeline-stage, not both");
  if (o.layers_per_virtual_stage < 0 || o.pp < 1 ||
      layers % (o.pp * o.layers_per_virtual_stage) != 0)
    throw mm::config_error(mm::rules::id::pipeline_stages_divide_layers,
                           std::to_string(layers) + " layers, PP " + std::to_string(o.pp) + ", " +
                               std::to_string(o.layers_per_virtual_stage) +
                               " layers per virtual stage");
  o.vpp = layers / (o.pp * o.layers_per_virtual_stage);
  return o;
}

/// The start-up values of this job: its degrees, its world size and its pipeline's split.
inline mm::startup_values job_values(mm::parallel::degrees const& d, int world_size,
                                     options const& o) {
  mm::startup_values v{
      .tp = d.tp, .cp = d.cp, .pp = d.pp, .etp = d.etp, .ep = d.ep, .world_size = world_size};
  if (o.vpp > 0) v.vpp = o.vpp;
  if (o.first_stage_layers >= 0) v.first_stage_layers = o.first_stage_layers;
  if (o.last_stage_layers >= 0) v.last_stage_layers = o.last_stage_layers;
  v.pipeline_layout = o.pipeline_layout;
  if (o.bf16_layers[0] > 0 || o.bf16_layers[1] > 0) {
    v.bf16_layers_at_start = o.bf16_layers[0];
    v.bf16_layers_at_end = o.bf16_layers[1];
  }
  return v;
}

/// --describe: the preset resolved for this job, with its size and cost, as one JSON line.
template <class Config>
int describe_job(mm::parallel::environment& env, options o) {
  auto const& world = env.world();
  mm::config_values values;
  mm::parallel::pipeline_layout pipeline;
  mm::parallel::check_on_every_rank(world, [&] {
    if (o.seq_len < 2) throw mm::input_error("megamoe-train: --seq-len must be at least 2");
    o = with_virtual_stages<Config>(o);
    auto const given = job_values(job_degrees(world.size(), o), world.size(), o);
    values = mm::resolve<Config>(given);
    pipeline = mm::parallel::pipeline_layout::of(values.model.layers, values.parallel.pp,
                                                 given.pipeline_layout, given.vpp,
                                                 given.first_stage_layers, given.last_stage_layers);
  });
  if (world.rank() == 0) {
    auto json = mm::describe(values).flat;
    json["num_virtual_stages_per_pipeline_rank"] = pipeline.vpp();
    std::vector<int> layers;
    for (int j = 0; j < pipeline.stages(); ++j) layers.push_back(pipeline.layers(j));
    json["layers_per_virtual_stage"] = layers;
    json["preset"] = o.preset;
    json["precision_modules"] =
        quantized_modules(values, o.precision, o.bf16_layers, o.quantized_weights);
    json["backend"] = o.backend;
    json["optimizer_moments"] = o.moments;
    json["seq_length"] = o.seq_len;
    json["num_parameters"] = mm::parameter_count(values);
    json["model_flops_per_token"] = mm::flops_per_token(values, o.seq_len);
    std::cout << json.dump() << std::endl;
  }
  return 0;
}

/// Each expert's share of a layer's tokens (0 where no token was routed).
inline std::vector<double> load_shares(std::vector<double> const& counts) {
  double total = 0.0;
  for (double c : counts) total += c;
  std::vector<double> share(counts.size());
  for (std::size_t e = 0; e < counts.size(); ++e) share[e] = total > 0 ? counts[e] / total : 0;
  return share;
}

inline std::string duration(double seconds) {
  int const s = static_cast<int>(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%dm%02ds", s / 60, s % 60);
  return buf;
}

/// Continues `prompt` by sampling bytes (temperature 0.8) from the model, every rank alike.
template <class Trainer>
std::string generate(mm::context& ctx, Trainer& trainer, std::string const& prompt, int length,
                     int window, std::uint64_t seed) {
  auto& model = trainer.model();
  std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
  ctx.step.mode = rt::pass::eval;
  std::string out = prompt;
  // Under CP and TP the window is padded at its end to whole chunks and sequence-parallel parts:
  // causal attention and dropless routing keep the padding from the logits of position n - 1.
  int const cp = model.context_parallel();
  int const multiple = (cp > 1 ? 2 * cp : 1) * model.tensor_parallel();
  std::vector<std::int32_t> context;
  for (int i = 0; i < length; ++i) {
    int const n = std::min<int>(static_cast<int>(tokens.size()), window);
    int const padded = (n + multiple - 1) / multiple * multiple;
    context.assign(tokens.end() - n, tokens.end());
    context.resize(static_cast<std::size_t>(padded), 0);
    // Through the pipeline's stages; the last one's logits to every stage.
    trainer.pipeline().run_forward_only(ctx, context, {}, padded, 1);
    std::vector<double> logits(static_cast<std::size_t>(model.values().model.vocabulary));
    int const last_chunk = model.pipeline().vpp() - 1;
    if (model.chunk_has_head(last_chunk)) logits = model.logits_at(n - 1, 0);
    if (model.pipelined())
      boost::mpi::broadcast(trainer.groups()->pp(), logits.data(), static_cast<int>(logits.size()),
                            model.pipeline().pp() - 1);
    Eigen::RowVectorXd const last = Eigen::Map<Eigen::RowVectorXd const>(
                                        logits.data(), static_cast<Eigen::Index>(logits.size())) /
                                    0.8;
    Eigen::RowVectorXd const p = (last.array() - last.maxCoeff()).exp();
    double u = mm::uniform_open01(mm::splitmix64(seed) ^ static_cast<std::uint64_t>(i)) * p.sum();
    int next = 0;
    while (next < 255 && (u -= p(next)) > 0) ++next;
    tokens.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  ctx.step.mode = rt::pass::training;
  return out;
}

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
nlohmann::ordered_json group_traffic(mm::parallel::process_groups const& groups, Model& model,
                                     mt::train_settings const& s,
                                     std::span<mm::parallel::pipeline_op const> ops,
                                     std::span<char const> repeats,
                                     std::array<double, D> const& decoder_bytes,
                                     std::array<double, E> const& expert_bytes, int steps) {
  using scalar = typename Model::scalar;
  double const bytes = sizeof(scalar);
  // Elements per kind they are reduced and gathered as (weights held as codes are gathered in
  // fp32 from the optimizer's shards, one tensor at a time, as the others all at once).
  std::array<double, mm::parameter_kinds> elements{};
  model.for_each_parameter([&](std::string_view, auto, auto grad, mm::parameter_kind kind) {
    elements[static_cast<std::size_t>(mm::reduced_as(kind))] += static_cast<double>(grad.size());
  });
  using kind = mm::parameter_kind;
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
  bool const p2p = Model::cp_comm == mm::parallel::cp_comm_type::p2p;
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
    bool const forward = ops[i].kind == mm::parallel::pipeline_op::forward;
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
  using dg = mm::parallel::decoder_group;
  using eg = mm::parallel::expert_group;
  for (std::size_t g = 0; g < D; ++g) {
    auto const group = static_cast<dg>(g);
    std::optional<double> implied;
    if (group == dg::tp) implied = tp_bytes;
    if (group == dg::cp) implied = cp_bytes;
    if (group == dg::pp) implied = pp_bytes;
    if (group == dg::tp_dp_cp) implied = replicated(of(kind::dense), P) + logged_bytes;
    if (group == dg::dp_cp) implied = replicated(of(kind::tensor_parallel), groups.dp_cp().size());
    report(mm::parallel::process_groups::decoder_names[g], groups.get(group).size(),
           decoder_bytes[g], implied);
  }
  for (std::size_t g = 0; g < E; ++g) {
    auto const group = static_cast<eg>(g);
    std::optional<double> implied;
    if (group == eg::dp) implied = replicated(of(kind::expert), groups.expert_dp().size());
    report(mm::parallel::process_groups::expert_names[g], groups.get(group).size(), expert_bytes[g],
           implied);
  }
  return out;
}

/// A setting megamoe-train kept in a checkpoint's job state, or `fallback` where it kept none.
inline std::string saved_job_setting(mm::io::checkpoint_reader const& checkpoint, char const* key,
                                     char const* fallback) {
  return checkpoint.state().value("job", nlohmann::json::object()).value(key, fallback);
}

/// A resumed run takes the job's settings from the checkpoint where the command line did not
/// give them; a flag that contradicts it is an error. Returns the saved schedule's total.
inline int take_saved_settings(nlohmann::json const& state, options& o) {
  if (!state.contains("step"))
    throw mm::input_error("megamoe-train: " + o.load +
                          " holds weights only, no training state: load it with --finetune");
  auto const job = state.value("job", nlohmann::json::object());
  int const saved_steps = job.value("steps", 0);
  auto same = [](char const* flag, bool given, auto mine, auto saved) {
    if (given && mine != saved)
      throw mm::input_error("megamoe-train: " + std::string(flag) + " " + std::to_string(mine) +
                            " differs from the checkpoint's " + std::to_string(saved) +
                            " (a resumed run keeps it; --finetune starts afresh)");
  };
  auto const seed = state.at("seed").get<std::uint64_t>();
  int const seq_len = state.at("seq_length").get<int>();
  int const global = state.at("global_batch").get<int>();
  double const lr = state.at("schedule").at("peak").get<double>();
  same("--seed", o.seed_given, o.seed, seed);
  same("--seq-len", o.seq_len_given, o.seq_len, seq_len);
  same("--global-batch", o.global_batch_given, o.global_batch, global);
  same("--lr", o.lr_given, o.lr, lr);
  o.seed = seed;
  o.seq_len = seq_len;
  o.global_batch = global;
  o.lr = lr;
  if (!o.steps_given) o.steps = saved_steps;
  if (!o.micro_batch_given) o.micro_batch = job.value("micro_batch", o.micro_batch);
  return saved_steps;
}

template <class Config, class Moments>
int train(mm::parallel::environment& env, options o, mm::io::checkpoint_reader* resume) {
  auto const& world = env.world();
  mm::parallel::check_on_every_rank(world, [&] { o = with_virtual_stages<Config>(o); });
  bool const root = world.rank() == 0;
  bool const resuming = resume != nullptr && !o.finetune;
  int saved_total = 0;
  if (resuming)
    mm::parallel::check_on_every_rank(
        world, [&] { saved_total = take_saved_settings(resume->state(), o); });
  auto const degrees = job_degrees(world.size(), o);
  mm::parallel::process_groups const groups(world, degrees);
  int const dp = groups.dp().size();
  // A resumed job on fewer ranks per sequence keeps the global batch: its saved micro-batch
  // size gives way where it no longer divides it.
  if (resuming && !o.micro_batch_given && o.global_batch % (o.micro_batch * dp) != 0 &&
      o.global_batch % dp == 0)
    o.micro_batch = o.global_batch / dp;
  mt::train_settings settings;
  mm::parallel::check_on_every_rank(world, [&] {
    if (o.eval_interval < 0 || o.eval_iters < 0)
      throw mm::input_error("megamoe-train: --eval-interval and --eval-iters cannot be negative");
    if (o.steps < 1 || o.micro_batch < 1 || o.seq_len < 2 || !(o.lr > 0))
      throw mm::input_error(
          "megamoe-train: --steps, --micro-batch, --seq-len and --lr must be "
          "positive (--seq-len at least 2)");
    int const global = o.global_batch > 0 ? o.global_batch : o.micro_batch * dp;
    if (global % (o.micro_batch * dp) != 0)
      throw mm::input_error("megamoe-train: --global-batch " + std::to_string(global) +
                            " does not divide into micro-batches of " +
                            std::to_string(o.micro_batch) + " over " + std::to_string(dp) +
                            " data-parallel ranks");
    settings.micro_batches = global / (o.micro_batch * dp);
  });
  mt::byte_corpus corpus = [&] {
    std::optional<mt::byte_corpus> loaded;
    mm::parallel::check_on_every_rank(world, [&] { loaded = mt::byte_corpus::load(o.data); });
    return std::move(*loaded);
  }();
  settings.seq_length = o.seq_len;
  settings.micro_batch = o.micro_batch;
  settings.steps = o.steps;
  settings.seed = o.seed;
  settings.schedule = {o.lr, o.lr / 10, std::max(1, o.steps / 20), o.steps};
  mm::transformer<Config> model(groups, job_values(degrees, world.size(), o));
  model.initialize(o.seed, 0.02);
  std::string upcycled_line;
  if (!o.upcycle.empty()) {
    int const g = mt::upcycle(model, world, o.upcycle);
    upcycled_line = "; upcycled from " + o.upcycle + " (granularity " + std::to_string(g) + ")";
  }
  mt::trainer<Config, Moments> trainer(groups, model, corpus, settings);
  // Adam's moments over the job: their bytes and what their dtype saves against fp32; and with
  // weights held as codes, the fp32 masters the optimizer keeps and the fp32 weight values the
  // modules freed.
  double freed = 0.0;
  model.for_each_parameter([&](std::string_view, auto, auto grad, mm::parameter_kind kind) {
    if (mm::holds_codes(kind)) freed += static_cast<double>(grad.size() * sizeof(float));
  });
  std::array<double, 4> moment_bytes = {
      static_cast<double>(trainer.optimizer().state_bytes()),
      static_cast<double>(trainer.optimizer().state_bytes_saved()),
      static_cast<double>(trainer.optimizer().master_bytes()), freed};
  mm::parallel::all_reduce_sum(world, std::span<double>(moment_bytes));
  if (o.merged_schedule)
    mm::parallel::check_on_every_rank(world, [&] {
      if constexpr (mm::transformer<Config>::parks_micro_batches)
        trainer.template use_schedule<mm::parallel::merged_one_f_one_b>();
      else
        throw mm::input_error(
            "megamoe-train: --overlap-moe-expert-parallel-comm needs a model "
            "that sets micro-batches aside; under --precision " +
            o.precision + " the operands keep one micro-batch's codes");
    });
  mm::context ctx(env.num_threads());
  std::string resumed_line;
  if (resume != nullptr) {
    auto const report = mt::load_checkpoint(
        trainer, world, *resume, {.optimizer = !o.no_load_optim, .finetune = o.finetune});
    std::ostringstream line;
    line << (o.finetune ? "fine-tuning from" : "resumed from") << " iteration " << report.iteration
         << " of " << resume->folder().parent_path().string() << " (" << report.bytes
         << " bytes in " << report.seconds << " s"
         << (o.no_load_optim && !o.finetune ? ", fresh optimizer state" : "") << ")";
    auto const saved_moments = saved_job_setting(*resume, "moments", "fp32");
    if (!o.no_load_optim && !o.finetune && saved_moments != o.moments)
      line << "; Adam moments converted from " << saved_moments << " to " << o.moments;
    if (resuming) {
      // The saved schedule continues bit for bit; another total recomputes it.
      auto const& s = resume->state().at("schedule");
      mm::optim::lr_schedule saved{s.at("peak").get<double>(), s.at("minimum").get<double>(),
                                   s.at("warmup").get<int>(), s.at("total").get<int>()};
      if (o.steps != saved_total && o.steps > trainer.steps_done())
        line << "; learning-rate schedule recomputed for " << o.steps << " steps (was "
             << saved_total << ")";
      else
        trainer.set_schedule(saved);
    }
    resumed_line = line.str();
  }
  int const first_step = trainer.steps_done() + 1;
  if (o.exit_signal_handler) std::signal(SIGTERM, request_termination);
  nlohmann::json const job_state = {{"preset", o.preset},
                                    {"precision", o.precision},
                                    {"backend", o.backend},
                                    {"moments", o.moments},
                                    {"steps", o.steps},
                                    {"micro_batch", o.micro_batch},
                                    {"bf16_layers", o.bf16_layers},
                                    {"quantized_weights", o.quantized_weights}};
  int last_saved = resuming ? trainer.steps_done() : -1;
  auto save = [&] {
    if (o.save.empty() || last_saved == trainer.steps_done()) return;
    auto const report = mt::save_checkpoint(trainer, world, o.save, job_state);
    last_saved = trainer.steps_done();
    if (root)
      std::fprintf(stderr, "\n  saved iteration %d to %s (%.1f MB in %.2f s)\n", report.iteration,
                   o.save.c_str(), static_cast<double>(report.bytes) / 1e6, report.seconds);
  };

  std::filesystem::create_directories(o.out);
  auto const out_dir = std::filesystem::absolute(o.out);
  auto const metrics_path = out_dir / "metrics.jsonl", plot_path = out_dir / "training.svg",
             weights_path = out_dir / "model.safetensors";
  // Held-out evaluation: --eval-iters global batches of windows (0: every window).
  int const global_sequences = settings.micro_batch * settings.micro_batches * dp;
  int const eval_windows = o.eval_iters > 0 ? std::min(corpus.heldout_windows(o.seq_len),
                                                       o.eval_iters * global_sequences)
                                            : corpus.heldout_windows(o.seq_len);
  double const unigram = corpus.unigram_bits_per_byte(o.seq_len, eval_windows);
  mt::training_history history;
  history.unigram_bpb = unigram;
  history.load.resize(static_cast<std::size_t>(model.moe_layer_count()));
  std::ofstream metrics;
  if (root) {
    // A resumed run keeps the lines of the steps it resumes after (a killed run may have written
    // more) and rebuilds the picture's history from them.
    std::vector<std::string> kept;
    if (resuming) {
      std::ifstream in(metrics_path);
      for (std::string text; std::getline(in, text);) {
        auto const line = nlohmann::json::parse(text, nullptr, false);
        if (line.is_discarded() || line.value("step", 0) < 1 || line.value("step", 0) >= first_step)
          continue;
        kept.push_back(text);
        history.train_bpb.push_back(line.value("train_bpb", 0.0));
        if (line.contains("heldout_bpb"))
          history.heldout_bpb.emplace_back(line["step"].get<int>(),
                                           line["heldout_bpb"].get<double>());
        auto const& loads = line.value("expert_load", nlohmann::json::array());
        for (std::size_t l = 0; l < loads.size() && l < history.load.size(); ++l) {
          history.load[l].push_back(
              load_shares(loads[l].at("tokens_per_expert").get<std::vector<double>>()));
        }
      }
    }
    metrics.open(metrics_path, std::ios::trunc);
    for (auto const& text : kept) metrics << text << '\n';
    metrics.flush();
  }
  std::string bf16_layers_note;
  for (int i : layers_in_bf16(model.layers(), o.bf16_layers))
    bf16_layers_note += (bf16_layers_note.empty() ? " (layers " : ", ") + std::to_string(i);
  if (!bf16_layers_note.empty()) bf16_layers_note += " in BF16)";
  if (root)
    std::cerr << "megamoe-train: preset " << o.preset << ", precision " << o.precision
              << bf16_layers_note << " on " << o.backend << ", " << corpus.training().size()
              << " training bytes, " << corpus.heldout().size() << " held out (unigram " << unigram
              << " bits/byte); " << world.size() << " rank(s), TP " << degrees.tp << ", CP "
              << degrees.cp << ", PP " << degrees.pp
              << (model.pipeline().vpp() > 1 ? " x V " + std::to_string(model.pipeline().vpp())
                                             : std::string())
              << ", EP " << degrees.ep << ", global batch "
              << settings.micro_batch * settings.micro_batches * dp << " x " << o.seq_len
              << " bytes; Adam moments " << o.moments << " (" << std::lround(moment_bytes[0] / 1e3)
              << " kB, " << std::lround(moment_bytes[1] / 1e3) << " kB saved)"
              << (o.quantized_weights ? "; linear weights as " + o.precision + " codes (" +
                                            std::to_string(std::lround(moment_bytes[3] / 1e3)) +
                                            " kB of fp32 values freed, " +
                                            std::to_string(std::lround(moment_bytes[2] / 1e3)) +
                                            " kB of fp32 masters in the optimizer's shards)"
                                      : std::string())
              << (resumed_line.empty() ? std::string() : "; " + resumed_line) << upcycled_line
              << "\n";
  int const eval_every = o.eval_interval > 0 ? o.eval_interval : std::max(1, o.steps / 4);
  bool const terminal = isatty(fileno(stderr)) != 0;
  double const flops_per_token = model.flops_per_token(o.seq_len);
  // With multi-token prediction its loss is reported beside the main head's.
  constexpr bool has_mtp = std::remove_reference_t<decltype(model)>::mtp_depths > 0;
  double heldout = 0.0;
  if (first_step == 1) {
    heldout = trainer.heldout_bits_per_byte(ctx, eval_windows);
    history.heldout_bpb.emplace_back(1, heldout);
  }
  if (first_step > o.steps && root)
    std::fprintf(stderr, "megamoe-train: --steps %d already reached at iteration %d\n", o.steps,
                 first_step - 1);
  double tokens_per_s = 0.0, elapsed = 0.0, bubble = 0.0;
  bool terminated = false;
  // The step profile: seconds per stage over the steps run (this rank's).
  std::array<double, static_cast<std::size_t>(mm::layer_stage::count)> moe_seconds{};
  std::array<double, static_cast<std::size_t>(mm::step_stage::count)> step_seconds{};
  // And the bytes this rank sent on each group in the training steps (parallel/traffic.hpp).
  using groups_type = mm::parallel::process_groups;
  std::array<double, groups_type::decoder_names.size()> decoder_bytes{};
  std::array<double, groups_type::expert_names.size()> expert_bytes{};
  auto& traffic = mm::parallel::traffic::instance();
  for (int step = first_step; step <= o.steps; ++step) {
    ctx.stages.clear();
    ctx.step_stages.clear();
    traffic.reset();
    auto const& m = trainer.step(ctx);
    for (std::size_t g = 0; g < decoder_bytes.size(); ++g)
      decoder_bytes[g] += static_cast<double>(
          traffic.bytes(MPI_Comm(groups.get(static_cast<mm::parallel::decoder_group>(g)))));
    for (std::size_t g = 0; g < expert_bytes.size(); ++g)
      expert_bytes[g] += static_cast<double>(
          traffic.bytes(MPI_Comm(groups.get(static_cast<mm::parallel::expert_group>(g)))));
    for (std::size_t i = 0; i < moe_seconds.size(); ++i) moe_seconds[i] += ctx.stages.seconds[i];
    for (std::size_t i = 0; i < step_seconds.size(); ++i)
      step_seconds[i] += ctx.step_stages.seconds[i];
    elapsed += m.seconds;
    bubble += m.pipeline_bubble;
    tokens_per_s =
        static_cast<double>(trainer.global_batch_tokens()) * (step - first_step + 1) / elapsed;
    double const bpb = m.loss / std::log(2.0);
    history.train_bpb.push_back(bpb);
    nlohmann::ordered_json line;
    line["step"] = step;
    line["loss"] = m.loss;
    line["train_bpb"] = bpb;
    line["aux_loss"] = m.aux_loss;
    line["z_loss"] = m.z_loss;
    if constexpr (has_mtp) line["mtp_loss"] = m.mtp_loss;
    line["lr"] = m.lr;
    line["grad_norm"] = m.grad_norm;
    line["tokens_per_s"] = m.tokens_per_s;
    line["model_gflops_per_s"] = m.tokens_per_s * flops_per_token / 1e9;
    if (model.pipelined()) line["pipeline_bubble"] = m.pipeline_bubble;
    if (m.skipped) {
      line["skipped_nonfinite"] = m.nonfinite_at;
      if (root)
        std::fprintf(stderr, "\nstep %d skipped: non-finite loss or gradient (first in %s)\n", step,
                     m.nonfinite_at.empty() ? "the loss" : m.nonfinite_at.c_str());
    }
    nlohmann::ordered_json loads = nlohmann::ordered_json::array();
    for (std::size_t l = 0; l < m.expert_load.size(); ++l) {
      auto const& counts = m.expert_load[l];
      double total = 0.0, top = 0.0;
      for (double c : counts) total += c, top = std::max(top, c);
      history.load[l].push_back(load_shares(counts));
      loads.push_back({{"tokens_per_expert", counts},
                       {"imbalance", total > 0 ? top * counts.size() / total : 0.0}});
    }
    line["expert_load"] = loads;
    if (step % eval_every == 0 || step == o.steps) {
      heldout = trainer.heldout_bits_per_byte(ctx, eval_windows);
      history.heldout_bpb.emplace_back(step, heldout);
      line["heldout_bpb"] = heldout;
      if constexpr (has_mtp) line["heldout_mtp_bpb"] = trainer.heldout_mtp_bits_per_byte();
    }
    if (root) metrics << line.dump() << '\n' << std::flush;
    if (o.save_interval > 0 && step % o.save_interval == 0) save();
    if (o.exit_signal_handler) {
      int const asked = boost::mpi::all_reduce(world, static_cast<int>(terminate_requested),
                                               boost::mpi::maximum<int>());
      if (asked != 0) {
        save();
        if (root)
          std::fprintf(stderr, "\nmegamoe-train: SIGTERM: %s after step %d, exiting\n",
                       o.save.empty() ? "no --save, nothing saved" : "saved", step);
        terminated = true;
        break;
      }
    }
    if (!root) continue;
    bool const evaluated = line.contains("heldout_bpb");
    if (!terminal && !evaluated) continue;  // a log file gets one line per interval
    int const bar = 30, done = bar * step / o.steps;
    std::fprintf(stderr, "%sstep %d/%d [%s%s] loss %.3f bits/byte | %.0f tok/s | ETA %s   %s",
                 terminal ? "\r" : "", step, o.steps,
                 std::string(static_cast<std::size_t>(done), '#').c_str(),
                 std::string(static_cast<std::size_t>(bar - done), '-').c_str(), bpb, tokens_per_s,
                 duration(elapsed / step * (o.steps - step)).c_str(), terminal ? "" : "\n");
    if (evaluated && has_mtp)
      std::fprintf(stderr, "%s  held-out %.3f bits/byte (unigram %.3f; MTP %.3f)\n",
                   terminal ? "\n" : "", heldout, unigram, trainer.heldout_mtp_bits_per_byte());
    else if (evaluated)
      std::fprintf(stderr, "%s  held-out %.3f bits/byte (unigram %.3f)\n", terminal ? "\n" : "",
                   heldout, unigram);
  }
  if (terminated) return 0;
  save();
  if (first_step > o.steps) heldout = trainer.heldout_bits_per_byte(ctx, eval_windows);
  // Shares of the step: the stages outside the MoE layers, the MoE layers' stages, the rest.
  nlohmann::ordered_json profile, traffic_report;
  if (o.profile && elapsed > 0) {
    double accounted = 0.0;
    auto share = [&](char const* name, double seconds) {
      profile[name] = seconds / elapsed;
      accounted += seconds;
    };
    for (std::size_t i = 0; i < step_seconds.size(); ++i)
      share(mm::step_stage_names[i], step_seconds[i]);
    for (std::size_t i = 0; i < moe_seconds.size(); ++i)
      share(mm::layer_stage_names[i], moe_seconds[i]);
    profile["rest"] = (elapsed - accounted) / elapsed;
    profile["seconds_per_step"] = elapsed / (o.steps - first_step + 1);
    if (model.pipelined()) {
      // The schedule's idle share with equal passes: (p - 1) / (m + p - 1), divided by V when
      // interleaved.
      double const p = model.pipeline().pp(), mb = settings.micro_batches;
      profile["pipeline_bubble_analytical"] = (p - 1) / (mb + p - 1) / model.pipeline().vpp();
    }
    if (root) {
      std::string line = "megamoe-train: step profile (rank 0, share of the step):";
      for (auto const& [name, value] : profile.items())
        if (name != "seconds_per_step") {
          char part[80];
          std::snprintf(part, sizeof part, " %s %.1f %%", name.c_str(),
                        100.0 * value.template get<double>());
          line += part;
        }
      std::fprintf(stderr, "%s; %.4f s per step\n", line.c_str(),
                   profile["seconds_per_step"].get<double>());
    }
    traffic_report = group_traffic(groups, model, settings, trainer.schedule(),
                                   trainer.pipeline().repeated_forwards(), decoder_bytes,
                                   expert_bytes, o.steps - first_step + 1);
    if (root && !traffic_report.empty()) {
      std::string line = "megamoe-train: bytes per step sent by rank 0 (implied by the layout):";
      for (auto const& [name, value] : traffic_report.items()) {
        char part[120];
        std::snprintf(part, sizeof part, " %s %.4g", name.c_str(),
                      value["bytes_per_step"].template get<double>());
        line += part;
        if (value.contains("implied")) {
          std::snprintf(part, sizeof part, " (%.4g)", value["implied"].template get<double>());
          line += part;
        }
      }
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }
  std::string const sample = generate(ctx, trainer, "The ", 200, o.seq_len, o.seed);
  if (root) {
    std::fprintf(stderr,
                 "megamoe-train: %d steps run, %.0f tokens/s, %.2f effective model GFLOP/s (%.3g "
                 "FLOPs per token, forward + backward), held-out %.3f bits/byte (unigram %.3f)\n",
                 std::max(0, o.steps - first_step + 1), tokens_per_s,
                 tokens_per_s * flops_per_token / 1e9, flops_per_token, heldout, unigram);
    std::cout << "sample:\n" << sample << "\n" << std::flush;
  }

  // Weights: every rank's pieces of each tensor to rank 0 (experts live on their EP ranks, TP and
  // ETP shards on theirs), placed there by their numbering into whole tensors, fp32.
  std::vector<std::string> names;
  std::vector<std::vector<std::int64_t>> shapes, rectangles;  // whole [rows, cols]; per piece
  std::vector<std::vector<float>> values;                     // (row, col, rows, cols) in order
  // One-expert layers (the dense preset) are dense FFNs: saved under the dense names.
  bool const dense_names = model.values().shape.experts == 1;
  model.for_each_numbered_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind,
                                        mm::element_numbering const& n) {
    auto const saved = dense_names ? mt::dense_parameter_name(std::string(name))
                                   : std::optional<std::string>(name);
    if (!saved || value.size() == 0) return;
    names.push_back(*saved);
    shapes.push_back({n.whole_rows(value.rows()), n.global_cols});
    auto& pieces = rectangles.emplace_back();
    mm::for_each_rectangle(n, value.cols(), 0, value.size(), [&](mm::global_rectangle const& r) {
      pieces.insert(pieces.end(), {r.row, r.col, r.rows, r.cols});
    });
    values.emplace_back(value.data(), value.data() + value.size());
  });
  // Weights held as codes: their fp32 masters, each element in the optimizer shard of one rank.
  if constexpr (mm::transformer<Config>::quantized_weights) {
    auto const numbering = mt::parameter_numbering(model);
    trainer.optimizer().for_each_shard_piece([&](auto const& piece) {
      if (!mm::holds_codes(piece.kind) || piece.count == 0) return;
      auto const& n = numbering.at(std::string(piece.name));
      names.emplace_back(piece.name);
      shapes.push_back({n.whole_rows(piece.rows), n.global_cols});
      auto& pieces = rectangles.emplace_back();
      mm::for_each_rectangle(n, piece.cols, piece.first, piece.count,
                             [&](mm::global_rectangle const& r) {
                               pieces.insert(pieces.end(), {r.row, r.col, r.rows, r.cols});
                             });
      values.emplace_back(piece.values, piece.values + piece.count);
    });
  }
  model.for_each_persistent_state([&](mm::persistent_state const& s) {
    if (s.name.find("expert_bias") == std::string_view::npos || dense_names) return;
    names.emplace_back(s.name);
    shapes.push_back({s.rows, s.cols});
    rectangles.push_back({s.first_row, 0, std::ssize(s.values) / s.cols, s.cols});
    values.emplace_back(s.values.begin(), s.values.end());
  });
  std::vector<std::vector<std::string>> all_names;
  std::vector<std::vector<std::vector<std::int64_t>>> all_shapes, all_rectangles;
  std::vector<std::vector<std::vector<float>>> all_values;
  boost::mpi::gather(world, names, all_names, 0);
  boost::mpi::gather(world, shapes, all_shapes, 0);
  boost::mpi::gather(world, rectangles, all_rectangles, 0);
  boost::mpi::gather(world, values, all_values, 0);
  if (root) {
    std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>> whole;
    for (std::size_t r = 0; r < all_names.size(); ++r)
      for (std::size_t i = 0; i < all_names[r].size(); ++i) {
        auto const& shape = all_shapes[r][i];
        auto& [dims, data] = whole[all_names[r][i]];
        if (dims.empty()) {
          dims = shape;
          data.assign(static_cast<std::size_t>(shape[0] * shape[1]), 0.0f);
        }
        auto const& pieces = all_rectangles[r][i];
        auto from = all_values[r][i].begin();
        for (std::size_t k = 0; k + 3 < pieces.size(); k += 4)
          for (std::int64_t row = 0; row < pieces[k + 2]; ++row) {
            auto const at = (pieces[k] + row) * shape[1] + pieces[k + 1];
            std::copy_n(from, pieces[k + 3], data.begin() + at);
            from += pieces[k + 3];
          }
      }
    std::vector<mm::io::tensor_view> tensors;
    for (auto const& [name, t] : whole)
      tensors.push_back({name, mm::io::reference_shape(name, t.first[0], t.first[1]), t.second});
    mm::io::write_safetensors(
        weights_path, tensors,
        {{"format", "pt"},
         {"producer", "megamoe-train"},
         {"preset", o.preset},
         {"configuration", mt::checkpoint_configuration(model.values()).at("model").dump()}});
    mt::write_svg(plot_path, history);
    nlohmann::ordered_json final;
    final["final"] = {{"steps", std::max(o.steps, first_step - 1)},
                      {"precision", o.precision},
                      {"backend", o.backend},
                      {"tokens_per_s", tokens_per_s},
                      {"heldout_bpb", heldout},
                      {"unigram_bpb", unigram},
                      {"metrics_path", metrics_path.string()},
                      {"plot_path", plot_path.string()},
                      {"weights_path", weights_path.string()},
                      {"optimizer_moments", o.moments},
                      {"optimizer_state_bytes", moment_bytes[0]},
                      {"optimizer_state_bytes_saved", moment_bytes[1]},
                      {"bf16_layers", layers_in_bf16(model.layers(), o.bf16_layers)},
                      {"quantized_weights", o.quantized_weights},
                      {"weight_master_bytes", moment_bytes[2]}};
    int const steps_run = o.steps - first_step + 1;
    if (model.pipelined() && steps_run > 0) final["final"]["pipeline_bubble"] = bubble / steps_run;
    if constexpr (has_mtp) final["final"]["heldout_mtp_bpb"] = trainer.heldout_mtp_bits_per_byte();
    if (!profile.empty()) final["final"]["profile"] = profile;
    if (!traffic_report.empty()) final["final"]["traffic"] = traffic_report;
    std::cout << final.dump() << std::endl;
  }
  return 0;
}

/// One configuration's job: --describe, or training with the moments' dtype `o.moments` (fp32
/// only where Bf16Moments is false; presets::bf16_moments_built_for refuses bf16 before).
template <class Config, bool Bf16Moments = true>
int run_config(mm::parallel::environment& env, options const& o,
               mm::io::checkpoint_reader* resume) {
  if (o.describe) return describe_job<Config>(env, o);
  if constexpr (Bf16Moments)
    if (o.moments == "bf16") return train<Config, mm::optim::bf16_moments>(env, o, resume);
  return train<Config, mm::optim::master_moments<typename mm::transformer<Config>::scalar>>(env, o,
                                                                                            resume);
}

/// The job of the preset and recipe `o` names, one group of configurations per translation unit:
/// small under fp32 and bf16 (megamoe_train_small.cpp) and under the FP8 and FP4 recipes
/// (megamoe_train_small_recipes.cpp), small with its weights held as codes
/// (megamoe_train_codes.cpp), medium and the presets built for fp32 only
/// (megamoe_train_other.cpp), the model families' presets (megamoe_train_families.cpp).
int run_small(mm::parallel::environment& env, options const& o, mm::io::checkpoint_reader* resume);
int run_small_recipes(mm::parallel::environment& env, options const& o,
                      mm::io::checkpoint_reader* resume);
int run_small_codes(mm::parallel::environment& env, options const& o,
                    mm::io::checkpoint_reader* resume);
int run_medium(mm::parallel::environment& env, options const& o, mm::io::checkpoint_reader* resume);
int run_fp32_presets(mm::parallel::environment& env, options const& o,
                     mm::io::checkpoint_reader* resume);
int run_family_presets(mm::parallel::environment& env, options const& o,
                       mm::io::checkpoint_reader* resume);

}  // namespace megamoe::train_job
