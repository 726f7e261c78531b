// SPDX-License-Identifier: Apache-2.0
// megamoe/router/router.hpp — the top-k router: gating, scores, top-k, group limits, expert bias,
// Sinkhorn, capacity, load-balancing and z losses, forward and backward.
//
//   megamoe::router::topk_router<float> router(settings, num_experts);
//   auto const& out = router.route(logits, {.seq_length = S, .micro_batch_size = B});
//   auto const& grad_logits = router.backward(grad_probs, backward_scale);
//   router.state().finish_global_batch(groups);          // once per global batch
//
// L is the router dtype (logits, probs, their gradients); S is the type the score functions use,
// fp32 as in the reference, or fp64 to run the whole router in double for finite differences. A
// static policy and a run-time router are the same class, built from `router::settings`; the
// order of operations is the reference's (docs/spec: z-loss, scores and top-k, capacity, aux
// losses, expert-bias counts). Buffers are reused across calls: nothing is allocated per token.
#pragma once

#include <megamoe/config/rules.hpp>
#include <megamoe/config/error.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/router/capacity.hpp>
#include <megamoe/router/gating.hpp>
#include <megamoe/router/groups.hpp>
#include <megamoe/router/kernels.hpp>
#include <megamoe/router/tags.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace megamoe::router {

/// Which forward this is. `recompute` repeats a training forward (activation recomputation): same
/// results, but counts and running averages are not accumulated a second time. `eval` routes
/// without losses, bias counting, jitter or Sinkhorn.
enum class pass { training, recompute, eval };

/// The micro-batch: S positions of B sequences, T = S*B tokens in the order t = s*B + b.
struct batch_shape {
  int seq_length = 0;
  int micro_batch_size = 1;
};

/// Per-call inputs besides the logits.
struct route_options {
  pass mode = pass::training;
  /// [T] (1 = padding token), or empty. Padding tokens are routed but excluded from counts,
  /// losses and bias statistics.
  std::span<std::uint8_t const> padding_mask{};
  /// Makes input jitter reproducible: the noise is a function of (jitter seed, this key, element).
  /// A recompute must pass the key of the forward it repeats.
  std::uint64_t jitter_key = 0;
};

/// A loss attached to the router: `value` is coefficient-scaled (it enters the gradient),
/// `unscaled` is what is logged (value / coefficient).
struct attached_loss {
  double value = 0.0;
  double unscaled = 0.0;
};

struct loss_values {
  std::optional<attached_loss> aux_loss, seq_aux_loss, global_aux_loss, z_loss;
};

/// What a dispatcher needs from routing, as the reference gives it.
template <class L>
struct routing_output {
  row_matrix<L> probs;                          // [T,E] routing weights, 0 where not routed
  mask_matrix routing_map;                      // [T,E] selection, incl. prob-0 fillers
  std::vector<std::int64_t> tokens_per_expert;  // [E] = routing_map column sums
  row_matrix<L> topk_probs;                     // [T,k] dense view, before capacity dropping
  row_matrix<int> topk_indices;                 // [T,k] experts, by descending selection score
  int capacity = 0;                             // C, or 0 without capacity
  loss_values losses;
};

/// Which terms a backward includes (all by default); single terms give per-loss gradients.
struct gradient_terms {
  bool objective = true;  // the upstream gradient on the probs
  bool aux_loss = true, seq_aux_loss = true, global_aux_loss = true, z_loss = true;
};

/// Router state that lives across micro-batches: the aux-loss-free expert bias with its counts, and
/// the global-aux-loss accumulator.
struct router_state {
  std::vector<float> expert_bias;                // [E] (empty without expert bias)
  std::vector<double> local_tokens_per_expert;   // [E] counts since the last global batch
  std::vector<double> global_tokens_per_expert;  // [E] sum of reduced counts (global aux loss)
  int global_aux_steps = 0;                      // micro-batches in that sum
  float bias_update_rate = 1e-3F;
  bool frozen_expert_bias = false;  // keep the bias fixed (fine-tuning)

