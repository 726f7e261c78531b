// SPDX-License-Identifier: Apache-2.0
// megamoe/router/router.hpp — the top-k router: gating, scores and top-k (or Sinkhorn), capacity,
// the attached losses and the expert-bias counts, forward and backward.
//
//   megamoe::router::topk_router<float> router(settings, num_experts);
//   auto const& out = router.route(logits, {.seq_length = S, .micro_batch_size = B});
//   auto const& grad_logits = router.backward(grad_probs, backward_scale);
//   router.state().finish_global_batch(groups);          // once per global batch
//
// L is the router dtype (logits, probs, their gradients); S is the type the score functions use,
// fp32 as in the reference, or fp64 to run the whole router in double for finite differences. The
// order of operations is the reference's (docs/spec: z-loss, scores and top-k, capacity, aux
// losses, expert-bias counts). The per-token loops run under a `route_plan` fixed at compile time:
// a router of a static policy (`router_of<R>`, `make_router`) carries it in its type; the run-time
// router (`Plan = plan_per_call`) picks it once per call from its settings. Buffers are reused
// across calls: nothing is allocated per token.
#pragma once

#include <megamoe/config/rules.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/policy/error.hpp>
#include <megamoe/router/capacity.hpp>
#include <megamoe/router/expert_bias.hpp>
#include <megamoe/router/gating.hpp>
#include <megamoe/router/groups.hpp>
#include <megamoe/router/losses.hpp>
#include <megamoe/router/output.hpp>
#include <megamoe/router/plan.hpp>
#include <megamoe/router/sinkhorn.hpp>
#include <megamoe/router/tags.hpp>
#include <megamoe/router/top_k.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace megamoe::router {

/// Checks router settings for `num_experts` experts with the configuration rules (same ids as the
/// compile-time check); throws `config_error`.
inline void require_valid_router(settings const& s, int num_experts) {
  config_values v;
  v.shape = {.hidden = 1, .ffn = 1, .experts = num_experts, .shared_ffn = 0};
  v.router = s;
  // Router-side padding is checked against the recipe by the configuration, not here.
  v.router->pad_for_quantization = false;
  rules::require_valid(v);
}

/// A router that picks its plan once per call from its settings (the run-time router).
struct plan_per_call {};
/// A router whose plan is fixed in its type (a static router policy's).
template <route_plan P>
struct fixed_plan {
  static constexpr route_plan value = P;
};

// What a router's forward keeps for its backward (core/stash.hpp), in logits L and scores S; the
// stashes of the element types the recipes use are compiled once (router/router.ipp).
#define MEGAMOE_ROUTER_STASH(L, S)                                                                \
  ::megamoe::activation_stash<                                                                    \
      ::megamoe::router::routing_output<L>, ::megamoe::router::topk_selection<L, S>,              \
      ::megamoe::router::sinkhorn_selection<L, S>, ::megamoe::router::attached_losses<L, S>, int, \
      ::megamoe::router::batch_shape, bool, bool, bool, bool, bool, std::vector<std::uint8_t>,    \
      ::megamoe::row_matrix<L>, ::megamoe::row_matrix<float>, ::megamoe::mask_matrix,             \
      std::vector<int>>
template <class L, class S>
using router_stash = MEGAMOE_ROUTER_STASH(L, S);

template <class L = float, class S = float, class Plan = plan_per_call>
class topk_router {
 public:
  using logit_type = L;
  using score_type = S;
  /// True when the plan is part of the type (no choice at all at run time).
  static constexpr bool plan_in_type = !std::is_same_v<Plan, plan_per_call>;

