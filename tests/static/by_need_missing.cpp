// SPDX-License-Identifier: Apache-2.0
// Configurations that choose a module included by need (core/by_need.hpp) without its header:
// each must fail to compile with the message naming that header (tests/static/
// check_by_need.cmake requires every one). The same choices compile where the headers are
// included (static/moe_static.cpp, model/modules_test.cpp, expert/backends_test.cpp).
#include <megamoe/config/config.hpp>
#include <megamoe/model/decoder_block.hpp>
#include <megamoe/model/moe_layer.hpp>
#include <megamoe/model/moe_types.hpp>

namespace mm = megamoe;
namespace md = megamoe::dispatch;
namespace mo = megamoe::model;

namespace {

using shape = mm::shape<mm::hidden<16>, mm::ffn<24>, mm::experts<8>>;
template <class... Policies>
using config = mm::make_config<shape, Policies...>;

// The dispatchers on MPI-3 windows.
using hierarchical = mm::moe_types<config<md::hierarchical<>>>::dispatcher_type;
using shared_memory = mm::moe_types<config<md::shared_memory>>::dispatcher_type;
// A quantizing recipe's operands.
using mxfp8 = mm::moe_types<config<mm::precision::mxfp8>>::routed_operands;
// The GEMM backend on Eigen's Tensor module.
using tensor = mm::moe_types<
    config<mm::expert::mlp<mm::expert::swiglu, mm::expert::tensor_contraction>>>::backend;
// Multi-head latent attention.
using latent_config =
    config<mo::decoder<mo::heads<4>, mo::multi_latent_attention<0, 8, 8, 4, 8>>>;
using latent =
    mm::decoder_layers<latent_config>::modules<latent_config>::attention_type;
// The FP8 wire's sender.
constexpr bool wire =
    mm::moe_layer<config<md::fp8_wire<>, mm::precision::fp8_tensorwise<mm::precision::current>>>::
        fp8_wire;

}  // namespace
