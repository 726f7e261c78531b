// SPDX-License-Identifier: Apache-2.0
// megamoe-train — trains a small byte-level MoE language model on real English text.
//
//   ./build/examples/megamoe-train                         # fortunes, preset "small", one process
//   mpiexec -n 2 ./build/examples/megamoe-train --ep 2     # experts over 2 ranks
//   mpiexec -n 4 ./build/examples/megamoe-train --cp 2 --etp 1 --ep 4   # folded: attention CP 2
//   ./build/examples/megamoe-train --preset qwen3          # a model family's proportions
//
// Degrees (the reference's long names too): --tp (tensor parallelism of attention, the dense FFN,
// embedding and output layer, with sequence parallelism), --cp (context parallelism: 2 CP
// divides --seq-len), --etp (default: --tp), --ep (default: every rank of the expert grid,
// world / ETP); DP takes the rest of the world.
//
// The corpus (default: the Debian `fortunes` files) is split: the last 5 % of its bytes are held
// out and never trained on. Held-out bits per byte cover every held-out window of --seq-len (or
// the first --eval-iters global batches of them), every --eval-interval steps, shown against the
// unigram baseline over exactly the bytes those windows predict. Rank 0 shows a progress bar on
// stderr (one line per interval when stderr is not a terminal) and a generated sample at the end,
// and writes to --out: metrics.jsonl (one JSON line per step), training.svg (loss curves and
// expert-load heat maps) and model.safetensors (every weight under the reference's parameter names,
// fp32). The last stdout line is
//   {"final": {"steps", "precision", "backend", "tokens_per_s", "heldout_bpb", "unigram_bpb",
//              "metrics_path", "plot_path", "weights_path", "optimizer_moments",
//              "optimizer_state_bytes", "optimizer_state_bytes_saved", "bf16_layers",
//              "quantized_weights", "weight_master_bytes"}}
// Checkpoints (the reference's flags): --save DIR with --save-interval N writes DIR/iter_NNNNNNN/
// (every rank its shards, io/checkpoint.hpp) and then DIR/latest_checkpointed_iteration.txt;
// --save alone saves at the end. --load DIR resumes from the iteration the tracker names, on any
// layout: the step, the optimizer, the schedule, the seed and the batch size come from the
// checkpoint (a flag given with another value is an error, except a larger --steps, which
// recomputes the learning-rate schedule for the new total); metrics.jsonl keeps its lines up to
// that step and goes on from there. --no-load-optim starts fresh Adam moments; --finetune loads
// the weights only and starts at step 0. --exit-signal-handler: on SIGTERM the job saves (with
// --save) after the current step and exits 0.
// --precision fp32|bf16|fp8_delayed|fp8_current|fp8_blockwise|mxfp8|nvfp4 trains every linear
// layer (attention's linear_qkv and linear_proj, the dense FFNs, the experts) on the recipe's
// operands, emulated bit for bit; the router, norms, attention's softmax, embedding, output layer
// and loss stay fp32 (the small preset; bf16 on medium too). The reference's flags say the same:
// --bf16, --fp8-format hybrid|e4m3 with --fp8-recipe delayed|tensorwise|blockwise|mxfp8,
// --fp4-format e2m1 with --fp4-recipe nvfp4. --first-last-layers-bf16 (on by default for nvfp4, as
// the reference's NVFP4 recipes; --no-first-last-layers-bf16 turns it off) keeps the first
// --num-layers-at-start-in-bf16 and last --num-layers-at-end-in-bf16 layers (1 and 1) in BF16
// under an FP8 or FP4 recipe.
// --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 keeps Adam's moments
// in BF16 (the reference's precision-aware optimizer): half their bytes, the update still computed
// in fp32; the start-up line and the final JSON give the moments' bytes and the bytes saved. They
// are built for small (every recipe, weights in fp32) and medium.
// --fp8-param-gather (FP8 recipes) and --fp4-param-gather (nvfp4) hold the linear weights under
// the recipe as their codes, the fp32 masters in the optimizer's shards (small preset); a resumed
// run keeps this.
// Presets are complete configuration types (the model slot included), chosen once at start-up.
// `--describe` prints the chosen preset's configuration resolved for this job (its degrees from
// the world size and the flags) as one JSON object, with its parameter count and model FLOPs per
// token, and exits without reading the corpus.
#include "megamoe_train.hpp"

