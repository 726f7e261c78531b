// SPDX-License-Identifier: Apache-2.0
// The all-to-all dispatcher (dispatch/all_to_all.hpp) without MPI: its static interface only, since
// building one needs the expert groups' communicators. Both forms (plain, and overlapped by pieces
// of local experts) are `token_dispatcher`s of their scalar and probs types; it is built from
// expert groups and a hidden size, optionally with the pieces and the smallest piece; its
// bookkeeping accessors (send rows, splits, the count table, the chunk order, the arrival order)
// give what the MPI tests read. Its logic runs under mpiexec in tests/mpi/dispatch_vectors_mpi.cpp
// (splits, the count exchange, permutations 1 and 2, received rows and combined outputs against the
// reference's all-to-all dispatcher), tests/mpi/moe_layer_mpi.cpp (the layer on folded mappings,
// ETP > 1, capacity, drop-and-pad) and tests/mpi/dispatch_equivalence_mpi.cpp --variant overlap
// (the overlapped form bit for bit, in the expected number of pieces).
#include <megamoe/dispatch/all_to_all.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace md = megamoe::dispatch;

namespace {

template <class T, class P, bool Overlapped = false>
using all_to_all = md::all_to_all_dispatcher<T, P, Overlapped>;
using plain = all_to_all<float, float>;

static_assert(md::token_dispatcher<plain, float, float>);
static_assert(md::token_dispatcher<all_to_all<double, double>, double, double>);
static_assert(md::token_dispatcher<all_to_all<float, float, true>, float, float>);
static_assert(md::token_dispatcher<all_to_all<double, float, true>, double, float>);
static_assert(!md::token_dispatcher<plain, double, double>);
static_assert(std::is_constructible_v<plain, md::expert_groups const&, int>);
static_assert(std::is_constructible_v<plain, md::expert_groups const&, int, int, std::size_t>);
static_assert(!std::is_default_constructible_v<plain>);

static_assert(
    std::is_same_v<decltype(std::declval<plain const&>().send_rows()), md::token_rows const&>);
static_assert(std::is_same_v<decltype(std::declval<plain const&>().send_splits()),
                             std::span<std::int64_t const>>);
static_assert(std::is_same_v<decltype(std::declval<plain const&>().recv_splits()),
                             std::span<std::int64_t const>>);
static_assert(std::is_same_v<decltype(std::declval<plain const&>().global_counts()),
                             std::span<std::int64_t const>>);
static_assert(
    std::is_same_v<decltype(std::declval<plain const&>().chunk_order()), std::span<int const>>);
static_assert(std::is_same_v<decltype(std::declval<plain const&>().received_rows_in_expert_order()),
                             std::vector<std::int64_t>>);
static_assert(std::is_same_v<decltype(std::declval<plain const&>().in_place()), bool>);
static_assert(std::is_same_v<decltype(std::declval<plain const&>().overlap_pieces()), int>);

}  // namespace
