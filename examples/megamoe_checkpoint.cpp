// SPDX-License-Identifier: Apache-2.0
// megamoe-checkpoint — looks into checkpoints and converts them (one process).
//
//   megamoe-checkpoint inspect DIR                  step, configuration, layout, tensors
//   megamoe-checkpoint export DIR FILE [--optimizer] one safetensors file: every tensor whole
//                                                   under the reference's names (every expert),
//                                                   the configuration and the training state
//                                                   in its metadata; Adam's moments with
//                                                   --optimizer
//   megamoe-checkpoint import FILE DIR              a single safetensors file (an export, or
//                                                   megamoe-train's model.safetensors) to a
//                                                   checkpoint any layout loads
//   megamoe-checkpoint upcycle FILE DIR [--preset P] [--seed K]
//                                                   a dense model's model.safetensors (the dense
//                                                   preset's) upcycled into preset P (small) as
//                                                   megamoe-train --upcycle does with seed K: a
//                                                   weights-only checkpoint for --finetune
// A file with the training state (an export with --optimizer) imports to a checkpoint that
// resumes; one with weights only (model.safetensors, an export without --optimizer) to one that
// megamoe-train --load ... --finetune starts from.
#include "presets.hpp"

#include <megamoe/io/checkpoint_files.hpp>
#include <megamoe/io/safetensors.hpp>
#include <megamoe/io/whole_tensors.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/train/training_state.hpp>
#include <megamoe/train/upcycle.hpp>
#include <megamoe/version.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace io = megamoe::io;
namespace fs = std::filesystem;