#include <CLI/CLI.hpp>
#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/operations.hpp>

#include <array>
#include <optional>
#include <string>

namespace {

namespace mm = megamoe;
using megamoe::train_job::options;
using megamoe::train_job::saved_job_setting;

/// The dtype of Adam's moments the precision-aware optimizer's flags name; as the reference, a
/// dtype other than fp32 needs --use-precision-aware-optimizer.
std::string moments_from_flags(options const& o) {
  if (!o.precision_aware_optimizer && (o.exp_avg_dtype != "fp32" || o.exp_avg_sq_dtype != "fp32"))
    throw mm::input_error(
        "megamoe-train: --exp-avg-dtype and --exp-avg-sq-dtype other than fp32 need "
        "--use-precision-aware-optimizer");
  if (o.exp_avg_dtype != o.exp_avg_sq_dtype)
    throw mm::input_error("megamoe-train: --exp-avg-dtype " + o.exp_avg_dtype +
                          " and --exp-avg-sq-dtype " + o.exp_avg_sq_dtype +
                          ": megamoe-train is built for both moments in one dtype (fp32 or bf16)");
  return o.exp_avg_dtype;
}

/// The recipe the reference's flags name (--bf16, --fp8-format with --fp8-recipe, --fp4-format
/// with --fp4-recipe), checked against --precision where both are given; empty where none is.
std::string precision_from_reference_flags(options const& o) {
  std::string named;
  auto name = [&](std::string const& recipe, std::string const& flags) {
    if (!named.empty() && named != recipe)
      throw mm::input_error("megamoe-train: " + flags + " names " + recipe + ", but another flag " +
                            named);
    named = recipe;
  };
  if (o.bf16_flag) name("bf16", "--bf16");
  if (!o.fp8_format.empty()) {
    std::string const flags = "--fp8-format " + o.fp8_format + " --fp8-recipe " + o.fp8_recipe;
    bool const tensorwise = o.fp8_recipe == "delayed" || o.fp8_recipe == "tensorwise";
    // Per-tensor FP8 is built with the hybrid format (E4M3 forward, E5M2 gradients); blockwise
    // FP8 and MXFP8 are E4M3 throughout, as the reference's recipes.
    if (tensorwise && o.fp8_format != "hybrid")
      throw mm::input_error("megamoe-train: " + flags +
                            ": per-tensor FP8 is built with --fp8-format hybrid only");
    if (!tensorwise && o.fp8_format != "e4m3")
      throw mm::input_error("megamoe-train: " + flags +
                            ": blockwise FP8 and MXFP8 take --fp8-format e4m3");
    if (o.fp8_recipe == "delayed") name("fp8_delayed", flags);
    if (o.fp8_recipe == "tensorwise") name("fp8_current", flags);
    if (o.fp8_recipe == "blockwise") name("fp8_blockwise", flags);
    if (o.fp8_recipe == "mxfp8") name("mxfp8", flags);
  }
  if (!o.fp4_format.empty())
    name("nvfp4", "--fp4-format " + o.fp4_format + " --fp4-recipe " + o.fp4_recipe);
  if (!named.empty() && o.precision_given && named != o.precision)
    throw mm::input_error("megamoe-train: --precision " + o.precision + ", but the reference's " +
                          "flags name " + named);
  return named;
}

/// The GEMM backend of the job: --backend as given, or for `auto` the fastest unit every rank
/// can run the recipe on (AMX's tiles, then AVX512-BF16's dot products, then the fp32 grouped
/// GEMMs; the BF16 units are built for --precision bf16), agreed over the world. A BF16 unit by
/// name needs a recipe (R037) and must be usable on every rank (R052); every error is agreed.
std::string resolved_backend(boost::mpi::communicator const& world, options const& o) {
  using mm::expert::gemm_backend;
  bool const built = MEGAMOE_HAS_AMX_INTRINSICS &&
                     megamoe::presets::recipe_built_for(o.preset, o.precision) &&
                     megamoe::presets::bf16_units_built_for(o.precision);
  mm::parallel::check_on_every_rank(world, [&] {
    if (o.backend == "auto" || o.backend == "grouped") return;
    std::string const flag = "--backend " + o.backend;
    if (o.precision == "fp32")
      throw mm::config_error(mm::rules::id::bf16_backends_need_a_recipe,
                             flag + " with --precision fp32");
    if (!built)
      throw mm::input_error("megamoe-train: " + flag +
                            " is built for --precision bf16 on the small and medium presets; "
                            "--precision " +
                            o.precision + " on " + o.preset + " runs on --backend grouped");
    auto const unit = o.backend == "amx" ? gemm_backend::amx : gemm_backend::avx512_bf16;
    if (auto const why = mm::expert::unavailable_reason(unit); !why.empty())
      throw mm::config_error(mm::rules::id::bf16_unit_usable, flag + ": " + why);
  });
  if (o.backend != "auto") return o.backend;
  // 2: AMX, 1: AVX512-BF16, 0: grouped; the least any rank can run.
  int mine = 0;
  if (built && mm::expert::unavailable_reason(gemm_backend::amx).empty())
    mine = 2;
  else if (built && mm::expert::unavailable_reason(gemm_backend::avx512_bf16).empty())
    mine = 1;
  int const agreed = boost::mpi::all_reduce(world, mine, boost::mpi::minimum<int>());
  return agreed == 2 ? "amx" : agreed == 1 ? "avx512_bf16" : "grouped";
}

/// The layers kept in BF16 at the start and end (`bf16_layers`): --first-last-layers-bf16, on by
/// default for nvfp4, with the reference's counts; none otherwise. A count without the flag
/// would do nothing, so it is an error.
std::array<int, 2> bf16_layers_from_flags(options const& o) {
  if (o.first_last_layers_bf16 && o.no_first_last_layers_bf16)
    throw mm::input_error(
        "megamoe-train: --first-last-layers-bf16 and --no-first-last-layers-bf16 together");
  bool const on =
      o.first_last_layers_bf16 || (!o.no_first_last_layers_bf16 && o.precision == "nvfp4");
  if (on) return {o.layers_at_start_in_bf16, o.layers_at_end_in_bf16};
  if (o.layers_at_start_in_bf16 != 1 || o.layers_at_end_in_bf16 != 1)
    throw mm::input_error(
        "megamoe-train: --num-layers-at-start-in-bf16 and --num-layers-at-end-in-bf16 count the "
        "layers --first-last-layers-bf16 keeps in BF16 (on by default for nvfp4 only); it is off "
        "here");
  return {0, 0};
}
/// Whether the linear weights are held as the recipe's codes: --fp8-param-gather under an FP8
/// recipe, --fp4-param-gather under nvfp4 (the reference's flags; R030 where the recipe keeps no
/// codes); built for the small preset.
bool quantized_weights_from_flags(options const& o) {
  if (o.fp8_param_gather && o.fp4_param_gather)
    throw mm::input_error("megamoe-train: --fp8-param-gather and --fp4-param-gather together");
  if (!o.fp8_param_gather && !o.fp4_param_gather) return false;
  std::string const flag = o.fp8_param_gather ? "--fp8-param-gather" : "--fp4-param-gather";
  if (o.precision == "fp32" || o.precision == "bf16")
    throw mm::config_error(mm::rules::id::quantized_storage_needs_quantized_recipe,
                           flag + " with --precision " + o.precision);
  if (o.fp8_param_gather && o.precision == "nvfp4")
    throw mm::input_error(
        "megamoe-train: --fp8-param-gather holds FP8 weights; under --precision nvfp4 the "
        "weights are FP4 codes: --fp4-param-gather");
  if (o.fp4_param_gather && o.precision != "nvfp4")
    throw mm::input_error(
        "megamoe-train: --fp4-param-gather holds NVFP4 weights; under "
        "--precision " +
        o.precision + " the weights are FP8 codes: --fp8-param-gather");
  if (!megamoe::presets::quantized_weights_built_for(o.preset))
    throw mm::input_error("megamoe-train: " + flag + " is built for the small preset, not " +
                          o.preset);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    options o;
    CLI::App app{"megamoe-train: train a small byte-level MoE language model on English text"};
    app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
    app.add_option("--micro-batch", o.micro_batch, "sequences per micro-batch (medium: 8)")
        ->capture_default_str();
    app.add_option("--global-batch", o.global_batch,
                   "sequences per step (micro-batch x micro-batches x DP; default: one "
                   "micro-batch per DP rank)");
    app.add_option("--seq-len", o.seq_len, "bytes per sequence (medium: 256)")
        ->capture_default_str();
    app.add_option("--lr", o.lr, "peak learning rate (warmup 5 %, cosine to a tenth)")
        ->capture_default_str();
    app.add_option("--seed", o.seed, "seed of weights and batches")->capture_default_str();
    app.add_option("--data", o.data, "corpus: a text file or a folder of them")
        ->capture_default_str();
    app.add_option("--eval-interval", o.eval_interval,
                   "held-out evaluation every N steps (default: a quarter of --steps)");
    app.add_option("--eval-iters", o.eval_iters,
                   "global batches of held-out windows per evaluation (default: every window)");
    app.add_option("--out", o.out, "folder for metrics, plot and weights")->capture_default_str();
    app.add_option("--tp,--tensor-model-parallel-size", o.tp,
                   "tensor-parallel ranks (attention, dense FFN, embedding, output layer)")
        ->capture_default_str();
    app.add_option("--cp,--context-parallel-size", o.cp,
                   "context-parallel ranks: each sequence cut into 2 CP chunks")
        ->capture_default_str();
    app.add_option("--etp,--expert-tensor-parallel-size", o.etp,
                   "expert tensor-parallel ranks (default: --tp)");
    app.add_option("--ep,--expert-model-parallel-size", o.ep,
                   "expert-parallel ranks (default: every rank of a stage's expert grid, world / "
                   "(ETP x PP))");
    app.add_option("--pp,--pipeline-model-parallel-size", o.pp,
                   "pipeline stages: the layers split over them (1F1B; interleaved with --vpp)")
        ->capture_default_str();
    app.add_option("--vpp,--num-virtual-stages-per-pipeline-rank", o.vpp,
                   "model chunks per pipeline rank (interleaved 1F1B; default 1)");
    app.add_option("--num-layers-per-virtual-pipeline-stage", o.layers_per_virtual_stage,
                   "layers per model chunk (sets --vpp to layers / (PP x this))");
    app.add_option("--decoder-first-pipeline-num-layers", o.first_stage_layers,
                   "layers of the first pipeline stage (the rest split evenly)");
    app.add_option("--decoder-last-pipeline-num-layers", o.last_stage_layers,
                   "layers of the last pipeline stage (the rest split evenly)");
    app.add_option("--pipeline-model-parallel-layout", o.pipeline_layout,
                   "the virtual stages as text: 'E' embedding, 't' a layer, 'L' loss, '|' between "
                   "stages, '*n' repeats (e.g. \"Et|(tt|)*2tL\"; V follows from it)");
    app.add_flag("--overlap-moe-expert-parallel-comm", o.merged_schedule,
                 "the merged forward-backward schedule (the reference's combined 1F1B): "
                 "steady-state forward and backward passes of two micro-batches run as one, "
                 "layer by layer in turn; with --pp above 1 it needs --vpp above 1");
    app.add_option("--preset", o.preset,
                   "model: tiny | small | fine | medium | dense | qwen3 | mixtral | deepseek "
                   "(qwen3: 120 steps, mixtral: 160, deepseek: 100 unless given)")
        ->check(CLI::IsMember(
            {"tiny", "small", "fine", "medium", "dense", "qwen3", "mixtral", "deepseek"}))
        ->capture_default_str();
    app.add_option(
           "--precision", o.precision,
           "recipe of every linear layer's GEMMs: fp32 | bf16 | fp8_delayed | fp8_current "
           "| fp8_blockwise | mxfp8 | nvfp4 (emulated bit for bit; the router, norms, "
           "softmax, embedding, output layer and loss stay fp32; small preset, bf16 on medium too)")
        ->check(CLI::IsMember(
            {"fp32", "bf16", "fp8_delayed", "fp8_current", "fp8_blockwise", "mxfp8", "nvfp4"}))
        ->capture_default_str();
    app.add_flag("--bf16", o.bf16_flag, "the reference's name for --precision bf16");
    app.add_option("--backend", o.backend,
                   "GEMM unit of every linear layer: auto (the fastest this CPU runs the recipe "
                   "on: amx, then avx512_bf16, then grouped) | grouped (fp32) | avx512_bf16 | amx "
                   "(the BF16 units: --precision bf16, small and medium presets)")
        ->check(CLI::IsMember({"auto", "grouped", "avx512_bf16", "amx"}))
        ->capture_default_str();
    app.add_option("--fp8-format", o.fp8_format,
                   "the reference's FP8 flag: hybrid (with --fp8-recipe delayed | tensorwise) or "
                   "e4m3 (with --fp8-recipe blockwise | mxfp8)")
        ->check(CLI::IsMember({"hybrid", "e4m3"}));
    app.add_option("--fp8-recipe", o.fp8_recipe,
                   "with --fp8-format: delayed (fp8_delayed), tensorwise (fp8_current), blockwise "
                   "(fp8_blockwise), mxfp8")
        ->check(CLI::IsMember({"delayed", "tensorwise", "blockwise", "mxfp8"}))
        ->capture_default_str();
    app.add_option("--fp4-format", o.fp4_format,
                   "the reference's FP4 flag: e2m1 (with --fp4-recipe nvfp4: --precision nvfp4)")
        ->check(CLI::IsMember({"e2m1"}));
    app.add_option("--fp4-recipe", o.fp4_recipe, "with --fp4-format: nvfp4")
        ->check(CLI::IsMember({"nvfp4"}))
        ->capture_default_str();
    app.add_flag("--first-last-layers-bf16", o.first_last_layers_bf16,
                 "keep the first and last layers in BF16 under an FP8 or FP4 recipe (on by "
                 "default for nvfp4; --num-layers-at-start/end-in-bf16 count them)");
    app.add_flag("--no-first-last-layers-bf16", o.no_first_last_layers_bf16,
                 "every layer under the recipe, nvfp4 included");
    app.add_option("--num-layers-at-start-in-bf16", o.layers_at_start_in_bf16,
                   "with --first-last-layers-bf16: the first layers kept in BF16")
        ->capture_default_str();
    app.add_option("--num-layers-at-end-in-bf16", o.layers_at_end_in_bf16,
                   "with --first-last-layers-bf16: the last layers kept in BF16")
        ->capture_default_str();
    app.add_flag("--fp8-param-gather", o.fp8_param_gather,
                 "hold the linear weights as their FP8 codes under an FP8 recipe, the fp32 "
                 "masters in the optimizer's shards (small preset)");
    app.add_flag("--fp4-param-gather", o.fp4_param_gather,
                 "the same for NVFP4 codes under --precision nvfp4 (small preset)");
    app.add_flag("--use-precision-aware-optimizer", o.precision_aware_optimizer,
                 "the reference's precision-aware optimizer: Adam's moments in the dtypes "
                 "--exp-avg-dtype and --exp-avg-sq-dtype give");
    app.add_option("--exp-avg-dtype", o.exp_avg_dtype,
                   "dtype of Adam's first moment: fp32 | bf16 (bf16 needs "
                   "--use-precision-aware-optimizer; the update is computed in fp32)")
        ->check(CLI::IsMember({"fp32", "bf16"}))
        ->capture_default_str();
    app.add_option("--exp-avg-sq-dtype", o.exp_avg_sq_dtype,
                   "dtype of Adam's second moment: fp32 | bf16 (as --exp-avg-dtype)")
        ->check(CLI::IsMember({"fp32", "bf16"}))
        ->capture_default_str();
    app.add_flag("--profile", o.profile,
                 "print the share of the step in each stage at the end (and in the final JSON)");
    app.add_flag("--describe", o.describe,
                 "print the preset's configuration for this job as one JSON object and exit");
    app.add_option("--save", o.save, "checkpoint folder to save to");
    app.add_option("--save-interval", o.save_interval,
                   "save every N steps (with --save; --save alone saves at the end)");
    app.add_option("--load", o.load,
                   "checkpoint folder to resume from (the iteration its tracker names)");
    app.add_flag("--no-load-optim", o.no_load_optim,
                 "with --load: fresh optimizer moments (the step continues)");
    app.add_flag("--finetune", o.finetune,
                 "with --load: the weights only; fresh optimizer, step 0");
    app.add_option("--upcycle", o.upcycle,
                   "start from a dense model's model.safetensors (the dense preset's): every "
                   "expert a copy (or a slice) of its FFN");
    app.add_flag("--exit-signal-handler", o.exit_signal_handler,
                 "on SIGTERM, save (with --save) after the current step and exit 0");
    try {
      app.parse(argc, argv);
    } catch (CLI::ParseError const& e) {
      int const code = app.exit(e, env.world().rank() == 0 ? std::cout : std::cerr,
                                env.world().rank() == 0 ? std::cerr : std::cerr);
      return code;
    }
    o.steps_given = app.count("--steps") > 0;
    o.seed_given = app.count("--seed") > 0;
    o.seq_len_given = app.count("--seq-len") > 0;
    o.global_batch_given = app.count("--global-batch") > 0;
    o.lr_given = app.count("--lr") > 0;
    o.preset_given = app.count("--preset") > 0;
    o.micro_batch_given = app.count("--micro-batch") > 0;
    o.precision_given = app.count("--precision") > 0;
    o.moments_given = app.count("--exp-avg-dtype") + app.count("--exp-avg-sq-dtype") > 0;
    o.quantized_weights_given = o.fp8_param_gather || o.fp4_param_gather;
    o.bf16_layers_given =
        app.count("--first-last-layers-bf16") + app.count("--no-first-last-layers-bf16") +
            app.count("--num-layers-at-start-in-bf16") + app.count("--num-layers-at-end-in-bf16") >
        0;
    mm::parallel::check_on_every_rank(env.world(), [&] { o.moments = moments_from_flags(o); });
    mm::parallel::check_on_every_rank(env.world(), [&] {
      auto const named = precision_from_reference_flags(o);
      if (!named.empty()) {
        o.precision = named;
        o.precision_given = true;
      }
    });
    // A checkpoint to resume from names its preset: the model type follows it unless given.
    std::optional<mm::io::checkpoint_reader> resume;
    std::optional<std::array<int, 2>> saved_bf16_layers;
    mm::parallel::check_on_every_rank(env.world(), [&] {
      if (!o.upcycle.empty() && !o.load.empty())
        throw mm::input_error(
            "megamoe-train: --upcycle starts a new run; it does not go with --load");
    });
    if (!o.load.empty() && !o.describe) {
      auto const& world = env.world();
      resume.emplace(world, o.load, mm::io::checkpoint_reader::latest_iteration(world, o.load));
      mm::parallel::check_on_every_rank(world, [&] {
        auto const saved = saved_job_setting(*resume, "preset", "");
        if (saved.empty()) return;
        if (o.preset_given && saved != o.preset)
          throw mm::input_error("megamoe-train: --preset " + o.preset + ", but " + o.load +
                                " holds a " + saved + " model");
        if (!o.preset_given) o.preset = saved;
        // The recipe too: a checkpoint holds its recipe's state (delayed scaling's histories).
        auto const recipe = saved_job_setting(*resume, "precision", "fp32");
        if (o.precision_given && recipe != o.precision && !o.finetune)
          throw mm::input_error("megamoe-train: --precision " + o.precision + ", but " + o.load +
                                " was trained under " + recipe +
                                " (a resumed run keeps its recipe)");
        if (!o.precision_given) o.precision = recipe;
        // Adam's moments keep their saved dtype unless the flags name one (then they convert).
        if (!o.moments_given) o.moments = saved_job_setting(*resume, "moments", "fp32");
        // A resumed run holds its weights as codes as the checkpoint's run did unless the flags
        // say so themselves (a checkpoint holds the fp32 masters either way).
        if (!o.quantized_weights_given && !o.finetune &&
            resume->state()
                .value("job", nlohmann::json::object())
                .value("quantized_weights", false))
          (o.precision == "nvfp4" ? o.fp4_param_gather : o.fp8_param_gather) = true;
        saved_bf16_layers = resume->state()
                                .value("job", nlohmann::json::object())
                                .value("bf16_layers", std::array<int, 2>{0, 0});
      });
    }
    mm::parallel::check_on_every_rank(env.world(), [&] {
      if (!megamoe::presets::recipe_built_for(o.preset, o.precision))
        throw mm::input_error("megamoe-train: --precision " + o.precision + " is built for " +
                              megamoe::presets::presets_built_for(o.precision) + ", not " +
                              o.preset);
      // The layers kept in BF16 are the checkpoint's unless the flags name them (as its recipe).
      o.bf16_layers = saved_bf16_layers && !o.bf16_layers_given ? *saved_bf16_layers
                                                                : bf16_layers_from_flags(o);
      if (saved_bf16_layers && *saved_bf16_layers != o.bf16_layers && !o.finetune)
        throw mm::input_error("megamoe-train: " + o.load + " keeps " +
                              std::to_string((*saved_bf16_layers)[0]) + " first and " +
                              std::to_string((*saved_bf16_layers)[1]) +
                              " last layers in BF16; a resumed run keeps them");
      o.quantized_weights = quantized_weights_from_flags(o);
      if (o.moments == "bf16" &&
          !megamoe::presets::bf16_moments_built_for(o.preset, o.quantized_weights))
        throw mm::input_error(
            "megamoe-train: Adam's moments in bf16 are built for the small preset with fp32 "
            "weights and for medium, not " +
            o.preset + (o.quantized_weights ? " with its weights held as codes" : ""));
    });
    if (o.preset == "medium") {  // its own sequence length and micro-batch unless given
      if (!o.seq_len_given) o.seq_len = 256;
      if (!o.micro_batch_given) o.micro_batch = 8;
    }
    // The families' presets cost about three times small's FLOPs per token: fewer steps by
    // default, so a run ends in under 10 minutes on two cores.
    if (o.preset == "qwen3" && !o.steps_given) o.steps = 120;
    if (o.preset == "mixtral" && !o.steps_given) o.steps = 160;
    if (o.preset == "deepseek" && !o.steps_given) o.steps = 100;
    o.backend = resolved_backend(env.world(), o);
    namespace job = megamoe::train_job;
    auto* const from = resume ? &*resume : nullptr;
    if (o.preset == "tiny" || o.preset == "fine" || o.preset == "dense")
      return job::run_fp32_presets(env, o, from);
    if (o.preset == "medium") return job::run_medium(env, o, from);
    if (o.preset == "qwen3" || o.preset == "mixtral" || o.preset == "deepseek")
      return job::run_family_presets(env, o, from);
    if (o.quantized_weights) return job::run_small_codes(env, o, from);
    if (o.precision == "fp32" || o.precision == "bf16") return job::run_small(env, o, from);
    return job::run_small_recipes(env, o, from);
  });
}
