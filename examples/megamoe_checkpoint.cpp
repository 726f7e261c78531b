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
//   megamoe-checkpoint export --format hf --arch A [--dtype f32|bf16] [--max-shard-size BYTES] SRC OUT
//                                                   a checkpoint or model.safetensors as a Hugging
//                                                   Face folder of architecture A (mixtral,
//                                                   qwen3_moe, deepseek_v3): config.json, the
//                                                   weights under the Hub's names, sharded above
//                                                   the size, and the run's tokenizer files
//   megamoe-checkpoint import --format hf SRC DIR   a Hugging Face folder of those architectures
//                                                   (F32, BF16 or F16; one or many files) to a
//                                                   weights-only checkpoint for --finetune
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
#include <megamoe/io/hugging_face.hpp>
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

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
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

namespace hf = megamoe::io::hugging_face;

/// What an export reads: the model configuration, the weights (whole, fp32), the training
/// sequence length and the tokenizer the run used (megamoe-train records both).
struct exported_model {
  nlohmann::json model, tokenizer;
  std::int64_t seq_length = 4096;
  hf::named_tensors tensors;
};

exported_model read_model(boost::mpi::communicator const& world, fs::path const& source) {
  exported_model m;
  auto json_of = [&](std::string const& text, char const* what) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw mm::input_error(source.string() + ": its " + what + " is not a JSON object");
    return j;
  };
  if (fs::is_regular_file(source)) {
    io::readable_file const in(source);
    auto const header = io::read_safetensors_header(in);
    auto const c = header.metadata.find("configuration");
    if (c == header.metadata.end())
      throw mm::input_error(source.string() +
                            " holds no megamoe configuration in its metadata (megamoe-train's "
                            "model.safetensors and megamoe-checkpoint export write one)");
    m.model = json_of(c->second, "configuration");
    if (auto const t = header.metadata.find("tokenizer"); t != header.metadata.end())
      m.tokenizer = json_of(t->second, "tokenizer");
    if (auto const s = header.metadata.find("seq_length"); s != header.metadata.end())
      m.seq_length = std::stoll(s->second);
    for (auto const& t : header.tensors) {
      if (optimizer_tensor(t.name)) continue;
      std::vector<float> values;
      with_element_type(t.type, source.string() + ": " + t.name, [&]<class T>() {
        for (auto v : io::read_tensor<T>(in, t)) values.push_back(static_cast<float>(v));
      });
      m.tensors.emplace_back(t.name, hf::tensor{t.shape, std::move(values)});
    }
    return m;
  }
  io::checkpoint_reader reader(world, source, io::checkpoint_reader::latest_iteration(world, source));
  auto const& state = reader.state();
  if (!state.contains("configuration") || !state["configuration"].contains("model"))
    throw mm::input_error(reader.folder().string() + " records no model configuration");
  m.model = state["configuration"]["model"];
  m.tokenizer = state.value("job", nlohmann::json::object()).value("tokenizer", nlohmann::json());
  m.seq_length = state.value("seq_length", std::int64_t{4096});
  for (auto const& [name, t] : reader.tensors()) {
    if (optimizer_tensor(name)) continue;
    m.tensors.emplace_back(name, hf::tensor{t.shape, reader.read_whole<float>(name)});
  }
  return m;
}

/// The tokenizer's files a run read (megamoe-train's record of its --tokenizer-* flags).
std::vector<fs::path> tokenizer_files(nlohmann::json const& tokenizer) {
  std::vector<fs::path> files;
  if (!tokenizer.is_object()) return files;
  for (char const* key : {"vocab_file", "merge_file", "model"})
    if (tokenizer.contains(key) && tokenizer[key].is_string() &&
        !tokenizer[key].get<std::string>().empty())
      files.emplace_back(tokenizer[key].get<std::string>());
  return files;
}

int export_hf(boost::mpi::communicator const& world, fs::path const& source, fs::path const& out,
              hf::architecture arch, io::dtype stored, std::uint64_t shard_bytes) {
  auto m = read_model(world, source);
  std::optional<std::int64_t> eos;
  if (m.tokenizer.is_object() && m.tokenizer.contains("eod") && m.tokenizer["eod"].is_number())
    eos = m.tokenizer["eod"].get<std::int64_t>();
  auto const config = hf::config_of(m.model, arch, stored, eos, m.seq_length);
  auto const files = tokenizer_files(m.tokenizer);
  for (auto const& f : files)
    if (!fs::is_regular_file(f))
      throw mm::input_error("the run's tokenizer file " + f.string() +
                            " is gone; put it back there to export it beside the weights");
  auto const tensors = hf::to_hugging_face(m.model, arch, std::move(m.tensors));
  auto written = hf::write_folder(out, config, tensors, stored, shard_bytes);
  for (auto const& f : files) {
    // Hugging Face's loaders look for tokenizer.json, vocab.json / merges.txt and tokenizer.model.
    auto const name = f.filename();
    fs::copy_file(f, out / name);
    written.push_back(out / name);
  }
  std::uint64_t bytes = 0;
  for (auto const& f : written) bytes += fs::file_size(f);
  std::cout << "exported " << tensors.size() << " tensors as " << hf::architecture_class(arch)
            << " (" << io::dtype_name(stored) << ") to " << out.string() << ": " << written.size()
            << " files, " << bytes << " bytes"
            << (files.empty() ? std::string(m.tokenizer.is_object()
                                                ? ", no tokenizer files (the run's " +
                                                      m.tokenizer.value("type", std::string("?")) +
                                                      " has none)"
                                                : ", no tokenizer recorded")
                              : ", with the tokenizer's files")
            << "\n";
  return 0;
}

