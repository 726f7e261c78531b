// SPDX-License-Identifier: Apache-2.0
// A unit that trains on one rank in fp32 (examples/my_moe.cpp's includes) parses none of the
// modules included by need (core/by_need.hpp): not the dispatchers on MPI-3 windows, a
// quantizing recipe's operands, multi-head latent attention, the FP8 wire's sender, nor Eigen's
// Tensor module. If it compiles, it passes.
#include <megamoe/config/config.hpp>
#include <megamoe/config/describe.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/train/trainer.hpp>

namespace {

namespace bn = megamoe::by_need;
static_assert(!bn::included<bn::module::hierarchical_dispatcher, void>);
static_assert(!bn::included<bn::module::shared_memory_dispatcher, void>);
static_assert(!bn::included<bn::module::recipe_operands, void>);
static_assert(!bn::included<bn::module::latent_attention, void>);
static_assert(!bn::included<bn::module::fp8_wire, void>);
static_assert(!bn::included<bn::module::tensor_gemm, void>);
#ifdef EIGEN_CXX11_TENSOR_TENSOR_H
#error "a one-rank fp32 unit includes Eigen's Tensor module"
#endif

}  // namespace
