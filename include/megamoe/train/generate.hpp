// SPDX-License-Identifier: Apache-2.0
// megamoe/train/generate.hpp — a sample from a trained byte-level model: the prompt continued
// byte by byte through every pipeline stage, the same on every rank.
#pragma once

#include <megamoe/core/random.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/router/output.hpp>

#include <Eigen/Core>
#include <boost/mpi/collectives/broadcast.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace megamoe::train {

/// Continues `prompt` by sampling `length` bytes (temperature 0.8) from the model `trainer`
/// trains, over windows of at most `window` bytes; every rank returns the same text.
template <class Trainer>
std::string generate(context& ctx, Trainer& trainer, std::string const& prompt, int length,
                     int window, std::uint64_t seed) {
  auto& model = trainer.model();
  std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
  ctx.step.mode = router::pass::eval;
  std::string out = prompt;
  // Under CP and TP the window is padded at its end to whole chunks and sequence-parallel parts:
  // causal attention and dropless routing keep the padding from the logits of position n - 1.
  int const cp = model.context_parallel();
  int const multiple = (cp > 1 ? 2 * cp : 1) * model.tensor_parallel();
  int const vocabulary = model.values().model.vocabulary;
  std::vector<std::int32_t> context;
  for (int i = 0; i < length; ++i) {
    int const n = std::min<int>(static_cast<int>(tokens.size()), window);
    int const padded = (n + multiple - 1) / multiple * multiple;
    context.assign(tokens.end() - n, tokens.end());
    context.resize(static_cast<std::size_t>(padded), 0);
    // Through the pipeline's stages; the last one's logits to every stage.
    trainer.pipeline().run_forward_only(ctx, context, {}, padded, 1);
    std::vector<double> logits(static_cast<std::size_t>(vocabulary));
    int const last_chunk = model.pipeline().vpp() - 1;
    if (model.chunk_has_head(last_chunk)) logits = model.logits_at(n - 1, 0);
    if (model.pipelined())
      boost::mpi::broadcast(trainer.groups()->pp(), logits.data(), static_cast<int>(logits.size()),
                            model.pipeline().pp() - 1);
    Eigen::RowVectorXd const last = Eigen::Map<Eigen::RowVectorXd const>(
                                        logits.data(), static_cast<Eigen::Index>(logits.size())) /
                                    0.8;
    Eigen::RowVectorXd const p = (last.array() - last.maxCoeff()).exp();
    double u = uniform_open01(splitmix64(seed) ^ static_cast<std::uint64_t>(i)) * p.sum();
    int next = 0;
    while (next < vocabulary - 1 && (u -= p(next)) > 0) ++next;
    tokens.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  ctx.step.mode = router::pass::training;
  return out;
}

}  // namespace megamoe::train
