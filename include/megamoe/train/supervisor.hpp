// SPDX-License-Identifier: Apache-2.0
// megamoe/train/supervisor.hpp — what megamoe-run decides between launches of a training job:
// the ranks it may use (a hostfile, read again before every launch, so a node taken out of it is
// not used again), the layout on those ranks (one the user listed for that count, or the job's
// own degrees where they still divide it), the flags of a relaunch (--load of the job's --save
// folder once it holds a checkpoint) and the launcher's command (mpiexec or srun). No process is
// started here: examples/megamoe_run.cpp runs the commands.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe::train::supervisor {

/// One host of a hostfile (Open MPI's syntax: "host [slots=N] [max_slots=M]", '#' comments; a
/// host without slots= counts one slot per line that names it).
struct host_slots {
  std::string host;
  int slots = 1;
};

/// The hosts of a hostfile, in order, each once.
MEGAMOE_DECL std::vector<host_slots> read_hostfile(std::filesystem::path const& path);
[[nodiscard]] MEGAMOE_DECL int total_slots(std::span<host_slots const> hosts);

/// A layout for a count of ranks, as `--layout N:FLAGS` gives it: the flags replace the job's
/// own of the same names on N ranks.
struct layout_choice {
  int ranks = 0;
  std::vector<std::string> flags;
};
/// "N:FLAGS" (FLAGS split on spaces; `--name=value` or `--name value`).
MEGAMOE_DECL layout_choice parse_layout(std::string_view text);

/// The value of option `names` (aliases, e.g. {"--ep", "--expert-model-parallel-size"}) in a
/// program's flags, given as `--name value` or `--name=value`; the last one given wins.
MEGAMOE_DECL std::optional<std::string> option_value(std::span<std::string const> flags,
                                                     std::span<std::string_view const> names);
/// `flags` without option `names` (with its value where `takes_value`).
MEGAMOE_DECL std::vector<std::string> without_option(std::span<std::string const> flags,
                                                     std::span<std::string_view const> names,
                                                     bool takes_value);
/// `flags` with each option of `replacements` (flags as `--layout` gives them) replacing the
/// option of the same name (and its aliases among megamoe-train's degree flags).
MEGAMOE_DECL std::vector<std::string> with_options(std::span<std::string const> flags,
                                                   std::span<std::string const> replacements);

/// The product of the degrees that a world of ranks must divide: {TP x CP x PP, ETP x EP x PP},
/// from megamoe-train's degree flags (1 where not given).
MEGAMOE_DECL std::pair<int, int> degree_products(std::span<std::string const> flags);

/// The layout of the next launch: `wanted` ranks with the job's flags where `available` holds
/// them; otherwise, with at least `min_ranks` (0: no fewer than `wanted`), the largest count a
/// listed layout names that fits, else the largest count the job's degrees divide. nullopt when
/// none fits.
MEGAMOE_DECL std::optional<layout_choice> choose_layout(int wanted, int available, int min_ranks,
                                                        std::span<layout_choice const> listed,
                                                        std::span<std::string const> flags);

/// The iteration `save` holds (its tracker, latest_checkpointed_iteration.txt), if any.
MEGAMOE_DECL std::optional<int> saved_iteration(std::filesystem::path const& save);

/// The flags of a launch: the job's, with the layout's replacements, --exit-signal-handler (so
/// that a SIGUSR1 forwarded by the launcher saves and stops the job), and, where the job's --save
/// folder holds a checkpoint, --load of it in place of the job's own --load, --finetune and
/// --no-load-optim (a restart continues the run it saved).
MEGAMOE_DECL std::vector<std::string> launch_flags(std::span<std::string const> flags,
                                                   layout_choice const& layout, bool resume);

/// How the ranks start.
struct launcher {
  std::string program = "mpiexec";  // mpiexec, or srun (--launcher srun)
  std::vector<std::string> args;    // the launcher's own flags (--launcher-args)
  std::string hostfile;             // mpiexec --hostfile
};
/// The command line of a launch of `program` with `flags` on `ranks` ranks.
MEGAMOE_DECL std::vector<std::string> launch_command(launcher const& l, int ranks,
                                                     std::string const& program,
                                                     std::span<std::string const> flags);

}  // namespace megamoe::train::supervisor

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/supervisor.ipp>
#endif
