// SPDX-License-Identifier: Apache-2.0
// megamoe/train/command_line.hpp — a training job's command line: every flag of megamoe-train in
// groups (model and data, parallelism, precision, checkpoints, output), the reference's long names
// beside megamoe's, --version, help and parse errors printed once under mpiexec, a warning for a
// flag that depends on one not given, and the reference's precision and optimizer flags resolved
// into job_options' recipe, moments, BF16 layers and weight codes.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/train/job_options.hpp>

#include <boost/mpi/communicator.hpp>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace megamoe::train {

/// Option groups of the help, in the order it shows them.
namespace option_group {
inline constexpr char const* model = "Model and data";
inline constexpr char const* parallelism = "Parallelism";
inline constexpr char const* precision = "Precision";
inline constexpr char const* checkpoints = "Checkpoints";
inline constexpr char const* output = "Output";
inline constexpr char const* checks = "Step checks";
}  // namespace option_group

/// The dtype of Adam's moments the precision-aware optimizer's flags name; as the reference, a
/// dtype other than fp32 needs --use-precision-aware-optimizer.
MEGAMOE_DECL std::string moments_from_flags(job_options const& o);

/// The recipe the reference's flags name (--bf16, --fp8-format with --fp8-recipe, --fp4-format
/// with --fp4-recipe), checked against --precision where both are given; empty where none is.
MEGAMOE_DECL std::string precision_from_reference_flags(job_options const& o);

/// The layers kept in BF16 at the start and end: --first-last-layers-bf16, on by default for
/// nvfp4, with the reference's counts; none otherwise. A count without the flag would do
/// nothing, so it is an error.
MEGAMOE_DECL std::array<int, 2> bf16_layers_from_flags(job_options const& o);

/// Whether the linear weights are held as the recipe's codes: --fp8-param-gather under an FP8
/// recipe, --fp4-param-gather under nvfp4 (the reference's flags; R030 where the recipe keeps no
/// codes).
MEGAMOE_DECL bool quantized_weights_from_flags(job_options const& o);

/// The command line of a training job over `options`: construct (with the names of the models
/// the program builds, for --preset, where it builds more than one), add the program's own
/// options to app() where it has any, then parse().
class command_line {
 public:
  command_line(std::string const& description, job_options& o,
               std::vector<std::string> const& presets = {}, std::string const& preset_help = {});
  ~command_line();
  command_line(command_line const&) = delete;
  command_line& operator=(command_line const&) = delete;

  /// The parser itself (CLI11's), for a program's own options; <CLI/CLI.hpp> declares it.
  [[nodiscard]] CLI::App& app() noexcept;

  /// Reads argv into the options; help, --version and parse errors are printed by rank 0 alone,
  /// and every rank returns the same exit code. Otherwise (nullopt) the flags given are noted,
  /// the reference's precision and optimizer flags resolved (agreed over `world`), and a flag
  /// that depends on one not given is warned about once.
  std::optional<int> parse(boost::mpi::communicator const& world, int argc, char** argv);

 private:
  void add_model_options();
  void add_parallel_options();
  void add_precision_options();
  void add_checkpoint_options();
  void add_output_options();

  std::unique_ptr<CLI::App> app_;
  job_options& o_;
};

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/command_line.ipp>
#endif
