// SPDX-License-Identifier: Apache-2.0
// megamoe/model/moe_layer.hpp — one MoE layer on one rank: route -> permute -> experts ->
// unpermute, plus the optional shared expert, forward and backward, for a configuration type.
//
//   megamoe::context ctx;
//   megamoe::moe_layer<my_config> layer(/*layer_number=*/0);
//   layer.initialize(seed);
//   auto out = layer.forward(ctx, x, S, B);       // x [S*B, H], token t = s*B + b
//   auto dx = layer.backward(ctx, dy);            // adds every weight gradient
//   layer.for_each_parameter([](std::string_view name, auto value, auto grad,
//                               megamoe::parameter_kind kind) { ... });
//
// The interface is spelled out in docs/layer.md. Inside a step the layer runs no virtual call and,
// after its first step, allocates nothing: its buffers and the context's scratch only grow.
// What backward needs is kept or recomputed as the memory policy says (memory::keep_all,
// memory::recompute<memory::moe_act>, memory::recompute<memory::moe_layer>, and
// memory::shared_experts for the shared expert).
#pragma once

#include <megamoe/config/resolve.hpp>
#include <megamoe/core/buffer.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/dispatch/permute.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/gemm.hpp>
#include <megamoe/expert/mlp.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/router/router.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace megamoe {

/// Dense parameters reduce over DP x CP; expert parameters over the expert data-parallel group.
enum class parameter_kind { dense, expert };

/// What a forward returns: the layer output and the losses the router attached to it.
template <class T>
struct moe_output {
  const_row_matrix_map<T> y;   // [T,H]; valid until the layer's next forward
  router::loss_values losses;  // coefficient-scaled values and the logged (unscaled) ones
};

namespace detail {
template <class C>
using layer_scalar = typename C::precision::master_type;

/// The router's logits type: double for the fp64 recipe, else the router policy's dtype (fp32 for
/// a run-time router).
template <class C>
consteval bool router_in_double() {
  if constexpr (std::is_same_v<layer_scalar<C>, double>) {
    return true;
  } else if constexpr (static_router_policy<typename C::router>) {
    return C::router::value.dtype == router::logits_dtype::fp64;
  } else {
    return false;
  }
}
}  // namespace detail

template <training_config Config>
class moe_layer {
 public:
  using scalar = detail::layer_scalar<Config>;
  using logit = std::conditional_t<detail::router_in_double<Config>(), double, float>;
  using score = std::conditional_t<std::is_same_v<scalar, double>, double, float>;
  using router_type = router::topk_router<logit, score>;
  static constexpr expert::settings expert_settings = Config::expert::value;
  static constexpr memory::settings memory_settings = Config::memory::value;
  static constexpr expert::activation_function activation = expert_settings.activation;
  using backend = expert::backend_t<expert_settings.backend>;
  using mlp_type = expert::grouped_mlp<activation, backend, scalar>;

  static_assert(Config::dispatch::value == dispatch::dispatcher::local ||
                    Config::dispatch::value == dispatch::dispatcher::auto_,
                "megamoe: moe_layer runs on one rank with dispatch::local (or auto); the "
                "expert-parallel dispatchers arrive with expert parallelism");
  static_assert(Config::precision::value.recipe == precision::recipe_id::fp32 ||
                    Config::precision::value.recipe == precision::recipe_id::fp64,
                "megamoe: moe_layer computes in fp32 or fp64 for now; the bf16, FP8 and FP4 "
                "recipes arrive with the precision-recipes work");
  static_assert(!memory_settings.quantized_activations && !memory_settings.quantized_weights,
                "megamoe: quantized storage needs the precision recipes in the layer");

  /// `layer_number` names the parameters (decoder.layers.{i}); `given` supplies what the type left
  /// to start-up (sizes, a run-time router). Every configuration rule is checked here.
  explicit moe_layer(int layer_number = 0, startup_values const& given = {})
      : values_(checked_values(given)),
        layer_number_(layer_number),
        router_(router_settings(values_), values_.shape.experts,
                Config::precision::value.padding_multiple),
        experts_(routed_sizes(values_)),
        routed_mlp_(routed_sizes(values_)),
        shared_(shared_sizes(values_)),
        shared_mlp_(shared_sizes(values_)),
        router_weight_(values_.shape.experts, values_.shape.hidden),
        router_weight_grad_(row_matrix<scalar>::Zero(values_.shape.experts, values_.shape.hidden)),
        problem_(1) {
    if (has_shared_gate()) {
      gate_weight_ = row_matrix<scalar>::Zero(1, values_.shape.hidden);
      gate_weight_grad_ = row_matrix<scalar>::Zero(1, values_.shape.hidden);
    }
    router_weight_.setZero();
    name_parameters();
  }