  /// `padding_multiple`: the precision recipe's multiple for `pad_for_quantization` when the
  /// settings leave it 0. `jitter_seed` seeds input jitter. A router with its plan in the type
  /// takes only settings of that plan.
  topk_router(settings const& config, int num_experts, int padding_multiple = 0,
              std::uint64_t jitter_seed = 0x6d656761u)
      : config_(config), experts_(num_experts), jitter_seed_(jitter_seed) {
    require_valid_router(config, num_experts);
    if constexpr (plan_in_type) {
      if (!(plan_of(config, true) == Plan::value))
        throw input_error(
            "router: these settings need another routing plan than the one this router type "
            "fixes (score function, Sinkhorn, group limits, expert bias, k > 1, capacity)");
    }
    if ((config.dtype == logits_dtype::fp64) != std::is_same_v<L, double>)
      throw input_error(std::string("router dtype is ") +
                        (config.dtype == logits_dtype::fp64 ? "fp64" : "fp32") +
                        " but this router computes its logits in " +
                        (std::is_same_v<L, double> ? "double" : "float"));
    padding_multiple_ =
        config.quantization_multiple != 0 ? config.quantization_multiple : padding_multiple;
    if (config.pad_for_quantization && padding_multiple_ <= 0)
      throw config_error(rules::id::quantization_padding_matches_recipe,
                         "pass the precision recipe's padding multiple to the router");
    state_.bias_update_rate = static_cast<float>(config.bias_update_rate);
    if (config.expert_bias) {
      state_.expert_bias.assign(static_cast<std::size_t>(num_experts), 0.0F);
      state_.local_tokens_per_expert.assign(static_cast<std::size_t>(num_experts), 0.0);
    }
    state_.global_tokens_per_expert.assign(static_cast<std::size_t>(num_experts), 0.0);
  }

  [[nodiscard]] settings const& config() const noexcept { return config_; }
  /// The multiple pad_for_quantization rounds each expert's token count up to.
  [[nodiscard]] int padding_multiple() const noexcept { return padding_multiple_; }
  [[nodiscard]] int num_experts() const noexcept { return experts_; }
  [[nodiscard]] router_state& state() noexcept { return state_; }
  [[nodiscard]] router_state const& state() const noexcept { return state_; }
  [[nodiscard]] routing_output<L> const& output() const noexcept { return out_; }

  /// Sets micro-batch `key`'s routing and what its backward reads aside (core/stash.hpp), or
  /// brings them back; the router's state (expert bias, counts) stays.
  void park(std::uint64_t key) {
    stash_.park(key, out_, topk_, sinkhorn_, losses_, tokens_, batch_, has_mask_, z_active_,
                aux_active_, gated_, jittered_, valid_, logits_, jitter_, kept_, order_);
  }
  void restore(std::uint64_t key) {
    stash_.restore(key, out_, topk_, sinkhorn_, losses_, tokens_, batch_, has_mask_, z_active_,
                   aux_active_, gated_, jittered_, valid_, logits_, jitter_, kept_, order_);
  }
  /// The logits [T,E] of the last route (after gating and jitter when routed from the input).
  [[nodiscard]] row_matrix<L> const& logits() const noexcept { return logits_; }
  /// The aux losses' own scores [T,E] and top-k map of the last training forward (padding rows 0).
  [[nodiscard]] row_matrix<S> const& aux_scores() const noexcept { return losses_.aux_scores(); }
  [[nodiscard]] mask_matrix const& aux_routing_map() const noexcept {
    return losses_.aux_routing_map();
  }

  /// Routes from the logits [T,E] (the gating output). T must equal S*B.
  template <count_group TpCp = one_rank, count_group TpDpCp = one_rank>
  routing_output<L> const& route(Eigen::Ref<row_matrix<L> const> logits, batch_shape batch,
                                 route_options const& options = {},
                                 reduction_groups<TpCp, TpDpCp> const& groups = {}) {
    logits_ = logits;
    gated_ = false;
    return route_logits(batch, options, groups);
  }

  /// Routes from the router input x [T,H] and the gating weight W [E,H]: jitter (training), then
  /// z = x W^T in L, then as `route`. The router keeps no copy of x; the backward takes it again.
  template <class X, class W, count_group TpCp = one_rank, count_group TpDpCp = one_rank>
  routing_output<L> const& route(Eigen::MatrixBase<X> const& hidden,
                                 Eigen::MatrixBase<W> const& weight, batch_shape batch,
                                 route_options const& options = {},
                                 reduction_groups<TpCp, TpDpCp> const& groups = {}) {
    if (weight.rows() != experts_ || weight.cols() != hidden.cols()) {
      // Reported through route_logits, so that every rank of a reduction group hears of it.
      logits_.resize(0, experts_);
      gated_ = false;
      return route_logits(batch, options, groups,
                          "router weight has shape " +
                              detail::shape_text(weight.rows(), weight.cols()) + ", expected " +
                              detail::shape_text(experts_, hidden.cols()) +
                              " (num_moe_experts x the input's hidden size)");
    }
    jittered_ =
        config_.input_jitter_eps && *config_.input_jitter_eps > 0.0 && options.mode != pass::eval;
    if (jittered_) {
      jitter_.resize(hidden.rows(), hidden.cols());
      fill_jitter(options.jitter_key);
      gating_forward<L>(jittered(hidden), weight, logits_);
    } else {
      gating_forward<L>(hidden, weight, logits_);
    }
    gated_ = true;
    return route_logits(batch, options, groups);
  }

