// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. Pipeline parallelism folded with TP, CP, DP, EP and ETP, against one rank on
// the same global batches, on an 8-layer model (MoE on even layers, dense on odd ones, so with
// 8 virtual stages every other stage has no MoE layer and the rest no dense layer):
//   - fp64, clipping every step: every step's loss, router losses and expert loads, and after the
//     last step every parameter this rank holds equal the one-rank run's (1e-9 relative);
//     softmax with aux and z loss, the sequence aux loss, sigmoid scores with the expert-bias
//     update, and (where DP is 1) the global aux loss;
//   - with --hang 1 the last stage runs a schedule one micro-batch short of the others': the
//     first stage waits for a gradient that never comes, and the watchdog must name the step,
//     micro-batch and virtual stage of the wait (a failure test);
//   - each rank's passes and messages in one step follow the schedule's definition, checked
//     here by its properties (1F1B: micro-batches in order, PP - p in flight, strict alternation
//     after the warm-up; interleaved: the reference's order of chunks and micro-batches), and a
//     GPipe order and a non-interleaved order of virtual stages fail those checks;
//   - with --mtp 1, two multi-token prediction depths (MoE layers, as the decoder's last) on the
//     last stage instead: the MTP loss of every step too, and the last stage's copy of the
//     embedding table, shared once more after the last step, equal to one rank's embedding.
//
//   mpiexec -n 4 megamoe_pipeline_mpi --pp 2 [--vpp 2] [--tp 2] [--cp 2] [--etp 1] [--ep 2]
//                                     [--micro-batches 4] [--first 3 --last 3] [--steps 3]
//                                     [--layout "Et|ttt|ttt|tL"] [--mtp 1]
#include "support/sample_data.hpp"
#include "support/tally.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/dispatch/hierarchical.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/parallel/pipeline_schedule.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/parallel/watchdog.hpp>
#include <megamoe/train/trainer.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mt = megamoe::train;
namespace rt = megamoe::router;
namespace mp = megamoe::parallel;

namespace {

namespace md = mm::model;
using decoder = md::decoder<md::layers<8>, md::heads<4>, md::query_groups<2>, md::vocabulary<256>,
                            md::dense_ffn<20>, md::moe_layer_freq<2>>;
using softmax_aux = rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>;
using seq_aux = rt::top_k<2, rt::seq_aux_loss<1e-2>>;
using sigmoid_bias = rt::top_k<2, rt::sigmoid, rt::expert_bias<1e-2>>;
using global_aux = rt::top_k<2, rt::global_aux_loss<1e-2>>;
// MoE on odd layers, so the MTP depths' layers (the last decoder layer's kind) are MoE layers.
using mtp_decoder =
    md::decoder<md::layers<8>, md::heads<4>, md::query_groups<2>, md::vocabulary<256>,
                md::dense_ffn<20>, md::moe_layer_pattern<0, 1, 0, 1, 0, 1, 0, 1>,
                md::multi_token_prediction<2, 0.3>>;
template <class Dispatch, class Parallel, class Router, class Decoder = decoder>
using config = mm::make_config<mm::shape<mm::hidden<16>, mm::ffn<12>, mm::experts<8>>, Router,
                               Dispatch, mm::expert::mlp<mm::expert::swiglu>, mm::precision::fp64,
                               Parallel, mm::memory::keep_all, Decoder>;
using mapped = mp::mapping<mp::tp<mm::dynamic>, mp::cp<mm::dynamic>, mp::pp<mm::dynamic>,
                           mp::etp<mm::dynamic>, mp::ep<mm::dynamic>>;

constexpr int seq = 8, micro = 2;

struct options {
  mp::degrees degrees;
  mm::startup_values pipeline;  // vpp, first and last stage layers
  int micro_batches = 4, steps = 3;
  bool hang = false, bubble = false;
  bool merged = false;        // the merged forward-backward schedule
  bool hierarchical = false;  // the node-aware dispatcher (MEGAMOE_RANKS_PER_NODE sets the nodes)
  bool mtp = false;           // the MTP model alone
};

/// --bubble: the measured pipeline bubble (the mean over ranks of the schedule's time spent
/// waiting on messages) with V = 2 below V = 1 on the same model and batches: fp32, hidden 128,
/// 8 micro-batches per step, steps of the two alternating, medians compared.
int compare_bubbles(mp::process_groups const& groups, options const& o,
                    mm::testing::sample_corpus const& corpus, mm::context& ctx) {
  using wide =
      mm::make_config<mm::shape<mm::hidden<128>, mm::ffn<128>, mm::experts<8>>, softmax_aux,
                      mm::dispatch::all_to_all, mm::expert::mlp<mm::expert::swiglu>,
                      mm::precision::fp32, mapped, mm::memory::keep_all, decoder>;
  mt::train_settings s;
  s.seq_length = 64;
  s.micro_batch = 4;
  s.micro_batches = 8;
  s.steps = o.steps;
  s.schedule = {1e-3, 1e-4, 1, o.steps};
  auto given = mp::with_layout(o.pipeline, groups.layout());
  given.vpp = 1;
  mm::transformer<wide> plain(groups, given);
  given.vpp = 2;
  mm::transformer<wide> interleaved(groups, given);
  plain.initialize(5);
  interleaved.initialize(5);
  mt::trainer<wide> a(groups, plain, corpus(s.seq_length), s),
      b(groups, interleaved, corpus(s.seq_length), s);
  std::vector<double> one, two;
  for (int k = 0; k < o.steps; ++k) {
    one.push_back(a.step(ctx).pipeline_bubble);
    two.push_back(b.step(ctx).pipeline_bubble);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double const p = groups.pp().size(), m = s.micro_batches;
  bool const below = median(two) < median(one);
  if (groups.pp().rank() == 0 && groups.tp_dp_cp().rank() == 0)
    std::printf(
        "pipeline bubble over %d steps (median): V 1 %.3f (analytical %.3f), V 2 %.3f "
        "(analytical %.3f): %s\n",
        o.steps, median(one), (p - 1) / (m + p - 1), median(two), (p - 1) / (m + p - 1) / 2,
        below ? "interleaving shrinks it" : "NOT below");
  return below ? 0 : 1;
}

/// 1F1B without the last micro-batch: stages that disagree on the schedule.
struct one_micro_batch_short {
  static std::vector<mp::pipeline_op> ops(mp::pipeline_shape s) {
    --s.micro_batches;
    return mp::one_f_one_b::ops(s);
  }
};

template <class Model>
std::map<std::string, mm::row_matrix<double>> tensors(Model& model) {
  std::map<std::string, mm::row_matrix<double>> out;
  model.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    out.emplace(std::string(name), value);
  });
  return out;
}

