// SPDX-License-Identifier: Apache-2.0
// megamoe/io/hugging_face.hpp — megamoe's whole tensors and model configuration as a Hugging Face
// folder of one of three architectures (Mixtral, Qwen3-MoE, DeepSeek-V3), and back, exactly.
//
// A conversion is a plan made from the model configuration alone: one entry per megamoe tensor
// (the reference's names and shapes, as checkpoints and model.safetensors hold them) naming the
// architecture's tensors it becomes. Three forms occur:
//   whole          one tensor under another name (norms, embeddings, routers, projections);
//   halves         linear_fc1's rows [gate; up] become gate_proj and up_proj (Mixtral: w1, w3);
//   query_groups   linear_qkv's rows, G blocks of [P query heads | key head | value head] of d
//                  rows each, become q_proj (the heads in order), k_proj and v_proj.
// DeepSeek-V3's multi-token prediction layers hold the embedding and the output layer again
// (model.layers.{L+k}.embed_tokens, shared_head.head): an export writes the copies, an import
// requires them equal to the originals, which megamoe holds once.
// No other layout differs: megamoe's attention rotates halves as Mixtral's and Qwen3's do, and its
// MLA de-interleaves the rotated pairs as DeepSeek-V3's rope_interleave does; the vocabulary
// padding never reaches a checkpoint's whole tensors.
//
// What an architecture cannot compute the same way (a router mode, a norm epsilon its code fixes,
// a layer pattern) is refused by name; every tensor on either side is used, or the conversion
// fails naming it.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/io/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace megamoe::io::hugging_face {

enum class architecture { mixtral, qwen3_moe, deepseek_v3 };

/// mixtral, qwen3_moe or deepseek_v3 (megamoe-checkpoint's --arch).
MEGAMOE_DECL std::optional<architecture> parse_architecture(std::string const& name);
MEGAMOE_DECL char const* architecture_name(architecture a) noexcept;
/// The class config.json's "architectures" names: MixtralForCausalLM, ...
MEGAMOE_DECL char const* architecture_class(architecture a) noexcept;

/// A whole fp32 tensor, row-major.
struct tensor {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};
/// Named tensors in the order they are written.
using named_tensors = std::vector<std::pair<std::string, tensor>>;

/// The layer kinds of a model of `layers` layers from megamoe's moe_layer_freq (an integer f:
/// layer i is MoE where i % f == 0; or a list of 0 and 1).
MEGAMOE_DECL std::vector<int> moe_layer_pattern(nlohmann::json const& freq, int layers);

/// config.json for megamoe's model configuration `model` (a checkpoint's configuration "model")
/// as `a`, its weights stored as `stored` (F32 or BF16), `eos` the tokenizer's end of document.
/// Throws input_error naming the option the architecture cannot express.
MEGAMOE_DECL nlohmann::ordered_json config_of(nlohmann::json const& model, architecture a,
                                              dtype stored, std::optional<std::int64_t> eos,
                                              std::int64_t max_positions);

/// The whole tensors (names and the reference's shapes) a megamoe model of `model` holds that `a`
/// has a place for, in the plan's order.
MEGAMOE_DECL std::vector<std::pair<std::string, std::vector<std::int64_t>>> model_tensor_shapes(
    nlohmann::json const& model, architecture a);

/// megamoe's whole tensors of `model` under `a`'s names and shapes, in the order a Hub checkpoint
/// lists them. Optimizer moments and recipe states (fp8 amax histories) are left out; any other
/// tensor without a place, a missing tensor or a shape other than the configuration's throws.
MEGAMOE_DECL named_tensors to_hugging_face(nlohmann::json const& model, architecture a,
                                           named_tensors megamoe);

/// The architecture config.json names (its "architectures", else its "model_type").
MEGAMOE_DECL architecture architecture_of(nlohmann::json const& config);

/// megamoe's model configuration for config.json: every field that decides the weights' shapes
/// and the forward (training-only fields are the loading job's). Throws input_error naming the
/// field megamoe cannot compute as the architecture does.
MEGAMOE_DECL nlohmann::json model_of(nlohmann::json const& config);

/// A Hugging Face model as megamoe's: its configuration's fields (model_of's) and whole tensors.
struct imported_model {
  nlohmann::json model;
  named_tensors tensors;
  std::vector<std::string> notes;  // what the import decided that its caller should say
};

/// The Hugging Face tensors `hf` of `config`'s model as megamoe's whole tensors (reference names
/// and shapes). A DeepSeek-V3 config.json whose prediction layers hold no tensor (transformers
/// saves none) imports without them, noted. Throws input_error naming an unmatched or missing
/// tensor or a shape mismatch.
MEGAMOE_DECL imported_model from_hugging_face(nlohmann::json const& config, named_tensors hf);

/// A Hugging Face model folder read: config.json and every tensor as fp32.
struct folder {
  nlohmann::json config;
  named_tensors tensors;
};

/// Reads `path`: config.json and model.safetensors.index.json's files (or every *.safetensors
/// file there), F32, BF16 or F16. Throws input_error for a missing or malformed file, a tensor in
/// two files or not where the index says, and any other dtype.
MEGAMOE_DECL folder read_folder(std::filesystem::path const& path);

/// Writes `config` and `tensors` (as `stored`: F32, or BF16 rounded to nearest even) to the new or
/// empty folder `path`: model.safetensors, or above `shard_bytes` model-0000i-of-0000n.safetensors
/// with model.safetensors.index.json. Returns the files written.
MEGAMOE_DECL std::vector<std::filesystem::path> write_folder(std::filesystem::path const& path,
                                                             nlohmann::ordered_json const& config,
                                                             named_tensors const& tensors,
                                                             dtype stored,
                                                             std::uint64_t shard_bytes);

}  // namespace megamoe::io::hugging_face

#if MEGAMOE_HEADER_ONLY
#include <megamoe/io/hugging_face.ipp>
#endif
