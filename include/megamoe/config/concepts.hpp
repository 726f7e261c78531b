// SPDX-License-Identifier: Apache-2.0
// megamoe/config/concepts.hpp — one concept per configuration slot, and `training_config`.
//
// A policy opts into its slot by naming its kind (`using policy_kind = router::kind;`) and exposes
// its choices as `static constexpr ... value` of the slot's plain-value type. The concepts check
// exactly that, so a user's own policy of a slot works like the built-in ones.
#pragma once

#include <megamoe/dispatch/tags.hpp>
#include <megamoe/expert/tags.hpp>
#include <megamoe/memory/tags.hpp>
#include <megamoe/model/tags.hpp>
#include <megamoe/parallel/tags.hpp>
#include <megamoe/policy/policy.hpp>
#include <megamoe/policy/shape.hpp>
#include <megamoe/precision/tags.hpp>
#include <megamoe/router/tags.hpp>

#include <concepts>
#include <string_view>

namespace megamoe {

namespace detail {
template <class P, class Value>
concept has_value_of = requires {
  { P::value } -> std::convertible_to<Value>;
};
template <class P>
concept has_name = requires {
  { P::name } -> std::convertible_to<std::string_view>;
};
}  // namespace detail

/// The `shape` slot: model sizes.
template <class S>
concept shape_policy = policy_of<S, shape_kind> && detail::has_value_of<S, shape_sizes>;

/// A router whose choices are fixed in the type.
template <class R>
concept static_router_policy =
    policy_of<R, router::kind> && detail::has_name<R> && detail::has_value_of<R, router::settings>;

/// A router whose choices are read at start-up.
template <class R>
concept runtime_router_policy = policy_of<R, router::kind> && detail::has_name<R> && requires {
  requires R::is_runtime;
};

/// The `router` slot.
template <class R>
concept router_policy = static_router_policy<R> || runtime_router_policy<R>;

/// The `dispatch` slot.
template <class D>
concept dispatch_policy = policy_of<D, dispatch::kind> && detail::has_name<D> &&
    detail::has_value_of<D, dispatch::dispatcher>;

/// The `expert` slot.
template <class E>
concept expert_policy =
    policy_of<E, expert::kind> && detail::has_name<E> && detail::has_value_of<E, expert::settings>;

/// The `precision` slot: the numeric recipe, with the scalar types of master weights and
/// accumulation.
template <class P>
concept precision_recipe = policy_of<P, precision::kind> && detail::has_name<P> &&
    detail::has_value_of<P, precision::settings> && requires {
  typename P::master_type;
  typename P::accumulate_type;
} && std::floating_point<typename P::master_type>;

/// The `parallel` slot: fixed degrees TP, CP, PP, ETP, EP (DP and EDP follow from the world size).
template <class M>
concept parallel_mapping = policy_of<M, parallel::kind> && detail::has_name<M> &&
    detail::has_value_of<M, parallel::degrees>;

/// The `memory` slot: what is kept or recomputed.
template <class M>
concept memory_policy =
    policy_of<M, memory::kind> && detail::has_name<M> && detail::has_value_of<M, memory::settings>;

/// The `model` slot: the decoder around the MoE layers.
template <class M>
concept model_policy =
    policy_of<M, model::kind> && detail::has_name<M> && detail::has_value_of<M, model::settings>;

/// A complete training configuration: a type whose eight named slots each hold a policy of their
/// kind.
template <class C>
concept training_config = shape_policy<typename C::shape> && router_policy<typename C::router> &&
    dispatch_policy<typename C::dispatch> && expert_policy<typename C::expert> &&
    precision_recipe<typename C::precision> && parallel_mapping<typename C::parallel> &&
    memory_policy<typename C::memory> && model_policy<typename C::model>;

}  // namespace megamoe