  /// End of a global batch: sums the counts over TPxDPxCP, applies
  /// bias += rate * sign(mean(c) - c) (unless frozen), and resets counts and the global-aux
  /// accumulator. Collective over the group: every rank of it must call.
  template <count_group TpCp, count_group TpDpCp>
  void finish_global_batch(reduction_groups<TpCp, TpDpCp> const& groups) {
    if (!expert_bias.empty()) {
      std::vector<double> counts = local_tokens_per_expert;
      groups.tp_dp_cp.sum(counts);
      if (!frozen_expert_bias) {
        // The reference works in fp32: mean of the counts, sign of the offset, rate * sign.
        float total = 0.0F;
        for (double c : counts) total += static_cast<float>(c);
        float const mean = total / static_cast<float>(counts.size());
        for (std::size_t e = 0; e < counts.size(); ++e) {
          float const offset = mean - static_cast<float>(counts[e]);
          float const sign = offset > 0.0F ? 1.0F : (offset < 0.0F ? -1.0F : 0.0F);
          expert_bias[e] += sign * bias_update_rate;
        }
      }
      std::fill(local_tokens_per_expert.begin(), local_tokens_per_expert.end(), 0.0);
    }
    std::fill(global_tokens_per_expert.begin(), global_tokens_per_expert.end(), 0.0);
    global_aux_steps = 0;
  }
};

/// The gradient scale a training schedule gives the attached losses: loss_scale * CP / number of
/// micro-batches (the reference's MoEAuxLossAutoScaler scale), or loss_scale alone with per-token
/// loss. Pass it as `backward_scale` to `topk_router::backward`.
constexpr double loss_backward_scale(double loss_scale, int cp, int num_microbatches,
                                     bool per_token_loss = false) {
  return per_token_loss ? loss_scale : loss_scale * cp / num_microbatches;
}

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

template <class L = float, class S = float>
class topk_router {
 public:
  using logit_type = L;
  using score_type = S;

  /// `padding_multiple`: the precision recipe's multiple for `pad_for_quantization` when the
  /// settings leave it 0. `jitter_seed` seeds input jitter.
  topk_router(settings const& config, int num_experts, int padding_multiple = 0,
              std::uint64_t jitter_seed = 0x6d656761u)
      : config_(config), experts_(num_experts), jitter_seed_(jitter_seed) {
    require_valid_router(config, num_experts);
    if ((config.dtype == logits_dtype::fp64) != std::is_same_v<L, double>)
      throw input_error(std::string("router dtype is ") +
                        (config.dtype == logits_dtype::fp64 ? "fp64" : "fp32") +
                        " but this router computes its logits in " +
                        (std::is_same_v<L, double> ? "double" : "float"));
    padding_multiple_ =
        config.quantization_multiple != 0 ? config.quantization_multiple : padding_multiple;
    if (config.pad_for_quantization && padding_multiple_ <= 0)
      throw config_error(rules::id::quantization_padding_matches_recipe, "pass the precision recipe's padding multiple to the router");
    state_.bias_update_rate = static_cast<float>(config.bias_update_rate);
    if (config.expert_bias) {
      state_.expert_bias.assign(static_cast<std::size_t>(num_experts), 0.0F);
      state_.local_tokens_per_expert.assign(static_cast<std::size_t>(num_experts), 0.0);
    }
    state_.global_tokens_per_expert.assign(static_cast<std::size_t>(num_experts), 0.0);
  }

  [[nodiscard]] settings const& config() const noexcept { return config_; }
  [[nodiscard]] int num_experts() const noexcept { return experts_; }
  [[nodiscard]] router_state& state() noexcept { return state_; }
  [[nodiscard]] router_state const& state() const noexcept { return state_; }
  [[nodiscard]] routing_output<L> const& output() const noexcept { return out_; }
  /// The logits [T,E] of the last route (after gating and jitter when routed from the input).
  [[nodiscard]] row_matrix<L> const& logits() const noexcept { return logits_; }
  /// The aux losses' own scores [T,E] and top-k map of the last training forward (padding rows 0).
  [[nodiscard]] row_matrix<S> const& aux_scores() const noexcept { return aux_scores_; }
  [[nodiscard]] mask_matrix const& aux_routing_map() const noexcept { return aux_map_; }

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
    if (terms.objective) {
      if (config_.sinkhorn) {
        backward_sinkhorn(grad_probs);
      } else {
        backward_topk(grad_probs);
      }
    }
    if (aux_active_) backward_aux(backward_scale, terms);
    if (z_active_ && terms.z_loss) backward_z(backward_scale);
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
    bool const collective = training_like(options) && any_aux_loss() &&
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
    if (z_active_) forward_z(valid_tokens, groups.tp_cp.size());

