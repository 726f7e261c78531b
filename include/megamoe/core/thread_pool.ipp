// SPDX-License-Identifier: Apache-2.0
// megamoe/core/thread_pool.ipp — the definitions behind thread_pool.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/core/thread_pool.hpp>

namespace megamoe {

MEGAMOE_DECL thread_pool::thread_pool(int num_threads)
    : pool_(std::max(1, num_threads)) {}

MEGAMOE_DECL thread_pool::~thread_pool() = default;

}  // namespace megamoe
