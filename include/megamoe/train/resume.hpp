// SPDX-License-Identifier: Apache-2.0
// megamoe/train/resume.hpp — what a resumed job takes from its checkpoint: the settings a training
// job keeps there (its "job" state: model name, recipe, moments, BF16 layers, weight codes, steps,
// micro-batch) and the schedule's (seed, sequence length, global batch, learning rate), each
// where the command line did not give it; a flag that contradicts the checkpoint is an error.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/io/checkpoint_files.hpp>
#include <megamoe/train/command_line.hpp>
#include <megamoe/train/job_options.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace megamoe::train {

/// The tokenizer flags as a checkpoint and model.safetensors record them: the type and its
/// files' absolute paths (megamoe-checkpoint export copies the files beside the weights).
MEGAMOE_DECL nlohmann::json tokenizer_record(data::tokenizer_options const& t);

/// The job state a training job keeps in its checkpoints (`take_saved_recipe` and
/// `take_saved_settings` read it back).
MEGAMOE_DECL nlohmann::json job_state(job_options const& o);

/// A setting a training job kept in a checkpoint's job state, or `fallback` where it kept none.
MEGAMOE_DECL std::string saved_job_setting(io::checkpoint_reader const& checkpoint, char const* key,
                                           char const* fallback);

/// The checkpoint --load names at the iteration its tracker names (none for --describe).
MEGAMOE_DECL std::optional<io::checkpoint_reader> open_load(boost::mpi::communicator const& world,
                                                            job_options const& o);

/// The recipe, Adam's moments and the weight codes of the run `checkpoint` holds, where the flags
/// do not name them; returns the layers it kept in BF16. A checkpoint holds its recipe's state
/// (delayed scaling's histories), so another recipe is an error unless fine-tuning; the moments
/// convert to the dtype the flags name.
MEGAMOE_DECL std::array<int, 2> take_saved_recipe(io::checkpoint_reader const& checkpoint,
                                                  job_options& o);

/// The layers kept in BF16 (the checkpoint's, `saved`, unless the flags name them) and whether
/// the weights are held as codes, from the flags.
MEGAMOE_DECL void settle_recipe_options(job_options& o, std::optional<std::array<int, 2>> saved);

/// A resumed run takes the job's settings from the checkpoint where the command line did not
/// give them; a flag that contradicts it is an error. Returns the saved schedule's total.
MEGAMOE_DECL int take_saved_settings(nlohmann::json const& state, job_options& o);

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/resume.ipp>
#endif
