// SPDX-License-Identifier: Apache-2.0
// The node-aware dispatcher (dispatch/hierarchical.hpp) without MPI: what one dispatch sends
// (`node_traffic`: rows times row bytes plus the probs riding along, across and inside nodes), and
// the dispatcher's static interface (a `token_dispatcher` running the sequential exchange, built
// from expert groups and a hidden size, with its node layout, traffic and per-hop row counts).
// Building one needs the EP group's communicators and its node layout; its logic runs under
// mpiexec in tests/mpi/dispatch_equivalence_mpi.cpp (results against the flat all-to-all at 1, 2
// and 4 emulated nodes, the rows crossing nodes counted from the routing map, drop-and-pad) and
// tests/mpi/moe_layer_mpi.cpp --dispatcher hierarchical (the layer against one rank, R034).
#include <megamoe/dispatch/hierarchical.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

namespace md = megamoe::dispatch;

namespace {

using hierarchical = md::hierarchical_dispatcher<float, float>;

static_assert(md::token_dispatcher<hierarchical, float, float>);
static_assert(md::token_dispatcher<md::hierarchical_dispatcher<double, double>, double, double>);
static_assert(std::is_base_of_v<md::sequential_exchange<hierarchical, float, float>, hierarchical>);
static_assert(std::is_constructible_v<hierarchical, md::expert_groups const&, int>);
static_assert(!std::is_default_constructible_v<hierarchical>);
static_assert(
    std::is_same_v<decltype(std::declval<hierarchical const&>().nodes()), md::node_layout const&>);
static_assert(std::is_same_v<decltype(std::declval<hierarchical const&>().traffic()),
                             md::node_traffic const&>);
static_assert(std::is_same_v<decltype(std::declval<hierarchical const&>().rows_to_nodes()),
                             std::span<std::int64_t const>>);
static_assert(std::is_same_v<decltype(std::declval<hierarchical const&>().rows_in_node()),
                             std::span<std::int64_t const>>);

TEST(NodeTraffic, BytesAreRowsTimesRowBytesPlusTheProbs) {
  md::node_traffic const none;
  EXPECT_EQ(none.inter_node_bytes(), 0);
  EXPECT_EQ(none.intra_node_bytes(), 0);
  // 12 rows of 1024 floats to other nodes with 8 experts' probs each, 5 rows inside the node with
  // 2 experts' probs each (the dispatcher's count_traffic fills it this way).
  md::node_traffic t;
  t.inter_node_rows = 12;
  t.intra_node_rows = 5;
  t.row_bytes = 1024 * 4;
  t.inter_node_meta_bytes = 12 * 8 * 4;
  t.intra_node_meta_bytes = 5 * 2 * 4;
  EXPECT_EQ(t.inter_node_bytes(), 12 * 4096 + 384);
  EXPECT_EQ(t.intra_node_bytes(), 5 * 4096 + 40);
  // Large exchanges do not overflow: 64-bit counts.
  t.inter_node_rows = std::int64_t{1} << 31;
  EXPECT_EQ(t.inter_node_bytes(), (std::int64_t{1} << 31) * 4096 + 384);
}

}  // namespace
