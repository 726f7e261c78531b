// SPDX-License-Identifier: Apache-2.0
// Dispatch policies (dispatch/tags.hpp) as plain values: each policy's dispatcher and name, the
// overlap pieces and minimum piece size a policy asks for (1 and 0 when it does not overlap), what
// `auto_` resolves to for the expert degrees (and that every other choice stays), megamoe's names
// of the dispatchers, and the parameters the policy templates refuse.
#include <megamoe/dispatch/tags.hpp>

#include <gtest/gtest.h>

#include <string_view>
#include <type_traits>

namespace md = megamoe::dispatch;

namespace {

template <template <int, int> class Overlap, int Chunks, int MinKiB>
concept overlap_accepts = requires {
  typename Overlap<Chunks, MinKiB>;
};
static_assert(overlap_accepts<md::all_to_all_overlap, 2, 0>);
static_assert(!overlap_accepts<md::all_to_all_overlap, 1, 1024>);  // one piece overlaps nothing
static_assert(!overlap_accepts<md::all_to_all_overlap, 4, -1>);
template <int Chunks>
concept shared_overlap_accepts = requires {
  typename md::shared_memory_overlap<Chunks>;
};
static_assert(shared_overlap_accepts<2> && !shared_overlap_accepts<1>);

static_assert(std::is_same_v<md::hierarchical<>::intra_node, md::all_to_all>);
static_assert(md::intra_node_shared<md::hierarchical<md::shared_memory>>());
static_assert(!md::intra_node_shared<md::hierarchical<>>() &&
              !md::intra_node_shared<md::shared_memory>());
// Inside a node: MPI's all-to-all or the shared window, nothing else.
template <class IntraNode>
concept hierarchical_accepts = requires {
  typename md::hierarchical<IntraNode>;
};
static_assert(hierarchical_accepts<md::shared_memory> && !hierarchical_accepts<md::all_gather>);

TEST(DispatchPolicies, NameTheirDispatcher) {
  EXPECT_EQ(md::local::value, md::dispatcher::local);
  EXPECT_EQ(md::all_gather::value, md::dispatcher::all_gather);
  EXPECT_EQ(md::all_to_all::value, md::dispatcher::all_to_all);
  EXPECT_EQ((md::all_to_all_overlap<4, 64>::value), md::dispatcher::all_to_all);
  EXPECT_EQ(md::hierarchical<>::value, md::dispatcher::hierarchical);
  EXPECT_EQ(md::shared_memory_overlap<3>::value, md::dispatcher::shared_memory);
  EXPECT_EQ(md::auto_::value, md::dispatcher::auto_);
  EXPECT_EQ(md::local::name, std::string_view("local"));
  EXPECT_EQ(md::all_gather::name, std::string_view("all_gather"));
  EXPECT_EQ(md::all_to_all::name, std::string_view("all_to_all"));
  EXPECT_EQ(md::all_to_all_overlap<2>::name, std::string_view("all_to_all_overlap"));
  EXPECT_EQ(md::hierarchical<>::name, std::string_view("hierarchical"));
  EXPECT_EQ(md::shared_memory_overlap<2>::name, std::string_view("shared_memory_overlap"));
  EXPECT_EQ(md::auto_::name, std::string_view("auto"));
  EXPECT_EQ(md::fp8_wire<>::value, md::dispatcher::all_to_all);
  EXPECT_EQ(md::fp8_wire<>::name, std::string_view("fp8_wire"));
}

TEST(DispatchPolicies, Fp8WireKeepsItsBase) {
  EXPECT_TRUE(md::fp8_wire_of<md::fp8_wire<>>());
  EXPECT_FALSE(md::fp8_wire_of<md::all_to_all>());
  EXPECT_FALSE(md::fp8_wire_of<md::all_to_all_overlap<2>>());
  EXPECT_EQ(md::overlap_chunks_of<md::fp8_wire<>>(), 1);
  EXPECT_EQ((md::overlap_chunks_of<md::fp8_wire<md::all_to_all_overlap<3, 0>>>()), 3);
  EXPECT_EQ((md::overlap_min_piece_kib_of<md::fp8_wire<md::all_to_all_overlap<3, 0>>>()), 0);
}

TEST(DispatchPolicies, OverlapPiecesAndMinimumPieceSize) {
  EXPECT_EQ(md::overlap_chunks_of<md::all_to_all>(), 1);
  EXPECT_EQ(md::overlap_chunks_of<md::local>(), 1);
  EXPECT_EQ(md::overlap_chunks_of<md::hierarchical<>>(), 1);
  EXPECT_EQ(md::overlap_chunks_of<md::all_to_all_overlap<4>>(), 4);
  EXPECT_EQ((md::overlap_chunks_of<md::all_to_all_overlap<3, 0>>()), 3);
  EXPECT_EQ(md::overlap_min_piece_kib_of<md::all_to_all>(), 0);
  EXPECT_EQ(md::overlap_min_piece_kib_of<md::all_to_all_overlap<2>>(), 1024);  // 1 MiB default
  EXPECT_EQ((md::overlap_min_piece_kib_of<md::all_to_all_overlap<2, 64>>()), 64);
  static_assert(md::overlap_chunks_of<md::all_to_all_overlap<8>>() == 8, "a constant expression");
  // A shared-memory piece costs no exchange: no minimum size.
  EXPECT_EQ(md::overlap_chunks_of<md::shared_memory>(), 1);
  EXPECT_EQ(md::overlap_chunks_of<md::shared_memory_overlap<4>>(), 4);
  EXPECT_EQ(md::overlap_min_piece_kib_of<md::shared_memory_overlap<4>>(), 0);
}

TEST(DispatchPolicies, AutoResolvesByTheExpertDegrees) {
  using d = md::dispatcher;
  EXPECT_EQ(md::resolve(d::auto_, 1, 1), d::local);
  EXPECT_EQ(md::resolve(d::auto_, 2, 1), d::all_to_all);
  EXPECT_EQ(md::resolve(d::auto_, 1, 2), d::all_to_all);  // ETP alone needs exchanges too
  EXPECT_EQ(md::resolve(d::auto_, 4, 2), d::all_to_all);
  // Any other choice stays, even where it cannot work (the rules say so, not resolve).
  EXPECT_EQ(md::resolve(d::all_gather, 1, 1), d::all_gather);
  EXPECT_EQ(md::resolve(d::local, 4, 1), d::local);
  EXPECT_EQ(md::resolve(d::hierarchical, 8, 1), d::hierarchical);
  static_assert(md::resolve(d::auto_, 1, 1) == d::local);
}

TEST(DispatchPolicies, NamesOfTheDispatchers) {
  using d = md::dispatcher;
  EXPECT_EQ(md::name_of(d::auto_), "auto");
  EXPECT_EQ(md::name_of(d::local), "local");
  EXPECT_EQ(md::name_of(d::all_gather), "all_gather");
  EXPECT_EQ(md::name_of(d::all_to_all), "all_to_all");
  EXPECT_EQ(md::name_of(d::hierarchical), "hierarchical");
  EXPECT_EQ(md::name_of(static_cast<d>(99)), "?");
  // A policy's name and its dispatcher's name agree where they are the same thing.
  EXPECT_EQ(md::name_of(md::all_gather::value), md::all_gather::name);
  EXPECT_EQ(md::name_of(md::auto_::value), md::auto_::name);
}

}  // namespace
