// SPDX-License-Identifier: Apache-2.0
// megamoe/train/generate.hpp — a sample from a trained model: the prompt, encoded by the training
// data's tokenizer, continued token by token through every pipeline stage, the same on every rank.
#pragma once

#include <megamoe/core/random.hpp>
#include <megamoe/data/tokenizer.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/router/output.hpp>
#include <megamoe/train/token_data.hpp>

#include <Eigen/Core>
#include <boost/mpi/collectives/broadcast.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace megamoe::train {

/// Continues `prompt` by sampling tokens (temperature 0.8) of the data's tokenizer's vocabulary
/// (the padding never) from the model `trainer` trains, over windows of at most `window` tokens,
/// until the text holds `length` bytes more or the end of a document comes; every rank returns the
/// same text.
template <class Trainer>
std::string generate(context& ctx, Trainer& trainer, std::string const& prompt, int length,
                     int window, std::uint64_t seed) {
  auto& model = trainer.model();
  auto const& tokenizer = trainer.data().tokenizer();
  auto const encoded = data::encode(tokenizer, prompt);
  std::vector<std::int32_t> tokens(encoded.begin(), encoded.end());
  std::vector<std::int64_t> generated;
  ctx.step.mode = router::pass::eval;
  std::string out = prompt;
  // Under CP and TP the window is padded at its end to whole chunks and sequence-parallel parts:
  // causal attention and dropless routing keep the padding from the logits of position n - 1.
  int const cp = model.context_parallel();
  int const multiple = (cp > 1 ? 2 * cp : 1) * model.tensor_parallel();
  int const vocabulary = static_cast<int>(
      std::min<std::int64_t>(data::vocab_size(tokenizer), model.values().model.vocabulary));
  auto const eod = trainer.data().end_of_document();
  std::vector<std::int32_t> context;
  std::vector<double> logits;
  if (tokens.empty()) tokens.push_back(0);
  for (int i = 0; i < 4 * length && out.size() < prompt.size() + static_cast<std::size_t>(length);
       ++i) {
    int const n = std::min<int>(static_cast<int>(tokens.size()), window);
    int const padded = (n + multiple - 1) / multiple * multiple;
    context.assign(tokens.end() - n, tokens.end());
    context.resize(static_cast<std::size_t>(padded), 0);
    // Through the pipeline's stages; the last one's logits to every stage.
    trainer.pipeline().run_forward_only(ctx, context, {}, padded, 1);
    logits.assign(static_cast<std::size_t>(model.values().model.vocabulary), 0.0);
    int const last_chunk = model.pipeline().vpp() - 1;
    if (model.chunk_has_head(last_chunk)) logits = model.logits_at(n - 1, 0);
    if (model.pipelined())
      boost::mpi::broadcast(trainer.groups()->pp(), logits.data(), static_cast<int>(logits.size()),
                            model.pipeline().pp() - 1);
    Eigen::RowVectorXd const last =
        Eigen::Map<Eigen::RowVectorXd const>(logits.data(), vocabulary) / 0.8;
    Eigen::RowVectorXd const p = (last.array() - last.maxCoeff()).exp();
    double u = uniform_open01(splitmix64(seed) ^ static_cast<std::uint64_t>(i)) * p.sum();
    int next = 0;
    while (next < vocabulary - 1 && (u -= p(next)) > 0) ++next;
    if (next == eod) break;
    tokens.push_back(next);
    generated.push_back(next);
    out = prompt + data::decode(tokenizer, generated);
  }
  ctx.step.mode = router::pass::training;
  return out;
}

}  // namespace megamoe::train
