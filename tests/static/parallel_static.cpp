// SPDX-License-Identifier: Apache-2.0
// Static tests of the dispatcher resolution and the parallel layout's compile-time pieces.
#include <megamoe/config/config.hpp>
#include <megamoe/parallel/layout.hpp>

namespace {
namespace mm = megamoe;
using mm::dispatch::dispatcher;

// auto_ becomes local on one expert rank and all_to_all otherwise; explicit choices stay.
static_assert(mm::dispatch::resolve(dispatcher::auto_, 1, 1) == dispatcher::local);
static_assert(mm::dispatch::resolve(dispatcher::auto_, 2, 1) == dispatcher::all_to_all);
static_assert(mm::dispatch::resolve(dispatcher::auto_, 1, 2) == dispatcher::all_to_all);
static_assert(mm::dispatch::resolve(dispatcher::all_gather, 4, 1) == dispatcher::all_gather);

// The group types of both grids, in the reference's order.
static_assert(mm::parallel::decoder_group_types.size() == 9);
static_assert(mm::parallel::expert_group_types.size() == 6);
static_assert(mm::parallel::decoder_group_types[3] == "dp-cp");
static_assert(mm::parallel::expert_group_types[2] == "tp-ep");
static_assert(mm::parallel::default_order == "tp-cp-ep-dp-pp");

// World-size rules hold vacuously until the world size is known.
static_assert(mm::rules::world_fits_attention_grid(mm::parallel::degrees{4, 1, 1, 1, 1},
                                                   std::nullopt));
static_assert(!mm::rules::world_fits_attention_grid(mm::parallel::degrees{4, 1, 1, 1, 1}, 6));
static_assert(!mm::rules::world_fits_expert_grid(mm::parallel::degrees{1, 1, 1, 2, 4}, 4));
static_assert(mm::rules::world_fits_expert_grid(mm::parallel::degrees{1, 1, 1, 2, 4}, 16));
}  // namespace