// ---- the schedules' definitions, as properties of one rank's events ----
using event = mp::pipeline_event;

/// Which virtual stage chunk v of rank p is, and whether it is the first / last.
struct place {
  int pp, rank, vpp;
  [[nodiscard]] int stage(int v) const { return v * pp + rank; }
  [[nodiscard]] bool first(int v) const { return stage(v) == 0; }
  [[nodiscard]] bool last(int v) const { return stage(v) == pp * vpp - 1; }
};

/// A pass and whether it ran merged with the one after it.
struct pass {
  event e;
  bool merged = false;
};

/// Messages around each pass: a forward is preceded by its activation's receive (unless the
/// first stage) and followed by its send (unless the last); a backward the other way. A merged
/// pass (its marker, then a forward and a backward) receives both messages first and sends both
/// after. Returns the passes alone, or an empty optional with the reason in `why`.
std::optional<std::vector<pass>> passes_with_messages(std::vector<event> const& trace,
                                                      place const& at, std::string& why) {
  std::vector<pass> passes;
  std::size_t i = 0;
  auto expect = [&](event::kind_type kind, int m, int v) {
    if (i < trace.size() && trace[i] == event{kind, m, v}) {
      ++i;
      return true;
    }
    why = "event " + std::to_string(i) + " is not the expected message";
    return false;
  };
  while (i < trace.size()) {
    event const e = trace[i];
    if (e.kind == event::merged) {
      ++i;
      int const m = e.micro_batch, v = e.chunk;
      if (!at.first(v) && !expect(event::recv_activation, m, v)) return std::nullopt;
      std::optional<event> back;
      if (i < trace.size() && trace[i].kind == event::recv_gradient) back = trace[i++];
      if (!expect(event::forward, m, v)) return std::nullopt;
      if (i >= trace.size() || trace[i].kind != event::backward ||
          (back && (trace[i].micro_batch != back->micro_batch || trace[i].chunk != back->chunk)) ||
          (!back && !at.last(trace[i].chunk))) {
        why = "a merged pass without its backward at event " + std::to_string(i);
        return std::nullopt;
      }
      event const b = trace[i++];
      if (!at.last(v) && !expect(event::send_activation, m, v)) return std::nullopt;
      if (!at.first(b.chunk) && !expect(event::send_gradient, b.micro_batch, b.chunk))
        return std::nullopt;
      passes.push_back({{event::forward, m, v}, true});
      passes.push_back({{event::backward, b.micro_batch, b.chunk}});
      continue;
    }
    bool const forward = e.kind == event::forward || e.kind == event::recv_activation;
    bool const backward = e.kind == event::backward || e.kind == event::recv_gradient;
    if (!forward && !backward) {
      why = "a send without its pass at event " + std::to_string(i);
      return std::nullopt;
    }
    if (forward) {
      if (!at.first(e.chunk) && !expect(event::recv_activation, e.micro_batch, e.chunk))
        return std::nullopt;
      if (!expect(event::forward, e.micro_batch, e.chunk)) return std::nullopt;
      if (!at.last(e.chunk) && !expect(event::send_activation, e.micro_batch, e.chunk))
        return std::nullopt;
    } else {
      if (!at.last(e.chunk) && !expect(event::recv_gradient, e.micro_batch, e.chunk))
        return std::nullopt;
      if (!expect(event::backward, e.micro_batch, e.chunk)) return std::nullopt;
      if (!at.first(e.chunk) && !expect(event::send_gradient, e.micro_batch, e.chunk))
        return std::nullopt;
    }
    passes.push_back({{forward ? event::forward : event::backward, e.micro_batch, e.chunk}});
  }
  return passes;
}

