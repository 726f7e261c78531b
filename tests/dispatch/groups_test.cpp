// SPDX-License-Identifier: Apache-2.0
// The dispatcher's view of the expert grid (dispatch/groups.hpp) without MPI: its static interface
// only, since it is built from process groups, which need MPI. It is built from process groups and
// an expert count (no default), is copied into each dispatcher, and hands out its three
// communicators by reference and its grid position as numbers. Under mpiexec every dispatcher
// builds one: in tests/mpi/dispatch_vectors_mpi.cpp (EP ranks and experts against the reference
// files), tests/mpi/moe_layer_mpi.cpp and tests/mpi/dispatch_equivalence_mpi.cpp (folded mappings
// with TP, ETP and EP, so first_expert and local_experts place every expert's shard). An expert
// count that EP does not divide is R003, which the rules refuse before a group is built
// (tests/compile_fail/R003_ep_divides_experts.cpp).
#include <megamoe/dispatch/groups.hpp>

#include <gtest/gtest.h>

#include <boost/mpi/communicator.hpp>

#include <type_traits>
#include <utility>

namespace md = megamoe::dispatch;

namespace {

using groups = md::expert_groups;

static_assert(std::is_constructible_v<groups, megamoe::parallel::process_groups const&, int>);
static_assert(!std::is_default_constructible_v<groups>);
static_assert(std::is_copy_constructible_v<groups>);  // dispatchers keep their own copy
static_assert(std::is_same_v<decltype(std::declval<groups const&>().tp_ep()),
                             boost::mpi::communicator const&>);
static_assert(
    std::is_same_v<decltype(std::declval<groups const&>().ep()), boost::mpi::communicator const&>);
static_assert(
    std::is_same_v<decltype(std::declval<groups const&>().etp()), boost::mpi::communicator const&>);
static_assert(std::is_same_v<decltype(std::declval<groups const&>().local_experts()), int>);
static_assert(std::is_same_v<decltype(std::declval<groups const&>().first_expert()), int>);
static_assert(noexcept(std::declval<groups const&>().first_expert()));

}  // namespace