int import_hf(boost::mpi::communicator const& world, fs::path const& source, fs::path const& dir) {
  auto folder = hf::read_folder(source);
  auto const arch = hf::architecture_of(folder.config);
  auto const imported = hf::from_hugging_face(folder.config, std::move(folder.tensors));
  auto const& model = imported.model;
  auto const& tensors = imported.tensors;
  for (auto const& note : imported.notes) std::cout << "note: " << note << "\n";
  io::checkpoint_writer writer(world, dir, 0);
  for (auto const& [name, t] : tensors) {
    std::int64_t const rows = t.shape.size() == 1 ? 1 : t.shape[0];
    writer.add_whole(name, t.shape, rows, t.shape.back(), t.values.data());
  }
  nlohmann::json const state = {
      {"configuration", {{"model", model}}},
      {"weights_only", true},
      {"imported_configuration", true},
      {"imported_from",
       {{"format", "hf"}, {"architecture", hf::architecture_class(arch)}, {"path", source.string()}}}};
  auto const bytes = writer.commit(state);
  std::cout << "imported " << tensors.size() << " tensors of " << hf::architecture_class(arch)
            << " from " << source.string() << " to " << (dir / io::iteration_folder(0)).string()
            << " (" << bytes << " bytes, weights only: load with --finetune)\n"
            << "the configuration it needs (the loading type must agree on every field):\n"
            << model.dump() << "\n";
  for (char const* name : {"tokenizer.json", "tokenizer.model"})
    if (fs::is_regular_file(source / name))
      std::cout << "its tokenizer: --tokenizer-type "
                << (std::string(name) == "tokenizer.json" ? "HuggingFaceTokenizer"
                                                          : "SentencePieceTokenizer")
                << " --tokenizer-model " << (source / name).string() << "\n";
  if (fs::is_regular_file(source / "vocab.json") && fs::is_regular_file(source / "merges.txt"))
    std::cout << "its tokenizer: --tokenizer-type GPT2BPETokenizer --vocab-file "
              << (source / "vocab.json").string() << " --merge-file "
              << (source / "merges.txt").string() << "\n";
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
    auto* export_cmd = app.add_subcommand(
        "export", "one safetensors file, every tensor whole (or a Hugging Face folder)");
    export_cmd
        ->add_option("DIR", dir, "checkpoint folder (with --format hf also a model.safetensors)")
        ->required();
    export_cmd
        ->add_option("FILE", file, "safetensors file to write (with --format hf a new folder)")
        ->required();
    export_cmd->add_flag("--optimizer", optimizer, "with Adam's moments and the training state");
    std::string format = "megamoe", arch, dtype = "f32";
    std::uint64_t shard_bytes = 5'000'000'000;
    export_cmd
        ->add_option("--format", format,
                     "megamoe (one safetensors file) or hf (a Hugging Face folder: SRC a "
                     "checkpoint or model.safetensors, OUT a new folder)")
        ->check(CLI::IsMember({"megamoe", "hf"}))
        ->capture_default_str();
    export_cmd->add_option("--arch", arch, "with --format hf: mixtral | qwen3_moe | deepseek_v3")
        ->check(CLI::IsMember({"mixtral", "qwen3_moe", "deepseek_v3"}));
    export_cmd->add_option("--dtype", dtype, "with --format hf: the weights' dtype, f32 | bf16")
        ->check(CLI::IsMember({"f32", "bf16"}))
        ->capture_default_str();
    export_cmd
        ->add_option("--max-shard-size", shard_bytes,
                     "with --format hf: bytes per safetensors file before the next one starts")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    auto* import_cmd = app.add_subcommand(
        "import", "a safetensors file (or a Hugging Face folder) to a checkpoint");
    import_cmd->add_option("FILE", file, "safetensors file (a Hugging Face folder with --format hf)")
        ->required();
    import_cmd
        ->add_option("--format", format, "megamoe (one safetensors file) or hf (a Hugging Face folder)")
        ->check(CLI::IsMember({"megamoe", "hf"}))
        ->capture_default_str();
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
    if (*export_cmd && format == "hf") {
      if (arch.empty()) throw mm::input_error("export --format hf needs --arch");
      if (optimizer) throw mm::input_error("export --format hf writes the model only (no --optimizer)");
      return export_hf(world, dir, file, *hf::parse_architecture(arch),
                       dtype == "bf16" ? io::dtype::bf16 : io::dtype::f32, shard_bytes);
    }
    if (*export_cmd) {
      if (!arch.empty() || dtype != "f32")
        throw mm::input_error("--arch and --dtype belong to export --format hf");
      return export_file(world, dir, file, optimizer);
    }
    if (*import_cmd && format == "hf") return import_hf(world, file, dir);
    if (*upcycle_cmd) {
      auto run = [&]<class Config>() {
        return upcycle_file<Config>(world, file, dir, preset, seed);
      };
      return megamoe::presets::with_preset(preset, run);
    }
    return import_file(world, file, dir);
  });
}
