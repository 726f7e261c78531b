// SPDX-License-Identifier: Apache-2.0
// megamoe/config/rules.hpp — the cross-slot rules: one named predicate per rule, checked at compile
// time by `rules::check<C>()` and at start-up by `rules::require_valid(values)`, with the same ids.
//
// Each predicate reads `config_values` and holds vacuously when a value it needs is `dynamic`,
// absent (run-time router, unknown world size) or already broken under another rule, so one mistake
// gives one rule id. Rules R020-R024 are about assembling a type and live where types are assembled
// (policy/policy.hpp, config/config.hpp); R028 and R029 are about the environment
// (core/thread_pool.hpp, parallel/environment.hpp).
#pragma once

#include <megamoe/config/values.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/policy/error.hpp>
#include <megamoe/policy/rule_ids.hpp>

#include <array>
#include <string>
#include <vector>

namespace megamoe::rules {

namespace detail {
constexpr bool known(int x) {
  return x != dynamic;
}
constexpr bool positive_or_dynamic(int x) {
  return x == dynamic || x > 0;
}
/// A known, valid (positive) value.
constexpr bool usable(int x) {
  return known(x) && x > 0;
}
constexpr bool group_limit_on(router::settings const& r) {
  return r.num_groups != 0 || r.group_top_k != 0;
}
constexpr bool finite_at_least(double x, double lo) {
  return x >= lo && x < 1e308;
}
constexpr bool finite_above(double x, double lo) {
  return x > lo && x < 1e308;
}
}  // namespace detail

/// R001
constexpr bool shape_sizes_valid(config_values const& v) {
  auto const& s = v.shape;
  return detail::positive_or_dynamic(s.hidden) && detail::positive_or_dynamic(s.ffn) &&
         detail::positive_or_dynamic(s.experts) && (s.shared_ffn == dynamic || s.shared_ffn >= 0);
}

/// R002
constexpr bool top_k_within_experts(config_values const& v) {
  if (!v.router) return true;
  int const k = v.router->top_k;
  return k >= 1 && (!detail::usable(v.shape.experts) || k <= v.shape.experts);
}

/// R003
constexpr bool ep_divides_experts(config_values const& v) {
  if (!detail::usable(v.parallel.ep) || !detail::usable(v.shape.experts)) return true;
  return v.shape.experts % v.parallel.ep == 0;
}

/// R004
constexpr bool groups_divide_experts(config_values const& v) {
  if (!v.router || !detail::group_limit_on(*v.router)) return true;
  int const g = v.router->num_groups;
  return g > 0 && (!detail::usable(v.shape.experts) || v.shape.experts % g == 0);
}

/// R005
constexpr bool group_top_k_within_groups(config_values const& v) {
  if (!v.router || !detail::group_limit_on(*v.router) || v.router->num_groups <= 0) return true;
  return v.router->group_top_k >= 1 && v.router->group_top_k <= v.router->num_groups;
}

/// R006
constexpr bool top_k_at_least_group_top_k(config_values const& v) {
  if (!v.router || !detail::group_limit_on(*v.router) || v.router->group_top_k < 1) return true;
  return v.router->top_k >= v.router->group_top_k;
}

/// R007
constexpr bool expert_bias_needs_sigmoid_family(config_values const& v) {
  if (!v.router || !v.router->expert_bias) return true;
  return v.router->score == router::score_function::sigmoid ||
         v.router->score == router::score_function::sqrtsoftplus;
}

/// R008
constexpr bool softmax_after_topk_needs_k_above_one(config_values const& v) {
  if (!v.router) return true;
  auto const& r = *v.router;
  return r.top_k != 1 || r.sinkhorn || r.score != router::score_function::softmax_after_topk;
}

/// R009
constexpr bool capacity_needs_compatible_balancing(config_values const& v) {
  return !v.router || !v.router->capacity_factor || !v.router->sinkhorn;
}

/// R010
constexpr bool pad_to_capacity_needs_capacity(config_values const& v) {
  return !v.router || !v.router->pad_to_capacity || v.router->capacity_factor.has_value();
}

/// R011
constexpr bool quantization_padding_matches_recipe(config_values const& v) {
  if (!v.router || !v.router->pad_for_quantization) return true;
  int const multiple = v.router->quantization_multiple;
  return precision::is_quantized(v.precision.recipe) &&
         (multiple == 0 || multiple == v.precision.padding_multiple);
}

/// R012
constexpr bool router_padding_not_with_all_gather(config_values const& v) {
  return !v.router || !v.router->pad_for_quantization ||
         v.dispatch != dispatch::dispatcher::all_gather;
}

/// R013
constexpr bool hierarchical_needs_expert_parallelism(config_values const& v) {
  if (v.dispatch != dispatch::dispatcher::hierarchical || !detail::usable(v.parallel.ep))
    return true;
  return v.parallel.ep > 1;
}

/// R032
constexpr bool hierarchical_needs_etp_one(config_values const& v) {
  return v.dispatch != dispatch::dispatcher::hierarchical || !detail::usable(v.parallel.etp) ||
         v.parallel.etp == 1;
}

/// R033 (shared_memory_overlap pulls rows of any ETP index, so only the all-to-all's pieces)
constexpr bool overlap_needs_etp_one(config_values const& v) {
  return v.overlap_chunks <= 1 || v.dispatch != dispatch::dispatcher::all_to_all ||
         !detail::usable(v.parallel.etp) || v.parallel.etp == 1;
}

/// R055 (codes made before the dispatch equal fc1's own only where the sender has all they depend
/// on: one per-tensor FP8 copy, or row-local blocks whose wgrad copy comes from the rowwise codes)
constexpr bool fp8_wire_needs_codes_made_at_source(config_values const& v) {
  if (!v.fp8_wire) return true;
  using precision::recipe_id;
  auto const r = v.precision.recipe;
  bool const per_tensor = r == recipe_id::fp8_delayed || r == recipe_id::fp8_current;
  bool const row_blocks =
      (r == recipe_id::mxfp8 || r == recipe_id::fp8_blockwise) && v.precision.wgrad_from_rowwise;
  return (per_tensor || row_blocks) && (!detail::usable(v.parallel.etp) || v.parallel.etp == 1);
}

/// R056
constexpr bool wgrad_from_rowwise_needs_row_blocks(config_values const& v) {
  using precision::recipe_id;
  return !v.precision.wgrad_from_rowwise || v.precision.recipe == recipe_id::mxfp8 ||
         v.precision.recipe == recipe_id::fp8_blockwise;
}

/// R014
constexpr bool expert_bias_linear_needs_etp_one(config_values const& v) {
  return !v.expert.bias || !detail::usable(v.parallel.etp) || v.parallel.etp == 1;
}

/// R015
constexpr bool shared_expert_width_positive(config_values const& v) {
  if (!v.expert.shared_expert_gate || !detail::known(v.shape.shared_ffn) || v.shape.shared_ffn < 0)
    return true;
  return v.shape.shared_ffn > 0;
}

/// R016
constexpr bool degrees_positive(parallel::degrees const& d) {
  return detail::positive_or_dynamic(d.tp) && detail::positive_or_dynamic(d.cp) &&
         detail::positive_or_dynamic(d.pp) && detail::positive_or_dynamic(d.etp) &&
         detail::positive_or_dynamic(d.ep);
}
constexpr bool degrees_positive(config_values const& v) {
  return degrees_positive(v.parallel);
}

/// R017
constexpr bool world_fits_attention_grid(parallel::degrees const& d, std::optional<int> world) {
  if (!world || !detail::usable(d.tp) || !detail::usable(d.cp) || !detail::usable(d.pp))
    return true;
  return *world > 0 && *world % (d.tp * d.cp * d.pp) == 0;
}
constexpr bool world_fits_attention_grid(config_values const& v) {
  return world_fits_attention_grid(v.parallel, v.world_size);
}

/// R018
constexpr bool world_fits_expert_grid(parallel::degrees const& d, std::optional<int> world) {
  if (!world || !detail::usable(d.etp) || !detail::usable(d.ep) || !detail::usable(d.pp))
    return true;
  return *world > 0 && *world % (d.etp * d.ep * d.pp) == 0;
}
constexpr bool world_fits_expert_grid(config_values const& v) {
  return world_fits_expert_grid(v.parallel, v.world_size);
}

/// R019
constexpr bool local_dispatch_needs_one_expert_rank(config_values const& v) {
  if (v.dispatch != dispatch::dispatcher::local) return true;
  auto const& d = v.parallel;
  return (!detail::usable(d.ep) || d.ep == 1) && (!detail::usable(d.etp) || d.etp == 1);
}

/// R025
constexpr bool sinkhorn_without_aux_losses(config_values const& v) {
  if (!v.router || !v.router->sinkhorn) return true;
  auto const& r = *v.router;
  return !r.aux_loss_coeff && !r.seq_aux_loss_coeff && !r.global_aux_loss_coeff;
}

/// R026
constexpr bool router_numbers_in_range(config_values const& v) {
  if (!v.router) return true;
  auto const& r = *v.router;
  auto coeff_ok = [](std::optional<double> c) { return !c || detail::finite_at_least(*c, 0.0); };
  return (!r.capacity_factor || detail::finite_above(*r.capacity_factor, 0.0)) &&
         (!r.topk_scaling_factor || detail::finite_above(*r.topk_scaling_factor, 0.0)) &&
         coeff_ok(r.aux_loss_coeff) && coeff_ok(r.seq_aux_loss_coeff) &&
         coeff_ok(r.global_aux_loss_coeff) && coeff_ok(r.z_loss_coeff) &&
         detail::finite_above(r.bias_update_rate, 0.0) && r.quantization_multiple >= 0 &&
         (!r.input_jitter_eps || (*r.input_jitter_eps >= 0.0 && *r.input_jitter_eps < 1.0));
}

/// R030
constexpr bool quantized_storage_needs_quantized_recipe(config_values const& v) {
  return (!v.memory.quantized_activations && !v.memory.quantized_weights) ||
         precision::is_quantized(v.precision.recipe);
}

/// R037: the tile units multiply BF16 values, which every bf16 / FP8 / FP4 operand is over its
/// per-tensor factor; fp32 and fp64 values are not.
constexpr bool bf16_backends_need_a_recipe(config_values const& v) {
  using precision::recipe_id;
  return (v.expert.backend != expert::gemm_backend::amx &&
          v.expert.backend != expert::gemm_backend::avx512_bf16) ||
         (v.precision.recipe != recipe_id::fp32 && v.precision.recipe != recipe_id::fp64);
}

/// R031
constexpr bool top_k_within_chosen_groups(config_values const& v) {
  if (!v.router || !detail::group_limit_on(*v.router)) return true;
  auto const& r = *v.router;
  int const g = r.num_groups;
  if (!detail::usable(v.shape.experts) || g <= 0 || v.shape.experts % g != 0 || r.group_top_k < 1 ||
      r.group_top_k > g)
    return true;
  return r.top_k <= r.group_top_k * (v.shape.experts / g);
}

/// R038
constexpr bool etp_divides_ffn(config_values const& v) {
  if (!detail::usable(v.parallel.etp) || !detail::usable(v.shape.ffn)) return true;
  return v.shape.ffn % v.parallel.etp == 0;
}

/// R039
constexpr bool model_sizes_valid(config_values const& v) {
  auto const& m = v.model;
  return detail::positive_or_dynamic(m.layers) && detail::positive_or_dynamic(m.heads) &&
         detail::positive_or_dynamic(m.query_groups) && detail::positive_or_dynamic(m.vocabulary) &&
         (m.dense_ffn == dynamic || m.dense_ffn >= 0) && m.vocab_multiple > 0 &&
         detail::finite_above(m.norm_epsilon, 0.0) && detail::finite_above(m.rope_base, 0.0);
}

/// R057 (MLA's sizes; its heads are its own, no groups; qk_layernorm norms its latents)
constexpr bool mla_sizes_valid(config_values const& v) {
  auto const& m = v.model;
  auto const& a = m.mla;
  if (a == model::mla_settings{}) return true;
  bool const groups =
      !detail::usable(m.query_groups) || !detail::usable(m.heads) || m.query_groups == m.heads;
  return a.kv_lora_rank > 0 && a.q_lora_rank >= 0 && a.qk_head_dim > 0 && a.v_head_dim > 0 &&
         a.qk_pos_emb_head_dim > 0 && a.qk_pos_emb_head_dim % 2 == 0 && groups;
}

/// R058 (multi-token prediction: its depths and loss scale)
constexpr bool mtp_valid(config_values const& v) {
  auto const& m = v.model;
  if (m.mtp_num_layers == 0) return true;
  return m.mtp_num_layers > 0 && detail::finite_at_least(m.mtp_loss_scaling_factor, 0.0);
}

/// R040 (the head size of grouped-query attention; MLA sizes its heads itself)
constexpr bool heads_divide_hidden(config_values const& v) {
  if (v.model.mla.enabled()) return true;
  if (!detail::usable(v.model.heads) || !detail::usable(v.shape.hidden)) return true;
  return v.shape.hidden % v.model.heads == 0;
}

/// R041
constexpr bool head_size_even(config_values const& v) {
  if (v.model.mla.enabled()) return true;
  if (!heads_divide_hidden(v) || !detail::usable(v.model.heads) || !detail::usable(v.shape.hidden))
    return true;
  return (v.shape.hidden / v.model.heads) % 2 == 0;
}

/// R042
constexpr bool query_groups_divide_heads(config_values const& v) {
  if (!detail::usable(v.model.query_groups) || !detail::usable(v.model.heads)) return true;
  return v.model.heads % v.model.query_groups == 0;
}

/// R044
constexpr bool dense_ffn_for_dense_layers(config_values const& v) {
  auto const& m = v.model;
  if (m.dense_ffn == dynamic || m.dense_ffn < 0) return true;
  return m.dense_ffn > 0 || !m.has_dense_layer();
}

/// R045
constexpr bool moe_layer_pattern_valid(config_values const& v) {
  auto const& p = v.model.moe_layers;
  if (!p.is_list()) return p.every == dynamic || p.every > 0;
  if (p.length > model::max_pattern_layers) return false;
  for (int i = 0; i < p.length; ++i)
    if (p.moe[static_cast<std::size_t>(i)] != 0 && p.moe[static_cast<std::size_t>(i)] != 1)
      return false;
  return !detail::usable(v.model.layers) || p.length == v.model.layers;
}

/// R047
constexpr bool tp_divides_query_groups(config_values const& v) {
  if (!detail::usable(v.parallel.tp) || !detail::usable(v.model.query_groups)) return true;
  return v.model.query_groups % v.parallel.tp == 0;
}

/// R048
constexpr bool tp_divides_dense_ffn(config_values const& v) {
  auto const& m = v.model;
  if (!detail::usable(v.parallel.tp) || !detail::usable(m.dense_ffn) || !m.has_dense_layer())
    return true;
  return m.dense_ffn % v.parallel.tp == 0;
}

/// Whether every size of the model slot is known (the transformer's part of R027).
constexpr bool model_resolved(model::settings const& m) {
  return detail::known(m.layers) && detail::known(m.heads) && detail::known(m.query_groups) &&
         detail::known(m.vocabulary) && detail::known(m.dense_ffn) &&
         (m.moe_layers.is_list() || detail::known(m.moe_layers.every));
}

/// R027, for the degrees alone.
constexpr bool degrees_resolved(parallel::degrees const& d) {
  return detail::known(d.tp) && detail::known(d.cp) && detail::known(d.pp) &&
         detail::known(d.etp) && detail::known(d.ep);
}
/// R027
constexpr bool values_resolved(config_values const& v) {
  auto const& s = v.shape;
  return v.router.has_value() && detail::known(s.hidden) && detail::known(s.ffn) &&
         detail::known(s.experts) && detail::known(s.shared_ffn) && degrees_resolved(v.parallel);
}

/// A rule that reads configuration values: its id and its predicate.
struct value_rule {
  rules::id which;
  bool (*holds)(config_values const&);
};

/// Every value rule, in id order; the start-up check runs all of them.
inline constexpr std::array<value_rule, 40> value_rules{{
    {id::shape_sizes_valid, shape_sizes_valid},
    {id::top_k_within_experts, top_k_within_experts},
    {id::ep_divides_experts, ep_divides_experts},
    {id::groups_divide_experts, groups_divide_experts},
    {id::group_top_k_within_groups, group_top_k_within_groups},
    {id::top_k_at_least_group_top_k, top_k_at_least_group_top_k},
    {id::expert_bias_needs_sigmoid_family, expert_bias_needs_sigmoid_family},
    {id::softmax_after_topk_needs_k_above_one, softmax_after_topk_needs_k_above_one},
    {id::capacity_needs_compatible_balancing, capacity_needs_compatible_balancing},
    {id::pad_to_capacity_needs_capacity, pad_to_capacity_needs_capacity},
    {id::quantization_padding_matches_recipe, quantization_padding_matches_recipe},
    {id::router_padding_not_with_all_gather, router_padding_not_with_all_gather},
    {id::hierarchical_needs_expert_parallelism, hierarchical_needs_expert_parallelism},
    {id::expert_bias_linear_needs_etp_one, expert_bias_linear_needs_etp_one},
    {id::shared_expert_width_positive, shared_expert_width_positive},
    {id::degrees_positive, degrees_positive},
    {id::world_fits_attention_grid, world_fits_attention_grid},
    {id::world_fits_expert_grid, world_fits_expert_grid},
    {id::local_dispatch_needs_one_expert_rank, local_dispatch_needs_one_expert_rank},
    {id::sinkhorn_without_aux_losses, sinkhorn_without_aux_losses},
    {id::router_numbers_in_range, router_numbers_in_range},
    {id::values_resolved, values_resolved},
    {id::quantized_storage_needs_quantized_recipe, quantized_storage_needs_quantized_recipe},
    {id::top_k_within_chosen_groups, top_k_within_chosen_groups},
    {id::hierarchical_needs_etp_one, hierarchical_needs_etp_one},
    {id::overlap_needs_etp_one, overlap_needs_etp_one},
    {id::fp8_wire_needs_codes_made_at_source, fp8_wire_needs_codes_made_at_source},
    {id::wgrad_from_rowwise_needs_row_blocks, wgrad_from_rowwise_needs_row_blocks},
    {id::bf16_backends_need_a_recipe, bf16_backends_need_a_recipe},
    {id::etp_divides_ffn, etp_divides_ffn},
    {id::model_sizes_valid, model_sizes_valid},
    {id::mla_sizes_valid, mla_sizes_valid},
    {id::mtp_valid, mtp_valid},
    {id::heads_divide_hidden, heads_divide_hidden},
    {id::head_size_even, head_size_even},
    {id::query_groups_divide_heads, query_groups_divide_heads},
    {id::dense_ffn_for_dense_layers, dense_ffn_for_dense_layers},
    {id::moe_layer_pattern_valid, moe_layer_pattern_valid},
    {id::tp_divides_query_groups, tp_divides_query_groups},
    {id::tp_divides_dense_ffn, tp_divides_dense_ffn},
}};

/// The ids of every broken rule, in id order (empty when the values are valid).
inline std::vector<int> broken(config_values const& v) {
  std::vector<int> ids;
  for (auto const& r : value_rules)
    if (!r.holds(v)) ids.push_back(static_cast<int>(r.which));
  return ids;
}

/// Start-up check: throws `config_error` for the first broken rule, naming any others too.
inline void require_valid(config_values const& v) {
  auto const ids = broken(v);
  if (ids.empty()) return;
  std::string details;
  for (std::size_t i = 1; i < ids.size(); ++i) {
    details += (i == 1 ? "also broken: " : "; ");
    details += rule(ids[i]).message;
  }
  throw config_error(static_cast<id>(ids.front()), details);
}

/// Compile-time check of a configuration type; `static_assert(megamoe::rules::check<C>())`.
/// Every rule that the type's fixed values can break is a static_assert here with its id; values
/// left to start-up are checked by `require_valid` with the same predicates.
template <class C>
consteval bool check() {
  static_assert(
      requires { requires shape_policy<typename C::shape>; }, MEGAMOE_RULE_R022 " [slot: shape]");
  static_assert(
      requires { requires router_policy<typename C::router>; },
      MEGAMOE_RULE_R022 " [slot: router]");
  static_assert(
      requires { requires dispatch_policy<typename C::dispatch>; },
      MEGAMOE_RULE_R022 " [slot: dispatch]");
  static_assert(
      requires { requires expert_policy<typename C::expert>; },
      MEGAMOE_RULE_R022 " [slot: expert]");
  static_assert(
      requires { requires precision_recipe<typename C::precision>; },
      MEGAMOE_RULE_R022 " [slot: precision]");
  static_assert(
      requires { requires parallel_mapping<typename C::parallel>; },
      MEGAMOE_RULE_R022 " [slot: parallel]");
  static_assert(
      requires { requires memory_policy<typename C::memory>; },
      MEGAMOE_RULE_R022 " [slot: memory]");
  static_assert(
      requires { requires model_policy<typename C::model>; }, MEGAMOE_RULE_R022 " [slot: model]");
  if constexpr (training_config<C>) {
    constexpr config_values v = values_of<C>();
    static_assert(shape_sizes_valid(v), MEGAMOE_RULE_R001);
    static_assert(top_k_within_experts(v), MEGAMOE_RULE_R002);
    static_assert(ep_divides_experts(v), MEGAMOE_RULE_R003);
    static_assert(groups_divide_experts(v), MEGAMOE_RULE_R004);
    static_assert(group_top_k_within_groups(v), MEGAMOE_RULE_R005);
    static_assert(top_k_at_least_group_top_k(v), MEGAMOE_RULE_R006);
    static_assert(expert_bias_needs_sigmoid_family(v), MEGAMOE_RULE_R007);
    static_assert(softmax_after_topk_needs_k_above_one(v), MEGAMOE_RULE_R008);
    static_assert(capacity_needs_compatible_balancing(v), MEGAMOE_RULE_R009);
    static_assert(pad_to_capacity_needs_capacity(v), MEGAMOE_RULE_R010);
    static_assert(quantization_padding_matches_recipe(v), MEGAMOE_RULE_R011);
    static_assert(router_padding_not_with_all_gather(v), MEGAMOE_RULE_R012);
    static_assert(hierarchical_needs_expert_parallelism(v), MEGAMOE_RULE_R013);
    static_assert(expert_bias_linear_needs_etp_one(v), MEGAMOE_RULE_R014);
    static_assert(shared_expert_width_positive(v), MEGAMOE_RULE_R015);
    static_assert(degrees_positive(v), MEGAMOE_RULE_R016);
    static_assert(local_dispatch_needs_one_expert_rank(v), MEGAMOE_RULE_R019);
    static_assert(sinkhorn_without_aux_losses(v), MEGAMOE_RULE_R025);
    static_assert(router_numbers_in_range(v), MEGAMOE_RULE_R026);
    static_assert(quantized_storage_needs_quantized_recipe(v), MEGAMOE_RULE_R030);
    static_assert(top_k_within_chosen_groups(v), MEGAMOE_RULE_R031);
    static_assert(hierarchical_needs_etp_one(v), MEGAMOE_RULE_R032);
    static_assert(overlap_needs_etp_one(v), MEGAMOE_RULE_R033);
    static_assert(wgrad_from_rowwise_needs_row_blocks(v), MEGAMOE_RULE_R056);
    static_assert(fp8_wire_needs_codes_made_at_source(v), MEGAMOE_RULE_R055);
    static_assert(bf16_backends_need_a_recipe(v), MEGAMOE_RULE_R037);
    static_assert(etp_divides_ffn(v), MEGAMOE_RULE_R038);
    static_assert(model_sizes_valid(v), MEGAMOE_RULE_R039);
    static_assert(mla_sizes_valid(v), MEGAMOE_RULE_R057);
    static_assert(mtp_valid(v), MEGAMOE_RULE_R058);
    static_assert(heads_divide_hidden(v), MEGAMOE_RULE_R040);
    static_assert(head_size_even(v), MEGAMOE_RULE_R041);
    static_assert(query_groups_divide_heads(v), MEGAMOE_RULE_R042);
    static_assert(dense_ffn_for_dense_layers(v), MEGAMOE_RULE_R044);
    static_assert(moe_layer_pattern_valid(v), MEGAMOE_RULE_R045);
    static_assert(tp_divides_query_groups(v), MEGAMOE_RULE_R047);
    static_assert(tp_divides_dense_ffn(v), MEGAMOE_RULE_R048);
  }
  return true;
}

}  // namespace megamoe::rules