/// 1F1B on rank p of PP with M micro-batches: forwards and backwards each in micro-batch order,
/// min(PP - p, M) forwards before the first backward, then backward and forward alternate until
/// the forwards are done, never more than PP - p micro-batches in flight.
std::string check_one_f_one_b(std::vector<pass> const& passes, place const& at, int M) {
  int f = 0, b = 0, in_flight = 0;
  int const limit = std::min(at.pp - at.rank, M);
  bool steady = false;
  event::kind_type previous = event::forward;
  for (std::size_t i = 0; i < passes.size(); ++i) {
    auto const& e = passes[i].e;
    if (passes[i].merged) return "a merged pass";
    if (e.chunk != 0) return "a chunk other than 0";
    if (e.kind == event::forward) {
      if (e.micro_batch != f++) return "forwards out of order";
      ++in_flight;
      if (steady && previous != event::backward) return "two forwards in the steady state";
    } else {
      if (e.micro_batch != b++) return "backwards out of order";
      if (!steady && in_flight != limit) return "the first backward after the wrong warm-up";
      steady = true;
      --in_flight;
      if (previous == event::backward && f < M) return "two backwards before the forwards end";
    }
    if (in_flight > limit) return "more than PP - p micro-batches in flight";
    previous = e.kind;
  }
  return f == M && b == M ? "" : "not every micro-batch went forward and back";
}

/// Interleaved 1F1B (the reference's): the k-th forward is chunk (k / PP) mod V of micro-batch
/// (k / (PP V)) PP + k mod PP, the k-th backward the same micro-batch in chunk V - 1 - (k / PP)
/// mod V; the warm-up is 2 (PP - p - 1) + (V - 1) PP forwards (all when M = PP); then alternation.
/// Merged (the reference's combined 1F1B): one more warm-up forward, and exactly the steady
/// state's forwards merged with their backwards.
std::string check_interleaved(std::vector<pass> const& passes, place const& at, int M,
                              bool merged = false) {
  int const P = at.pp, V = at.vpp, total = M * V;
  int const warmup =
      M == P ? total : std::min(2 * (P - at.rank - 1) + (V - 1) * P + (merged ? 1 : 0), total);
  int f = 0, b = 0;
  for (std::size_t i = 0; i < passes.size(); ++i) {
    auto const& e = passes[i].e;
    bool const want_forward = f < warmup || (f < total && (f - warmup) == b);
    if ((e.kind == event::forward) != want_forward)
      return "pass " + std::to_string(i) + " out of turn";
    if (passes[i].merged != (merged && e.kind == event::forward && f >= warmup))
      return "pass " + std::to_string(i) + (passes[i].merged ? " merged" : " not merged");
    int const k = e.kind == event::forward ? f++ : b++;
    int const group = k / (P * V), m = group * P + k % P, chunk = (k / P) % V;
    if (e.micro_batch != m) return "micro-batch out of order at pass " + std::to_string(i);
    if (e.chunk != (e.kind == event::forward ? chunk : V - 1 - chunk))
      return "chunk out of order at pass " + std::to_string(i);
  }
  return f == total && b == total ? ""
                                  : "not every chunk of every micro-batch went forward and back";
}

