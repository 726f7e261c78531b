// SPDX-License-Identifier: Apache-2.0
// megamoe/config/config.hpp — assembling a configuration type.
//
// Two ways, same result:
//
//   struct mixtral_like : megamoe::defaults {                 // named slots; unnamed ones default
//     using shape  = megamoe::shape<megamoe::hidden<4096>, megamoe::ffn<14336>,
//     megamoe::experts<8>>; using router = megamoe::router::top_k<2,
//     megamoe::router::aux_loss<1e-2>>;
//   };
//
//   using deepseek_like = megamoe::make_config<                // any order, defaults for the rest
//       megamoe::router::aux_loss_free<8, megamoe::router::group_limit<8, 4>>,
//       megamoe::shape<megamoe::hidden<2048>, megamoe::ffn<1408>, megamoe::experts<64>>>;
//
// Write slot types fully qualified (`megamoe::router::...`) inside a struct: a member alias named
// `router` would otherwise change the meaning of `router::` in its own declaration.
#pragma once

#include <megamoe/config/concepts.hpp>
#include <megamoe/policy/policy.hpp>
#include <megamoe/policy/rule_ids.hpp>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>
#include <boost/mp11/utility.hpp>

#include <type_traits>

namespace megamoe {

/// The visible defaults of every slot but `shape`, which has none.
struct defaults {
  using router = megamoe::router::top_k<2>;
  using dispatch = megamoe::dispatch::auto_;
  using expert = megamoe::expert::mlp<>;
  using precision = megamoe::precision::fp32;
  using parallel = megamoe::parallel::mapping<>;
  using memory = megamoe::memory::keep_all;
  using model = megamoe::model::decoder<>;
};

/// A configuration with its slots given in the canonical order; `make_config` produces one.
template <class Shape, class Router, class Dispatch, class Expert, class Precision, class Parallel,
          class Memory, class Model>
struct basic_config {
  using shape = Shape;
  using router = Router;
  using dispatch = Dispatch;
  using expert = Expert;
  using precision = Precision;
  using parallel = Parallel;
  using memory = Memory;
  using model = Model;
};

namespace detail {

/// Stands in for the missing shape of a make_config without one (R022 has already fired).
struct no_shape {};

template <class P>
using policy_kind_t = typename P::policy_kind;
template <class P>
using policy_kind_or_void = boost::mp11::mp_eval_or<void, policy_kind_t, P>;

using slot_kinds = boost::mp11::mp_list<shape_kind, router::kind, dispatch::kind, expert::kind,
                                        precision::kind, parallel::kind, memory::kind, model::kind>;

template <class P>
using is_slot_policy = boost::mp11::mp_contains<slot_kinds, policy_kind_or_void<P>>;

template <class Kind>
struct is_policy_of_q {
  template <class P>
  using fn = std::is_same<policy_kind_or_void<P>, Kind>;
};

template <class... Policies>
struct make_config_impl {
  using given = boost::mp11::mp_list<Policies...>;
  using unknown = boost::mp11::mp_remove_if<given, is_slot_policy>;
  static_assert(boost::mp11::mp_empty<unknown>::value, MEGAMOE_RULE_R021);
  static_assert(name_first<unknown, show_unknown_megamoe_policy>::value);

  template <class Kind>
  using of_kind = boost::mp11::mp_copy_if_q<given, is_policy_of_q<Kind>>;
  template <class Kind>
  using at_most_once = boost::mp11::mp_bool<(boost::mp11::mp_size<of_kind<Kind>>::value <= 1)>;
  static_assert(boost::mp11::mp_all_of<slot_kinds, at_most_once>::value, MEGAMOE_RULE_R020);
  static_assert(!boost::mp11::mp_empty<of_kind<shape_kind>>::value,
                MEGAMOE_RULE_R022 " [slot: shape]");

  template <class Kind, class Default>
  using pick = boost::mp11::mp_eval_if_c<boost::mp11::mp_empty<of_kind<Kind>>::value, Default,
                                         boost::mp11::mp_front, of_kind<Kind>>;

  using type =
      basic_config<pick<shape_kind, no_shape>, pick<router::kind, defaults::router>,
                   pick<dispatch::kind, defaults::dispatch>, pick<expert::kind, defaults::expert>,
                   pick<precision::kind, defaults::precision>,
                   pick<parallel::kind, defaults::parallel>, pick<memory::kind, defaults::memory>,
                   pick<model::kind, defaults::model>>;
};

}  // namespace detail

/// A configuration from policies in any order; every slot not given takes its default from
/// `megamoe::defaults`. Two policies of one kind break R020, a non-policy R021, no shape R022.
template <class... Policies>
using make_config = typename detail::make_config_impl<Policies...>::type;

namespace detail {
template <class Option>
using stores_quantized = boost::mp11::mp_bool<
    std::is_same_v<typename Option::option_kind, memory::option::quantized_activations_kind> ||
    std::is_same_v<typename Option::option_kind, memory::option::quantized_weights_kind>>;
template <class Memory>
struct without_quantized_storage {
  using type = Memory;
};
template <class... Options>
struct without_quantized_storage<memory::plan<Options...>> {
  using type = boost::mp11::mp_rename<
      boost::mp11::mp_remove_if<boost::mp11::mp_list<Options...>, stores_quantized>, memory::plan>;
};
/// A dispatch policy without FP8 codes on the wire (dispatch::fp8_wire<Base> -> Base).
template <class Dispatch>
struct without_fp8_wire {
  using type = Dispatch;
};
template <class Base>
struct without_fp8_wire<dispatch::fp8_wire<Base>> {
  using type = Base;
};
}  // namespace detail

/// What a layer kept in BF16 under `Config`'s FP8 or FP4 recipe runs (the reference's
/// first_last_layers_bf16): the bf16 recipe, the memory plan without its quantized storage, which
/// needs a quantized recipe (R030), and the dispatch without FP8 codes on the wire (R055). For a
/// `make_config` configuration this is the very type its bf16 counterpart is, so no module is
/// built twice.
template <training_config Config>
using bf16_layer_config_t =
    basic_config<typename Config::shape, typename Config::router,
                 typename detail::without_fp8_wire<typename Config::dispatch>::type,
                 typename Config::expert, precision::bf16, typename Config::parallel,
                 typename detail::without_quantized_storage<typename Config::memory>::type,
                 typename Config::model>;

}  // namespace megamoe