  [[nodiscard]] config_values const& values() const noexcept { return values_; }
  [[nodiscard]] int hidden_size() const noexcept { return values_.shape.hidden; }
  [[nodiscard]] int num_experts() const noexcept { return values_.shape.experts; }
  [[nodiscard]] router_type& router() noexcept { return router_; }
  [[nodiscard]] router_type const& router() const noexcept { return router_; }
  [[nodiscard]] bool has_shared_expert() const noexcept { return values_.shape.shared_ffn > 0; }
  [[nodiscard]] bool has_shared_gate() const noexcept {
    return has_shared_expert() && expert_settings.shared_expert_gate;
  }
  /// The permutation of the last forward (rows grouped by expert).
  [[nodiscard]] dispatch::permutation const& permutation() const noexcept { return perm_; }

  /// Draws every weight from N(0, std^2) as a function of (seed, parameter, element); biases 0.
  void initialize(std::uint64_t seed, double std = 0.02) {
    std::uint64_t index = 0;
    for_each_parameter([&](std::string_view name, auto value, auto, parameter_kind) {
      ++index;
      bool const bias = name.find(".bias") != std::string_view::npos;
      for (Eigen::Index i = 0; i < value.size(); ++i)
        value.data()[i] =
            bias ? scalar(0)
                 : static_cast<scalar>(
                       std * standard_normal(seed + index, static_cast<std::uint64_t>(i)));
    });
  }

  /// Calls f(name, value, grad, kind) for every parameter, with value and grad as row-major maps
  /// (biases as [1, n]), named as the reference names them.
  template <class F>
  void for_each_parameter(F&& f) {
    std::size_t n = 0;
    auto visit = [&](row_matrix_map<scalar> value, row_matrix_map<scalar> grad, parameter_kind k) {
      f(std::string_view(names_[n++]), value, grad, k);
    };
    visit(map(router_weight_), map(router_weight_grad_), parameter_kind::dense);
    int const E = num_experts();
    for (int e = 0; e < E; ++e)
      visit(experts_.fc1(e), experts_.grad_fc1(e), parameter_kind::expert);
    for (int e = 0; e < E; ++e)
      visit(experts_.fc2(e), experts_.grad_fc2(e), parameter_kind::expert);
    if (expert_settings.bias) {
      for (int e = 0; e < E; ++e)
        visit(experts_.fc1_bias(e), experts_.grad_fc1_bias(e), parameter_kind::expert);
      for (int e = 0; e < E; ++e)
        visit(experts_.fc2_bias(e), experts_.grad_fc2_bias(e), parameter_kind::expert);
    }
    if (has_shared_expert()) {
      visit(shared_.fc1(0), shared_.grad_fc1(0), parameter_kind::dense);
      visit(shared_.fc2(0), shared_.grad_fc2(0), parameter_kind::dense);
      if (has_shared_gate())
        visit(map(gate_weight_), map(gate_weight_grad_), parameter_kind::dense);
    }
  }

  void zero_grad() {
    router_weight_grad_.setZero();
    experts_.zero_grad();
    shared_.zero_grad();
    gate_weight_grad_.setZero();
  }

