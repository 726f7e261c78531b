// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/tags.hpp — the parallel mapping (tags and degrees only).
//
//   parallel::mapping<>                                    everything 1: one rank, or pure DP
//   parallel::mapping<parallel::tp<2>, parallel::ep<4>>    attention TP2, experts EP4 (ETP follows
//   TP) parallel::mapping<parallel::cp<2>, parallel::etp<2>, parallel::ep<2>>
//   parallel::mapping<parallel::ep<megamoe::dynamic>>      EP decided at start-up
//   parallel::mapping<parallel::cp<2>, parallel::cp_comm<parallel::cp_comm_type::all_gather>>
//
// Parallel folding: attention uses TP x CP x DP x PP and experts ETP x EP x EDP x PP over the same
// world. DP and EDP are never in the type; they follow from the world size.
#pragma once

#include <megamoe/policy/policy.hpp>

#include <string_view>

namespace megamoe::parallel {

/// The kind of the `parallel` slot.
struct kind {};

/// The fixed degrees of a mapping. `dynamic` marks a degree decided at start-up.
struct degrees {
  int tp = 1;   // tensor_model_parallel_size
  int cp = 1;   // context_parallel_size
  int pp = 1;   // pipeline_model_parallel_size
  int etp = 1;  // expert_tensor_parallel_size
  int ep = 1;   // expert_model_parallel_size
  friend constexpr bool operator==(degrees const&, degrees const&) = default;
};

/// How context parallelism moves keys and values (the reference's `cp_comm_type`): `p2p` passes
/// each rank's keys and values around the CP ring, one neighbour at a time, merging partial
/// attention by its log-sum-exp (the reference's default); `all_gather` gathers every rank's at
/// once. Both give the same attention.
enum class cp_comm_type { p2p, all_gather };

/// The reference's name of a cp_comm_type.
constexpr std::string_view name_of(cp_comm_type c) noexcept {
  return c == cp_comm_type::p2p ? "p2p" : "all_gather";
}

namespace option {
struct tp_kind {};
struct cp_kind {};
struct pp_kind {};
struct etp_kind {};
struct ep_kind {};
struct cp_comm_kind {};
using all_kinds = boost::mp11::mp_list<tp_kind, cp_kind, pp_kind, etp_kind, ep_kind, cp_comm_kind>;
}  // namespace option

/// Attention tensor parallelism.
template <int N>
struct tp : megamoe::detail::int_option<option::tp_kind, N> {};
/// Context parallelism.
template <int N>
struct cp : megamoe::detail::int_option<option::cp_kind, N> {};
/// Pipeline parallelism (shared by both grids).
template <int N>
struct pp : megamoe::detail::int_option<option::pp_kind, N> {};
/// Expert tensor parallelism; defaults to tp, as in the reference.
template <int N>
struct etp : megamoe::detail::int_option<option::etp_kind, N> {};
/// Expert parallelism.
template <int N>
struct ep : megamoe::detail::int_option<option::ep_kind, N> {};

/// Context parallelism's exchange of keys and values (default p2p).
template <cp_comm_type C>
struct cp_comm {
  using option_kind = option::cp_comm_kind;
  static constexpr cp_comm_type value = C;
};

template <class... Degrees>
struct mapping {
  using policy_kind = kind;
  static constexpr std::string_view name = "mapping";

 private:
  using options = megamoe::detail::option_list<option::all_kinds, Degrees...>;
  template <class Kind, class Default>
  static constexpr int degree = options::template get<Kind, Default>::value;
  static constexpr int tp_degree = degree<option::tp_kind, parallel::tp<1>>;

 public:
  static constexpr degrees value{
      tp_degree,
      degree<option::cp_kind, parallel::cp<1>>,
      degree<option::pp_kind, parallel::pp<1>>,
      degree<option::etp_kind, parallel::etp<tp_degree>>,
      degree<option::ep_kind, parallel::ep<1>>,
  };
  static constexpr int tp = value.tp;
  static constexpr int cp = value.cp;
  static constexpr int pp = value.pp;
  static constexpr int etp = value.etp;
  static constexpr int ep = value.ep;
  static constexpr cp_comm_type cp_comm =
      options::template get<option::cp_comm_kind, parallel::cp_comm<cp_comm_type::p2p>>::value;
};

}  // namespace megamoe::parallel
