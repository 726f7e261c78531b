// SPDX-License-Identifier: Apache-2.0
// megamoe/policy/policy.hpp — what makes a type a megamoe policy, and how policies read their
// options.
//
// A policy is an empty type that names its kind (`using policy_kind = router::kind;`),
// Kokkos-style, and exposes its choices as `static constexpr ... value`. Options inside a policy
// are small types that name their own kind (`using option_kind = ...;`); they may be given in any
// order, each kind at most once. Unknown or repeated options stop compilation with a rule id.
// This header is light on purpose: no Eigen, Boost.MPI or range-v3.
#pragma once

#include <megamoe/policy/rule_ids.hpp>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>
#include <boost/mp11/utility.hpp>

#include <concepts>
#include <type_traits>

namespace megamoe {

/// A size or degree written as `dynamic` is left to start-up: its rules run once the value is
/// known.
inline constexpr int dynamic = -1;

/// True for a type that names its policy kind.
template <class P>
concept megamoe_policy = requires {
  typename P::policy_kind;
};

/// True for a policy of kind `Kind` (e.g. `policy_of<P, router::kind>`).
template <class P, class Kind>
concept policy_of = megamoe_policy<P> && std::same_as<typename P::policy_kind, Kind>;

namespace detail {

/// Deliberately incomplete: instantiating them prints the offending type next to the rule message.
template <class T>
struct show_unknown_megamoe_policy;
template <class T>
struct show_unknown_megamoe_option;

template <class T, template <class> class Show>
struct names_type : std::bool_constant<(sizeof(Show<T>) > 0)> {};

/// Names the first type of the list L through `Show` (an error), or does nothing for an empty list.
template <class L, template <class> class Show>
struct name_first : std::true_type {};
template <class T, class... Rest, template <class> class Show>
struct name_first<boost::mp11::mp_list<T, Rest...>, Show> : names_type<T, Show> {};

template <class O>
using option_kind_t = typename O::option_kind;

/// The option kind of O, or void for a type that is not an option.
template <class O>
using option_kind_or_void = boost::mp11::mp_eval_or<void, option_kind_t, O>;

template <class Kind>
struct is_option_of_q {
  template <class O>
  using fn = std::is_same<option_kind_or_void<O>, Kind>;
};

template <class Kinds>
struct has_kind_in_q {
  template <class O>
  using fn = boost::mp11::mp_contains<Kinds, option_kind_or_void<O>>;
};

/// The option list of one policy: each option must be of one of the accepted `Kinds` (R024), each
/// kind at most once (R023).
template <class Kinds, class... Options>
struct option_list {
  using all = boost::mp11::mp_list<Options...>;
  using unknown = boost::mp11::mp_remove_if_q<all, has_kind_in_q<Kinds>>;

  static_assert(boost::mp11::mp_empty<unknown>::value, MEGAMOE_RULE_R024);
  static_assert(name_first<unknown, show_unknown_megamoe_option>::value);

  template <class Kind>
  using count = boost::mp11::mp_count_if_q<all, is_option_of_q<Kind>>;

  template <class Kind>
  using at_most_once = boost::mp11::mp_bool<(count<Kind>::value <= 1)>;

  static_assert(boost::mp11::mp_all_of<Kinds, at_most_once>::value, MEGAMOE_RULE_R023);

  /// Every option of kind Kind, in the order given.
  template <class Kind>
  using every = boost::mp11::mp_copy_if_q<all, is_option_of_q<Kind>>;

  /// The option of kind Kind, or Default when none was given.
  template <class Kind, class Default>
  using get = boost::mp11::mp_eval_if_c<(count<Kind>::value == 0), Default, boost::mp11::mp_front,
                                        every<Kind>>;

  /// False after R023 or R024 fired; lets callers skip work that would only add noise to the error.
  static constexpr bool valid =
      boost::mp11::mp_empty<unknown>::value && boost::mp11::mp_all_of<Kinds, at_most_once>::value;
};

/// Starts from `base` and lets each option write its fields (`static constexpr void apply(S&)`).
/// The options are checked first (R023, R024); each kind writes different fields, so the order in
/// which options are given does not matter.
template <class Kinds, class S, class... Options>
constexpr S apply_options(S base) {
  using list = option_list<Kinds, Options...>;
  if constexpr (list::valid) (Options::apply(base), ...);
  return base;
}

/// An option that carries one number: `template <int N> struct hidden : int_option<kind, N> {};`.
template <class Kind, int N>
struct int_option {
  using option_kind = Kind;
  static constexpr int value = N;
};

/// An option that sets one field of its policy's settings to a fixed value:
/// `struct sigmoid : set_field<score_kind, &settings::score, score_function::sigmoid> {};`.
template <class Kind, auto Field, auto Value>
struct set_field {
  using option_kind = Kind;
  template <class S>
  static constexpr void apply(S& s) {
    s.*Field = Value;
  }
};

/// An option that switches one flag of its policy's settings on.
template <class Kind, auto Field>
using set_flag = set_field<Kind, Field, true>;

}  // namespace detail
}  // namespace megamoe