  /// Forward of S positions x B sequences, x [S*B, H] with token t = s*B + b. In training mode the
  /// router attaches its losses and counts its tokens; backward must follow before the next
  /// training forward of this layer.
  moe_output<scalar> forward(context& ctx, Eigen::Ref<row_matrix<scalar> const> x, int seq_length,
                             int micro_batch_size) {
    int const H = hidden_size();
    if (seq_length < 1 || micro_batch_size < 1)
      throw input_error("moe_layer: the micro-batch needs S >= 1 and B >= 1, got S = " +
                        std::to_string(seq_length) + ", B = " + std::to_string(micro_batch_size));
    if (x.rows() != std::int64_t{seq_length} * micro_batch_size || x.cols() != H)
      throw input_error("moe_layer: input has shape " +
                        router::detail::shape_text(x.rows(), x.cols()) + ", expected " +
                        router::detail::shape_text(std::int64_t{seq_length} * micro_batch_size, H) +
                        " (S*B tokens x hidden size)");
    router::pass const mode = ctx.step.mode;
    if (mode == router::pass::recompute)
      throw input_error(
          "moe_layer: pass::recompute is the layer's own; forward in training or eval");
    // Whatever happens below, the previous forward's state is gone: no backward may follow a
    // forward that failed.
    awaiting_backward_ = false;
    tokens_ = static_cast<int>(x.rows());
    batch_ = {seq_length, micro_batch_size};
    jitter_key_ = ctx.step.micro_batch_key;
    auto input = input_.matrix(tokens_, H);
    input = x;
    compute_forward(ctx, mode, true);
    awaiting_backward_ = mode == router::pass::training;
    return {const_row_matrix_map<scalar>(output_.data(), tokens_, H), router_.output().losses};
  }

  /// Backward from dy [T,H] of the last training forward: returns dx [T,H] (valid until the next
  /// backward) and adds every weight gradient (router and experts, attached losses included, scaled
  /// by ctx.step.loss_backward_scale).
  const_row_matrix_map<scalar> backward(context& ctx, Eigen::Ref<row_matrix<scalar> const> dy) {
    int const H = hidden_size(), E = num_experts();
    if (!awaiting_backward_)
      throw input_error("moe_layer: backward needs a training forward first (once per forward)");
    router::require_shape(dy, tokens_, H, "moe_layer: output gradient");
    awaiting_backward_ = false;
    auto& exec = ctx.executor<scalar>();
    auto& stages = ctx.stages;
    if (memory_settings.moe_layer) {
      compute_forward(ctx, router::pass::recompute, false);
    } else {
      if (memory_settings.moe_act)
        stages.time(layer_stage::experts, [&] {
          routed_mlp_.recompute_activation(exec, experts_, rows(ctx),
                                           buf(ctx, scratch_slot::routed_fc1).data(),
                                           buf(ctx, scratch_slot::routed_act).data());
        });
      if (memory_settings.shared_experts && has_shared_expert())
        stages.time(layer_stage::shared_expert, [&] { shared_forward(ctx); });
    }
    int const N = perm_.rows();
    int const W1 = fc1_width(values_.shape.ffn), F = values_.shape.ffn;
    // Combine backward is a dispatch: each row takes its token's gradient.
    scalar* grad_rows = ctx.scratch<scalar>(scratch_slot::grad_rows).reserve(std::size_t(N) * H);
    stages.time(layer_stage::unpermute, [&] { gather_rows(exec, dy.data(), grad_rows); });
    scalar* grad_probs_rows =
        ctx.scratch<scalar>(scratch_slot::grad_row_probs).reserve(std::size_t(N));
    stages.time(layer_stage::experts, [&] {
      routed_mlp_.backward(exec, experts_, rows(ctx), buf(ctx, scratch_slot::routed_rows).data(),
                           buf(ctx, scratch_slot::routed_fc1).data(),
                           buf(ctx, scratch_slot::routed_act).data(), grad_rows,
                           ctx.scratch<scalar>(scratch_slot::grad_act).reserve(std::size_t(N) * F),
                           ctx.scratch<scalar>(scratch_slot::grad_fc1).reserve(std::size_t(N) * W1),
                           grad_rows, grad_probs_rows);
    });
    // The probs' gradient goes back through the router (attached losses included) and its gating.
    auto grad_input = grad_input_.matrix(tokens_, H);
    stages.time(layer_stage::router, [&] {
      grad_probs_.setZero(tokens_, E);
      for (int j = 0; j < N; ++j)
        grad_probs_(perm_.source_token[static_cast<std::size_t>(j)],
                    perm_.row_expert[static_cast<std::size_t>(j)]) =
            static_cast<logit>(grad_probs_rows[j]);
      router_backward(ctx, grad_input);
    });
    // Dispatch backward is a combine: each token adds its rows' gradients, in row order.
    stages.time(layer_stage::permute,
                [&] { combine_rows(exec, grad_rows, grad_input.data(), true); });
    if (has_shared_expert())
      stages.time(layer_stage::shared_expert,
                  [&] { shared_backward(ctx, dy.data(), grad_input.data()); });
    return {grad_input_.data(), tokens_, H};
  }

