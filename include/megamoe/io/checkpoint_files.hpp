// SPDX-License-Identifier: Apache-2.0
// megamoe/io/checkpoint_files.hpp — sharded, self-describing, atomic checkpoints: the index
// format (checkpoint_index.hpp), the writer (checkpoint_writer.hpp), the reader
// (checkpoint_reader.hpp) and the reference's shapes of whole tensors (whole_tensors.hpp), which
// the callers save their tensors under.
//
// A checkpoint of iteration N under ROOT:
//   ROOT/iter_000000N/rank_00000.safetensors ...   each rank's pieces, written in parallel
//   ROOT/iter_000000N/index.json                   every tensor: dtype, shape, its pieces; every
//                                                  file: bytes and CRC-32; the caller's state
//   ROOT/latest_checkpointed_iteration.txt         "N", written last
// Every element of every tensor lies in exactly one piece: the writer checks it before recording
// the checkpoint, the reader before using it.
//
// Collective calls (the writer's commit, the reader's constructor) agree on failure over the
// world: every rank throws the same error, none hangs. read() is local; callers wrap their reads
// in parallel::check_on_every_rank.
#pragma once

#include <megamoe/io/checkpoint_index.hpp>
#include <megamoe/io/checkpoint_reader.hpp>
#include <megamoe/io/checkpoint_writer.hpp>
#include <megamoe/io/whole_tensors.hpp>
