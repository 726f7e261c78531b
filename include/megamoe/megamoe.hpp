// SPDX-License-Identifier: Apache-2.0
// megamoe/megamoe.hpp — everything at once, the modules included by need too (core/by_need.hpp).
// Prefer the narrow headers in your own code: each of them compiles on its own, the light ones
// (config/, */tags.hpp) keep compile-time checks fast, and a unit parses only what it chooses.
#pragma once

#include <megamoe/version.hpp>

#include <megamoe/core/bf16.hpp>
#include <megamoe/core/by_need.hpp>
#include <megamoe/core/buffer.hpp>
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>

#include <megamoe/policy/error.hpp>
#include <megamoe/policy/policy.hpp>
#include <megamoe/policy/rule_ids.hpp>
#include <megamoe/policy/shape.hpp>

#include <megamoe/dispatch/tags.hpp>
#include <megamoe/expert/tags.hpp>
#include <megamoe/memory/tags.hpp>
#include <megamoe/model/tags.hpp>
#include <megamoe/parallel/tags.hpp>
#include <megamoe/precision/tags.hpp>
#include <megamoe/router/tags.hpp>

#include <megamoe/config/concepts.hpp>
#include <megamoe/config/config.hpp>
#include <megamoe/config/describe.hpp>
#include <megamoe/config/resolve.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/config/values.hpp>

#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/gradients.hpp>
#include <megamoe/parallel/layout.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/parallel/progress.hpp>
#include <megamoe/parallel/rank_generator.hpp>
#include <megamoe/parallel/threads.hpp>
#include <megamoe/parallel/watchdog.hpp>

#include <megamoe/router/capacity.hpp>
#include <megamoe/router/expert_bias.hpp>
#include <megamoe/router/gating.hpp>
#include <megamoe/router/groups.hpp>
#include <megamoe/router/losses.hpp>
#include <megamoe/router/megatron_config.hpp>
#include <megamoe/router/output.hpp>
#include <megamoe/router/plan.hpp>
#include <megamoe/router/router.hpp>
#include <megamoe/router/scores.hpp>
#include <megamoe/router/sinkhorn.hpp>
#include <megamoe/router/top_k.hpp>

#include <megamoe/precision/formats.hpp>
#include <megamoe/precision/operands.hpp>
#include <megamoe/precision/quantize.hpp>
#include <megamoe/precision/recipe.hpp>
#include <megamoe/precision/scaling.hpp>

#include <megamoe/expert/activation.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/gemm.hpp>
#include <megamoe/expert/gemm_problem.hpp>
#include <megamoe/expert/mlp.hpp>
#include <megamoe/expert/sgemm_avx512.hpp>
#include <megamoe/expert/tensor_gemm.hpp>
#include <megamoe/expert/tile_gemm.hpp>

#include <megamoe/dispatch/all_gather.hpp>
#include <megamoe/dispatch/all_to_all.hpp>
#include <megamoe/dispatch/dispatcher.hpp>
#include <megamoe/dispatch/groups.hpp>
#include <megamoe/dispatch/hierarchical.hpp>
#include <megamoe/dispatch/local.hpp>
#include <megamoe/dispatch/nodes.hpp>
#include <megamoe/dispatch/permute.hpp>
#include <megamoe/dispatch/shared_memory.hpp>
#include <megamoe/dispatch/token_rows.hpp>

#include <megamoe/model/attention.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/model/counts.hpp>
#include <megamoe/model/dense_mlp.hpp>
#include <megamoe/model/embedding.hpp>
#include <megamoe/model/lm_head.hpp>
#include <megamoe/model/mla.hpp>
#include <megamoe/model/moe_layer.hpp>
#include <megamoe/model/moe_wire.hpp>
#include <megamoe/model/norm.hpp>
#include <megamoe/model/transformer.hpp>

#include <megamoe/optim/adamw.hpp>

#include <megamoe/io/safetensors.hpp>

#include <megamoe/data/blended_dataset.hpp>
#include <megamoe/data/bpe_tokenizer.hpp>
#include <megamoe/data/dataset_builder.hpp>
#include <megamoe/data/gpt_dataset.hpp>
#include <megamoe/data/indexed_dataset.hpp>
#include <megamoe/data/numpy_random.hpp>
#include <megamoe/data/preprocess.hpp>
#include <megamoe/data/pretraining_sampler.hpp>
#include <megamoe/data/sentencepiece_tokenizer.hpp>
#include <megamoe/data/tokenizer.hpp>
#include <megamoe/data/utf8.hpp>

#include <megamoe/train/token_data.hpp>
#include <megamoe/train/report.hpp>
#include <megamoe/train/trainer.hpp>
