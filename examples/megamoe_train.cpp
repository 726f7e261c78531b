// SPDX-License-Identifier: Apache-2.0
// megamoe-train — trains a byte-level MoE language model on English text: the training job of
// megamoe::train::run (train/run.hpp, every flag there; --help lists them) over the presets of
// presets.hpp, one configuration type each, chosen at start-up by --preset, --precision,
// --backend, the weight codes and the moments' dtype.
//
//   ./build/examples/megamoe-train                         # fortunes, preset "small", one process
//   mpiexec -n 2 ./build/examples/megamoe-train --ep 2     # experts over 2 ranks
//   ./build/examples/megamoe-train --preset qwen3          # a model family's proportions
#include "megamoe_train.hpp"

#include <megamoe/train/command_line.hpp>
#include <megamoe/train/resume.hpp>

#include <CLI/CLI.hpp>

#include <boost/mpi/collectives/all_reduce.hpp>

#include <array>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace mm = megamoe;
namespace mt = megamoe::train;
namespace presets = megamoe::presets;

/// The GEMM backend of the job: --backend as given, or for `auto` the fastest unit every rank
/// can run the recipe on (AMX's tiles, then AVX512-BF16's dot products, then the fp32 grouped
/// GEMMs; the BF16 units are built for --precision bf16), agreed over the world. A BF16 unit by
/// name needs a recipe (R037) and must be usable on every rank (R052); every error is agreed.
std::string resolved_backend(boost::mpi::communicator const& world, mt::job_options const& o) {
  using mm::expert::gemm_backend;
  bool const built =
      MEGAMOE_HAS_AMX_INTRINSICS && presets::bf16_units_built_for(o.preset, o.precision);
  mm::parallel::check_on_every_rank(world, [&] {
    if (o.backend == "auto" || o.backend == "grouped") return;
    std::string const flag = "--backend " + o.backend;
    if (o.precision == "fp32")
      throw mm::config_error(mm::rules::id::bf16_backends_need_a_recipe,
                             flag + " with --precision fp32");
    if (!built)
      throw o.error(flag + " is built for --precision bf16 on the small and medium presets; " +
                    "--precision " + o.precision + " on " + o.preset +
                    " runs on --backend grouped");
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

/// --help's text for an option whose default some presets change: "(medium: 8)".
void note_preset_defaults(CLI::App& app, char const* flag, int presets::preset_defaults::*field) {
  auto* option = app.get_option(flag);
  std::string note;
  for (auto const& p : presets::preset_table)
    if (p.*field != presets::preset_table[1].*field)
      note += (note.empty() ? " (" : ", ") + std::string(p.name) + ": " + std::to_string(p.*field);
  if (!note.empty()) option->description(option->get_description() + note + ")");
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    auto const& world = env.world();
    mt::job_options o;
    std::vector<std::string> names;
    for (auto const& p : presets::preset_table) names.emplace_back(p.name);
    mt::command_line line(
        "megamoe-train: train a byte-level MoE language model on English text", o, names,
        "model: tiny | small | fine | medium | dense | qwen3 | mixtral | deepseek, each built "
        "under every --precision");
    note_preset_defaults(line.app(), "--steps", &presets::preset_defaults::steps);
    note_preset_defaults(line.app(), "--seq-len", &presets::preset_defaults::seq_len);
    note_preset_defaults(line.app(), "--micro-batch", &presets::preset_defaults::micro_batch);
    if (auto const exit = line.parse(world, argc, argv)) return *exit;
    // A checkpoint to resume from names its preset: the model type follows it unless given, and
    // its recipe, moments, weight codes and BF16 layers with it.
    auto resume = mt::open_load(world, o);
    mm::parallel::check_on_every_rank(world, [&] {
      std::optional<std::array<int, 2>> saved_bf16_layers;
      if (auto const saved = resume ? mt::saved_job_setting(*resume, "preset", "") : "";
          !saved.empty()) {
        if (o.preset_given && saved != o.preset)
          throw o.error("--preset " + o.preset + ", but " + o.load + " holds a " + saved +
                        " model");
        o.preset = saved;
        saved_bf16_layers = mt::take_saved_recipe(*resume, o);
      }
      mt::settle_recipe_options(o, saved_bf16_layers);
      if (o.quantized_weights && !presets::quantized_weights_built_for(o.preset))
        throw o.error(
            std::string(o.fp8_param_gather ? "--fp8-param-gather" : "--fp4-param-gather") +
            " is built for the small preset, not " + o.preset);
      if (o.moments == "bf16" && !presets::bf16_moments_built_for(o.preset, o.quantized_weights))
        throw o.error(
            "Adam's moments in bf16 are built for the small and medium presets with fp32 "
            "weights, not " +
            o.preset + (o.quantized_weights ? " with its weights held as codes" : ""));
    });
    auto const& defaults = presets::preset_named(o.preset);
    if (!o.steps_given) o.steps = defaults.steps;
    if (!o.seq_len_given) o.seq_len = defaults.seq_len;
    if (!o.micro_batch_given) o.micro_batch = defaults.micro_batch;
    o.backend = resolved_backend(world, o);
    namespace job = megamoe::train_job;
    auto* const from = resume ? &*resume : nullptr;
    if (o.quantized_weights) return job::run_small_codes(env, o, from);
    if (o.backend == "amx" || o.backend == "avx512_bf16") return job::run_bf16_units(env, o, from);
    if (o.precision == "fp32") return job::run_fp32(env, o, from);
    if (o.precision == "bf16") return job::run_bf16(env, o, from);
    if (o.precision == "fp8_delayed") return job::run_fp8_delayed(env, o, from);
    if (o.precision == "fp8_current") return job::run_fp8_current(env, o, from);
    if (o.precision == "fp8_blockwise") return job::run_fp8_blockwise(env, o, from);
    if (o.precision == "mxfp8") return job::run_mxfp8(env, o, from);
    return job::run_nvfp4(env, o, from);
  });
}