std::string check_schedule(std::vector<event> const& trace, place const& at, int M, bool merged) {
  std::string why;
  auto const passes = passes_with_messages(trace, at, why);
  if (!passes) return why;
  if (merged) return check_interleaved(*passes, at, M, true);
  return at.vpp == 1 ? check_one_f_one_b(*passes, at, M) : check_interleaved(*passes, at, M);
}

/// The checks must reject other orders: GPipe (every forward, then every backward) where 1F1B
/// has a steady state, and with V chunks the virtual stages run one after the other.
void checks_can_fail(mm::testing::tally& result, place const& at, int M) {
  std::vector<pass> gpipe;
  for (int m = 0; m < M; ++m) gpipe.push_back({{event::forward, m, 0}});
  for (int m = 0; m < M; ++m) gpipe.push_back({{event::backward, m, 0}});
  if (std::min(at.pp - at.rank, M) < M)
    result.close("a GPipe order fails the 1F1B check",
                 check_one_f_one_b(gpipe, {at.pp, at.rank, 1}, M).empty() ? 1 : 0, 0, 1, 0);
  if (at.vpp > 1) {
    std::vector<pass> serial;
    for (int m = 0; m < M; ++m)
      for (int v = 0; v < at.vpp; ++v) serial.push_back({{event::forward, m, v}});
    for (int m = 0; m < M; ++m)
      for (int v = at.vpp - 1; v >= 0; --v) serial.push_back({{event::backward, m, v}});
    result.close("a non-interleaved order fails the interleaved check",
                 check_interleaved(serial, at, M).empty() ? 1 : 0, 0, 1, 0);
  }
  // The interleaved order itself, unmerged, is not the merged schedule (nor is it merged).
  std::vector<pass> plain;
  for (auto const& op : mp::interleaved_one_f_one_b::ops({at.pp, at.rank, at.vpp, M}))
    plain.push_back({{op.kind == mp::pipeline_op::forward ? event::forward : event::backward,
                      op.micro_batch, op.chunk}});
  if (at.pp == 1 || at.vpp > 1) {
    auto const merged = mp::merged_one_f_one_b::ops({at.pp, at.rank, at.vpp, M});
    if (std::any_of(merged.begin(), merged.end(), [](auto const& op) { return op.merged; }))
      result.close("an unmerged order fails the merged check",
                   check_interleaved(plain, at, M, true).empty() ? 1 : 0, 0, 1, 0);
  }
}

