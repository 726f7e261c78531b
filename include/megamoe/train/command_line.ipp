// SPDX-License-Identifier: Apache-2.0
// megamoe/train/command_line.ipp — the definitions behind command_line.hpp, which depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/command_line.hpp>

#include <megamoe/parallel/environment.hpp>
#include <megamoe/policy/error.hpp>
#include <megamoe/policy/rule_ids.hpp>
#include <megamoe/version.hpp>

#include <CLI/CLI.hpp>

#include <iostream>
#include <sstream>

namespace megamoe::train {

MEGAMOE_DECL std::string moments_from_flags(job_options const& o) {
  if (!o.precision_aware_optimizer && (o.exp_avg_dtype != "fp32" || o.exp_avg_sq_dtype != "fp32"))
    throw o.error(
        "--exp-avg-dtype and --exp-avg-sq-dtype other than fp32 need "
        "--use-precision-aware-optimizer");
  if (o.exp_avg_dtype != o.exp_avg_sq_dtype)
    throw o.error("--exp-avg-dtype " + o.exp_avg_dtype + " and --exp-avg-sq-dtype " +
                  o.exp_avg_sq_dtype + ": " + o.program +
                  " is built for both moments in one dtype (fp32 or bf16)");
  return o.exp_avg_dtype;
}

MEGAMOE_DECL std::string precision_from_reference_flags(job_options const& o) {
  std::string named;
  auto name = [&](std::string const& recipe, std::string const& flags) {
    if (!named.empty() && named != recipe)
      throw o.error(flags + " names " + recipe + ", but another flag " + named);
    named = recipe;
  };
  if (o.bf16_flag) name("bf16", "--bf16");
  if (!o.fp8_format.empty()) {
    std::string const flags = "--fp8-format " + o.fp8_format + " --fp8-recipe " + o.fp8_recipe;
    bool const tensorwise = o.fp8_recipe == "delayed" || o.fp8_recipe == "tensorwise";
    // Per-tensor FP8 is built with the hybrid format (E4M3 forward, E5M2 gradients); blockwise
    // FP8 and MXFP8 are E4M3 throughout, as the reference's recipes.
    if (tensorwise && o.fp8_format != "hybrid")
      throw o.error(flags + ": per-tensor FP8 is built with --fp8-format hybrid only");
    if (!tensorwise && o.fp8_format != "e4m3")
      throw o.error(flags + ": blockwise FP8 and MXFP8 take --fp8-format e4m3");
    if (o.fp8_recipe == "delayed") name("fp8_delayed", flags);
    if (o.fp8_recipe == "tensorwise") name("fp8_current", flags);
    if (o.fp8_recipe == "blockwise") name("fp8_blockwise", flags);
    if (o.fp8_recipe == "mxfp8") name("mxfp8", flags);
  }
  if (!o.fp4_format.empty())
    name("nvfp4", "--fp4-format " + o.fp4_format + " --fp4-recipe " + o.fp4_recipe);
  if (!named.empty() && o.precision_given && named != o.precision)
    throw o.error("--precision " + o.precision + ", but the reference's flags name " + named);
  return named;
}

MEGAMOE_DECL std::array<int, 2> bf16_layers_from_flags(job_options const& o) {
  if (o.first_last_layers_bf16 && o.no_first_last_layers_bf16)
    throw o.error("--first-last-layers-bf16 and --no-first-last-layers-bf16 together");
  bool const on =
      o.first_last_layers_bf16 || (!o.no_first_last_layers_bf16 && o.precision == "nvfp4");
  if (on) return {o.layers_at_start_in_bf16, o.layers_at_end_in_bf16};
  if (o.layers_at_start_in_bf16 != 1 || o.layers_at_end_in_bf16 != 1)
    throw o.error(
        "--num-layers-at-start-in-bf16 and --num-layers-at-end-in-bf16 count the layers "
        "--first-last-layers-bf16 keeps in BF16 (on by default for nvfp4 only); it is off here");
  return {0, 0};
}

MEGAMOE_DECL bool quantized_weights_from_flags(job_options const& o) {
  if (o.fp8_param_gather && o.fp4_param_gather)
    throw o.error("--fp8-param-gather and --fp4-param-gather together");
  if (!o.fp8_param_gather && !o.fp4_param_gather) return false;
  std::string const flag = o.fp8_param_gather ? "--fp8-param-gather" : "--fp4-param-gather";
  if (o.precision == "fp32" || o.precision == "bf16")
    throw config_error(rules::id::quantized_storage_needs_quantized_recipe,
                       flag + " with --precision " + o.precision);
  if (o.fp8_param_gather && o.precision == "nvfp4")
    throw o.error(
        "--fp8-param-gather holds FP8 weights; under --precision nvfp4 the weights are FP4 "
        "codes: --fp4-param-gather");
  if (o.fp4_param_gather && o.precision != "nvfp4")
    throw o.error("--fp4-param-gather holds NVFP4 weights; under --precision " + o.precision +
                  " the weights are FP8 codes: --fp8-param-gather");
  return true;
}

MEGAMOE_DECL command_line::command_line(std::string const& description, job_options& o,
                                        std::vector<std::string> const& presets,
                                        std::string const& preset_help)
    : app_(std::make_unique<CLI::App>(description)), o_(o) {
  app_->set_version_flag("--version", version_line(o.program));
  if (!presets.empty())
    app_->add_option("--preset", o_.preset, preset_help)
        ->check(CLI::IsMember(presets))
        ->capture_default_str()
        ->group(option_group::model);
  add_model_options();
  add_parallel_options();
  add_precision_options();
  add_checkpoint_options();
  add_output_options();
}

MEGAMOE_DECL command_line::~command_line() = default;

MEGAMOE_DECL CLI::App& command_line::app() noexcept {
  return *app_;
}

MEGAMOE_DECL std::optional<int> command_line::parse(boost::mpi::communicator const& world, int argc,
                                                    char** argv) {
  try {
    app_->parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    if (world.rank() == 0) return app_->exit(e);
    std::ostringstream quiet;
    return app_->exit(e, quiet, quiet);
  }
  auto given = [&](char const* flag) { return app_->count(flag) > 0; };
  o_.steps_given = given("--steps");
  o_.seed_given = given("--seed");
  o_.seq_len_given = given("--seq-len");
  o_.global_batch_given = given("--global-batch");
  o_.lr_given = given("--lr");
  o_.micro_batch_given = given("--micro-batch");
  o_.precision_given = given("--precision");
  o_.moments_given = given("--exp-avg-dtype") || given("--exp-avg-sq-dtype");
  o_.quantized_weights_given = o_.fp8_param_gather || o_.fp4_param_gather;
  o_.bf16_layers_given =
      given("--first-last-layers-bf16") || given("--no-first-last-layers-bf16") ||
      given("--num-layers-at-start-in-bf16") || given("--num-layers-at-end-in-bf16");
  if (auto* preset = app_->get_option_no_throw("--preset")) o_.preset_given = preset->count() > 0;
  parallel::check_on_every_rank(world, [&] {
    o_.moments = moments_from_flags(o_);
    auto const named = precision_from_reference_flags(o_);
    if (!named.empty()) {
      o_.precision = named;
      o_.precision_given = true;
    }
    if (!o_.upcycle.empty() && !o_.load.empty())
      throw o_.error("--upcycle starts a new run; it does not go with --load");
  });
  // Accepted as the reference accepts them, but they do nothing alone.
  if (world.rank() == 0) {
    auto warn = [&](char const* flag, char const* needs, char const* why) {
      if (given(flag) && !given(needs))
        std::cerr << o_.program << ": warning: " << flag << " without " << needs << " " << why
                  << "\n";
    };
    warn("--save-interval", "--save", "saves nothing");
    warn("--async-save", "--save", "saves nothing");
    warn("--finetune", "--load", "has nothing to load");
    warn("--no-load-optim", "--load", "has nothing to load");
  }
  return std::nullopt;
}

MEGAMOE_DECL void command_line::add_model_options() {
  namespace g = option_group;
  auto* text = app_->add_option("--data", o_.data,
                                "text to train on: a file or a folder of them, documents ending "
                                "at lines of %; tokenized into --out's data/ folder")
                   ->capture_default_str()
                   ->group(g::model);
  auto& d = o_.dataset;
  auto* blend = app_->add_option("--data-path", d.data_path,
                                 "tokenized datasets (.bin/.idx prefixes), or weight prefix pairs "
                                 "(Megatron's)")
                    ->expected(1, -1)
                    ->group(g::model);
  text->excludes(blend);
  std::array<char const*, 3> const split_flags{"--train-data-path", "--valid-data-path",
                                               "--test-data-path"};
  for (std::size_t i = 0; i < 3; ++i)
    app_->add_option(split_flags[i], d.split_path[i],
                     "this split's datasets, or weight prefix pairs")
        ->expected(1, -1)
        ->excludes(blend)
        ->excludes(text)
        ->group(g::model);
  app_->add_option("--split", d.split, "train, valid and test shares of --data-path's documents")
      ->capture_default_str()
      ->group(g::model);
  app_->add_option("--data-cache-path", d.cache,
                   "folder for the sample indices (built by rank 0, mapped by the others)")
      ->group(g::model);
  app_->add_option("--mid-level-dataset-surplus", d.mid_level_surplus,
                   "extra share of samples each dataset of a weighted blend builds")
      ->capture_default_str()
      ->group(g::model);
  app_->add_flag("--eod-mask-loss", d.eod_mask_loss,
                 "no loss on the token after an end of document")
      ->group(g::model);
  auto& t = d.tokenizer;
  app_->add_option("--tokenizer-type", t.type,
                   "ByteTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer, "
                   "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer or "
                   "NullTokenizer")
      ->capture_default_str()
      ->group(g::model);
  app_->add_option("--vocab-file", t.vocab_file, "GPT-2's vocab.json (GPT2BPETokenizer)")
      ->group(g::model);
  app_->add_option("--merge-file", t.merge_file, "GPT-2's merges.txt (GPT2BPETokenizer)")
      ->group(g::model);
  app_->add_option("--tokenizer-model", t.model,
                   "tokenizer.json (HuggingFaceTokenizer) or a SentencePiece model")
      ->group(g::model);
  app_->add_option("--vocab-size", t.vocab_size, "NullTokenizer's vocabulary")->group(g::model);
  app_->add_option("--null-tokenizer-eod-id", t.null_eod,
                   "NullTokenizer's end of document (default: its last id)")
      ->group(g::model);
  app_->add_option("--make-vocab-size-divisible-by", o_.vocab_multiple,
                   "pad the vocabulary to a multiple of this times TP (default: the "
                   "configuration's, 128)")
      ->group(g::model);
  app_->add_option("--steps", o_.steps, "optimizer steps")->capture_default_str()->group(g::model);
  app_->add_option("--micro-batch", o_.micro_batch, "sequences per micro-batch")
      ->capture_default_str()
      ->group(g::model);
  app_->add_option("--global-batch", o_.global_batch,
                   "sequences per step (micro-batch x micro-batches x DP; default: one "
                   "micro-batch per DP rank)")
      ->group(g::model);
  app_->add_option("--seq-len", o_.seq_len, "tokens per sequence")
      ->capture_default_str()
      ->group(g::model);
  app_->add_option("--lr", o_.lr, "peak learning rate (warmup 5 %, cosine to a tenth)")
      ->capture_default_str()
      ->group(g::model);
  app_->add_option("--seed", o_.seed, "seed of weights and batches")
      ->capture_default_str()
      ->group(g::model);
  app_->add_option("--upcycle", o_.upcycle,
                   "start from a dense model's model.safetensors (the dense preset's): every "
                   "expert a copy (or a slice) of its FFN")
      ->group(g::model);
}

MEGAMOE_DECL void command_line::add_parallel_options() {
  namespace g = option_group;
  app_->add_option("--tp,--tensor-model-parallel-size", o_.tp,
                   "tensor-parallel ranks (attention, dense FFN, embedding, output layer)")
      ->capture_default_str()
      ->group(g::parallelism);
  app_->add_option("--cp,--context-parallel-size", o_.cp,
                   "context-parallel ranks: each sequence cut into 2 CP chunks")
      ->capture_default_str()
      ->group(g::parallelism);
  app_->add_option("--etp,--expert-tensor-parallel-size", o_.etp,
                   "expert tensor-parallel ranks (default: --tp)")
      ->group(g::parallelism);
  app_->add_option("--ep,--expert-model-parallel-size", o_.ep,
                   "expert-parallel ranks (default: every rank of a stage's expert grid, world / "
                   "(ETP x PP))")
      ->group(g::parallelism);
  app_->add_option("--pp,--pipeline-model-parallel-size", o_.pp,
                   "pipeline stages: the layers split over them (1F1B; interleaved with --vpp)")
      ->capture_default_str()
      ->group(g::parallelism);
  app_->add_option("--vpp,--num-virtual-stages-per-pipeline-rank", o_.vpp,
                   "model chunks per pipeline rank (interleaved 1F1B; default 1)")
      ->group(g::parallelism);
  app_->add_option("--num-layers-per-virtual-pipeline-stage", o_.layers_per_virtual_stage,
                   "layers per model chunk (sets --vpp to layers / (PP x this))")
      ->group(g::parallelism);
  app_->add_option("--decoder-first-pipeline-num-layers", o_.first_stage_layers,
                   "layers of the first pipeline stage (the rest split evenly)")
      ->group(g::parallelism);
  app_->add_option("--decoder-last-pipeline-num-layers", o_.last_stage_layers,
                   "layers of the last pipeline stage (the rest split evenly)")
      ->group(g::parallelism);
  app_->add_option("--pipeline-model-parallel-layout", o_.pipeline_layout,
                   "the virtual stages as text: 'E' embedding, 't' a layer, 'L' loss, '|' "
                   "between stages, '*n' repeats (e.g. \"Et|(tt|)*2tL\"; V follows from it)")
      ->group(g::parallelism);
  app_->add_flag("--overlap-moe-expert-parallel-comm", o_.merged_schedule,
                 "the merged forward-backward schedule (the reference's combined 1F1B): "
                 "steady-state forward and backward passes of two micro-batches run as one, "
                 "layer by layer in turn; with --pp above 1 it needs --vpp above 1")
      ->group(g::parallelism);
}

MEGAMOE_DECL void command_line::add_precision_options() {
  namespace g = option_group;
  app_->add_option("--precision", o_.precision,
                   "recipe of every linear layer's GEMMs: fp32 | bf16 | fp8_delayed | "
                   "fp8_current | fp8_blockwise | mxfp8 | nvfp4 (emulated bit for bit; the "
                   "router, norms, softmax, embedding, output layer and loss stay fp32)")
      ->check(CLI::IsMember(
          {"fp32", "bf16", "fp8_delayed", "fp8_current", "fp8_blockwise", "mxfp8", "nvfp4"}))
      ->capture_default_str()
      ->group(g::precision);
  app_->add_flag("--bf16", o_.bf16_flag, "the reference's name for --precision bf16")
      ->group(g::precision);
  app_->add_option("--backend", o_.backend,
                   "GEMM unit of every linear layer: auto (the fastest this CPU runs the "
                   "recipe on: amx, then avx512_bf16, then grouped) | grouped (fp32) | "
                   "avx512_bf16 | amx (the BF16 units: --precision bf16)")
      ->check(CLI::IsMember({"auto", "grouped", "avx512_bf16", "amx"}))
      ->capture_default_str()
      ->group(g::precision);
  app_->add_option("--fp8-format", o_.fp8_format,
                   "the reference's FP8 flag: hybrid (with --fp8-recipe delayed | tensorwise) "
                   "or e4m3 (with --fp8-recipe blockwise | mxfp8)")
      ->check(CLI::IsMember({"hybrid", "e4m3"}))
      ->group(g::precision);
  app_->add_option("--fp8-recipe", o_.fp8_recipe,
                   "with --fp8-format: delayed (fp8_delayed), tensorwise (fp8_current), "
                   "blockwise (fp8_blockwise), mxfp8")
      ->check(CLI::IsMember({"delayed", "tensorwise", "blockwise", "mxfp8"}))
      ->capture_default_str()
      ->group(g::precision);
  app_->add_option("--fp4-format", o_.fp4_format,
                   "the reference's FP4 flag: e2m1 (with --fp4-recipe nvfp4: --precision nvfp4)")
      ->check(CLI::IsMember({"e2m1"}))
      ->group(g::precision);
  app_->add_option("--fp4-recipe", o_.fp4_recipe, "with --fp4-format: nvfp4")
      ->check(CLI::IsMember({"nvfp4"}))
      ->capture_default_str()
      ->group(g::precision);
  app_->add_flag("--first-last-layers-bf16", o_.first_last_layers_bf16,
                 "keep the first and last layers in BF16 under an FP8 or FP4 recipe (on by "
                 "default for nvfp4; --num-layers-at-start/end-in-bf16 count them)")
      ->group(g::precision);
  app_->add_flag("--no-first-last-layers-bf16", o_.no_first_last_layers_bf16,
                 "every layer under the recipe, nvfp4 included")
      ->group(g::precision);
  app_->add_option("--num-layers-at-start-in-bf16", o_.layers_at_start_in_bf16,
                   "with --first-last-layers-bf16: the first layers kept in BF16")
      ->capture_default_str()
      ->group(g::precision);
  app_->add_option("--num-layers-at-end-in-bf16", o_.layers_at_end_in_bf16,
                   "with --first-last-layers-bf16: the last layers kept in BF16")
      ->capture_default_str()
      ->group(g::precision);
  app_->add_flag("--fp8-param-gather", o_.fp8_param_gather,
                 "hold the linear weights as their FP8 codes under an FP8 recipe, the fp32 "
                 "masters in the optimizer's shards")
      ->group(g::precision);
  app_->add_flag("--fp4-param-gather", o_.fp4_param_gather,
                 "the same for NVFP4 codes under --precision nvfp4")
      ->group(g::precision);
  app_->add_flag("--use-precision-aware-optimizer", o_.precision_aware_optimizer,
                 "the reference's precision-aware optimizer: Adam's moments in the dtypes "
                 "--exp-avg-dtype and --exp-avg-sq-dtype give")
      ->group(g::precision);
  app_->add_option("--exp-avg-dtype", o_.exp_avg_dtype,
                   "dtype of Adam's first moment: fp32 | bf16 (bf16 needs "
                   "--use-precision-aware-optimizer; the update is computed in fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str()
      ->group(g::precision);
  app_->add_option("--exp-avg-sq-dtype", o_.exp_avg_sq_dtype,
                   "dtype of Adam's second moment: fp32 | bf16 (as --exp-avg-dtype)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str()
      ->group(g::precision);
}

MEGAMOE_DECL void command_line::add_checkpoint_options() {
  namespace g = option_group;
  app_->add_option("--save", o_.save, "checkpoint folder to save to")->group(g::checkpoints);
  app_->add_option("--save-interval", o_.save_interval,
                   "save every N steps (with --save; --save alone saves at the end)")
      ->group(g::checkpoints);
  app_->add_option("--load", o_.load,
                   "checkpoint folder to resume from (the iteration its tracker names)")
      ->group(g::checkpoints);
  app_->add_flag("--no-load-optim", o_.no_load_optim,
                 "with --load: fresh optimizer moments (the step continues)")
      ->group(g::checkpoints);
  app_->add_flag("--finetune", o_.finetune,
                 "with --load: the weights only; fresh optimizer, step 0")
      ->group(g::checkpoints);
  app_->add_flag("--async-save", o_.async_save,
                 "write checkpoints in the background: the state is copied at the step's end, "
                 "training goes on while each rank writes its file")
      ->group(g::checkpoints);
  app_->add_flag("--exit-signal-handler", o_.exit_signal_handler,
                 "on SIGTERM or SIGUSR1, save (with --save) after the current step and exit 0")
      ->group(g::checkpoints);
}

MEGAMOE_DECL void command_line::add_output_options() {
  namespace g = option_group;
  app_->add_option("--out", o_.out, "folder for metrics, plot and weights")
      ->capture_default_str()
      ->group(g::output);
  app_->add_option("--eval-interval", o_.eval_interval,
                   "evaluation on the valid split every N steps and at the end (default: a "
                   "quarter of --steps)")
      ->group(g::output);
  app_->add_option("--eval-iters", o_.eval_iters,
                   "global batches of valid samples per evaluation, each evaluation continuing "
                   "the valid split's samples (0: none)")
      ->capture_default_str()
      ->group(g::output);
  app_->add_option("--sample-bytes", o_.sample_bytes,
                   "bytes of text (at least; whole tokens) the trained model writes after \"The \" "
                   "at the end (0: none)")
      ->capture_default_str()
      ->group(g::output);
  app_->add_flag("--skip-train", o_.skip_train,
                 "run no step: with --load, the loaded model's evaluation, sample, logits and "
                 "model.safetensors")
      ->group(g::output);
  app_->add_option("--logits-out", o_.logits_out,
                   "write the logits of the first --logits-samples valid samples (their tokens "
                   "too) to this safetensors file at the end")
      ->group(g::output);
  app_->add_option("--logits-samples", o_.logits_samples, "valid samples for --logits-out")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(g::output);
  app_->add_option("--log-straggler-interval", o_.log_straggler_interval,
                   "every N steps, name in metrics.jsonl and on the progress line the ranks whose "
                   "compute (their steps less their waits in communication) exceeds the median "
                   "rank's by more than --straggler-threshold (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->group(g::output);
  app_->add_option("--straggler-threshold", o_.straggler_threshold,
                   "the share over the median rank's compute that names a straggler")
      ->check(CLI::PositiveNumber)
      ->default_str("0.15")
      ->group(g::output);
  app_->add_option("--log-memory-interval", o_.log_memory_interval,
                   "every N steps, every rank's resident memory in metrics.jsonl "
                   "(\"resident_bytes\", by world rank; 0: never)")
      ->check(CLI::NonNegativeNumber)
      ->group(g::output);
  app_->add_option("--rerun-mode", o_.rerun_mode,
                   "validate_results: a step that fails a check (a non-finite loss or gradient "
                   "norm, or with the checks below a spike) runs again from the same state once; "
                   "differing bit for bit it was the machine's fault (transient, the recomputed "
                   "step goes on), repeating it the model's (persistent); disabled: no "
                   "recomputation")
      ->check(CLI::IsMember({"validate_results", "disabled"}))
      ->capture_default_str()
      ->group(g::checks);
  app_->add_flag("--check-for-spiky-loss", o_.check_spiky_loss,
                 "a loss over --spike-factor times the largest of the last --spike-window steps' "
                 "fails the step")
      ->group(g::checks);
  app_->add_flag("--check-for-large-grads", o_.check_large_grads,
                 "a gradient norm over --spike-factor times the largest of the last "
                 "--spike-window steps' fails the step")
      ->group(g::checks);
  app_->add_option("--spike-factor", o_.spike_factor, "the multiple of the recent maximum")
      ->capture_default_str()
      ->check(CLI::Range(1.0 + 1e-9, 1e300))
      ->group(g::checks);
  app_->add_option("--spike-window", o_.spike_window,
                   "the updated steps whose maximum the spike checks compare with")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(g::checks);
  app_->add_option("--on-failed-check", o_.on_failed_check,
                   "what a step still failing after its recomputation does: skip (no update) or "
                   "stop (an error on every rank)")
      ->check(CLI::IsMember({"skip", "stop"}))
      ->capture_default_str()
      ->group(g::checks);
  app_->add_flag("--profile", o_.profile,
                 "print the share of the step in each stage at the end (and in the final JSON)")
      ->group(g::output);
  app_->add_flag("--describe", o_.describe,
                 "print the model's configuration for this job as one JSON object and exit")
      ->group(g::output);
}

}  // namespace megamoe::train
