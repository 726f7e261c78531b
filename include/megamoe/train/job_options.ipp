// SPDX-License-Identifier: Apache-2.0
// megamoe/train/job_options.ipp — the definitions behind job_options.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/job_options.hpp>

#include <megamoe/data/preprocess.hpp>
#include <megamoe/parallel/environment.hpp>

#include <limits>

namespace megamoe::train {

MEGAMOE_DECL std::vector<int> layers_in_bf16(int layers, std::array<int, 2> bf16_layers) {
  std::vector<int> out;
  for (int i = 0; i < layers; ++i)
    if (i < bf16_layers[0] || i >= layers - bf16_layers[1]) out.push_back(i);
  return out;
}

MEGAMOE_DECL nlohmann::json quantized_modules(config_values const& v, std::string const& precision,
                                              std::array<int, 2> bf16_layers,
                                              bool quantized_weights) {
  nlohmann::json quantized = nlohmann::json::array(), codes = nlohmann::json::array();
  auto const kept = layers_in_bf16(v.model.layers, bf16_layers);
  auto add = [&](std::string const& module, bool as_codes) {
    quantized.push_back(module);
    if (quantized_weights && as_codes) codes.push_back(module);
  };
  if (precision != "fp32")
    for (int i = 0; i < v.model.layers; ++i) {
      if (std::ranges::find(kept, i) != kept.end()) continue;
      std::string const layer = "decoder.layers." + std::to_string(i);
      add(layer + ".self_attention.linear_qkv", true);
      add(layer + ".self_attention.linear_proj", true);
      if (v.model.is_moe(i)) {
        add(layer + ".mlp.experts", true);
        if (v.shape.shared_ffn > 0) add(layer + ".mlp.shared_experts", false);
      } else {
        add(layer + ".mlp.linear_fc1", true);
        add(layer + ".mlp.linear_fc2", true);
      }
    }
  return {{"precision", precision},
          {"quantized", quantized},
          {"weights_as_codes", codes},
          {"bf16_layers", kept},
          {"higher_precision",
           {"embedding", "router", "norms", "attention softmax", "output_layer", "loss"}}};
}

MEGAMOE_DECL parallel::degrees job_degrees(int world_size, job_options const& o, int experts) {
  parallel::degrees d;
  d.tp = o.tp;
  d.cp = o.cp;
  d.pp = o.pp;
  d.etp = o.etp > 0 ? o.etp : o.tp;
  int const per_stage = o.pp > 0 && world_size % o.pp == 0 ? world_size / o.pp : world_size;
  int const grid = d.etp > 0 && per_stage % d.etp == 0 ? per_stage / d.etp : per_stage;
  d.ep = o.ep > 0 ? o.ep : (experts == 1 ? 1 : grid);
  return d;
}

MEGAMOE_DECL startup_values job_values(parallel::degrees const& d, int world_size,
                                       job_options const& o, int vocabulary,
                                       std::int64_t tokenizer_vocabulary) {
  startup_values v{
      .tp = d.tp, .cp = d.cp, .pp = d.pp, .etp = d.etp, .ep = d.ep, .world_size = world_size};
  if (o.vpp > 0) v.vpp = o.vpp;
  if (o.first_stage_layers >= 0) v.first_stage_layers = o.first_stage_layers;
  if (o.last_stage_layers >= 0) v.last_stage_layers = o.last_stage_layers;
  v.pipeline_layout = o.pipeline_layout;
  if (vocabulary == dynamic) {
    if (tokenizer_vocabulary > std::numeric_limits<int>::max())
      throw o.error("the tokenizer's vocabulary of " + std::to_string(tokenizer_vocabulary) +
                    " is too large");
    v.vocabulary = static_cast<int>(tokenizer_vocabulary);
  } else if (vocabulary < tokenizer_vocabulary) {
    throw o.error("the configuration's vocabulary of " + std::to_string(vocabulary) +
                  " is smaller than the tokenizer's " + std::to_string(tokenizer_vocabulary) +
                  " (" + o.dataset.tokenizer.type + ")");
  }
  if (o.vocab_multiple != 0) {
    if (o.vocab_multiple < 1) throw o.error("--make-vocab-size-divisible-by must be positive");
    v.vocab_multiple = o.vocab_multiple;
  }
  if (o.bf16_layers[0] > 0 || o.bf16_layers[1] > 0) {
    v.bf16_layers_at_start = o.bf16_layers[0];
    v.bf16_layers_at_end = o.bf16_layers[1];
  }
  return v;
}

}  // namespace megamoe::train

namespace megamoe::train {

MEGAMOE_DECL auto job_options::error(std::string const& text) const -> input_error {
  return input_error(program + ": " + text);
}

MEGAMOE_DECL token_data job_data(boost::mpi::communicator const& world, job_options const& o,
                                 std::int64_t global_batch) {
  data::tokenizer tokenizer;
  parallel::check_on_every_rank(world,
                                [&] { tokenizer = data::make_tokenizer(o.dataset.tokenizer); });
  data_options d = o.dataset;
  bool const from_text = d.data_path.empty() &&
                         std::ranges::all_of(d.split_path, [](auto const& p) { return p.empty(); });
  if (from_text) {
    auto const prefix = std::filesystem::path(o.out) / "data" / "corpus";
    parallel::check_on_every_rank(world, [&] {
      if (world.rank() != 0) return;
      std::error_code error;
      if (!std::filesystem::exists(o.data, error))
        throw o.error("--data " + o.data + " does not exist");
      std::filesystem::create_directories(prefix.parent_path());
      data::preprocess_options p;
      p.inputs = {std::filesystem::path(o.data)};
      p.format = data::text_format::text;
      p.output_prefix = prefix;
      p.append_eod = true;
      if (data::preprocess(tokenizer, p).documents == 0)
        throw o.error("--data " + o.data + " holds no text");
    });
    d.data_path = {prefix.string() + "_text_document"};
  }
  auto sizes = data::requested_samples(o.steps, global_batch, eval_interval_of(o), o.eval_iters);
  sizes[2] = 0;  // the job never tests
  if (o.eval_iters == 0) sizes[1] = 0;
  if (!o.logits_out.empty())  // --logits-out's windows are the first valid samples
    sizes[1] = std::max<std::int64_t>(sizes[1].value_or(0), o.logits_samples);
  std::optional<token_data> out;
  auto const seed = static_cast<std::uint32_t>(o.seed);
  if (!d.cache.empty())  // rank 0 writes the cache's files, then the others map them
    parallel::check_on_every_rank(world, [&] {
      if (world.rank() == 0) out.emplace(d, tokenizer, o.seq_len, seed, sizes);
    });
  parallel::check_on_every_rank(world, [&] {
    if (!out) out.emplace(d, std::move(tokenizer), o.seq_len, seed, sizes);
  });
  return std::move(*out);
}

}  // namespace megamoe::train