  /// Gradient of (sum(grad_probs .* probs) + backward_scale * every attached loss) with respect to
  /// the logits of the last `route`.
  row_matrix<L> const& backward(Eigen::Ref<row_matrix<L> const> grad_probs,
                                double backward_scale = 1.0, gradient_terms terms = {}) {
    require_shape(grad_probs, tokens_, experts_, "gradient of the router probs");
    grad_logits_.setZero(tokens_, experts_);
    planned([&]<route_plan P>() {
      if (terms.objective) {
        if constexpr (P.sinkhorn) {
          sinkhorn_.template backward<P>(grad_probs, out_.topk_indices, kept_, grad_logits_);
        } else {
          topk_.template backward<P>(logits_, grad_probs, out_.topk_indices, kept_, config_,
                                     grad_logits_);
        }
      }
      if (aux_active_)
        losses_.template backward_aux<P>(logits_, valid_, batch_, backward_scale, terms,
                                         grad_logits_);
    });
    if (z_active_ && terms.z_loss)
      losses_.backward_z(logits_, valid_, backward_scale, grad_logits_);
    return grad_logits_;
  }

  /// As `backward`, then through the gating linear (and the jitter) of the last `route` from x,
  /// given the same x [T,H] and W [E,H] again: grad_hidden [T,H] and grad_weight [E,H].
  template <class X, class W, class GX, class GW>
  void backward(Eigen::Ref<row_matrix<L> const> grad_probs, double backward_scale,
                Eigen::MatrixBase<X> const& hidden, Eigen::MatrixBase<W> const& weight,
                GX& grad_hidden, GW& grad_weight) {
    if (!gated_) throw input_error("router backward to the input needs a route() from the input");
    require_shape(hidden, tokens_, weight.cols(), "router input given to backward");
    require_shape(weight, experts_, hidden.cols(), "router weight given to backward");
    backward(grad_probs, backward_scale);
    if (jittered_) {
      gating_backward<L>(grad_logits_, jittered(hidden), weight, grad_hidden, grad_weight);
      grad_hidden.array() *= jitter_.template cast<typename GX::Scalar>().array();
    } else {
      gating_backward<L>(grad_logits_, hidden, weight, grad_hidden, grad_weight);
    }
  }

 private:
  bool training_like(route_options const& o) const { return o.mode != pass::eval; }

  /// Calls f.template operator()<P>() with this router's plan: the type's, or the settings' (one
  /// switch per call).
  template <class F>
  decltype(auto) planned(F&& f) {
    if constexpr (plan_in_type) {
      return std::forward<F>(f).template operator()<Plan::value>();
    } else {
      return with_plan(config_, std::forward<F>(f));
    }
  }

  /// x * u elementwise in x's type (the reference's rsample), as an expression.
  template <class X>
  auto jittered(Eigen::MatrixBase<X> const& hidden) const {
    return (hidden.array() * jitter_.template cast<typename X::Scalar>().array()).matrix();
  }

