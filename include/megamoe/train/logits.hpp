// SPDX-License-Identifier: Apache-2.0
// megamoe/train/logits.hpp — the logits a trained model gives on held-out windows, written for
// another implementation to compare with (a converted model's forward, tests/hf/hf_forward.py).
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/io/safetensors.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/router/output.hpp>
#include <megamoe/train/token_data.hpp>

#include <boost/mpi/collectives/broadcast.hpp>
#include <boost/mpi/communicator.hpp>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace megamoe::train {

/// Writes to `path` (rank 0; every rank of `world` calls it) the first `samples` valid samples'
/// input tokens, I32 [samples, S], and the model's logits at every position over the tokenizer's
/// vocabulary (the padding left out), F32 [samples, S, V], each window run alone through every
/// pipeline stage as an evaluation forward.
template <class Trainer>
void write_logits(boost::mpi::communicator const& world, context& ctx, Trainer& trainer,
                  std::filesystem::path const& path, int samples) {
  auto& model = trainer.model();
  auto const& data = trainer.data();
  if (!data.has_valid())
    throw input_error("--logits-out needs a valid split (its windows are the first valid samples)");
  int const seq = data.seq_length();
  auto const vocabulary = static_cast<std::int64_t>(data.vocab_size());
  // Under CP and TP the window is padded at its end to whole chunks and sequence-parallel parts;
  // causal attention and dropless routing keep the padding from the positions before it.
  int const cp = model.context_parallel();
  int const multiple = (cp > 1 ? 2 * cp : 1) * model.tensor_parallel();
  int const padded = (seq + multiple - 1) / multiple * multiple;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(seq)), targets(tokens.size());
  std::vector<std::int32_t> window(static_cast<std::size_t>(padded), 0), all_tokens;
  std::vector<float> all_logits;
  std::vector<double> logits;
  int const last_chunk = model.pipeline().vpp() - 1;
  ctx.step.mode = router::pass::eval;
  for (int i = 0; i < samples; ++i) {
    data.valid_sample(i, 1, 0, tokens, targets);
    std::copy(tokens.begin(), tokens.end(), window.begin());
    trainer.pipeline().run_forward_only(ctx, window, {}, padded, 1);
    all_tokens.insert(all_tokens.end(), tokens.begin(), tokens.end());
    for (int position = 0; position < seq; ++position) {
      logits.assign(static_cast<std::size_t>(model.values().model.vocabulary), 0.0);
      if (model.chunk_has_head(last_chunk)) logits = model.logits_at(position, 0);
      if (model.pipelined())
        boost::mpi::broadcast(trainer.groups()->pp(), logits.data(),
                              static_cast<int>(logits.size()), model.pipeline().pp() - 1);
      all_logits.insert(all_logits.end(), logits.begin(), logits.begin() + vocabulary);
    }
  }
  ctx.step.mode = router::pass::training;
  if (world.rank() != 0) return;
  io::write_safetensors(
      path,
      std::vector<io::tensor_bytes>{
          {"tokens", io::dtype::i32, {samples, seq}, std::as_bytes(std::span(all_tokens))},
          {"logits", io::dtype::f32, {samples, seq, vocabulary}, std::as_bytes(std::span(all_logits))}},
      {{"format", "pt"}, {"producer", "megamoe-train --logits-out"}});
}

}  // namespace megamoe::train
