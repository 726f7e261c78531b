// SPDX-License-Identifier: Apache-2.0
// megamoe/train/progress.hpp — what a training job tells while it runs: one JSON line per step in
// metrics.jsonl (a resumed run keeps the lines before it and rebuilds the picture's history from
// them), a progress bar on stderr (one line per evaluation when stderr is not a terminal), and the
// step profile of --profile (the share of the step each stage took).
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/stage_times.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/train/report.hpp>
#include <megamoe/train/trainer.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace megamoe::train {

/// Each expert's share of a layer's tokens (0 where no token was routed).
MEGAMOE_DECL std::vector<double> load_shares(std::vector<double> const& counts);

/// Seconds as minutes and seconds, "1m05s".
MEGAMOE_DECL std::string duration(double seconds);

/// metrics.jsonl, written by one rank (`writes`). A resumed run (`first_step` above 1) keeps the
/// lines of the steps before `first_step` (a killed run may have written more) and adds their
/// losses and loads to `history`.
class metrics_log {
 public:
  metrics_log(bool writes, std::filesystem::path const& path, int first_step,
              training_history& history);

  void write(nlohmann::ordered_json const& line);

 private:
  std::ofstream out_;
};

/// A step's line of metrics.jsonl (train_bpb: the loss per byte at the data's `bytes_per_token`);
/// its expert loads go into `history` too.
MEGAMOE_DECL nlohmann::ordered_json step_line(int step, step_metrics const& m,
                                              double flops_per_token, bool pipelined, bool has_mtp,
                                              double bytes_per_token, training_history& history);

/// The progress bar on stderr: redrawn in place on a terminal; elsewhere (a log file) one line
/// per evaluation.
class progress_bar {
 public:
  explicit progress_bar(int steps) : steps_(steps), terminal_(isatty(fileno(stderr)) != 0) {}

  /// Step `step`'s training bits per byte and the run's tokens/s so far; `heldout` where the
  /// step evaluated (with the MTP depths' bits per byte where the model has them).
  void show(int step, double bpb, double tokens_per_s, double elapsed,
            std::optional<double> heldout, double unigram, std::optional<double> heldout_mtp) const;

 private:
  int steps_;
  bool terminal_;
};

/// Seconds per stage over the steps run (this rank's): the stages outside the MoE layers and the
/// MoE layers' own.
struct step_profile {
  std::array<double, static_cast<std::size_t>(layer_stage::count)> moe_seconds{};
  std::array<double, static_cast<std::size_t>(step_stage::count)> step_seconds{};

  void add(context const& ctx);

  /// Each stage's share of `elapsed` seconds, the rest's, and the seconds per step.
  [[nodiscard]] nlohmann::ordered_json shares(double elapsed, int steps) const;
};

/// The profile as one line on stderr.
MEGAMOE_DECL void print_profile(std::string const& program, nlohmann::ordered_json const& profile);

/// The traffic estimate as one line on stderr.
MEGAMOE_DECL void print_traffic(std::string const& program, nlohmann::ordered_json const& traffic);

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/progress.ipp>
#endif
