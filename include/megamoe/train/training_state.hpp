// SPDX-License-Identifier: Apache-2.0
// megamoe/train/training_state.hpp — the whole training state as a sharded checkpoint
// (io/checkpoint_files.hpp), saved on one layout and loaded on any.
//
// What a rank saves is what its optimizer owns: for every parameter piece of its AdamW shard
// (dense parameters sharded over TP x DP x CP, expert ones over EDP) the values (the fp32 masters
// of quantized weights), `optimizer.exp_avg.<name>` and `optimizer.exp_avg_sq.<name>` (in the
// moments' own dtype: F32, or BF16 under optim::bf16_moments; either loads into either), each as
// rectangles of the whole parameter (an ETP shard's rows and columns, a SwiGLU fc1 shard's two
// halves). So each element is saved exactly once, whatever the layout. State replicated across
// ranks (the router's expert bias, delayed scaling's amax histories) is written by the first
// replica. The index's state holds the configuration (describe), the layout, the step, the
// optimizer's step, the recipe operands' step (stochastic rounding), the schedule and the seed:
// batches and random draws are functions of (seed, step), so that is the data position and the
// random state.
//
// Loading reads, on each rank, exactly the pieces its new shard needs (any saved layout), then the
// optimizer's all-gathers give every rank its whole parameters and the quantized weights their
// codes. A checkpoint of another model (any differing model field of the configuration, or a
// tensor's shape) is refused.
#pragma once

#include <megamoe/config/describe.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/parameter_list.hpp>
#include <megamoe/io/checkpoint_files.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/train/trainer.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe::train {

/// The configuration fields that describe how a model runs rather than what it is: they may
/// differ between a checkpoint and the job that loads it.
MEGAMOE_DECL bool runtime_field(std::string const& key);

/// The model's configuration as a checkpoint records it (describe's flat form) and the layout.
MEGAMOE_DECL nlohmann::json checkpoint_configuration(config_values const& values);

/// What a save or a load did.
struct checkpoint_report {
  int iteration = 0;
  std::uint64_t bytes = 0;  // all ranks' files and the index
  double seconds = 0.0;     // from an opened reader: without its open_seconds()
};

struct load_options {
  bool optimizer = true;  // false (--no-load-optim): fresh moments, the step kept
  bool finetune = false;  // weights only: fresh optimizer, step 0
};

/// Where each parameter of `parameters` lies in the whole one, by name.
MEGAMOE_DECL std::map<std::string, element_numbering> numbering_by_name(
    parameter_list<float> const& parameters);
MEGAMOE_DECL std::map<std::string, element_numbering> numbering_by_name(
    parameter_list<double> const& parameters);

/// Where each of this rank's parameters lies in the whole one, by name.
template <class Config>
std::map<std::string, element_numbering> parameter_numbering(transformer<Config>& model) {
  return numbering_by_name(model.numbered_parameters());
}

namespace detail {

/// Whether this rank writes a replicated state owned by `owner`.
MEGAMOE_DECL bool writes(parallel::process_groups const* groups, state_owner owner);

/// Adds the persistent states this rank writes to `writer`; reads every one from `reader`.
MEGAMOE_DECL void add_persistent_states(io::checkpoint_writer& writer,
                                        parallel::process_groups const* groups,
                                        persistent_state_list const& states);
MEGAMOE_DECL void read_persistent_states(io::checkpoint_reader& reader,
                                         persistent_state_list const& states);

/// Calls f(piece, name, whole rows, cols, rectangle, offset into the piece's arrays) for the
/// rectangles of each parameter piece the optimizer owns.
template <class Optimizer, class Config, class F>
void for_each_owned_rectangle(Optimizer& optimizer, transformer<Config>& model, F&& f) {
  auto const numbering = parameter_numbering(model);
  optimizer.for_each_shard_piece([&](auto const& piece) {
    auto const it = numbering.find(std::string(piece.name));
    if (it == numbering.end())
      throw input_error("checkpoint: the optimizer's " + std::string(piece.name) +
                        " is not a parameter of the model");
    auto const& n = it->second;
    std::int64_t const rows = n.whole_rows(piece.rows), cols = n.global_cols;
    std::string const name(piece.name);
    for_each_rectangle(n, piece.cols, piece.first, piece.count, [&](global_rectangle const& r) {
      f(piece, name, rows, cols, r, r.local_first - piece.first);
    });
  });
}

}  // namespace detail