namespace {

bool optimizer_tensor(std::string const& name) {
  return name.rfind("optimizer.", 0) == 0;
}

int inspect(boost::mpi::communicator const& world, fs::path const& dir) {
  io::checkpoint_reader reader(world, dir, io::checkpoint_reader::latest_iteration(world, dir));
  auto const& state = reader.state();
  std::cout << "checkpoint " << reader.folder().string() << ": iteration " << reader.iteration()
            << ", " << reader.bytes() << " bytes in " << reader.saved_world_size()
            << " rank file(s), every CRC-32 checked\n";
  for (char const* key : {"step", "optimizer_step", "operand_step", "seed", "seq_length",
                          "global_batch", "schedule", "job", "weights_only"})
    if (state.contains(key)) std::cout << "  " << key << ": " << state[key].dump() << "\n";
  if (state.contains("configuration")) {
    auto const& c = state["configuration"];
    if (c.contains("model")) std::cout << "  model: " << c["model"].dump() << "\n";
    if (c.contains("runtime")) std::cout << "  saved on: " << c["runtime"].dump() << "\n";
  }
  std::int64_t elements = 0, model_elements = 0;
  std::cout << "  tensors (" << reader.tensors().size() << "):\n";
  for (auto const& [name, t] : reader.tensors()) {
    nlohmann::json shape = t.shape;
    std::cout << "    " << name << " " << io::dtype_name(t.type) << " " << shape.dump() << " in "
              << t.pieces.size() << " piece(s)\n";
    elements += t.rows * t.cols;
    if (!optimizer_tensor(name)) model_elements += t.rows * t.cols;
  }
  std::cout << "  " << model_elements << " model elements, " << elements << " in all\n";
  return 0;
}

/// Calls f.template operator()<T>() with the element type of `type`: F64, F32 or BF16 (Adam's
/// moments under --exp-avg-dtype bf16); any other is refused, naming `what`.
template <class F>
void with_element_type(io::dtype type, std::string const& what, F&& f) {
  if (type == io::dtype::f64)
    f.template operator()<double>();
  else if (type == io::dtype::f32)
    f.template operator()<float>();
  else if (type == io::dtype::bf16)
    f.template operator()<mm::bfloat16>();
  else
    throw mm::input_error("megamoe-checkpoint: " + what + " is " + io::dtype_name(type) +
                          "; megamoe-checkpoint reads F32, F64 and BF16 tensors");
}

int export_file(boost::mpi::communicator const& world, fs::path const& dir, fs::path const& file,
                bool optimizer) {
  io::checkpoint_reader reader(world, dir, io::checkpoint_reader::latest_iteration(world, dir));
  // Each tensor under the shape its checkpoint records (an imported file's own), in its dtype.
  io::whole_tensors whole;
  for (auto const& [name, t] : reader.tensors()) {
    if (optimizer_tensor(name) && !optimizer) continue;
    with_element_type(t.type, name, [&]<class T>() {
      whole.add<T>(name, t.shape, t.rows, t.cols);
      whole.place(name, mm::global_rectangle{0, 0, 0, t.rows, t.cols},
                  reader.read_whole<T>(name).data());
    });
  }
  auto state = reader.state();
  if (!optimizer) state["weights_only"] = true;
  std::map<std::string, std::string> metadata{{"format", "pt"},
                                              {"producer", "megamoe-checkpoint"},
                                              {"iteration", std::to_string(reader.iteration())},
                                              {"megamoe_state", state.dump()}};
  if (state.contains("configuration") && state["configuration"].contains("model"))
    metadata["configuration"] = state["configuration"]["model"].dump();
  whole.write(file, metadata);
  std::cout << "exported iteration " << reader.iteration() << ": " << whole.size() << " tensors to "
            << file.string() << (optimizer ? " (with optimizer state)" : "") << "\n";
  return 0;
}

int import_file(boost::mpi::communicator const& world, fs::path const& file, fs::path const& dir) {
  io::readable_file const in(file);
  auto const header = io::read_safetensors_header(in);
  nlohmann::json state;
  int iteration = 0;
  if (auto const it = header.metadata.find("megamoe_state"); it != header.metadata.end()) {
    state = nlohmann::json::parse(it->second, nullptr, false);
    if (state.is_discarded() || !state.is_object())
      throw mm::input_error("megamoe-checkpoint: " + file.string() +
                            ": its megamoe_state metadata is not a JSON object");
    iteration = state.value("step", 0);
  } else if (auto const c = header.metadata.find("configuration"); c != header.metadata.end()) {
    auto const model = nlohmann::json::parse(c->second, nullptr, false);
    if (model.is_discarded() || !model.is_object())
      throw mm::input_error("megamoe-checkpoint: " + file.string() +
                            ": its configuration metadata is not a JSON object");
    state = {{"configuration", {{"model", model}}}, {"weights_only", true}};
  } else {
    throw mm::input_error("megamoe-checkpoint: " + file.string() +
                          " holds no megamoe configuration in its metadata (megamoe-train's "
                          "model.safetensors and megamoe-checkpoint export write one)");
  }
  bool const has_moments = std::any_of(header.tensors.begin(), header.tensors.end(),
                                       [](auto const& t) { return optimizer_tensor(t.name); });
  if (!has_moments) state["weights_only"] = true;
  io::checkpoint_writer writer(world, dir, iteration);
  std::size_t count = 0;
  for (auto const& t : header.tensors) {
    if (t.shape.empty() || t.shape.size() > 2)
      throw mm::input_error("megamoe-checkpoint: " + file.string() + ": " + t.name +
                            " is not a vector or a matrix");
    std::int64_t const rows = t.shape.size() == 1 ? 1 : t.shape[0];
    std::int64_t const cols = t.shape.back();
    with_element_type(t.type, file.string() + ": " + t.name, [&]<class T>() {
      writer.add_whole(t.name, t.shape, rows, cols, io::read_tensor<T>(in, t).data());
    });
    ++count;
  }
  auto const bytes = writer.commit(state);
  std::cout << "imported " << count << " tensors from " << file.string() << " to "
            << (dir / io::iteration_folder(iteration)).string() << " (" << bytes << " bytes"
            << (state.value("weights_only", false) ? ", weights only: load with --finetune" : "")
            << ")\n";
  return 0;
}

/// The dense model in `file` upcycled into `Config` (initialised from `seed` as megamoe-train
/// does), saved whole as a weights-only checkpoint of iteration 0.
template <class Config>
int upcycle_file(boost::mpi::communicator const& world, fs::path const& file, fs::path const& dir,
                 std::string const& preset, std::uint64_t seed) {
  mm::parallel::process_groups const groups(world, mm::parallel::degrees{});
  // The vocabulary (dynamic in the presets) and its padding are the dense model's.
  auto const metadata = mm::io::read_safetensors_metadata(file);
  auto const configuration = metadata.find("configuration");
  if (configuration == metadata.end())
    throw mm::input_error(file.string() + " names no configuration (its vocabulary is needed)");
  auto const dense = nlohmann::json::parse(configuration->second);
  mm::startup_values given{.tp = 1, .cp = 1, .pp = 1, .etp = 1, .ep = 1, .world_size = 1};
  given.vocabulary = dense.at("vocab_size").get<int>();
  given.vocab_multiple = dense.value("make_vocab_size_divisible_by", 128);
  mm::transformer<Config> model(groups, given);
  model.initialize(seed, 0.02);
  int const g = mm::train::upcycle(model, world, file);
  io::checkpoint_writer writer(world, dir, 0);
  model.for_each_parameter([&](std::string_view view, auto value, auto, mm::parameter_kind) {
    std::string const name(view);
    writer.add_whole(name, io::reference_shape(name, value.rows(), value.cols()), value.rows(),
                     value.cols(), value.data());
  });
  model.for_each_persistent_state([&](mm::persistent_state const& s) {
    std::string const name(s.name);
    writer.add_whole(name, io::reference_shape(name, s.rows, s.cols), s.rows, s.cols,
                     s.values.data());
  });
  nlohmann::json const state = {
      {"configuration", mm::train::checkpoint_configuration(model.values())},
      {"weights_only", true},
      {"job", {{"preset", preset}}},
      {"upcycled_from", file.filename().string()},
      {"granularity", g}};
  auto const bytes = writer.commit(state);
  std::cout << "upcycled " << file.string() << " into preset " << preset << " (granularity " << g
            << "): " << (dir / io::iteration_folder(0)).string() << ", " << bytes
            << " bytes; start from it with megamoe-train --load " << dir.string()
            << " --finetune\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    CLI::App app{"megamoe-checkpoint: inspect, export and import megamoe checkpoints"};
    app.set_version_flag("--version", mm::version_line("megamoe-checkpoint"));
    app.require_subcommand(1);
    std::string dir, file;
    bool optimizer = false;
    auto* inspect_cmd = app.add_subcommand("inspect", "step, configuration, layout and tensors");
    inspect_cmd->add_option("DIR", dir, "checkpoint folder")->required();
    auto* export_cmd = app.add_subcommand("export", "one safetensors file, every tensor whole");
    export_cmd->add_option("DIR", dir, "checkpoint folder")->required();
    export_cmd->add_option("FILE", file, "safetensors file to write")->required();
    export_cmd->add_flag("--optimizer", optimizer, "with Adam's moments and the training state");
    auto* import_cmd = app.add_subcommand("import", "a safetensors file to a checkpoint");
    import_cmd->add_option("FILE", file, "safetensors file to read")->required();
    import_cmd->add_option("DIR", dir, "checkpoint folder to write")->required();
    std::string preset = "small";
    std::uint64_t seed = 1234;
    auto* upcycle_cmd = app.add_subcommand("upcycle", "a dense model upcycled into a checkpoint");
    upcycle_cmd->add_option("FILE", file, "the dense model's model.safetensors")->required();
    upcycle_cmd->add_option("DIR", dir, "checkpoint folder to write")->required();
    upcycle_cmd->add_option("--preset", preset, "the MoE preset: tiny | small | fine")
        ->check(CLI::IsMember({"tiny", "small", "fine"}))
        ->capture_default_str();
    upcycle_cmd->add_option("--seed", seed, "megamoe-train's --seed (the router's initialisation)")
        ->capture_default_str();
    try {
      app.parse(argc, argv);
    } catch (CLI::ParseError const& e) {
      return app.exit(e);
    }
    auto const& world = env.world();
    if (world.size() != 1) {
      mm::parallel::check_on_every_rank(world, [] {
        throw mm::input_error("megamoe-checkpoint runs as one process (no mpiexec -n > 1)");
      });
    }
    if (*inspect_cmd) return inspect(world, dir);
    if (*export_cmd) return export_file(world, dir, file, optimizer);
    if (*upcycle_cmd) {
      auto run = [&]<class Config>() {
        return upcycle_file<Config>(world, file, dir, preset, seed);
      };
      return megamoe::presets::with_preset(preset, run);
    }
    return import_file(world, file, dir);
  });
}
