// SPDX-License-Identifier: Apache-2.0
// The MoE layer's stage interfaces, checked where they are compiled: every dispatcher is a
// `token_dispatcher` (the overlapped all-to-all too), the expert stage an `expert_stage_of`, the
// builder picks the dispatcher class a policy names, and types that lack a part are rejected.
#include <megamoe/config/config.hpp>
#include <megamoe/dispatch/dispatcher.hpp>
#include <megamoe/dispatch/exchange.hpp>
#include <megamoe/dispatch/hierarchical.hpp>
#include <megamoe/dispatch/shared_memory.hpp>
#include <megamoe/model/moe_experts.hpp>
#include <megamoe/model/moe_types.hpp>
#include <megamoe/model/moe_wire.hpp>
#include <megamoe/precision/operands.hpp>

#include <type_traits>

namespace mm = megamoe;
namespace md = megamoe::dispatch;

namespace {

static_assert(md::token_dispatcher<md::local_dispatcher<float, float>, float, float>);
static_assert(md::token_dispatcher<md::all_gather_dispatcher<double, double>, double, double>);
static_assert(md::token_dispatcher<md::all_to_all_dispatcher<float, float>, float, float>);
static_assert(md::token_dispatcher<md::all_to_all_dispatcher<float, float, true>, float, float>);
static_assert(md::token_dispatcher<md::hierarchical_dispatcher<float, double>, float, double>);
// The probs' type is part of the interface.
static_assert(!md::token_dispatcher<md::local_dispatcher<float, float>, float, double>);

/// A dispatcher without an exchange (only plan and the single moves) is not one.
struct moves_rows_only {
  void plan(mm::thread_pool&, mm::mask_matrix const&, int, std::exception_ptr) {}
  [[nodiscard]] int expert_rows() const { return 0; }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_local_expert() const { return {}; }
  void dispatch(mm::thread_pool&, float const*, float*, mm::row_matrix<float> const&, float*) {}
  [[nodiscard]] std::size_t saved_bytes() const { return 0; }
};
static_assert(!md::token_dispatcher<moves_rows_only, float, float>);

using shape = mm::shape<mm::hidden<16>, mm::ffn<24>, mm::experts<8>>;
template <class... Policies>
using types_of = mm::moe_types<mm::make_config<shape, Policies...>>;

// The builder: auto is local on one rank, all_to_all_overlap the overlapped all-to-all,
// shared_memory_overlap the overlapped shared-memory dispatcher.
static_assert(std::is_same_v<types_of<>::dispatcher_type, md::local_dispatcher<float, float>>);
static_assert(std::is_same_v<types_of<md::all_to_all>::dispatcher_type,
                             md::all_to_all_dispatcher<float, float>>);
static_assert(std::is_same_v<types_of<md::all_to_all_overlap<2>>::dispatcher_type,
                             md::all_to_all_dispatcher<float, float, true>>);
static_assert(std::is_same_v<types_of<md::shared_memory_overlap<2>>::dispatcher_type,
                             md::shared_memory_dispatcher<float, float, true>>);
// fp8_wire: the all-to-all with codes on the forward wire, and the routed operands take them.
using fp8_current = mm::precision::fp8_tensorwise<mm::precision::current>;
static_assert(std::is_same_v<types_of<md::fp8_wire<>, fp8_current>::dispatcher_type,
                             md::all_to_all_dispatcher<float, float, false, true>>);
static_assert(
    std::is_same_v<types_of<md::fp8_wire<md::all_to_all_overlap<2>>, fp8_current>::dispatcher_type,
                   md::all_to_all_dispatcher<float, float, true, true>>);
static_assert(types_of<md::fp8_wire<>, fp8_current>::fp8_wire &&
              !types_of<md::all_to_all, fp8_current>::fp8_wire);
static_assert(types_of<md::fp8_wire<>, fp8_current>::routed_operands::codes_travel);
static_assert(!types_of<md::all_to_all, mm::precision::mxfp8>::routed_operands::codes_travel);
using mxfp8_from_rowwise = mm::precision::wgrad_from_rowwise<mm::precision::mxfp8>;
using blockwise_from_rowwise = mm::precision::wgrad_from_rowwise<mm::precision::fp8_blockwise>;
static_assert(types_of<md::fp8_wire<>, mxfp8_from_rowwise>::routed_operands::row_codes_travel);
static_assert(types_of<md::fp8_wire<>, blockwise_from_rowwise>::routed_operands::row_codes_travel);
// A row of H = 64 on the wire: 64 codes and 2 E8M0 scales, or 64 codes and one fp32 scale.
static_assert(types_of<md::fp8_wire<>, mxfp8_from_rowwise>::routed_operands::wire_row_bytes(64) ==
              66);
static_assert(
    types_of<md::fp8_wire<>, blockwise_from_rowwise>::routed_operands::wire_row_bytes(64) == 68);
static_assert(types_of<md::fp8_wire<>, fp8_current>::routed_operands::wire_row_bytes(64) == 64);
// A layer kept in BF16 (first_last_layers_bf16) dispatches its fp32 rows through Base (R055).
using wire_config = mm::make_config<shape, md::fp8_wire<md::all_to_all_overlap<2>>, fp8_current>;
static_assert(
    std::is_same_v<mm::bf16_layer_config_t<wire_config>::dispatch, md::all_to_all_overlap<2>>);
static_assert(mm::rules::check<mm::bf16_layer_config_t<wire_config>>());
static_assert(!mm::moe_types<mm::bf16_layer_config_t<wire_config>>::fp8_wire);
static_assert(std::is_same_v<types_of<mm::precision::fp64>::dispatcher_type,
                             md::local_dispatcher<double, double>>);
// A static router's plan is in its type; the memory policy decides what is kept.
static_assert(types_of<>::router_type::plan_in_type);
static_assert(types_of<>::keeps(mm::memory::layer_buffer::fc1_output));
static_assert(!types_of<mm::memory::recompute<mm::memory::moe_act>>::keeps(
    mm::memory::layer_buffer::activation));
static_assert(!types_of<mm::precision::bf16>::keeps(mm::memory::layer_buffer::expert_rows));

static_assert(mm::expert_stage_of<mm::expert_stage<types_of<>>, float>);
static_assert(mm::expert_stage_of<mm::expert_stage<types_of<mm::precision::fp64>>, double>);
static_assert(!mm::expert_stage_of<mm::expert_stage<types_of<>>, double>);
static_assert(!mm::expert_stage_of<moves_rows_only, float>);

}  // namespace
