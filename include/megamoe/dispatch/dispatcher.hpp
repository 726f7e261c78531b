// SPDX-License-Identifier: Apache-2.0
// megamoe/dispatch/dispatcher.hpp — the dispatcher class of a `dispatch` policy, chosen at compile
// time. Interface: dispatch/local.hpp.
//
// The local, all-gather and all-to-all dispatchers come with this header. The two that share
// MPI-3 windows inside a node are included by need (core/by_need.hpp): a configuration choosing
// dispatch::hierarchical (either kind) includes <megamoe/dispatch/hierarchical.hpp>, one choosing
// dispatch::shared_memory or shared_memory_overlap <megamoe/dispatch/shared_memory.hpp>.
#pragma once

#include <megamoe/core/by_need.hpp>
#include <megamoe/dispatch/all_gather.hpp>
#include <megamoe/dispatch/all_to_all.hpp>
#include <megamoe/dispatch/exchange.hpp>
#include <megamoe/dispatch/groups.hpp>
#include <megamoe/dispatch/local.hpp>
#include <megamoe/dispatch/tags.hpp>

#include <type_traits>

namespace megamoe::dispatch {

// Defined in dispatch/hierarchical.hpp and dispatch/shared_memory.hpp (with their defaults).
template <class T, class P, bool SharedNode>
class hierarchical_dispatcher;
template <class T, class P, bool Overlapped>
class shared_memory_dispatcher;

namespace detail {
template <dispatcher D, class T, class P>
struct dispatcher_class {
  static_assert(D != dispatcher::auto_, "megamoe: resolve dispatch::auto_ first");
  using type = local_dispatcher<T, P>;
};
template <class T, class P>
struct dispatcher_class<dispatcher::all_gather, T, P> {
  using type = all_gather_dispatcher<T, P>;
};
template <class T, class P>
struct dispatcher_class<dispatcher::all_to_all, T, P> {
  using type = all_to_all_dispatcher<T, P>;
};
template <class T, class P>
struct dispatcher_class<dispatcher::hierarchical, T, P> {
  using type = hierarchical_dispatcher<T, P, false>;
};
template <class T, class P>
struct dispatcher_class<dispatcher::shared_memory, T, P> {
  using type = shared_memory_dispatcher<T, P, false>;
};
}  // namespace detail

/// The class that moves tokens for dispatcher D (T: the layer's scalar; P: the probs type).
template <dispatcher D, class T, class P>
using dispatcher_t = typename detail::dispatcher_class<D, T, P>::type;

namespace detail {
template <class Policy, dispatcher D, class T, class P>
struct dispatcher_of_policy {
  using type = dispatcher_t<D, T, P>;
};
template <class Policy, class T, class P>
  requires(overlap_chunks_of<Policy>() > 1 || fp8_wire_of<Policy>())
struct dispatcher_of_policy<Policy, dispatcher::all_to_all, T, P> {
  using type =
      all_to_all_dispatcher<T, P, (overlap_chunks_of<Policy>() > 1), fp8_wire_of<Policy>()>;
};
template <class Policy, class T, class P>
  requires(overlap_chunks_of<Policy>() > 1)
struct dispatcher_of_policy<Policy, dispatcher::shared_memory, T, P> {
  using type = shared_memory_dispatcher<T, P, true>;
};
template <class Policy, class T, class P>
  requires(intra_node_shared<Policy>())
struct dispatcher_of_policy<Policy, dispatcher::hierarchical, T, P> {
  using type = hierarchical_dispatcher<T, P, true>;
};
template <class Policy, dispatcher D, class T, class P>
struct dispatcher_of_included : dispatcher_of_policy<Policy, D, T, P> {
  static constexpr bool hierarchical_included =
      D != dispatcher::hierarchical ||
      by_need::included<by_need::module::hierarchical_dispatcher, Policy>;
  static_assert(hierarchical_included,
                "megamoe: the configuration chooses dispatch::hierarchical: #include "
                "<megamoe/dispatch/hierarchical.hpp> before its model is instantiated");
  static constexpr bool shared_memory_included =
      D != dispatcher::shared_memory ||
      by_need::included<by_need::module::shared_memory_dispatcher, Policy>;
  static_assert(shared_memory_included,
                "megamoe: the configuration chooses dispatch::shared_memory: #include "
                "<megamoe/dispatch/shared_memory.hpp> before its model is instantiated");
};
}  // namespace detail

/// The class that moves tokens for dispatch policy Policy with D its resolved dispatcher (auto_
/// resolved by the layout): dispatch::all_to_all_overlap gives the overlapped all-to-all,
/// dispatch::fp8_wire the all-to-all with FP8 codes on the forward wire,
/// dispatch::shared_memory_overlap the overlapped shared-memory one, and
/// dispatch::hierarchical<shared_memory> the node-aware one with a shared window inside the node.
template <class Policy, dispatcher D, class T, class P>
using dispatcher_of = typename detail::dispatcher_of_included<Policy, D, T, P>::type;

/// True for the dispatchers that talk to other ranks (and so need process groups).
constexpr bool communicates(dispatcher d) {
  return d == dispatcher::all_gather || d == dispatcher::all_to_all ||
         d == dispatcher::hierarchical || d == dispatcher::shared_memory;
}

}  // namespace megamoe::dispatch
