// SPDX-License-Identifier: Apache-2.0
// megamoe/train/resume.ipp — the definitions behind resume.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/resume.hpp>

namespace megamoe::train {

MEGAMOE_DECL nlohmann::json job_state(job_options const& o) {
  return {{"preset", o.preset},
          {"precision", o.precision},
          {"backend", o.backend},
          {"moments", o.moments},
          {"steps", o.steps},
          {"micro_batch", o.micro_batch},
          {"bf16_layers", o.bf16_layers},
          {"quantized_weights", o.quantized_weights},
          {"tokenizer", tokenizer_record(o.dataset.tokenizer)}};
}

MEGAMOE_DECL nlohmann::json tokenizer_record(data::tokenizer_options const& t) {
  auto path = [](std::filesystem::path const& p) {
    return p.empty() ? std::string() : std::filesystem::absolute(p).string();
  };
  nlohmann::json record = {{"type", t.type},
                           {"vocab_file", path(t.vocab_file)},
                           {"merge_file", path(t.merge_file)},
                           {"model", path(t.model)}};
  if (t.vocab_size) record["vocab_size"] = *t.vocab_size;
  if (t.null_eod) record["null_eod"] = *t.null_eod;
  return record;
}

MEGAMOE_DECL std::string saved_job_setting(io::checkpoint_reader const& checkpoint, char const* key,
                                           char const* fallback) {
  return checkpoint.state().value("job", nlohmann::json::object()).value(key, fallback);
}

MEGAMOE_DECL std::optional<io::checkpoint_reader> open_load(boost::mpi::communicator const& world,
                                                            job_options const& o) {
  std::optional<io::checkpoint_reader> reader;
  if (!o.load.empty() && !o.describe)
    reader.emplace(world, o.load, io::checkpoint_reader::latest_iteration(world, o.load));
  return reader;
}

MEGAMOE_DECL std::array<int, 2> take_saved_recipe(io::checkpoint_reader const& checkpoint,
                                                  job_options& o) {
  auto const recipe = saved_job_setting(checkpoint, "precision", "fp32");
  if (o.precision_given && recipe != o.precision && !o.finetune)
    throw o.error("--precision " + o.precision + ", but " + o.load + " was trained under " +
                  recipe + " (a resumed run keeps its recipe)");
  if (!o.precision_given) o.precision = recipe;
  if (!o.moments_given) o.moments = saved_job_setting(checkpoint, "moments", "fp32");
  // Weights held as codes as the checkpoint's run held them unless the flags say so themselves
  // (a checkpoint holds the fp32 masters either way).
  auto const job = checkpoint.state().value("job", nlohmann::json::object());
  if (!o.quantized_weights_given && !o.finetune && job.value("quantized_weights", false))
    (o.precision == "nvfp4" ? o.fp4_param_gather : o.fp8_param_gather) = true;
  return job.value("bf16_layers", std::array<int, 2>{0, 0});
}

MEGAMOE_DECL void settle_recipe_options(job_options& o, std::optional<std::array<int, 2>> saved) {
  o.bf16_layers = saved && !o.bf16_layers_given ? *saved : bf16_layers_from_flags(o);
  if (saved && *saved != o.bf16_layers && !o.finetune)
    throw o.error(o.load + " keeps " + std::to_string((*saved)[0]) + " first and " +
                  std::to_string((*saved)[1]) + " last layers in BF16; a resumed run keeps them");
  o.quantized_weights = quantized_weights_from_flags(o);
}

MEGAMOE_DECL int take_saved_settings(nlohmann::json const& state, job_options& o) {
  if (!state.contains("step"))
    throw o.error(o.load + " holds weights only, no training state: load it with --finetune");
  auto const job = state.value("job", nlohmann::json::object());
  int const saved_steps = job.value("steps", 0);
  auto same = [&](char const* flag, bool given, auto mine, auto saved) {
    if (given && mine != saved)
      throw o.error(std::string(flag) + " " + std::to_string(mine) +
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

}  // namespace megamoe::train
