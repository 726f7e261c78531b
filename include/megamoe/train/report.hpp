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
  std::vector<std::vector<std::vector<double>>> load;  // [MoE layer][step][expert] share of tokens
};

MEGAMOE_DECL void write_svg(std::filesystem::path const& path, training_history const& h);

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/report.ipp>
#endif