  /// Bytes kept from forward to backward under this layer's memory policy: the input copy, and the
  /// rows, fc1 output, activation and routing bookkeeping the policy does not recompute. Scratch
  /// (shared by all layers through the context) is not counted.
  [[nodiscard]] std::size_t saved_activation_bytes() const {
    std::size_t bytes = input_.used_bytes();
    for (std::size_t s = 0; s < own_.size(); ++s)
      if (is_saved(static_cast<scratch_slot>(s))) bytes += own_[s].used_bytes();
    if (!memory_settings.moe_layer) {
      bytes += (perm_.source_token.size() + perm_.row_expert.size() + token_row_start_.size() +
                token_rows_.size()) *
               sizeof(int);
      bytes += gate_.size() * sizeof(scalar);
      bytes += static_cast<std::size_t>(router_.output().probs.size()) * (sizeof(logit) + 1);
    }
    return bytes;
  }

 private:
  static constexpr auto slot_count = static_cast<std::size_t>(scratch_slot::count);

  /// Kept by the layer between forward and backward (else taken from the context's scratch).
  static constexpr bool is_saved(scratch_slot s) {
    bool const whole_layer = memory_settings.moe_layer;
    switch (s) {
      case scratch_slot::routed_rows:
      case scratch_slot::routed_fc1:
      case scratch_slot::row_probs: return !whole_layer;
      case scratch_slot::routed_act: return !whole_layer && !memory_settings.moe_act;
      case scratch_slot::shared_fc1:
      case scratch_slot::shared_act: return !whole_layer && !memory_settings.shared_experts;
      case scratch_slot::shared_out:
        return !whole_layer && !memory_settings.shared_experts &&
               expert_settings.shared_expert_gate;
      default: return false;
    }
  }

  static config_values checked_values(startup_values const& given) {
    config_values v = resolve<Config>(given);
    if (!v.router) throw config_error(27, "moe_layer: give the run-time router's settings");
    if (v.parallel.ep != 1 || v.parallel.etp != 1)
      throw config_error(19, "moe_layer runs on one rank: EP and ETP must be 1");
    return v;
  }

  static router::settings router_settings(config_values const& v) {
    router::settings s = *v.router;
    if constexpr (std::is_same_v<logit, double>) {
      s.dtype = router::logits_dtype::fp64;  // the fp64 recipe runs the router in double too
    } else if (s.dtype == router::logits_dtype::fp64) {
      throw input_error(
          "moe_layer: a run-time router with router dtype fp64 needs precision::fp64 or a static "
          "router policy with router_dtype<fp64>");
    }
    return s;
  }

  static expert::mlp_sizes routed_sizes(config_values const& v) {
    return {v.shape.experts, v.shape.hidden, v.shape.ffn, activation, expert_settings.bias};
  }
  static expert::mlp_sizes shared_sizes(config_values const& v) {
    // Without a shared expert these sizes are a placeholder that is never run.
    return {1, v.shape.hidden, std::max(1, v.shape.shared_ffn), activation, false};
  }
  static constexpr int fc1_width(int ffn) { return expert::fc1_width(activation, ffn); }

  static row_matrix_map<scalar> map(row_matrix<scalar>& m) {
    return {m.data(), m.rows(), m.cols()};
  }

  void name_parameters() {
    std::string const prefix = "decoder.layers." + std::to_string(layer_number_) + ".mlp.";
    names_.push_back(prefix + "router.weight");
    int const E = num_experts();
    auto experts = [&](char const* what) {
      for (int e = 0; e < E; ++e) names_.push_back(prefix + "experts." + what + std::to_string(e));
    };
    experts("linear_fc1.weight");
    experts("linear_fc2.weight");
    if (expert_settings.bias) {
      experts("linear_fc1.bias");
      experts("linear_fc2.bias");
    }
    if (has_shared_expert()) {
      names_.push_back(prefix + "shared_experts.linear_fc1.weight");
      names_.push_back(prefix + "shared_experts.linear_fc2.weight");
      if (has_shared_gate()) names_.push_back(prefix + "shared_experts.gate_weight");
    }
  }

  [[nodiscard]] bool fast_gating() const {
    return std::is_same_v<logit, scalar> &&
           !(router_.config().input_jitter_eps && *router_.config().input_jitter_eps > 0.0);
  }

