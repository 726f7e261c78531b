// SPDX-License-Identifier: Apache-2.0
// Where EP ranks sit on nodes (dispatch/nodes.hpp) without MPI: MEGAMOE_RANKS_PER_NODE's parser
// takes a positive integer that divides the world size and refuses anything else with R034, naming
// the value and the world; node_layout itself is a collective over MPI communicators (shared-memory
// split or the emulated node size, agreement over the pipeline stage, the node and peer
// communicators) and
// runs under mpiexec in tests/mpi/dispatch_equivalence_mpi.cpp (1, 2 and 4 emulated nodes),
// tests/mpi/moe_layer_mpi.cpp (4 nodes of 2) and the R034 failure test
// mpi.hierarchical.ranks_per_node_not_dividing.
#include <megamoe/dispatch/nodes.hpp>
#include <megamoe/policy/error.hpp>

#include <gtest/gtest.h>

#include <boost/mpi/communicator.hpp>

#include <string>
#include <type_traits>

namespace mm = megamoe;
namespace md = megamoe::dispatch;

namespace {

static_assert(std::is_constructible_v<md::node_layout, boost::mpi::communicator const&,
                                      boost::mpi::communicator const&>);
static_assert(!std::is_default_constructible_v<md::node_layout>);

TEST(RanksPerNode, APositiveDivisorOfTheWorld) {
  EXPECT_EQ(md::parse_ranks_per_node("1", 7), 1);
  EXPECT_EQ(md::parse_ranks_per_node("2", 8), 2);
  EXPECT_EQ(md::parse_ranks_per_node("4", 8), 4);
  EXPECT_EQ(md::parse_ranks_per_node("8", 8), 8);
  EXPECT_EQ(md::parse_ranks_per_node("004", 8), 4);                     // leading zeros are digits
  EXPECT_EQ(md::parse_ranks_per_node("12345678", 12345678), 12345678);  // eight digits
}

TEST(RanksPerNode, AnythingElseIsR034NamingTheValue) {
  for (std::string const bad :
       {"3", "16", "0", "", "-2", "+2", " 2", "2 ", "2x", "two", "1.5", "123456789"}) {
    try {
      md::parse_ranks_per_node(bad, 8);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (mm::config_error const& e) {
      EXPECT_EQ(e.rule_id(), 34) << bad;
      EXPECT_NE(
          std::string(e.what()).find("MEGAMOE_RANKS_PER_NODE='" + bad + "' for a world of 8 ranks"),
          std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
