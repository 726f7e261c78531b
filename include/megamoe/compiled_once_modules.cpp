// SPDX-License-Identifier: Apache-2.0
// megamoe/compiled_once_modules.cpp — the modules that depend only on their element type (norms,
// embedding, output layer, attention, the experts' FFN, the all-to-all dispatcher, the gradient
// reduction, the stashes of router and experts), compiled once for float and double for programs
// built with MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp); each header declares its
// instances `extern template`. A unit apart from compiled_once.cpp, so the two build in parallel
// and neither needs the memory of both.
#if !defined(MEGAMOE_SEPARATE_COMPILATION)
#error "megamoe/compiled_once_modules.cpp is compiled with MEGAMOE_SEPARATE_COMPILATION defined"
#endif

#include <megamoe/core/compiled_once.hpp>

#include <megamoe/dispatch/all_to_all.ipp>
#include <megamoe/expert/mlp.ipp>
#include <megamoe/model/attention.ipp>
#include <megamoe/model/attention_core.ipp>
#include <megamoe/model/embedding.ipp>
#include <megamoe/model/lm_head.ipp>
#include <megamoe/model/moe_experts.ipp>
#include <megamoe/model/norm.ipp>
#include <megamoe/parallel/gradients.ipp>
#include <megamoe/router/router.ipp>
