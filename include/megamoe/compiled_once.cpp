// SPDX-License-Identifier: Apache-2.0
// megamoe/compiled_once.cpp — every definition of megamoe that depends on no configuration, for
// programs built with MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp): one translation unit
// per program compiles this file, compiled_once_modules.cpp (the modules compiled once per element
// type) and compiled_once_tokenizers.cpp (the tokenizers, on ICU and SentencePiece). The CMake
// target megamoe::megamoe links the static library built from the three; a build without CMake
// compiles them beside its own sources with the same flags.
#if !defined(MEGAMOE_SEPARATE_COMPILATION)
#error "megamoe/compiled_once.cpp is compiled with MEGAMOE_SEPARATE_COMPILATION defined"
#endif

#include <megamoe/core/compiled_once.hpp>

#include <megamoe/config/describe.ipp>
#include <megamoe/config/resolve.ipp>
#include <megamoe/core/cpu_features.ipp>
#include <megamoe/core/thread_pool.ipp>
#include <megamoe/data/blended_dataset.ipp>
#include <megamoe/data/dataset_builder.ipp>
#include <megamoe/data/gpt_dataset.ipp>
#include <megamoe/data/indexed_dataset.ipp>
#include <megamoe/dispatch/exchange_window.ipp>
#include <megamoe/dispatch/expert_chunks.ipp>
#include <megamoe/dispatch/groups.ipp>
#include <megamoe/dispatch/nodes.ipp>
#include <megamoe/dispatch/token_rows.ipp>
#include <megamoe/expert/backends.ipp>
#include <megamoe/expert/tile_gemm.ipp>
#include <megamoe/io/checkpoint_index.ipp>
#include <megamoe/io/checkpoint_reader.ipp>
#include <megamoe/io/checkpoint_writer.ipp>
#include <megamoe/io/files.ipp>
#include <megamoe/io/hugging_face.ipp>
#include <megamoe/io/safetensors.ipp>
#include <megamoe/io/whole_tensors.ipp>
#include <megamoe/model/context.ipp>
#include <megamoe/model/flash_attention.ipp>
#include <megamoe/model/model_values.ipp>
#include <megamoe/model/parameter_layout.ipp>
#include <megamoe/model/sequence_parallel.ipp>
#include <megamoe/optim/adamw.ipp>
#include <megamoe/parallel/collectives.ipp>
#include <megamoe/parallel/environment.ipp>
#include <megamoe/parallel/layout.ipp>
#include <megamoe/parallel/pipeline_schedule.ipp>
#include <megamoe/parallel/process_groups.ipp>
#include <megamoe/parallel/progress.ipp>
#include <megamoe/parallel/rank_generator.ipp>
#include <megamoe/parallel/shared_window.ipp>
#include <megamoe/parallel/threads.ipp>
#include <megamoe/parallel/traffic.ipp>
#include <megamoe/parallel/wait_clock.ipp>
#include <megamoe/parallel/watchdog.ipp>
#include <megamoe/router/megatron_config.ipp>
#include <megamoe/train/async_save.ipp>
#include <megamoe/train/command_line.ipp>
#include <megamoe/train/token_data.ipp>
#include <megamoe/train/export.ipp>
#include <megamoe/train/job_options.ipp>
#include <megamoe/train/progress.ipp>
#include <megamoe/train/report.ipp>
#include <megamoe/train/resume.ipp>
#include <megamoe/train/faults.ipp>
#include <megamoe/train/signals.ipp>
#include <megamoe/train/stragglers.ipp>
#include <megamoe/train/supervisor.ipp>
#include <megamoe/train/training_state.ipp>
#include <megamoe/train/upcycle.ipp>
