// SPDX-License-Identifier: Apache-2.0
// The all-gather dispatcher (dispatch/all_gather.hpp) without MPI: its static interface only, since
// building one needs the expert groups' communicators. It is a `token_dispatcher` of its scalar and
// probs types that runs the sequential exchange, is built from expert groups and a hidden size,
// and gives its gathered rows and per-rank token counts. Its logic runs under mpiexec in
// tests/mpi/dispatch_vectors_mpi.cpp (gathered rows and combined outputs against the reference's
// all-gather dispatcher) and tests/mpi/moe_layer_mpi.cpp (--dispatcher all_gather: the layer on
// folded mappings, ETP > 1 and drop-and-pad included, against one rank).
#include <megamoe/dispatch/all_gather.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

namespace md = megamoe::dispatch;

namespace {

template <class T, class P>
using all_gather = md::all_gather_dispatcher<T, P>;

static_assert(md::token_dispatcher<all_gather<float, float>, float, float>);
static_assert(md::token_dispatcher<all_gather<double, float>, double, float>);
static_assert(md::token_dispatcher<all_gather<double, double>, double, double>);
static_assert(!md::token_dispatcher<all_gather<float, float>, double, float>);
static_assert(std::is_base_of_v<md::sequential_exchange<all_gather<float, float>, float, float>,
                                all_gather<float, float>>);
static_assert(std::is_constructible_v<all_gather<float, float>, md::expert_groups const&, int>);
static_assert(!std::is_default_constructible_v<all_gather<float, float>>);
static_assert(
    std::is_same_v<decltype(std::declval<all_gather<float, float> const&>().gathered_rows()),
                   md::token_rows const&>);
static_assert(
    std::is_same_v<decltype(std::declval<all_gather<float, float> const&>().tokens_per_rank()),
                   std::span<std::int64_t const>>);

}  // namespace
