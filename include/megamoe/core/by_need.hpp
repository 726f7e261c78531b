// SPDX-License-Identifier: Apache-2.0
// megamoe/core/by_need.hpp — modules a translation unit includes only when its configuration
// chooses them.
//
// The model's headers name every module a configuration can choose, but a few are only declared
// there: the dispatchers that share MPI-3 windows (dispatch::hierarchical, dispatch::shared_memory),
// the quantizing recipes' operands (every recipe but fp32 and fp64), multi-head latent attention,
// the FP8 wire's sender and the GEMM backend on Eigen's Tensor module. A unit that trains on one
// rank in fp32 parses none of them. The
// header that defines such a module sets its flag here; the model checks the flag where it picks
// the module, so a configuration that chooses it without its header fails to compile with a
// message naming the header to include, not with an incomplete type.
#pragma once

namespace megamoe::by_need {

/// The modules whose headers are included by need.
enum class module {
  hierarchical_dispatcher,  // <megamoe/dispatch/hierarchical.hpp>
  shared_memory_dispatcher,  // <megamoe/dispatch/shared_memory.hpp>
  recipe_operands,          // <megamoe/precision/operands.hpp>
  latent_attention,         // <megamoe/model/mla.hpp>
  fp8_wire,                 // <megamoe/model/moe_wire.hpp>
  tensor_gemm,              // <megamoe/expert/tensor_gemm.hpp> (Eigen's Tensor module)
};

/// True once the header defining module M is included. `Dependent` is any type of the caller's
/// template (its configuration), so the check waits for the point where the module is chosen.
template <module M, class Dependent>
inline constexpr bool included = false;

}  // namespace megamoe::by_need
