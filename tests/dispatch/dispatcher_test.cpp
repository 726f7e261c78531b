// SPDX-License-Identifier: Apache-2.0
// The dispatcher class of a dispatch policy (dispatch/dispatcher.hpp), chosen at compile time:
// each resolved dispatcher's class, the overlapped all-to-all for all_to_all_overlap (and only when
// it resolves to all_to_all), every class a `token_dispatcher` of its scalar and probs types, and
// which dispatchers talk to other ranks.
#include <megamoe/dispatch/dispatcher.hpp>
#include <megamoe/dispatch/hierarchical.hpp>
#include <megamoe/dispatch/shared_memory.hpp>

#include <gtest/gtest.h>

#include <type_traits>

namespace md = megamoe::dispatch;

namespace {

using d = md::dispatcher;

static_assert(
    std::is_same_v<md::dispatcher_t<d::local, float, float>, md::local_dispatcher<float, float>>);
static_assert(std::is_same_v<md::dispatcher_t<d::all_gather, double, float>,
                             md::all_gather_dispatcher<double, float>>);
static_assert(std::is_same_v<md::dispatcher_t<d::all_to_all, float, double>,
                             md::all_to_all_dispatcher<float, double, false>>);
static_assert(std::is_same_v<md::dispatcher_t<d::hierarchical, float, float>,
                             md::hierarchical_dispatcher<float, float>>);

// all_to_all_overlap gives the overlapped class where it resolves to all_to_all; the plain
// policies keep the plain class.
static_assert(
    std::is_same_v<md::dispatcher_of<md::all_to_all_overlap<2>, d::all_to_all, float, float>,
                   md::all_to_all_dispatcher<float, float, true>>);
static_assert(std::is_same_v<md::dispatcher_of<md::all_to_all, d::all_to_all, float, float>,
                             md::all_to_all_dispatcher<float, float, false>>);
static_assert(std::is_same_v<md::dispatcher_of<md::auto_, d::all_to_all, float, float>,
                             md::all_to_all_dispatcher<float, float, false>>);
static_assert(std::is_same_v<md::dispatcher_of<md::auto_, d::local, double, double>,
                             md::local_dispatcher<double, double>>);
static_assert(std::is_same_v<md::dispatcher_of<md::hierarchical<>, d::hierarchical, float, float>,
                             md::hierarchical_dispatcher<float, float>>);
static_assert(std::is_same_v<md::dispatcher_of<md::hierarchical<md::shared_memory>, d::hierarchical,
                                               float, double>,
                             md::hierarchical_dispatcher<float, double, true>>);
static_assert(
    md::token_dispatcher<md::hierarchical_dispatcher<double, double, true>, double, double>);
// shared_memory_overlap gives the overlapped shared-memory class, shared_memory the plain one.
static_assert(
    std::is_same_v<md::dispatcher_of<md::shared_memory_overlap<2>, d::shared_memory, float, float>,
                   md::shared_memory_dispatcher<float, float, true>>);
static_assert(std::is_same_v<md::dispatcher_of<md::shared_memory, d::shared_memory, double, float>,
                             md::shared_memory_dispatcher<double, float, false>>);
static_assert(md::token_dispatcher<md::shared_memory_dispatcher<float, float, true>, float, float>);
// fp8_wire keeps its base's overlap and adds the codes' exchange.
static_assert(std::is_same_v<md::dispatcher_of<md::fp8_wire<>, d::all_to_all, float, float>,
                             md::all_to_all_dispatcher<float, float, false, true>>);
static_assert(std::is_same_v<md::dispatcher_of<md::fp8_wire<md::all_to_all_overlap<2>>,
                                               d::all_to_all, float, float>,
                             md::all_to_all_dispatcher<float, float, true, true>>);
static_assert(
    md::token_dispatcher<md::all_to_all_dispatcher<float, float, true, true>, float, float>);

// Every class is what the layer asks of a dispatcher.
template <d D, class T, class P>
constexpr bool usable = md::token_dispatcher<md::dispatcher_t<D, T, P>, T, P>;
static_assert(usable<d::local, float, float> && usable<d::local, double, double>);
static_assert(usable<d::all_gather, float, float> && usable<d::all_gather, double, float>);
static_assert(usable<d::all_to_all, float, float> && usable<d::all_to_all, double, double>);
static_assert(usable<d::hierarchical, float, float> && usable<d::hierarchical, double, double>);
static_assert(md::token_dispatcher<md::all_to_all_dispatcher<float, float, true>, float, float>);

TEST(Dispatcher, OnlyTheLocalDispatcherWorksWithoutOtherRanks) {
  EXPECT_FALSE(md::communicates(d::local));
  EXPECT_TRUE(md::communicates(d::all_gather));
  EXPECT_TRUE(md::communicates(d::all_to_all));
  EXPECT_TRUE(md::communicates(d::hierarchical));
  EXPECT_FALSE(md::communicates(d::auto_));  // resolved first; never a class of its own
  static_assert(md::communicates(md::resolve(d::auto_, 2, 1)));
  static_assert(!md::communicates(md::resolve(d::auto_, 1, 1)));
}

}  // namespace