    // 2. Scores and top-k.
    if (config_.sinkhorn) {
      forward_sinkhorn(options.mode);
    } else {
      forward_topk();
    }
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i) {
        int const e = out_.topk_indices(t, i);
        out_.probs(t, e) = out_.topk_probs(t, i);
        out_.routing_map(t, e) = 1;
      }

    // 3. Capacity.
    out_.capacity = 0;
    if (config_.capacity_factor)
      out_.capacity = apply_capacity(out_.probs, out_.routing_map, k, *config_.capacity_factor,
                                     config_.token_drop_policy, config_.pad_to_capacity, order_);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i) kept_(t, i) = out_.routing_map(t, out_.topk_indices(t, i));

    // 4. Aux losses (own scores and top-k; groups, bias and capacity ignored).
    aux_active_ = training_like(options) && any_aux_loss();
    if (aux_active_) forward_aux(options.mode, groups);

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

  bool any_aux_loss() const {
    auto on = [](std::optional<double> c) { return c && *c > 0.0; };
    return on(config_.aux_loss_coeff) || on(config_.seq_aux_loss_coeff) ||
           on(config_.global_aux_loss_coeff);
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

  S score_of(L z) const {
    return config_.score == score_function::sigmoid ? kernels::sigmoid(static_cast<S>(z))
                                                    : kernels::sqrtsoftplus(static_cast<S>(z));
  }
  S score_derivative(L z, S q) const {
    if (config_.score == score_function::sigmoid) return q * (S(1) - q);
    return kernels::sqrtsoftplus_derivative(static_cast<S>(z), q);
  }

  template <class T>
  void select(std::span<T const> values, int* out, std::vector<T>& masked,
              std::vector<T>& group_scores) {
    int const k = config_.top_k;
    if (config_.group_top_k > 0) {
      masked.resize(static_cast<std::size_t>(experts_));
      group_scores.resize(static_cast<std::size_t>(config_.num_groups));
      group_scratch_.resize(static_cast<std::size_t>(std::max(experts_, config_.num_groups)));
      kernels::group_limited_top_k(values, k, config_.num_groups, config_.group_top_k, out,
                                   masked.data(), group_scores.data(), group_scratch_.data());
    } else {
      kernels::top_k(values, k, out);
    }
  }

  void forward_topk() {
    int const T = tokens_, E = experts_, k = config_.top_k;
    S const scale =
        config_.topk_scaling_factor ? static_cast<S>(*config_.topk_scaling_factor) : S(1);
    saved_k_.resize(T, k);
    saved_sum_.resize(T);
    if (config_.score == score_function::softmax_before_topk) scores_.resize(T, E);
    row_s_.resize(static_cast<std::size_t>(E));
    std::vector<S>& values = row_k_;
    values.resize(static_cast<std::size_t>(k));
    for (int t = 0; t < T; ++t) {
      int* idx = &out_.topk_indices(t, 0);
      L const* z = &logits_(t, 0);
      switch (config_.score) {
        case score_function::softmax_after_topk: {
          select(std::span<L const>(z, static_cast<std::size_t>(E)), idx, masked_l_, groups_l_);
          for (int i = 0; i < k; ++i)
            values[static_cast<std::size_t>(i)] = static_cast<S>(z[idx[i]]);
          kernels::softmax(values.data(), k, &saved_k_(t, 0));
          for (int i = 0; i < k; ++i)
            out_.topk_probs(t, i) = static_cast<L>(saved_k_(t, i) * scale);
          break;
        }
        case score_function::softmax_before_topk: {
          S* s = &scores_(t, 0);
          kernels::softmax(z, E, s);
          select(std::span<S const>(s, static_cast<std::size_t>(E)), idx, masked_s_, groups_s_);
          for (int i = 0; i < k; ++i) out_.topk_probs(t, i) = static_cast<L>(s[idx[i]] * scale);
          break;
        }
        case score_function::sigmoid:
        case score_function::sqrtsoftplus: {
          for (int e = 0; e < E; ++e) {
            S r = score_of(z[e]);
            if (!state_.expert_bias.empty())
              r += static_cast<S>(state_.expert_bias[static_cast<std::size_t>(e)]);
            row_s_[static_cast<std::size_t>(e)] = r;
          }
          select(std::span<S const>(row_s_.data(), row_s_.size()), idx, masked_s_, groups_s_);
          S sum = 0;
          for (int i = 0; i < k; ++i) {
            S const q = score_of(z[idx[i]]);
            saved_k_(t, i) = q;
            sum += q;
          }
          sum += static_cast<S>(1e-20);
          saved_sum_(t) = sum;
          for (int i = 0; i < k; ++i) {
            S const p = k > 1 ? saved_k_(t, i) / sum : saved_k_(t, i);
            out_.topk_probs(t, i) = static_cast<L>(p * scale);
          }
          break;
        }
      }
    }
  }

  void forward_sinkhorn(pass mode) {
    int const T = tokens_, E = experts_, k = config_.top_k;
    activation_.resize(T, E);
    scores_.resize(T, E);  // the softmax (k > 1) in S, for the backward
    for (int t = 0; t < T; ++t) {
      if (k > 1) {
        kernels::softmax(&logits_(t, 0), E, &scores_(t, 0));
        for (int e = 0; e < E; ++e) activation_(t, e) = static_cast<L>(scores_(t, e));
      } else {
        for (int e = 0; e < E; ++e) activation_(t, e) = kernels::sigmoid(logits_(t, e));
      }
    }
    if (mode != pass::eval) {
      sinkhorn_cost_ = logits_.template cast<S>();
      sinkhorn_rows_.resize(static_cast<std::size_t>(T));
      sinkhorn_cols_.resize(static_cast<std::size_t>(E));
      sinkhorn_old_.resize(static_cast<std::size_t>(E));
      kernels::sinkhorn(sinkhorn_cost_.data(), T, E, sinkhorn_rows_.data(), sinkhorn_cols_.data(),
                        sinkhorn_old_.data());
      for (int t = 0; t < T; ++t)
        kernels::top_k(std::span<S const>(&sinkhorn_cost_(t, 0), static_cast<std::size_t>(E)), k,
                       &out_.topk_indices(t, 0));
    } else {
      for (int t = 0; t < T; ++t)
        kernels::top_k(std::span<L const>(&activation_(t, 0), static_cast<std::size_t>(E)), k,
                       &out_.topk_indices(t, 0));
    }
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i) out_.topk_probs(t, i) = activation_(t, out_.topk_indices(t, i));
  }

  void forward_z(int valid_tokens, int tp_cp_size) {
    int const T = tokens_, E = experts_;
    lse_.resize(T);
    double sum = 0.0;
    for (int t = 0; t < T; ++t) {
      L const* z = &logits_(t, 0);
      L m = z[0];
      for (int e = 1; e < E; ++e) m = std::max(m, z[e]);
      L s = 0;
      for (int e = 0; e < E; ++e) s += std::exp(z[e] - m);
      lse_(t) = m + std::log(s);
      if (valid_[static_cast<std::size_t>(t)]) sum += static_cast<double>(lse_(t) * lse_(t));
    }
    double const mean = sum / std::max(valid_tokens, 1);
    double const coeff = *config_.z_loss_coeff / tp_cp_size;
    z_factor_ = coeff / std::max(valid_tokens, 1);
    out_.losses.z_loss = attached_loss{mean * coeff, mean};
  }

  /// Scores for the aux losses [T,E] (softmax, or sigmoid / sqrtsoftplus normalised over E) and
  /// their top-k map; padding rows are zero.
  template <class TpCp, class TpDpCp>
  void forward_aux(pass mode, reduction_groups<TpCp, TpDpCp> const& groups) {
    int const T = tokens_, E = experts_, k = config_.top_k;
    int const B = batch_.micro_batch_size, Sq = batch_.seq_length;
    aux_scores_.setZero(T, E);
    aux_map_.setZero(T, E);
    std::vector<int>& idx = aux_idx_;
    idx.resize(static_cast<std::size_t>(k));
    std::vector<double>& counts = counts_;
    std::vector<double>& seq_counts = seq_counts_;
    counts.assign(static_cast<std::size_t>(E), 0.0);
    seq_counts.assign(static_cast<std::size_t>(B * E), 0.0);
    for (int t = 0; t < T; ++t) {
      if (!valid_[static_cast<std::size_t>(t)]) continue;
      S* s = &aux_scores_(t, 0);
      aux_row_scores(t, s);
      kernels::top_k(std::span<S const>(s, static_cast<std::size_t>(E)), k, idx.data());
      for (int e : idx) {
        aux_map_(t, e) = 1;
        counts[static_cast<std::size_t>(e)] += 1.0;
        seq_counts[static_cast<std::size_t>((t % B) * E + e)] += 1.0;
      }
    }
    // Column sums of the aux scores: per expert, and per (sequence, expert).
    std::vector<double>& probs_sum = probs_sum_;
    std::vector<double>& seq_probs_sum = seq_probs_sum_;
    probs_sum.assign(static_cast<std::size_t>(E), 0.0);
    seq_probs_sum.assign(static_cast<std::size_t>(B * E), 0.0);
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        double const s = static_cast<double>(aux_scores_(t, e));
        probs_sum[static_cast<std::size_t>(e)] += s;
        seq_probs_sum[static_cast<std::size_t>((t % B) * E + e)] += s;
      }
    auto dot = [](std::vector<double> const& a, std::vector<double> const& b) {
      double r = 0.0;
      for (std::size_t i = 0; i < a.size(); ++i) r += a[i] * b[i];
      return r;
    };
    auto total = [](std::vector<double> const& c) {
      double r = 0.0;
      for (double x : c) r += x;
      return r;
    };
    aux_weight_.assign(static_cast<std::size_t>(E), 0.0);
    global_weight_.assign(static_cast<std::size_t>(E), 0.0);
    seq_weight_.assign(static_cast<std::size_t>(B * E), 0.0);

    if (config_.aux_loss_coeff && *config_.aux_loss_coeff > 0.0) {
      double const coeff = *config_.aux_loss_coeff;
      std::vector<double>& c = reduced_;
      c.assign(counts.begin(), counts.end());
      groups.tp_cp.sum(c);
      double const tokens_total =
          has_mask_ ? total(c) / k : static_cast<double>(T) * groups.tp_cp.size();
      double const factor = switch_factor(coeff, tokens_total);
      double const loss = factor * dot(probs_sum, c);
      out_.losses.aux_loss = attached_loss{loss, loss / coeff};
      for (int e = 0; e < E; ++e)
        aux_weight_[static_cast<std::size_t>(e)] += factor * c[static_cast<std::size_t>(e)];
    }
    if (config_.global_aux_loss_coeff && *config_.global_aux_loss_coeff > 0.0) {
      double const coeff = *config_.global_aux_loss_coeff;
      std::vector<double>& c = reduced_;
      c.assign(counts.begin(), counts.end());
      groups.tp_dp_cp.sum(c);
      double const tokens_total =
          has_mask_ ? total(c) / k : static_cast<double>(T) * groups.tp_dp_cp.size();
      if (mode == pass::training || state_.global_aux_steps == 0) {
        for (int e = 0; e < E; ++e)
          state_.global_tokens_per_expert[static_cast<std::size_t>(e)] +=
              c[static_cast<std::size_t>(e)];
        ++state_.global_aux_steps;
      }
      std::vector<double>& average = average_;
      average.assign(state_.global_tokens_per_expert.begin(),
                     state_.global_tokens_per_expert.end());
      for (double& a : average) a /= state_.global_aux_steps;
      double const factor = switch_factor(coeff, tokens_total);
      double const loss = factor * dot(probs_sum, average);
      out_.losses.global_aux_loss = attached_loss{loss, loss / coeff};
      for (int e = 0; e < E; ++e)
        global_weight_[static_cast<std::size_t>(e)] = factor * average[static_cast<std::size_t>(e)];
    }
    if (config_.seq_aux_loss_coeff && *config_.seq_aux_loss_coeff > 0.0) {
      double const coeff = *config_.seq_aux_loss_coeff;
      std::vector<double>& c = reduced_;
      c.assign(seq_counts.begin(), seq_counts.end());
      groups.tp_cp.sum(c);
      double const tokens_total = has_mask_ ? total(c) / (static_cast<double>(k) * B)
                                            : static_cast<double>(Sq) * groups.tp_cp.size();
      double const factor = switch_factor(coeff, tokens_total) / B;
      double const loss = factor * dot(seq_probs_sum, c);
      out_.losses.seq_aux_loss = attached_loss{loss, loss / coeff};
      for (std::size_t i = 0; i < c.size(); ++i) seq_weight_[i] = factor * c[i];
    }
  }

  /// coeff * E / (k * T_tot^2): the switch loss's factor on sum_e P_e c_e.
  double switch_factor(double coeff, double tokens_total) const {
    if (tokens_total <= 0.0) return 0.0;
    return coeff * experts_ / (config_.top_k * tokens_total * tokens_total);
  }

  void aux_row_scores(int t, S* s) {
    int const E = experts_;
    L const* z = &logits_(t, 0);
    if (config_.score == score_function::softmax_after_topk ||
        config_.score == score_function::softmax_before_topk) {
      kernels::softmax(z, E, s);
      return;
    }
    S sum = 0;
    for (int e = 0; e < E; ++e) {
      s[e] = score_of(z[e]);
      sum += s[e];
    }
    sum += static_cast<S>(1e-20);
    for (int e = 0; e < E; ++e) s[e] /= sum;
  }

  void backward_topk(Eigen::Ref<row_matrix<L> const> const& grad_probs) {
    int const T = tokens_, E = experts_, k = config_.top_k;
    S const scale =
        config_.topk_scaling_factor ? static_cast<S>(*config_.topk_scaling_factor) : S(1);
    std::vector<S>& g = row_k_;
    std::vector<S>& ds = row_e_;
    g.resize(static_cast<std::size_t>(k));
    ds.resize(static_cast<std::size_t>(E));
    for (int t = 0; t < T; ++t) {
      int const* idx = &out_.topk_indices(t, 0);
      bool any = false;
      for (int i = 0; i < k; ++i) {
        g[static_cast<std::size_t>(i)] =
            kept_(t, i) ? static_cast<S>(grad_probs(t, idx[i])) * scale : S(0);
        any = any || g[static_cast<std::size_t>(i)] != S(0);
      }
      if (!any) continue;
      switch (config_.score) {
        case score_function::softmax_after_topk: {
          S const* p = &saved_k_(t, 0);
          S const dot = kernels::dot(p, g.data(), k);
          for (int i = 0; i < k; ++i)
            grad_logits_(t, idx[i]) +=
                static_cast<L>(p[i] * (g[static_cast<std::size_t>(i)] - dot));
          break;
        }
        case score_function::softmax_before_topk: {
          S const* s = &scores_(t, 0);
          std::fill(ds.begin(), ds.end(), S(0));
          for (int i = 0; i < k; ++i)
            ds[static_cast<std::size_t>(idx[i])] += g[static_cast<std::size_t>(i)];
          S const dot = kernels::dot(s, ds.data(), E);
          for (int e = 0; e < E; ++e)
            grad_logits_(t, e) += static_cast<L>(s[e] * (ds[static_cast<std::size_t>(e)] - dot));
          break;
        }
        case score_function::sigmoid:
        case score_function::sqrtsoftplus: {
          S const* q = &saved_k_(t, 0);
          S const sum = saved_sum_(t);
          S weighted = 0;
          for (int i = 0; i < k; ++i) weighted += g[static_cast<std::size_t>(i)] * q[i];
          for (int i = 0; i < k; ++i) {
            S const dq = k > 1 ? g[static_cast<std::size_t>(i)] / sum - weighted / (sum * sum)
                               : g[static_cast<std::size_t>(i)];
            grad_logits_(t, idx[i]) +=
                static_cast<L>(dq * score_derivative(logits_(t, idx[i]), q[i]));
          }
          break;
        }
      }
    }
  }

  void backward_sinkhorn(Eigen::Ref<row_matrix<L> const> const& grad_probs) {
    int const T = tokens_, E = experts_, k = config_.top_k;
    std::vector<S>& ds = row_e_;
    ds.resize(static_cast<std::size_t>(E));
    for (int t = 0; t < T; ++t) {
      std::fill(ds.begin(), ds.end(), S(0));
      for (int i = 0; i < k; ++i) {
        int const e = out_.topk_indices(t, i);
        if (kept_(t, i)) ds[static_cast<std::size_t>(e)] = static_cast<S>(grad_probs(t, e));
      }
      if (k > 1) {
        S const* s = &scores_(t, 0);
        S const dot = kernels::dot(s, ds.data(), E);
        for (int e = 0; e < E; ++e)
          grad_logits_(t, e) += static_cast<L>(s[e] * (ds[static_cast<std::size_t>(e)] - dot));
      } else {
        for (int e = 0; e < E; ++e) {
          L const a = activation_(t, e);
          grad_logits_(t, e) += static_cast<L>(ds[static_cast<std::size_t>(e)]) * a * (L(1) - a);
        }
      }
    }
  }

  void backward_aux(double backward_scale, gradient_terms terms) {
    int const T = tokens_, E = experts_, B = batch_.micro_batch_size;
    if (!terms.aux_loss && !terms.seq_aux_loss && !terms.global_aux_loss) return;
    double const aux_on = terms.aux_loss ? 1.0 : 0.0, global_on = terms.global_aux_loss ? 1.0 : 0.0;
    double const seq_on = terms.seq_aux_loss ? 1.0 : 0.0;
    std::vector<S>& ds = row_e_;
    std::vector<S>& raw = row_s_;
    ds.resize(static_cast<std::size_t>(E));
    raw.resize(static_cast<std::size_t>(E));
    bool const softmax_scores = config_.score == score_function::softmax_after_topk ||
                                config_.score == score_function::softmax_before_topk;
    for (int t = 0; t < T; ++t) {
      if (!valid_[static_cast<std::size_t>(t)]) continue;
      for (int e = 0; e < E; ++e)
        ds[static_cast<std::size_t>(e)] = static_cast<S>(
            backward_scale * (aux_on * aux_weight_[static_cast<std::size_t>(e)] +
                              global_on * global_weight_[static_cast<std::size_t>(e)] +
                              seq_on * seq_weight_[static_cast<std::size_t>((t % B) * E + e)]));
      L const* z = &logits_(t, 0);
      if (softmax_scores) {
        S const* s = &aux_scores_(t, 0);
        S const dot = kernels::dot(s, ds.data(), E);
        for (int e = 0; e < E; ++e)
          grad_logits_(t, e) += static_cast<L>(s[e] * (ds[static_cast<std::size_t>(e)] - dot));
      } else {
        S sum = 0;
        for (int e = 0; e < E; ++e) {
          raw[static_cast<std::size_t>(e)] = score_of(z[e]);
          sum += raw[static_cast<std::size_t>(e)];
        }
        sum += static_cast<S>(1e-20);
        S const weighted = kernels::dot(raw.data(), ds.data(), E);
        for (int e = 0; e < E; ++e) {
          S const dr = ds[static_cast<std::size_t>(e)] / sum - weighted / (sum * sum);
          grad_logits_(t, e) +=
              static_cast<L>(dr * score_derivative(z[e], raw[static_cast<std::size_t>(e)]));
        }
      }
    }
  }

  void backward_z(double backward_scale) {
    int const T = tokens_, E = experts_;
    for (int t = 0; t < T; ++t) {
      if (!valid_[static_cast<std::size_t>(t)]) continue;
      L const factor = static_cast<L>(backward_scale * z_factor_ * 2.0) * lse_(t);
      for (int e = 0; e < E; ++e) grad_logits_(t, e) += factor * std::exp(logits_(t, e) - lse_(t));
    }
  }

  settings config_;
  int experts_;
  int padding_multiple_ = 0;
  std::uint64_t jitter_seed_;
  router_state state_;
  routing_output<L> out_;

  // Saved by the forward for the backward; reused across calls.
  int tokens_ = 0;
  batch_shape batch_{};
  bool has_mask_ = false, z_active_ = false, aux_active_ = false, gated_ = false, jittered_ = false;
  std::vector<std::uint8_t> valid_;
  // Per-call work space, kept so that a step allocates nothing once it has grown.
  std::vector<S> row_k_, row_e_;
  std::vector<int> aux_idx_;
  std::vector<double> counts_, seq_counts_, probs_sum_, seq_probs_sum_, reduced_, average_;
  row_matrix<L> logits_, activation_, grad_logits_;
  row_matrix<float> jitter_;
  row_matrix<S> saved_k_, scores_, aux_scores_, sinkhorn_cost_;
  Eigen::Matrix<S, Eigen::Dynamic, 1> saved_sum_;
  Eigen::Matrix<L, Eigen::Dynamic, 1> lse_;
  mask_matrix kept_, aux_map_;
  double z_factor_ = 0.0;
  std::vector<double> aux_weight_, global_weight_, seq_weight_;
  std::vector<S> row_s_, masked_s_, groups_s_, sinkhorn_rows_, sinkhorn_cols_, sinkhorn_old_;
  std::vector<L> masked_l_, groups_l_;
  std::vector<int> group_scratch_, order_;
};

/// The logits type of a router dtype.
template <logits_dtype D>
using logits_type = std::conditional_t<D == logits_dtype::fp64, double, float>;

/// The router class of a static router policy: the same class as a run-time router, with the
/// settings the type fixes.
template <static_router_policy R>
using router_of = topk_router<logits_type<R::value.dtype>>;

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