  /// Through the router (attached losses included) and its gating: dx = dz Wr (written),
  /// dWr += dz^T x.
  void router_backward(context& ctx, row_matrix_map<scalar> grad_input) {
    int const H = hidden_size(), E = num_experts();
    auto& exec = ctx.executor<scalar>();
    if constexpr (std::is_same_v<logit, scalar>) {
      if (fast_gating()) {
        auto const& grad_logits = router_.backward(grad_probs_, ctx.step.loss_backward_scale);
        run_one<expert::gemm_op::nn>(exec, {tokens_, H, E, grad_logits.data(), E,
                                            router_weight_.data(), H, grad_input.data(), H, false});
        run_one<expert::gemm_op::tn>(exec, {E, H, tokens_, grad_logits.data(), E, input_.data(), H,
                                            router_weight_grad_.data(), H, true});
        return;
      }
    }
    auto const input = const_row_matrix_map<scalar>(input_.data(), tokens_, H);
    row_matrix<scalar> grad_weight(E, H);
    router_.backward(grad_probs_, ctx.step.loss_backward_scale, input, router_weight_, grad_input,
                     grad_weight);
    router_weight_grad_ += grad_weight;
  }

  buffer<scalar>& buf(context& ctx, scratch_slot s) {
    return is_saved(s) ? own_[static_cast<std::size_t>(s)] : ctx.scratch<scalar>(s);
  }

  expert::grouped_rows<scalar> rows(context& ctx) {
    return {perm_.rows(), perm_.tokens_per_expert, buf(ctx, scratch_slot::row_probs).data()};
  }

  template <expert::gemm_op Op>
  void run_one(expert::executor<scalar>& exec, expert::gemm_problem<scalar> const& p) {
    problem_[0] = p;
    backend::template run<Op>(exec, std::span<expert::gemm_problem<scalar> const>(problem_));
  }

  /// Route, permute and run the experts (and the shared expert) from the kept input; the training
  /// and eval forward also combine into the output.
  void compute_forward(context& ctx, router::pass mode, bool combine) {
    int const H = hidden_size(), E = num_experts();
    auto& exec = ctx.executor<scalar>();
    auto const input = const_row_matrix_map<scalar>(input_.data(), tokens_, H);
    router::route_options options;
    options.mode = mode;
    options.jitter_key = jitter_key_;
    auto& stages = ctx.stages;
    stages.time(layer_stage::router, [&] {
      if constexpr (std::is_same_v<logit, scalar>) {
        if (fast_gating()) {
          logits_.resize(tokens_, E);
          run_one<expert::gemm_op::nt>(exec, {tokens_, E, H, input_.data(), H,
                                              router_weight_.data(), H, logits_.data(), E, false});
          router_.route(logits_, batch_, options);
          return;
        }
      }
      router_.route(input, router_weight_, batch_, options);
    });
    auto const& routing = router_.output();
    int const W1 = fc1_width(values_.shape.ffn), F = values_.shape.ffn;
    scalar* routed_rows = nullptr;
    stages.time(layer_stage::permute, [&] {
      dispatch::make_permutation(routing.routing_map, perm_,
                                 router_.config().pad_to_capacity ? routing.capacity : 0);
      index_token_rows();
      int const N = perm_.rows();
      routed_rows = buf(ctx, scratch_slot::routed_rows).reserve(std::size_t(N) * H);
      scalar* probs = buf(ctx, scratch_slot::row_probs).reserve(std::size_t(N));
      gather_rows(exec, input_.data(), routed_rows);
      for (int j = 0; j < N; ++j)
        probs[j] =
            static_cast<scalar>(routing.probs(perm_.source_token[static_cast<std::size_t>(j)],
                                              perm_.row_expert[static_cast<std::size_t>(j)]));
    });
    int const N = perm_.rows();
    scalar* routed_out = ctx.scratch<scalar>(scratch_slot::routed_out).reserve(std::size_t(N) * H);
    stages.time(layer_stage::experts, [&] {
      routed_mlp_.forward(exec, experts_, rows(ctx), routed_rows,
                          buf(ctx, scratch_slot::routed_fc1).reserve(std::size_t(N) * W1),
                          buf(ctx, scratch_slot::routed_act).reserve(std::size_t(N) * F),
                          routed_out);
    });
    if (has_shared_expert()) stages.time(layer_stage::shared_expert, [&] { shared_forward(ctx); });
    if (!combine) return;
    auto output = output_.matrix(tokens_, H);
    stages.time(layer_stage::unpermute,
                [&] { combine_rows(exec, routed_out, output.data(), false); });
    if (has_shared_expert()) {
      scalar const* shared = buf(ctx, scratch_slot::shared_out).data();
      exec.parallel_rows(tokens_, [&](int begin, int end) {
        for (int t = begin; t < end; ++t) {
          scalar const g = has_shared_gate() ? gate_[static_cast<std::size_t>(t)] : scalar(1);
          output.row(t) += g * const_row_matrix_map<scalar>(shared + std::ptrdiff_t{t} * H, 1, H);
        }
      });
    }
  }

