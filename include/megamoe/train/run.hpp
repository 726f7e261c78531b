// SPDX-License-Identifier: Apache-2.0
// megamoe/train/run.hpp — the training job of a configuration type, as megamoe-train runs it: a
// user's program is a configuration and
//
//   int main(int argc, char** argv) { return megamoe::train::run<my_config>(argc, argv); }
//
// with every flag of megamoe-train (train/command_line.hpp): the data and the schedule, the
// degrees (TP, CP, PP with its virtual stages, EP, ETP; DP takes the rest of the world), the
// reference's precision flags (which must name the recipe the type holds), checkpoints (save at
// intervals, resume on any layout, SIGTERM), evaluation on the valid split, --profile, --describe.
// Rank 0
// shows progress on stderr and writes to --out: metrics.jsonl, training.svg and model.safetensors
// (every weight whole, under the reference's names); the last line of stdout is one JSON object,
// {"final": {...}}.
#pragma once

#include <megamoe/config/describe.hpp>
#include <megamoe/config/resolve.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/core/resident_memory.hpp>
#include <megamoe/expert/tags.hpp>
#include <megamoe/io/checkpoint_files.hpp>
#include <megamoe/model/counts.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/parallel/traffic.hpp>
#include <megamoe/precision/tags.hpp>
#include <megamoe/train/async_save.hpp>
#include <megamoe/train/command_line.hpp>
#include <megamoe/train/export.hpp>
#include <megamoe/train/faults.hpp>
#include <megamoe/train/generate.hpp>
#include <megamoe/train/logits.hpp>
#include <megamoe/train/job_options.hpp>
#include <megamoe/train/progress.hpp>
#include <megamoe/train/report.hpp>
#include <megamoe/train/resume.hpp>
#include <megamoe/train/signals.hpp>
#include <megamoe/train/stragglers.hpp>
#include <megamoe/train/traffic_estimate.hpp>
#include <megamoe/train/trainer.hpp>
#include <megamoe/train/training_state.hpp>
#include <megamoe/train/upcycle.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe::train {

/// An evaluation's measure, or null where none ran.
inline nlohmann::ordered_json measured(std::optional<evaluation> const& e,
                                       double (evaluation::*measure)() const) {
  return e ? nlohmann::ordered_json(((*e).*measure)()) : nlohmann::ordered_json();
}

/// --describe: the configuration resolved for this job, with its size and cost, as one JSON line.
template <class Config>
int describe_job(parallel::environment& env, job_options o) {
  auto const& world = env.world();
  config_values values;
  parallel::pipeline_layout pipeline;
  parallel::check_on_every_rank(world, [&] {
    if (o.seq_len < 2) throw o.error("--seq-len must be at least 2");
    o = with_virtual_stages<Config>(o);
    auto const tokenizer = data::make_tokenizer(o.dataset.tokenizer);
    auto const given =
        job_values(job_degrees(world.size(), o, Config::shape::value.experts), world.size(), o,
                   Config::model::value.vocabulary, data::vocab_size(tokenizer));
    values = resolve<Config>(given);
    pipeline = parallel::pipeline_layout::of(values.model.layers, values.parallel.pp,
                                             given.pipeline_layout, given.vpp,
                                             given.first_stage_layers, given.last_stage_layers);
  });
  if (world.rank() == 0) {
    auto json = describe(values).flat;
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
    json["num_parameters"] = parameter_count(values);
    json["model_flops_per_token"] = flops_per_token(values, o.seq_len);
    std::cout << json.dump() << std::endl;
  }
  return 0;
}