/// The trainer's whole state as iteration steps_done() under `root`, copied into a writer's host
/// buffers, and the index's state (collective over `world`: the copy agrees on failure). `extra`
/// goes into the state as "job" (the program's own settings).
struct staged_checkpoint {
  io::checkpoint_writer writer;
  nlohmann::json state;
};
template <class Config, class Moments>
staged_checkpoint stage_checkpoint(trainer<Config, Moments>& t,
                                   boost::mpi::communicator const& world,
                                   std::filesystem::path const& root,
                                   nlohmann::json const& extra = nlohmann::json::object()) {
  auto& model = t.model();
  auto& optimizer = t.optimizer();
  auto const* groups = t.groups();
  io::checkpoint_writer writer(world, root, t.steps_done());
  parallel::check_on_every_rank(world, [&] {
    detail::for_each_owned_rectangle(
        optimizer, model,
        [&](auto const& piece, std::string const& name, std::int64_t rows, std::int64_t cols,
            global_rectangle const& r, std::int64_t at) {
          auto const shape = io::reference_shape(name, rows, cols);
          writer.add(name, shape, rows, cols, r, piece.values + at);
          writer.add("optimizer.exp_avg." + name, shape, rows, cols, r, piece.exp_avg + at);
          writer.add("optimizer.exp_avg_sq." + name, shape, rows, cols, r, piece.exp_avg_sq + at);
        });
    detail::add_persistent_states(writer, groups, model.persistent_states());
  });
  auto const& settings = t.settings();
  nlohmann::json state = {
      {"configuration", checkpoint_configuration(model.values())},
      {"step", t.steps_done()},
      {"optimizer_step", optimizer.steps()},
      {"operand_step", model.operand_steps()},
      {"seed", settings.seed},
      {"seq_length", settings.seq_length},
      {"global_batch", std::int64_t{settings.micro_batch} * settings.micro_batches * t.dp_size()},
      {"schedule",
       {{"peak", settings.schedule.peak},
        {"minimum", settings.schedule.minimum},
        {"warmup", settings.schedule.warmup},
        {"total", settings.schedule.total}}},
      {"job", extra}};
  return {std::move(writer), std::move(state)};
}

/// Saves the trainer's whole state as iteration steps_done() under `root` (collective over
/// `world`). `extra` goes into the index's state as "job" (the program's own settings).
template <class Config, class Moments>
checkpoint_report save_checkpoint(trainer<Config, Moments>& t,
                                  boost::mpi::communicator const& world,
                                  std::filesystem::path const& root,
                                  nlohmann::json const& extra = nlohmann::json::object()) {
  auto const start = std::chrono::steady_clock::now();
  auto staged = stage_checkpoint(t, world, root, extra);
  checkpoint_report report;
  report.iteration = t.steps_done();
  report.bytes = staged.writer.commit(staged.state);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

/// Why a checkpoint's model differs from `values`' ("" when it is the same model). With
/// `saved_fields_only` (an imported model, which records the fields its format decides) the
/// fields the checkpoint does not record are the loading job's.
MEGAMOE_DECL std::string model_difference(nlohmann::json const& saved, config_values const& values,
                                          bool saved_fields_only = false);

/// Loads an opened checkpoint into a trainer built for this job (any layout), collectively over
/// `world`. Every check fails on every rank with the same error.
template <class Config, class Moments>
checkpoint_report load_checkpoint(trainer<Config, Moments>& t,
                                  boost::mpi::communicator const& world,
                                  io::checkpoint_reader& reader, load_options const& options = {}) {
  auto const start = std::chrono::steady_clock::now();
  int const iteration = reader.iteration();
  auto& model = t.model();
  auto& optimizer = t.optimizer();
  auto const& state = reader.state();
  parallel::check_on_every_rank(world, [&] {
    std::string const why = model_difference(
        state.contains("configuration") ? state["configuration"].value("model", nlohmann::json())
                                        : nlohmann::json(),
        model.values(), state.value("imported_configuration", false));
    if (!why.empty())
      throw input_error("checkpoint " + reader.folder().string() +
                        " was saved by another model: " + why);
    bool const moments = options.optimizer && !options.finetune;
    if (!options.finetune && !state.contains("step"))
      throw input_error("checkpoint " + reader.folder().string() +
                        " holds weights only, no training state: load it to fine-tune");
    if (moments && state.value("weights_only", false))
      throw input_error("checkpoint " + reader.folder().string() +
                        " holds no optimizer state: load it without the optimizer (megamoe-train "
                        "--no-load-optim) or to fine-tune");
    detail::for_each_owned_rectangle(
        optimizer, model,
        [&](auto const& piece, std::string const& name, std::int64_t rows, std::int64_t cols,
            global_rectangle const& r, std::int64_t at) {
          reader.read(name, rows, cols, r, piece.values + at);
          auto const count = r.rows * r.cols;
          if (moments) {
            reader.read("optimizer.exp_avg." + name, rows, cols, r, piece.exp_avg + at);
            reader.read("optimizer.exp_avg_sq." + name, rows, cols, r, piece.exp_avg_sq + at);
          } else {
            std::fill_n(piece.exp_avg + at, count,
                        std::remove_pointer_t<decltype(piece.exp_avg)>{});
            std::fill_n(piece.exp_avg_sq + at, count,
                        std::remove_pointer_t<decltype(piece.exp_avg_sq)>{});
          }
        });
    auto const states = model.persistent_states();
    detail::read_persistent_states(reader, states);
    model.set_persistent_states(states);
    if (!options.finetune) {
      t.set_steps_done(state.at("step").get<int>());
      optimizer.set_steps(moments ? state.at("optimizer_step").get<int>() : 0);
      model.set_operand_steps(state.at("operand_step").get<std::uint64_t>());
    }
  });
  reader.release();
  optimizer.publish(model);
  checkpoint_report report;
  report.iteration = iteration;
  report.bytes = reader.bytes();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

/// Opens the checkpoint `root`'s tracker names and loads it (see above).
template <class Config, class Moments>
checkpoint_report load_checkpoint(trainer<Config, Moments>& t,
                                  boost::mpi::communicator const& world,
                                  std::filesystem::path const& root,
                                  load_options const& options = {}) {
  auto const start = std::chrono::steady_clock::now();
  io::checkpoint_reader reader(world, root, io::checkpoint_reader::latest_iteration(world, root));
  auto report = load_checkpoint(t, world, reader, options);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/training_state.ipp>
#endif