  /// token_row_start_ [T+1] and token_rows_ [N]: the rows of each token, ascending (the order in
  /// which the reference's unpermute adds them).
  void index_token_rows() {
    int const N = perm_.rows();
    token_row_start_.assign(static_cast<std::size_t>(tokens_) + 1, 0);
    for (int j = 0; j < N; ++j)
      ++token_row_start_[static_cast<std::size_t>(perm_.source_token[static_cast<std::size_t>(j)]) +
                         1];
    for (int t = 0; t < tokens_; ++t)
      token_row_start_[static_cast<std::size_t>(t) + 1] +=
          token_row_start_[static_cast<std::size_t>(t)];
    token_rows_.resize(static_cast<std::size_t>(N));
    fill_.assign(token_row_start_.begin(), token_row_start_.end() - 1);
    for (int j = 0; j < N; ++j)
      token_rows_[static_cast<std::size_t>(
          fill_[static_cast<std::size_t>(perm_.source_token[static_cast<std::size_t>(j)])]++)] = j;
  }

  /// rows[j] = tokens[source_token[j]], split over the pool.
  void gather_rows(expert::executor<scalar>& exec, scalar const* tokens, scalar* rows_out) {
    int const H = hidden_size();
    exec.parallel_rows(perm_.rows(), [&](int begin, int end) {
      for (int j = begin; j < end; ++j)
        std::copy_n(tokens + std::ptrdiff_t{perm_.source_token[static_cast<std::size_t>(j)]} * H, H,
                    rows_out + std::ptrdiff_t{j} * H);
    });
  }

  /// out[t] (+)= sum of its rows, in row order, split over tokens.
  void combine_rows(expert::executor<scalar>& exec, scalar const* rows_in, scalar* out, bool add) {
    int const H = hidden_size();
    exec.parallel_rows(tokens_, [&](int begin, int end) {
      for (int t = begin; t < end; ++t) {
        row_matrix_map<scalar> o(out + std::ptrdiff_t{t} * H, 1, H);
        if (!add) o.setZero();
        for (int i = token_row_start_[static_cast<std::size_t>(t)];
             i < token_row_start_[static_cast<std::size_t>(t) + 1]; ++i)
          o += const_row_matrix_map<scalar>(
              rows_in + std::ptrdiff_t{token_rows_[static_cast<std::size_t>(i)]} * H, 1, H);
      }
    });
  }

  /// The shared expert on every token (prob 1), and its gate sigma(x g).
  void shared_forward(context& ctx) {
    int const H = hidden_size(), Fs = values_.shape.shared_ffn;
    auto& exec = ctx.executor<scalar>();
    if (shared_ones_.size() != static_cast<std::size_t>(tokens_))
      shared_ones_.assign(static_cast<std::size_t>(tokens_), scalar(1));
    shared_count_[0] = tokens_;
    expert::grouped_rows<scalar> const all{tokens_, shared_count_, shared_ones_.data()};
    shared_mlp_.forward(
        exec, shared_, all, input_.data(),
        buf(ctx, scratch_slot::shared_fc1).reserve(std::size_t(tokens_) * fc1_width(Fs)),
        buf(ctx, scratch_slot::shared_act).reserve(std::size_t(tokens_) * Fs),
        buf(ctx, scratch_slot::shared_out).reserve(std::size_t(tokens_) * H));
    if (has_shared_gate()) {
      gate_.resize(static_cast<std::size_t>(tokens_));
      auto const input = const_row_matrix_map<scalar>(input_.data(), tokens_, H);
      exec.parallel_rows(tokens_, [&](int begin, int end) {
        for (int t = begin; t < end; ++t) {
          scalar const z = input.row(t).dot(gate_weight_.row(0));
          gate_[static_cast<std::size_t>(t)] = scalar(1) / (scalar(1) + std::exp(-z));
        }
      });
    }
  }