  template <class TpCp, class TpDpCp>
  routing_output<L> const& route_logits(batch_shape batch, route_options const& options,
                                        reduction_groups<TpCp, TpDpCp> const& groups,
                                        std::optional<std::string> earlier_error = std::nullopt) {
    tokens_ = static_cast<int>(logits_.rows());
    int const T = tokens_, E = experts_, k = config_.top_k;
    // With reductions over other ranks ahead, an input error must end the call on every rank of
    // the group, not leave the others waiting in a collective: the ranks agree first.
    bool const collective = training_like(options) && any_aux_loss(config_) &&
                            (groups.tp_cp.size() > 1 || groups.tp_dp_cp.size() > 1);
    auto const error = earlier_error ? earlier_error : input_problem(batch, options);
    if (collective) {
      agree_on_input(error, batch, groups);
    } else if (error) {
      throw input_error(*error);
    }
    batch_ = batch;
    valid_.assign(static_cast<std::size_t>(T), 1);
    int valid_tokens = T;
    for (std::size_t t = 0; t < options.padding_mask.size(); ++t)
      if (options.padding_mask[t]) {
        valid_[t] = 0;
        --valid_tokens;
      }
    has_mask_ = !options.padding_mask.empty();

    out_.losses = {};
    out_.topk_indices.resize(T, k);
    out_.topk_probs.resize(T, k);
    out_.probs.setZero(T, E);
    out_.routing_map.setZero(T, E);
    kept_.resize(T, k);

    // 1. z-loss on the logits.
    z_active_ = config_.z_loss_coeff.has_value() && training_like(options);
    if (z_active_)
      losses_.forward_z(logits_, valid_, valid_tokens, *config_.z_loss_coeff, groups.tp_cp.size(),
                        out_.losses);

    planned([&]<route_plan P>() {
      // 2. Scores and top-k.
      if constexpr (P.sinkhorn) {
        sinkhorn_.template forward<P>(logits_, k, options.mode, out_.topk_indices, out_.topk_probs);
      } else {
        topk_.template forward<P>(logits_, state_.expert_bias, config_, out_.topk_indices,
                                  out_.topk_probs);
      }
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < k; ++i) {
          int const e = out_.topk_indices(t, i);
          out_.probs(t, e) = out_.topk_probs(t, i);
          out_.routing_map(t, e) = 1;
        }

      // 3. Capacity.
      out_.capacity = 0;
      if constexpr (P.capacity == capacity_choice::on) {
        apply_router_capacity();
      } else if constexpr (P.capacity == capacity_choice::per_call) {
        if (config_.capacity_factor) apply_router_capacity();
      }
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < k; ++i) kept_(t, i) = out_.routing_map(t, out_.topk_indices(t, i));

      // 4. Aux losses (own scores and top-k; groups, bias and capacity ignored).
      aux_active_ = training_like(options) && any_aux_loss(config_);
      if (aux_active_)
        losses_.template forward_aux<P>(logits_, valid_, has_mask_, batch_, config_, options.mode,
                                        groups, state_, out_.losses);
    });

    // 5. Expert-bias counts from the final map, once per training forward.
    if (config_.expert_bias && options.mode == pass::training)
      for (int t = 0; t < T; ++t)
        if (valid_[static_cast<std::size_t>(t)])
          for (int e = 0; e < E; ++e)
            state_.local_tokens_per_expert[static_cast<std::size_t>(e)] += out_.routing_map(t, e);

    // Router-side padding for quantized experts (the dispatcher's first step in the reference).
    if (config_.pad_for_quantization) pad_routing_map(out_.routing_map, padding_multiple_);

    out_.tokens_per_expert.assign(static_cast<std::size_t>(E), 0);
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e)
        out_.tokens_per_expert[static_cast<std::size_t>(e)] += out_.routing_map(t, e);
    return out_;
  }

  void apply_router_capacity() {
    out_.capacity =
        apply_capacity(out_.probs, out_.routing_map, config_.top_k, *config_.capacity_factor,
                       config_.token_drop_policy, config_.pad_to_capacity, order_);
  }

  /// What is wrong with this call's input, if anything.
  std::optional<std::string> input_problem(batch_shape batch, route_options const& options) const {
    int const T = static_cast<int>(logits_.rows()), E = experts_;
    if (logits_.cols() != E)
      return "router logits have shape " + detail::shape_text(logits_.rows(), logits_.cols()) +
             ", expected [T, " + std::to_string(E) + "] (E = num_moe_experts)";
    if (batch.micro_batch_size < 1 || batch.seq_length < 0 ||
        static_cast<long>(batch.seq_length) * batch.micro_batch_size != T)
      return "router logits have " + std::to_string(T) + " tokens but the batch is " +
             std::to_string(batch.seq_length) + " positions x " +
             std::to_string(batch.micro_batch_size) + " sequences";
    if (!options.padding_mask.empty() && static_cast<int>(options.padding_mask.size()) != T)
      return "router padding mask has " + std::to_string(options.padding_mask.size()) +
             " entries, expected T = " + std::to_string(T);
    for (Eigen::Index i = 0; i < logits_.size(); ++i)
      if (!std::isfinite(logits_.data()[i]))
        return "router logits " + detail::shape_text(T, E) + " hold a non-finite value at token " +
               std::to_string(i / E) + ", expert " + std::to_string(i % E);
    return std::nullopt;
  }

  /// One small sum over the widest reduction group: whether any rank's input is bad, and whether
  /// all agree on E and B (the sizes of the count vectors they are about to reduce). Throws the
  /// same kind of error on every rank of the group.
  template <class TpCp, class TpDpCp>
  void agree_on_input(std::optional<std::string> const& error, batch_shape batch,
                      reduction_groups<TpCp, TpDpCp> const& groups) const {
    double const e = experts_, b = batch.micro_batch_size;
    std::array<double, 5> v{error ? 1.0 : 0.0, e, e * e, b, b * b};
    bool const wide = groups.tp_dp_cp.size() > 1;
    double const n = wide ? groups.tp_dp_cp.size() : groups.tp_cp.size();
    if (wide) {
      groups.tp_dp_cp.sum(v);
    } else {
      groups.tp_cp.sum(v);
    }
    if (v[0] > 0.0)
      throw input_error(error ? *error
                              : std::string("router input rejected on ") +
                                    std::to_string(static_cast<int>(v[0])) +
                                    " other rank(s) of this rank's reduction group (their error "
                                    "names it)");
    if (v[1] != n * e || v[2] != n * e * e)
      throw input_error("router: the ranks of a reduction group disagree on num_moe_experts");
    if (v[3] != n * b || v[4] != n * b * b)
      throw input_error("router: the ranks of a reduction group disagree on micro_batch_size");
  }

  void fill_jitter(std::uint64_t key) {
    // splitmix64 of (seed, key, element): reproducible, independent of threads and platform.
    double const eps = *config_.input_jitter_eps;
    std::uint64_t const base = splitmix64(jitter_seed_ ^ splitmix64(key));
    for (Eigen::Index i = 0; i < jitter_.size(); ++i) {
      double const u = static_cast<double>(splitmix64(base + static_cast<std::uint64_t>(i)) >> 11) *
                       0x1.0p-53;  // [0, 1)
      jitter_.data()[i] = static_cast<float>(1.0 - eps + 2.0 * eps * u);
    }
  }

  settings config_;
  int experts_;
  int padding_multiple_ = 0;
  std::uint64_t jitter_seed_;
  router_state state_;
  routing_output<L> out_;
  topk_selection<L, S> topk_;
  sinkhorn_selection<L, S> sinkhorn_;
  attached_losses<L, S> losses_;

  // Saved by the forward for the backward; reused across calls.
  int tokens_ = 0;
  batch_shape batch_{};
  bool has_mask_ = false, z_active_ = false, aux_active_ = false, gated_ = false, jittered_ = false;
  std::vector<std::uint8_t> valid_;
  row_matrix<L> logits_, grad_logits_;
  row_matrix<float> jitter_;
  mask_matrix kept_;
  std::vector<int> order_;
  router_stash<L, S> stash_;
};

