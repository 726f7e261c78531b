// SPDX-License-Identifier: Apache-2.0
// megamoe/train/job_options.hpp — what a training job's command line says (train/command_line.hpp
// reads it), and what follows from it for a configuration: the job's degrees, its start-up values,
// its virtual pipeline stages and the modules its recipe reaches.
#pragma once

#include <megamoe/config/resolve.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/train/token_data.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace megamoe::train {

struct job_options {
  std::string program = "megamoe-train";  // names the program in its messages
  int steps = 700, micro_batch = 16, global_batch = 0, seq_len = 128;
  int tp = 1, cp = 1, etp = 0, ep = 0;                  // etp, ep 0: their defaults
  int pp = 1, vpp = 0, layers_per_virtual_stage = 0;    // vpp 0: 1, or from the layers per stage
  int first_stage_layers = -1, last_stage_layers = -1;  // -1: an even split
  std::string pipeline_layout;                          // the reference's layout text
  bool merged_schedule = false;                         // --overlap-moe-expert-parallel-comm
  int eval_interval = 0, eval_iters = 10;               // eval_interval 0: steps / 4
  int sample_bytes = 200;  // text generated after training, in bytes at least; 0: none
  bool skip_train = false;  // --skip-train: no step; evaluation, logits and the export only
  std::string logits_out;   // --logits-out: the logits of the first valid samples to this file
  int logits_samples = 2;   // --logits-samples: how many
  double lr = 3e-3;
  std::uint64_t seed = 1234;
  // Text to train on (a file or a folder; documents end at lines of "%"), tokenized into the
  // run's folder, unless the data flags name tokenized datasets.
  std::string data = "/usr/share/games/fortunes", out = "megamoe-train-out";
  data_options dataset{};        // Megatron's data and tokenizer flags
  int vocab_multiple = 0;        // --make-vocab-size-divisible-by (0: the type's)
  std::string preset = "small";  // the model's name (a program of one configuration: its own)
  std::string precision = "fp32";
  std::string backend = "auto";  // as given, then the unit that runs
  // The reference's precision flags, resolved into `precision` (command_line.hpp).
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
  bool async_save = false;  // --async-save: checkpoints written in the background
  int log_straggler_interval = 0;   // check for stragglers every N steps (0: never)
  double straggler_threshold = 0.15;  // over the median rank's compute (train/stragglers.hpp)
  int log_memory_interval = 0;        // every rank's resident memory every N steps (0: never)
  // A step's checks (train_settings): Megatron's --rerun-mode, --check-for-spiky-loss and
  // --check-for-large-grads, and what a step that still fails does.
  std::string rerun_mode = "validate_results";
  bool check_spiky_loss = false, check_large_grads = false;
  double spike_factor = 10.0;
  int spike_window = 50;
  std::string on_failed_check = "skip";
  // Which flags the command line gave (a resumed run takes the others from the checkpoint).
  bool steps_given = false, seed_given = false, seq_len_given = false, global_batch_given = false,
       lr_given = false, preset_given = false, micro_batch_given = false, precision_given = false,
       moments_given = false, quantized_weights_given = false;

  /// An input error of this job, its text after the program's name.
  [[nodiscard]] input_error error(std::string const& text) const;
};

/// The model's layers `bf16_layers` keeps in BF16, in order.
MEGAMOE_DECL std::vector<int> layers_in_bf16(int layers, std::array<int, 2> bf16_layers);

/// The modules whose GEMMs read the recipe's operands, those whose weights are held as codes
/// (`quantized_weights`: all of them but shared experts), the layers kept in BF16, and what stays
/// in higher precision.
MEGAMOE_DECL nlohmann::json quantized_modules(config_values const& v, std::string const& precision,
                                              std::array<int, 2> bf16_layers,
                                              bool quantized_weights);

/// The job's degrees: TP, CP and PP as given, ETP = --etp or TP, EP = --ep or every rank of a
/// stage's expert grid (world / (ETP PP); 1 for a model of one expert per layer).
MEGAMOE_DECL parallel::degrees job_degrees(int world_size, job_options const& o, int experts);

/// --num-layers-per-virtual-pipeline-stage n as V = layers / (PP n), the reference's conversion.
template <class Config>
job_options with_virtual_stages(job_options o) {
  if (o.layers_per_virtual_stage == 0) return o;
  int const layers = Config::model::value.layers;
  if (o.vpp > 0) throw o.error("give --vpp or --num-layers-per-virtual-pipeline-stage, not both");
  if (o.layers_per_virtual_stage < 0 || o.pp < 1 ||
      layers % (o.pp * o.layers_per_virtual_stage) != 0)
    throw config_error(rules::id::pipeline_stages_divide_layers,
                       std::to_string(layers) + " layers, PP " + std::to_string(o.pp) + ", " +
                           std::to_string(o.layers_per_virtual_stage) +
                           " layers per virtual stage");
  o.vpp = layers / (o.pp * o.layers_per_virtual_stage);
  return o;
}

/// The job's steps between evaluations (--eval-interval, or a quarter of the steps).
[[nodiscard]] inline int eval_interval_of(job_options const& o) {
  return o.eval_interval > 0 ? o.eval_interval : std::max(1, o.steps / 4);
}

/// The job's data, the same on every rank of `world`: the datasets the data flags name, or the
/// text of --data tokenized by rank 0 into `<--out>/data/` (documents ending at "%" lines, each
/// with the end-of-document id); Megatron's train and valid samples for --steps global batches
/// of `global_batch` and the evaluations (data::requested_samples; no test split). With
/// --data-cache-path rank 0 builds the indices first and the others map its files. An error is
/// the same input_error on every rank.
MEGAMOE_DECL token_data job_data(boost::mpi::communicator const& world, job_options const& o,
                                 std::int64_t global_batch);

/// The start-up values of this job: its degrees, its world size, its pipeline's split, and the
/// vocabulary: the tokenizer's where the type's `vocabulary` is dynamic; a type that fixes it
/// trains when it holds the tokenizer's (the rest is padding), and is an error otherwise.
MEGAMOE_DECL startup_values job_values(parallel::degrees const& d, int world_size,
                                       job_options const& o, int vocabulary,
                                       std::int64_t tokenizer_vocabulary);

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/job_options.ipp>
#endif