  /// Shared expert backward: gate, then the MLP; adds into grad_input.
  void shared_backward(context& ctx, scalar const* dy, scalar* grad_input) {
    int const H = hidden_size(), Fs = values_.shape.shared_ffn;
    auto& exec = ctx.executor<scalar>();
    scalar* grad_out =
        ctx.scratch<scalar>(scratch_slot::grad_rows).reserve(std::size_t(tokens_) * H);
    auto const input = const_row_matrix_map<scalar>(input_.data(), tokens_, H);
    if (has_shared_gate()) {
      // d(out) = sigma dy; dz = (dy . out) sigma (1 - sigma); dg += dz x; dx += dz g.
      scalar const* out = buf(ctx, scratch_slot::shared_out).data();
      gate_grad_.resize(static_cast<std::size_t>(tokens_));
      exec.parallel_rows(tokens_, [&](int begin, int end) {
        for (int t = begin; t < end; ++t) {
          auto const d = const_row_matrix_map<scalar>(dy + std::ptrdiff_t{t} * H, 1, H);
          scalar const s = gate_[static_cast<std::size_t>(t)];
          row_matrix_map<scalar>(grad_out + std::ptrdiff_t{t} * H, 1, H) = s * d;
          scalar const dz =
              d.cwiseProduct(const_row_matrix_map<scalar>(out + std::ptrdiff_t{t} * H, 1, H))
                  .sum() *
              s * (scalar(1) - s);
          gate_grad_[static_cast<std::size_t>(t)] = dz;
          row_matrix_map<scalar>(grad_input + std::ptrdiff_t{t} * H, 1, H) += dz * gate_weight_;
        }
      });
      for (int t = 0; t < tokens_; ++t)
        gate_weight_grad_ += gate_grad_[static_cast<std::size_t>(t)] * input.row(t);
    } else {
      std::copy_n(dy, std::size_t(tokens_) * H, grad_out);
    }
    shared_count_[0] = tokens_;
    expert::grouped_rows<scalar> const all{tokens_, shared_count_, shared_ones_.data()};
    scalar* grad_probs_rows =
        ctx.scratch<scalar>(scratch_slot::grad_row_probs).reserve(std::size_t(tokens_));
    shared_mlp_.backward(
        exec, shared_, all, input_.data(), buf(ctx, scratch_slot::shared_fc1).data(),
        buf(ctx, scratch_slot::shared_act).data(), grad_out,
        ctx.scratch<scalar>(scratch_slot::grad_act).reserve(std::size_t(tokens_) * Fs),
        ctx.scratch<scalar>(scratch_slot::grad_fc1).reserve(std::size_t(tokens_) * fc1_width(Fs)),
        grad_out, grad_probs_rows);
    exec.parallel_rows(tokens_, [&](int begin, int end) {
      for (int t = begin; t < end; ++t)
        row_matrix_map<scalar>(grad_input + std::ptrdiff_t{t} * H, 1, H) +=
            const_row_matrix_map<scalar>(grad_out + std::ptrdiff_t{t} * H, 1, H);
    });
  }

  config_values values_;
  int layer_number_;
  router_type router_;
  expert::expert_parameters<scalar> experts_;
  mlp_type routed_mlp_;
  expert::expert_parameters<scalar> shared_;
  mlp_type shared_mlp_;
  row_matrix<scalar> router_weight_, router_weight_grad_;
  row_matrix<scalar> gate_weight_, gate_weight_grad_;
  std::vector<std::string> names_;

  // Per micro-batch.
  int tokens_ = 0;
  router::batch_shape batch_{};
  std::uint64_t jitter_key_ = 0;
  bool awaiting_backward_ = false;
  buffer<scalar> input_, output_, grad_input_;
  std::array<buffer<scalar>, slot_count> own_;
  row_matrix<logit> logits_, grad_probs_;
  dispatch::permutation perm_;
  std::vector<int> token_row_start_, token_rows_, fill_;
  std::vector<scalar> gate_, gate_grad_, shared_ones_;
  std::array<std::int64_t, 1> shared_count_{};
  std::vector<expert::gemm_problem<scalar>> problem_;
};

}  // namespace megamoe
