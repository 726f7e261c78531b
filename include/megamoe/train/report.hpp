// SPDX-License-Identifier: Apache-2.0
// megamoe/train/report.hpp — one SVG picture of a training run: the loss curves (training loss and
// held-out loss in bits per byte, the unigram baseline dashed) and, per MoE layer, a heat map of
// each expert's share of the routed tokens over the steps.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace megamoe::train {

struct training_history {
  std::vector<double> train_bpb;                    // per step
  std::vector<std::pair<int, double>> heldout_bpb;  // (step, bits per byte)
  double unigram_bpb = 0.0;
  // [MoE layer][kept step][expert] share of tokens: steps 1, 1 + load_stride, 1 + 2 load_stride...
  std::vector<std::vector<std::vector<double>>> load;
  int load_stride = 1;

  /// Whether step `step`'s loads are kept.
  [[nodiscard]] bool keeps_load(int step) const noexcept { return (step - 1) % load_stride == 0; }
  /// After a kept step: past 600 kept steps every other one goes and the stride doubles, so that
  /// the heat maps' 300 columns stay evenly spread and a long job's history stays small.
  void thin_load() {
    if (load.empty() || load.front().size() < 600) return;
    for (auto& rows : load) {
      std::size_t kept = 0;
      for (std::size_t i = 2; i < rows.size(); i += 2) rows[++kept] = std::move(rows[i]);
      ++kept;  // row 0 stays where it is
      rows.resize(kept);
    }
    load_stride *= 2;
  }
};

MEGAMOE_DECL void write_svg(std::filesystem::path const& path, training_history const& h);

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/report.ipp>
#endif