template <class Router, class Dispatch = mm::dispatch::all_to_all, class Decoder = decoder>
void against_one_rank(mp::process_groups const& groups, options const& o,
                      mm::testing::sample_corpus const& corpus, mm::context& ctx,
                      mm::testing::tally& result, std::string const& what) {
  using job_config = config<Dispatch, mapped, Router, Decoder>;
  using one_config = config<mm::dispatch::local, mp::mapping<>, Router, Decoder>;
  int const DP = groups.dp().size();
  mt::train_settings s;
  s.seq_length = seq;
  s.micro_batch = micro;
  s.micro_batches = o.micro_batches;
  s.steps = o.steps;
  s.schedule = {1e-2, 1e-3, 1, o.steps};
  s.optimizer.clip_grad = 1e-3;
  mm::startup_values given = mp::with_layout(o.pipeline, groups.layout());
  mm::transformer<job_config> model(groups, given);
  model.initialize(9, 0.3);
  mt::trainer<job_config> job(groups, model, corpus(s.seq_length), s);
  if (o.merged) job.template use_schedule<mp::merged_one_f_one_b>();
  mt::train_settings s1 = s;
  s1.micro_batches = s.micro_batches * DP;
  mm::transformer<one_config> one;
  one.initialize(9, 0.3);
  mt::trainer<one_config> reference(one, corpus(s1.seq_length), s1);
  auto const& layout = model.pipeline();
  place const at{layout.pp(), model.pipeline_rank(), layout.vpp()};
  for (int k = 1; k <= o.steps; ++k) {
    job.pipeline().record_trace(k == 1);
    auto const a = job.step(ctx);
    auto const b = reference.step(ctx);
    std::string const step = " of step " + std::to_string(k);
    result.close(what + "loss" + step, a.loss, b.loss, 1.0, 1e-9);
    result.close(what + "router loss" + step, a.router_loss, b.router_loss, 1.0, 1e-9);
    result.close(what + "MTP loss" + step, a.mtp_loss, b.mtp_loss, 1.0, 1e-9);
    result.close(what + "clipped" + step, a.clip_factor < 1 ? 1 : 0, 1, 1, 0);
    result.close(what + "MoE layers with loads", static_cast<double>(a.expert_load.size()),
                 static_cast<double>(b.expert_load.size()), 1, 0);
    for (std::size_t l = 0; l < std::min(a.expert_load.size(), b.expert_load.size()); ++l)
      for (std::size_t e = 0; e < b.expert_load[l].size(); ++e)
        result.close(what + "expert load" + step,
                     e < a.expert_load[l].size() ? a.expert_load[l][e] : -1.0, b.expert_load[l][e],
                     1.0, 0.0);
    if (k == 1) {
      std::string const why = check_schedule(job.pipeline().trace(), at, o.micro_batches, o.merged);
      if (!why.empty()) {
        std::string events;
        for (auto const& e : job.pipeline().trace())
          events += " " + std::to_string(int(e.kind)) + ":" + std::to_string(e.micro_batch) + "." +
                    std::to_string(e.chunk);
        std::printf("rank %d: the schedule: %s;%s\n", groups.pp().rank(), why.c_str(),
                    events.c_str());
      }
      result.close(what + "passes and messages follow the schedule", why.empty() ? 1 : 0, 1, 1, 0);
    }
  }
  auto const whole = tensors(one);
  int held = 0;
  model.for_each_numbered_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind,
                                        mm::element_numbering const& n) {
    ++held;
    auto const it = whole.find(std::string(name));
    if (it == whole.end()) {
      result.close(what + std::string(name) + " has no one-rank twin", 1, 0, 1, 0);
      return;
    }
    for (Eigen::Index r = 0; r < value.rows(); ++r)
      for (Eigen::Index c = 0; c < value.cols(); ++c) {
        double const ref = it->second.data()[n.global(r, c)];
        result.close(what + "parameter " + std::string(name), value(r, c), ref,
                     std::max(1.0, std::abs(ref)), 1e-9);
      }
  });
  result.close(what + "holds parameters", held > 0 ? 1 : 0, 1, 1, 0);
  if constexpr (mm::transformer<job_config>::mtp_depths > 0) {
    bool const last = model.pipeline_rank() == layout.pp() - 1;
    result.close(what + "the last stage alone holds a copy of the embedding table",
                 model.holds_embedding_copy() ? 1 : 0, last && layout.pp() > 1 ? 1 : 0, 1, 0);
    job.pipeline().share_embedding();
    if (model.holds_embedding_copy()) {
      auto const copy = model.embedding_table();
      auto const& ref = whole.at("embedding.word_embeddings.weight");
      // This TP rank's part of the vocabulary: its rows of the whole table.
      auto const first = static_cast<Eigen::Index>(groups.tp().rank()) * copy.rows();
      for (Eigen::Index r = 0; r < copy.rows() && first + r < ref.rows(); ++r)
        for (Eigen::Index c = 0; c < copy.cols(); ++c)
          result.close(what + "the last stage's embedding copy", copy(r, c), ref(first + r, c),
                       std::max(1.0, std::abs(ref(first + r, c))), 1e-9);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return mp::run_main(argc, argv, [&](mp::environment& env) {
    options o;
    mp::check_on_every_rank(env.world(), [&] {
      for (int i = 1; i + 1 < argc; i += 2) {
        std::string const key = argv[i];
        if (key == "--layout") {
          o.pipeline.pipeline_layout = argv[i + 1];
          continue;
        }
        int const value = std::stoi(argv[i + 1]);
        if (key == "--ep")
          o.degrees.ep = value;
        else if (key == "--tp")
          o.degrees.tp = value;
        else if (key == "--cp")
          o.degrees.cp = value;
        else if (key == "--pp")
          o.degrees.pp = value;
        else if (key == "--etp")
          o.degrees.etp = value;
        else if (key == "--vpp")
          o.pipeline.vpp = value;
        else if (key == "--first")
          o.pipeline.first_stage_layers = value;
        else if (key == "--last")
          o.pipeline.last_stage_layers = value;
        else if (key == "--micro-batches")
          o.micro_batches = value;
        else if (key == "--steps")
          o.steps = value;
        else if (key == "--hang")
          o.hang = value != 0;
        else if (key == "--bubble")
          o.bubble = value != 0;
        else if (key == "--merged")
          o.merged = value != 0;
        else if (key == "--hierarchical")
          o.hierarchical = value != 0;
        else if (key == "--mtp")
          o.mtp = value != 0;
        else
          throw mm::input_error("unknown argument " + key);
      }
    });
    auto const& world = env.world();
    mp::process_groups const groups(world, o.degrees);
    mm::testing::sample_corpus const corpus;
    mm::context ctx(1);
    mm::testing::tally result;
    if (o.bubble) return compare_bubbles(groups, o, corpus, ctx);
    if (o.hang) {
      using job_config = config<mm::dispatch::all_to_all, mapped, softmax_aux>;
      mt::train_settings s;
      s.seq_length = seq;
      s.micro_batch = micro;
      s.micro_batches = o.micro_batches;
      mm::transformer<job_config> model(groups, mp::with_layout(o.pipeline, groups.layout()));
      model.initialize(9, 0.3);
      mt::trainer<job_config> job(groups, model, corpus(s.seq_length), s);
      // The short stage goes on to the step's reduction over the stages and waits there too; its
      // watchdog waits longer, so the first stage's, which names the pass, fires first.
      if (groups.pp().rank() == groups.pp().size() - 1) {
        job.use_schedule<one_micro_batch_short>();
        mp::watchdog::instance().start(60.0, world.rank(), world.size());
      }
      job.step(ctx);
      return 0;  // not reached: the watchdog ends the job
    }
    {
      // A layout the layers do not split (R036) is agreed on, so every rank prints it before any
      // exits (an error thrown on each rank alone would abort the job from the first one).
      int V = 1;
      mp::check_on_every_rank(world, [&] {
        V = mp::pipeline_layout::of(8, groups.pp().size(), o.pipeline.pipeline_layout,
                                    o.pipeline.vpp, o.pipeline.first_stage_layers,
                                    o.pipeline.last_stage_layers)
                .vpp();
      });
      checks_can_fail(result, {groups.pp().size(), groups.pp().rank(), V}, o.micro_batches);
    }
    if (o.mtp) {
      against_one_rank<softmax_aux, mm::dispatch::all_to_all, mtp_decoder>(groups, o, corpus, ctx,
                                                                           result, "MTP: ");
    } else {
      // Stages holding different numbers of MoE layers each agree on their own nodes.
      if (o.hierarchical)
        against_one_rank<softmax_aux, mm::dispatch::hierarchical<>>(groups, o, corpus, ctx, result,
                                                                    "hierarchical: ");
      against_one_rank<softmax_aux>(groups, o, corpus, ctx, result, "");
      against_one_rank<seq_aux>(groups, o, corpus, ctx, result, "seq aux: ");
      against_one_rank<sigmoid_bias>(groups, o, corpus, ctx, result, "sigmoid, expert bias: ");
      // The global aux loss's running mean is over the micro-batches a rank has seen, so DP ranks
      // differ from one rank by design (as without PP): compared where DP is 1. A stage's repeated
      // forward reads the mean its first forward read.
      if (groups.dp().size() == 1)
        against_one_rank<global_aux>(groups, o, corpus, ctx, result, "global aux: ");
    }
    return result.finish(
        world,
        "pipeline on " + std::to_string(world.size()) + " ranks (PP " +
            std::to_string(groups.pp().size()) + " x V " +
            (o.pipeline.pipeline_layout.empty() ? std::to_string(o.pipeline.vpp.value_or(1))
                                                : "layout " + o.pipeline.pipeline_layout) +
            ", TP " + std::to_string(groups.tp().size()) + ", CP " +
            std::to_string(groups.cp().size()) + ", DP " + std::to_string(groups.dp().size()) +
            ", EP " + std::to_string(groups.ep().size()) + ", " + std::to_string(o.micro_batches) +
            " micro-batches" + (o.merged ? ", merged schedule" : "") + (o.mtp ? ", MTP" : "") + ")",
        "all equal one rank's");
  });
}