/// Trains transformer<Config> with Adam's moments as `Moments` keeps them, as `o` says, resuming
/// from `resume` where given.
template <class Config, class Moments>
int train_job(parallel::environment& env, job_options o, io::checkpoint_reader* resume) {
  // First, so that a signal during the start-up stops the job after its first step.
  if (o.exit_signal_handler) handle_termination_signal();
  auto const& world = env.world();
  parallel::check_on_every_rank(world, [&] { o = with_virtual_stages<Config>(o); });
  bool const root = world.rank() == 0;
  bool const resuming = resume != nullptr && !o.finetune;
  int saved_total = 0;
  if (resuming)
    parallel::check_on_every_rank(world,
                                  [&] { saved_total = take_saved_settings(resume->state(), o); });
  auto const degrees = job_degrees(world.size(), o, Config::shape::value.experts);
  parallel::process_groups const groups(world, degrees);
  int const dp = groups.dp().size();
  // A resumed job on fewer ranks per sequence keeps the global batch: its saved micro-batch
  // size gives way where it no longer divides it.
  if (resuming && !o.micro_batch_given && o.global_batch % (o.micro_batch * dp) != 0 &&
      o.global_batch % dp == 0)
    o.micro_batch = o.global_batch / dp;
  train_settings settings;
  parallel::check_on_every_rank(world, [&] {
    if (o.eval_interval < 0 || o.eval_iters < 0 || o.sample_bytes < 0)
      throw o.error("--eval-interval, --eval-iters and --sample-bytes cannot be negative");
    if (o.steps < 1 || o.micro_batch < 1 || o.seq_len < 2 || !(o.lr > 0))
      throw o.error(
          "--steps, --micro-batch, --seq-len and --lr must be positive (--seq-len at least 2)");
    int const global = o.global_batch > 0 ? o.global_batch : o.micro_batch * dp;
    if (global % (o.micro_batch * dp) != 0)
      throw o.error("--global-batch " + std::to_string(global) +
                    " does not divide into micro-batches of " + std::to_string(o.micro_batch) +
                    " over " + std::to_string(dp) + " data-parallel ranks");
    settings.micro_batches = global / (o.micro_batch * dp);
  });
  int const global_sequences = o.micro_batch * settings.micro_batches * dp;
  token_data const corpus = job_data(world, o, global_sequences);
  settings.seq_length = o.seq_len;
  settings.micro_batch = o.micro_batch;
  settings.steps = o.steps;
  settings.seed = o.seed;
  settings.recompute_failed_steps = o.rerun_mode == "validate_results";
  settings.check_spiky_loss = o.check_spiky_loss;
  settings.check_large_grads = o.check_large_grads;
  settings.spike_factor = o.spike_factor;
  settings.spike_window = o.spike_window;
  settings.stop_on_failed_check = o.on_failed_check == "stop";
  settings.schedule = {o.lr, o.lr / 10, std::max(1, o.steps / 20), o.steps};
  std::optional<transformer<Config>> built;
  parallel::check_on_every_rank(world, [&] {
    built.emplace(groups, job_values(degrees, world.size(), o, Config::model::value.vocabulary,
                                     corpus.vocab_size()));
  });
  auto& model = *built;
  auto const padded_vocabulary = data::padded_vocab_size(
      model.values().model.vocabulary, model.values().model.vocab_multiple, degrees.tp);
  model.initialize(o.seed, 0.02);
  std::string upcycled_line;
  if (!o.upcycle.empty()) {
    int const g = upcycle(model, world, o.upcycle);
    upcycled_line = "; upcycled from " + o.upcycle + " (granularity " + std::to_string(g) + ")";
  }
  trainer<Config, Moments> trainer(groups, model, corpus, settings);
  // Adam's moments over the job: their bytes and what their dtype saves against fp32; and with
  // weights held as codes, the fp32 masters the optimizer keeps and the fp32 weight values the
  // modules freed.
  double freed = 0.0;
  for (auto const& p : model.numbered_parameters())
    if (holds_codes(p.kind)) freed += static_cast<double>(p.grad.size() * sizeof(float));
  std::array<double, 4> moment_bytes = {
      static_cast<double>(trainer.optimizer().state_bytes()),
      static_cast<double>(trainer.optimizer().state_bytes_saved()),
      static_cast<double>(trainer.optimizer().master_bytes()), freed};
  parallel::all_reduce_sum(world, std::span<double>(moment_bytes));
  if (o.merged_schedule)
    parallel::check_on_every_rank(world, [&] {
      if constexpr (transformer<Config>::parks_micro_batches)
        trainer.template use_schedule<parallel::merged_one_f_one_b>();
      else
        throw o.error(
            "--overlap-moe-expert-parallel-comm needs a model that sets micro-batches aside; "
            "under --precision " +
            o.precision + " the operands keep one micro-batch's codes");
    });
  context ctx(env.num_threads());
  std::string resumed_line;
  if (resume != nullptr) {
    auto const report = load_checkpoint(trainer, world, *resume,
                                        {.optimizer = !o.no_load_optim, .finetune = o.finetune});
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
      optim::lr_schedule saved{s.at("peak").get<double>(), s.at("minimum").get<double>(),
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
  // Evaluation: --eval-iters global batches of valid samples, each evaluation continuing the
  // valid split's samples where the last one stopped (a resumed run where its checkpoint did).
  bool const evaluates = o.eval_iters > 0 && corpus.has_valid();
  if (root && o.eval_iters > 0 && !corpus.has_valid())
    std::fprintf(stderr,
                 "%s: warning: no valid split (--split gives it no documents, or no "
                 "--valid-data-path): no evaluation\n",
                 o.program.c_str());
  std::int64_t const eval_samples = std::int64_t{o.eval_iters} * global_sequences;
  std::int64_t valid_consumed = resuming ? resume->state()
                                               .value("job", nlohmann::json::object())
                                               .value("consumed_valid_samples", std::int64_t{0})
                                         : 0;
  int last_saved = resuming ? trainer.steps_done() : -1;
  // Saves, synchronous or (--async-save) written in the background; `save_blocked` the seconds
  // they held the training's steps up: the whole save, or the copy into host buffers, the checks
  // after the steps, a wait for the save before and the recording of the index (the wait at the
  // job's end holds no step up).
  async_saver saver;
  double save_blocked = 0.0;
  int saves = 0;
  auto seconds_since = [](auto start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto print_recorded = [&](std::optional<recorded_save> const& done) {
    if (root && done)
      std::fprintf(
          stderr, "\n  saved iteration %d to %s (%.1f MB, written in %.2f s while training)\n",
          done->iteration, o.save.c_str(), static_cast<double>(done->bytes) / 1e6, done->seconds);
  };
  auto save = [&] {
    if (o.save.empty() || last_saved == trainer.steps_done()) return;
    auto const start = std::chrono::steady_clock::now();
    auto state = job_state(o);
    state["tokenizer"]["eod"] = corpus.end_of_document();
    state["consumed_train_samples"] = trainer.steps_done() * trainer.global_batch_samples();
    state["consumed_valid_samples"] = valid_consumed;
    if (o.async_save) {
      print_recorded(saver.wait());  // one save in flight at a time
      auto staged = stage_checkpoint(trainer, world, o.save, state);
      saver.start(std::move(staged.writer), std::move(staged.state));
      double const held = seconds_since(start);
      if (root)
        std::fprintf(stderr, "\n  saving iteration %d to %s in the background (held up %.3f s)\n",
                     trainer.steps_done(), o.save.c_str(), held);
    } else {
      auto const report = save_checkpoint(trainer, world, o.save, state);
      if (root)
        std::fprintf(stderr, "\n  saved iteration %d to %s (%.1f MB in %.2f s)\n",
                     report.iteration, o.save.c_str(), static_cast<double>(report.bytes) / 1e6,
                     report.seconds);
    }
    last_saved = trainer.steps_done();
    save_blocked += seconds_since(start);
    ++saves;
  };
  // A save in flight is recorded once every rank has written its file (checked after each step),
  // and waited for before the job ends.
  auto record_save = [&](bool at_the_end) {
    if (!saver.in_flight()) return;
    auto const start = std::chrono::steady_clock::now();
    print_recorded(at_the_end ? saver.wait() : saver.poll(world));
    if (!at_the_end) save_blocked += seconds_since(start);
  };

  std::filesystem::create_directories(o.out);
  auto const out_dir = std::filesystem::absolute(o.out);
  auto const metrics_path = out_dir / "metrics.jsonl", plot_path = out_dir / "training.svg",
             weights_path = out_dir / "model.safetensors";
  // The unigram baseline over the first evaluation's samples, from the tokens of the first
  // train samples (about 4 M tokens at most).
  std::int64_t const counted_train =
      std::min<std::int64_t>(std::int64_t{o.steps} * global_sequences,
                             std::max<std::int64_t>(1, (std::int64_t{1} << 22) / o.seq_len));
  double unigram = 0.0, bytes_per_token = 1.0;
  parallel::check_on_every_rank(world, [&] {  // they read samples the start-up did not check
    if (evaluates)
      unigram = corpus.unigram_bits_per_byte(valid_consumed, eval_samples, counted_train);
    bytes_per_token = corpus.bytes_per_token(std::min<std::int64_t>(counted_train, 4096));
  });
  training_history history;
  history.unigram_bpb = unigram;
  history.load.resize(static_cast<std::size_t>(model.moe_layer_count()));
  metrics_log metrics(root, metrics_path, resuming ? first_step : 1, history);
  std::string bf16_layers_note;
  for (int i : layers_in_bf16(model.layers(), o.bf16_layers))
    bf16_layers_note += (bf16_layers_note.empty() ? " (layers " : ", ") + std::to_string(i);
  if (!bf16_layers_note.empty()) bf16_layers_note += " in BF16)";
  if (root)
    std::cerr << o.program << ": preset " << o.preset << ", precision " << o.precision
              << bf16_layers_note << " on " << o.backend << ", " << o.dataset.tokenizer.type
              << " (vocabulary " << corpus.vocab_size() << ", padded to " << padded_vocabulary
              << "), " << corpus.train().size() << " train samples"
              << (corpus.has_valid() ? ", " + std::to_string(corpus.valid().size()) + " valid"
                                     : std::string())
              << " of " << o.seq_len + 1 << " tokens, " << bytes_per_token
              << " bytes per token (unigram " << unigram << " bits/byte); " << world.size()
              << " rank(s), TP " << degrees.tp << ", CP " << degrees.cp << ", PP " << degrees.pp
              << (model.pipeline().vpp() > 1 ? " x V " + std::to_string(model.pipeline().vpp())
                                             : std::string())
              << ", EP " << degrees.ep << ", global batch " << global_sequences << " x "
              << o.seq_len << " tokens; Adam moments " << o.moments << " ("
              << std::lround(moment_bytes[0] / 1e3) << " kB, " << std::lround(moment_bytes[1] / 1e3)
              << " kB saved)"
              << (o.quantized_weights ? "; linear weights as " + o.precision + " codes (" +
                                            std::to_string(std::lround(moment_bytes[3] / 1e3)) +
                                            " kB of fp32 values freed, " +
                                            std::to_string(std::lround(moment_bytes[2] / 1e3)) +
                                            " kB of fp32 masters in the optimizer's shards)"
                                      : std::string())
              << (resumed_line.empty() ? std::string() : "; " + resumed_line) << upcycled_line
              << "\n";
  int const eval_every = eval_interval_of(o);
  progress_bar const bar(o.steps);
  double const model_flops = model.flops_per_token(o.seq_len);
  // With multi-token prediction its loss is reported beside the main head's.
  constexpr bool has_mtp = transformer<Config>::mtp_depths > 0;
  std::optional<evaluation> heldout;
  auto evaluate = [&] {
    heldout = trainer.evaluate(ctx, valid_consumed, eval_samples);
    valid_consumed += eval_samples;
    return *heldout;
  };
  int const last_step = o.skip_train ? first_step - 1 : o.steps;
  if (first_step > o.steps && !o.skip_train && root)
    std::fprintf(stderr, "%s: --steps %d already reached at iteration %d\n", o.program.c_str(),
                 o.steps, first_step - 1);
  double tokens_per_s = 0.0, elapsed = 0.0, bubble = 0.0;
  step_profile profiled;
  // The bytes this rank sent on each group in the training steps (parallel/traffic.hpp).
  using groups_type = parallel::process_groups;
  std::array<double, groups_type::decoder_names.size()> decoder_bytes{};
  std::array<double, groups_type::expert_names.size()> expert_bytes{};
  auto& traffic = parallel::traffic::instance();
  straggler_detector stragglers(o.log_straggler_interval, o.straggler_threshold);
  planted_faults faults;
  parallel::check_on_every_rank(world,
                                [&] { faults = planted_faults_from_environment(world.rank()); });
  trainer.plant(faults);
  for (int step = first_step; step <= last_step; ++step) {
    ctx.stages.clear();
    ctx.step_stages.clear();
    traffic.reset();
    auto const step_start = std::chrono::steady_clock::now();
    slow_down(faults);
    auto const& m = trainer.step(ctx);
    double const step_seconds = seconds_since(step_start);
    for (std::size_t g = 0; g < decoder_bytes.size(); ++g)
      decoder_bytes[g] += static_cast<double>(
          traffic.bytes(MPI_Comm(groups.get(static_cast<parallel::decoder_group>(g)))));
    for (std::size_t g = 0; g < expert_bytes.size(); ++g)
      expert_bytes[g] += static_cast<double>(
          traffic.bytes(MPI_Comm(groups.get(static_cast<parallel::expert_group>(g)))));
    profiled.add(ctx);
    elapsed += m.seconds;
    bubble += m.pipeline_bubble;
    tokens_per_s =
        static_cast<double>(trainer.global_batch_tokens()) * (step - first_step + 1) / elapsed;
    auto line =
        step_line(step, m, model_flops, model.pipelined(), has_mtp, bytes_per_token, history);
    if (!m.failed_check.empty() && root)
      std::fprintf(stderr, "\nstep %d: %s%s%s%s; %s%s\n", step, m.failed_check.c_str(),
                   m.fault_at.empty() ? "" : " (in ", m.fault_at.c_str(),
                   m.fault_at.empty() ? "" : (" on rank " + std::to_string(m.fault_rank) + ")").c_str(),
                   m.rerun == rerun_outcome::none ? "not recomputed"
                   : m.rerun == rerun_outcome::transient
                       ? "recomputed: transient (the recomputation differs)"
                       : "recomputed: persistent (the recomputation repeats it)",
                   m.skipped ? ", step skipped" : ", going on with the recomputed step");
    std::optional<double> evaluated, evaluated_mtp;
    if (evaluates && (step % eval_every == 0 || step == o.steps)) {
      auto const e = evaluate();
      history.heldout_bpb.emplace_back(step, e.bits_per_byte());
      line["heldout_bpb"] = e.bits_per_byte();
      line["heldout_loss"] = e.loss_per_token();
      line["heldout_ppl"] = e.perplexity();
      evaluated = e.bits_per_byte();
      if constexpr (has_mtp) {
        evaluated_mtp = e.mtp_bits_per_byte();
        line["heldout_mtp_bpb"] = *evaluated_mtp;
      }
    }
    if (auto const report = stragglers.after_step(world, step, step_seconds); report && root) {
      auto slow = nlohmann::ordered_json::array();
      std::string named;
      for (auto const& s : report->slow) {
        slow.push_back({{"rank", s.rank}, {"relative", s.relative}});
        char text[64];
        std::snprintf(text, sizeof text, "%srank %d (%.2fx)", named.empty() ? "" : ", ", s.rank,
                      s.relative);
        named += text;
      }
      line["stragglers"] = std::move(slow);
      line["median_compute_seconds"] = report->median_seconds / o.log_straggler_interval;
      if (!named.empty())
        std::fprintf(stderr,
                     "\n  stragglers over steps %d-%d (compute over the median rank's): %s\n",
                     step - o.log_straggler_interval + 1, step, named.c_str());
    }
    if (o.log_memory_interval > 0 && step % o.log_memory_interval == 0) {
      std::int64_t const mine = resident_bytes();
      std::vector<std::int64_t> resident;
      parallel::all_gather_v_checked(world, std::span<std::int64_t const>(&mine, 1), 1, resident,
                                     1);
      line["resident_bytes"] = resident;
    }
    metrics.write(line);
    record_save(false);
    if (o.save_interval > 0 && step % o.save_interval == 0) save();
    if (o.exit_signal_handler)
      if (int const signal = termination_requested(world)) {
        save();
        record_save(true);
        if (root)
          std::fprintf(stderr, "\n%s: %s: %s after step %d, exiting\n", o.program.c_str(),
                       termination_signal_name(signal),
                       o.save.empty() ? "no --save, nothing saved" : "saved", step);
        return 0;
      }
    if (root)
      bar.show(step, line["train_bpb"].template get<double>(), tokens_per_s, elapsed, evaluated,
               unigram, evaluated_mtp);
  }
  save();
  record_save(true);
  if (evaluates && !heldout) evaluate();
  int const steps_run = last_step - first_step + 1;
  nlohmann::ordered_json profile, traffic_report;
  if (o.profile && elapsed > 0) {
    profile = profiled.shares(elapsed, steps_run);
    if (model.pipelined()) {
      // The schedule's idle share with equal passes: (p - 1) / (m + p - 1), divided by V when
      // interleaved.
      double const p = model.pipeline().pp(), mb = settings.micro_batches;
      profile["pipeline_bubble_analytical"] = (p - 1) / (mb + p - 1) / model.pipeline().vpp();
    }
    if (root) print_profile(o.program, profile);
    traffic_report = group_traffic(groups, model, settings, trainer.schedule(),
                                   trainer.pipeline().repeated_forwards(), decoder_bytes,
                                   expert_bytes, steps_run);
    if (root && !traffic_report.empty()) print_traffic(o.program, traffic_report);
  }
  std::string const sample =
      o.sample_bytes > 0 ? generate(ctx, trainer, "The ", o.sample_bytes, o.seq_len, o.seed) : "";
  if (!o.logits_out.empty())
    parallel::check_on_every_rank(world, [&] {
      write_logits(world, ctx, trainer, o.logits_out, o.logits_samples);
    });
  if (root) {
    // One write: under mpiexec stdout and stderr reach the terminal apart, line by line.
    char line[512];
    int n = std::snprintf(line, sizeof line,
                          "%s: %d steps run, %.0f tokens/s, %.2f effective model GFLOP/s (%.3g "
                          "FLOPs per token, forward + backward)",
                          o.program.c_str(), std::max(0, steps_run), tokens_per_s,
                          tokens_per_s * model_flops / 1e9, model_flops);
    if (heldout && n > 0 && n < static_cast<int>(sizeof line))
      n += std::snprintf(line + n, sizeof line - static_cast<std::size_t>(n),
                         ", valid: %.4f nats/token, perplexity %.2f, %.3f bits/byte (unigram %.3f)",
                         heldout->loss_per_token(), heldout->perplexity(), heldout->bits_per_byte(),
                         unigram);
    if (n > 0) std::fprintf(stderr, "%s\n", line);
    if (!sample.empty()) std::cout << "sample:\n" << sample << "\n" << std::flush;
  }
  export_whole_model(
      world, trainer, weights_path,
      {{"format", "pt"},
       {"producer", o.program},
       {"preset", o.preset},
       {"configuration", checkpoint_configuration(model.values()).at("model").dump()},
       {"tokenizer", [&] {
          auto record = tokenizer_record(o.dataset.tokenizer);
          record["eod"] = corpus.end_of_document();
          return record.dump();
        }()},
       {"seq_length", std::to_string(o.seq_len)}});
  if (!root) return 0;
  write_svg(plot_path, history);
  nlohmann::ordered_json final;
  final["final"] = {{"steps", trainer.steps_done()},
                    {"precision", o.precision},
                    {"backend", o.backend},
                    {"tokens_per_s", tokens_per_s},
                    {"heldout_bpb", measured(heldout, &evaluation::bits_per_byte)},
                    {"unigram_bpb", heldout ? nlohmann::ordered_json(unigram) : nullptr},
                    {"metrics_path", metrics_path.string()},
                    {"plot_path", plot_path.string()},
                    {"weights_path", weights_path.string()},
                    {"optimizer_moments", o.moments},
                    {"optimizer_state_bytes", moment_bytes[0]},
                    {"optimizer_state_bytes_saved", moment_bytes[1]},
                    {"bf16_layers", layers_in_bf16(model.layers(), o.bf16_layers)},
                    {"quantized_weights", o.quantized_weights},
                    {"weight_master_bytes", moment_bytes[2]}};
  auto& last = final["final"];
  last["heldout_loss"] = measured(heldout, &evaluation::loss_per_token);
  last["heldout_ppl"] = measured(heldout, &evaluation::perplexity);
  last["heldout_tokens"] = heldout ? heldout->tokens : 0.0;
  last["heldout_bytes"] = heldout ? heldout->bytes : 0.0;
  last["tokenizer"] = o.dataset.tokenizer.type;
  last["vocab_size"] = corpus.vocab_size();
  last["padded_vocab_size"] = padded_vocabulary;
  last["consumed_train_samples"] = trainer.steps_done() * trainer.global_batch_samples();
  last["consumed_valid_samples"] = valid_consumed;
  last["saves"] = saves;
  last["save_blocked_seconds"] = save_blocked;
  if (model.pipelined() && steps_run > 0) final["final"]["pipeline_bubble"] = bubble / steps_run;
  if constexpr (has_mtp)
    if (heldout) final["final"]["heldout_mtp_bpb"] = heldout->mtp_bits_per_byte();
  if (!profile.empty()) final["final"]["profile"] = profile;
  if (!traffic_report.empty()) final["final"]["traffic"] = traffic_report;
  std::cout << final.dump() << std::endl;
  return 0;
}

/// One configuration's job: --describe, or training with Adam's moments in `o.moments` (bf16
/// built where Bf16Moments is set; the caller refuses it elsewhere).
template <class Config, bool Bf16Moments = true>
int run_job(parallel::environment& env, job_options const& o, io::checkpoint_reader* resume) {
  if (o.describe) return describe_job<Config>(env, o);
  if constexpr (Bf16Moments)
    if (o.moments == "bf16") return train_job<Config, optim::bf16_moments>(env, o, resume);
  return train_job<Config, optim::master_moments<typename transformer<Config>::scalar>>(env, o,
                                                                                        resume);
}

/// The command-line name of a recipe (--precision).
constexpr std::string_view precision_flag_name(precision::recipe_id r) {
  using precision::recipe_id;
  switch (r) {
    case recipe_id::fp8_delayed: return "fp8_delayed";
    case recipe_id::fp8_current: return "fp8_current";
    default: return precision::name_of(r);
  }
}

/// Checks that the flags (and the checkpoint resumed from, whose BF16 layers are `saved`) ask for
/// what `Config` holds: its recipe, its GEMM backend, its weights as codes or not, and moments in
/// bf16 only where built (Bf16Moments); fills in what the type decides.
template <class Config, bool Bf16Moments>
void check_built_for(job_options& o, std::optional<std::array<int, 2>> saved) {
  constexpr std::string_view recipe = precision_flag_name(Config::precision::value.recipe);
  constexpr std::string_view backend = expert::name_of(Config::expert::value.backend);
  constexpr bool codes = transformer<Config>::quantized_weights;
  if (o.precision != recipe)
    throw o.error("--precision " + o.precision + (o.precision_given ? "" : " (the checkpoint's)") +
                  ": this program is built for --precision " + std::string(recipe));
  if (o.backend != "auto" && o.backend != backend)
    throw o.error("--backend " + o.backend + ": this program is built for --backend " +
                  std::string(backend));
  o.backend = backend;
  settle_recipe_options(o, saved);
  if (o.quantized_weights && !codes)
    throw o.error(
        "this program holds the linear weights in full precision (its memory plan has no "
        "memory::quantized_weights)");
  o.quantized_weights = codes;
  if (o.moments == "bf16" && !Bf16Moments)
    throw o.error(
        "Adam's moments in bf16 are not built into this program (train::run<Config, "
        "true> builds them)");
}

/// The whole job of configuration `Config` from the command line: parse, check the flags against
/// the type, resume or start, train, report. Bf16Moments builds Adam's moments in bf16 too (a
/// second build of the job).
template <class Config, bool Bf16Moments = false>
int run(int argc, char** argv) {
  static_assert(rules::check<Config>());
  return parallel::run_main(argc, argv, [&](parallel::environment& env) {
    job_options o;
    o.program = std::filesystem::path(argc > 0 ? argv[0] : "megamoe-job").filename().string();
    o.preset = o.program;
    o.out = o.program + "-out";
    o.precision = precision_flag_name(Config::precision::value.recipe);
    command_line line(o.program + ": trains its configuration type on text", o);
    if (auto const exit = line.parse(env.world(), argc, argv)) return *exit;
    auto resume = open_load(env.world(), o);
    parallel::check_on_every_rank(env.world(), [&] {
      std::optional<std::array<int, 2>> saved;
      if (resume) saved = take_saved_recipe(*resume, o);
      check_built_for<Config, Bf16Moments>(o, saved);
    });
    return run_job<Config, Bf16Moments>(env, o, resume ? &*resume : nullptr);
  });
}

}  // namespace megamoe::train