/// The logits type of a router dtype.
template <logits_dtype D>
using logits_type = std::conditional_t<D == logits_dtype::fp64, double, float>;

namespace detail {
template <class R, class L, class S>
struct router_class {
  using type = topk_router<L, S>;  // router::runtime: the plan is picked per call
};
template <static_router_policy R, class L, class S>
struct router_class<R, L, S> {
  using type = topk_router<L, S, fixed_plan<plan_of(R::value, true)>>;
};
}  // namespace detail

/// The router class of policy R computing logits in L and scores in S: a static policy's plan is
/// in the type; router::runtime picks its plan per call.
template <class R, class L, class S = float>
using router_class_t = typename detail::router_class<R, L, S>::type;

/// The router class of a static router policy, in the policy's own dtype.
template <static_router_policy R>
using router_of = router_class_t<R, logits_type<R::value.dtype>>;

/// The router of static policy R for `num_experts` experts.
template <static_router_policy R>
router_of<R> make_router(int num_experts, int padding_multiple = 0) {
  return router_of<R>(R::value, num_experts, padding_multiple);
}

/// The router of configuration C (its experts and its recipe's padding multiple).
template <training_config C>
  requires static_router_policy<typename C::router> router_of<typename C::router> make_router() {
    static_assert(C::shape::value.experts != dynamic,
                  "make_router<C>(): experts are left to start-up; use make_router<R>(experts)");
    return make_router<typename C::router>(C::shape::value.experts,
                                           C::precision::value.padding_multiple);
  }

}  // namespace megamoe::router

#if !MEGAMOE_HEADER_ONLY
namespace megamoe {
extern template class MEGAMOE_ROUTER_STASH(float, float);
extern template class MEGAMOE_ROUTER_STASH(double, float);
extern template class MEGAMOE_ROUTER_STASH(double, double);
}  // namespace megamoe
#endif

#if MEGAMOE_HEADER_ONLY
#include <megamoe/router/router.ipp>
#endif
