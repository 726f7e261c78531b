// SPDX-License-Identifier: Apache-2.0
// megamoe/model/moe_layer.hpp — one MoE layer: route -> dispatch -> experts -> combine, plus the
// optional shared expert, forward and backward, for a configuration type; on one rank
// (dispatch::local) or over a job's process groups (all-to-all or all-gather dispatcher, expert and
// expert-tensor parallelism, sequence-parallel input).
//
//   megamoe::context ctx;
//   megamoe::moe_layer<my_config> layer(/*layer_number=*/0);   // or layer(groups, 0)
//   layer.initialize(seed);
//   auto out = layer.forward(ctx, x, S, B);       // x [S*B, H], token t = s*B + b
//   auto dx = layer.backward(ctx, dy);            // adds every weight gradient
//   layer.for_each_parameter([](std::string_view name, auto value, auto grad,
//                               megamoe::parameter_kind kind) { ... });
//
// The interface is spelled out in docs/layer.md. Inside a step the layer runs no virtual call and,
// on one rank after its first step, allocates nothing: its buffers and the context's scratch only
// grow. What backward needs is kept or recomputed as the memory policy says (memory::keep_all,
// memory::recompute<memory::moe_act>, memory::recompute<memory::moe_layer>, and
// memory::shared_experts for the shared expert).
#pragma once

#include <megamoe/config/resolve.hpp>
#include <megamoe/core/buffer.hpp>
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/config/error.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/dispatch/dispatcher.hpp>
#include <megamoe/dispatch/permute.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/gemm.hpp>
#include <megamoe/expert/mlp.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/precision/operands.hpp>
#include <megamoe/precision/recipe.hpp>
#include <megamoe/router/router.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe {

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

/// The dispatcher a configuration runs: `auto_` is `local` when the type fixes EP = ETP = 1, else
/// `all_to_all` (which also works on one rank).
template <class C>
consteval dispatch::dispatcher layer_dispatcher() {
  constexpr auto chosen = C::dispatch::value;
  if constexpr (chosen != dispatch::dispatcher::auto_) {
    return chosen;
  } else {
    constexpr auto d = C::parallel::value;
    return d.ep == 1 && d.etp == 1 ? dispatch::dispatcher::local : dispatch::dispatcher::all_to_all;
  }
}
}  // namespace detail

template <training_config Config>
class moe_layer {
 public:
  using scalar = detail::layer_scalar<Config>;
  using logit = std::conditional_t<detail::router_in_double<Config>(), double, float>;
  using score = std::conditional_t<std::is_same_v<scalar, double>, double, float>;
  using router_type = router::router_class_t<typename Config::router, logit, score>;
  static constexpr expert::settings expert_settings = Config::expert::value;
  static constexpr memory::settings memory_settings = Config::memory::value;
  static constexpr expert::activation_function activation = expert_settings.activation;
  using backend = expert::backend_t<expert_settings.backend>;
  using mlp_type = expert::grouped_mlp<activation, backend, scalar>;
  /// The router's GEMMs multiply fp32 values: on a BF16 expert backend they take the grouped one.
  using router_backend =
      std::conditional_t<expert::multiplies_bf16<backend>, expert::grouped_gemm, backend>;
  static constexpr dispatch::dispatcher dispatcher_kind = detail::layer_dispatcher<Config>();
  static constexpr bool distributed = dispatch::communicates(dispatcher_kind);
  using dispatcher_type = dispatch::dispatcher_t<dispatcher_kind, scalar, logit>;
  /// Pieces the exchanges overlap with expert compute in (dispatch::all_to_all_overlap); 1: none.
  static constexpr int overlap_pieces = dispatch::overlap_chunks_of<typename Config::dispatch>();
  static constexpr bool overlapped =
      overlap_pieces > 1 && dispatcher_kind == dispatch::dispatcher::all_to_all;
  /// The precision recipe: fp32 and fp64 GEMMs read the values themselves; every other recipe's
  /// expert GEMMs (routed and shared) read its quantized operands, and backward keeps codes.
  static constexpr precision::settings recipe = Config::precision::value;
  static constexpr bool rounds_operands = precision::rounds_operands(recipe);
  /// A recipe's per-tensor amaxes are reduced over the ranks holding parts of one tensor: the
  /// expert-tensor-parallel shards of an expert, the sequence-parallel shards of the shared
  /// expert's tokens. memory::quantized_activations keeps fc1's output as codes too;
  /// memory::quantized_weights makes the routed experts' weight codes their primary copy.
  static constexpr bool quantized_weights = memory_settings.quantized_weights;
  template <bool QuantizedWeights>
  using operands_for = std::conditional_t<
      rounds_operands,
      precision::grouped_operands<typename Config::precision, parallel::communicator_max,
                                  memory_settings.quantized_activations, QuantizedWeights>,
      expert::exact_operands>;
  using operands_type = operands_for<quantized_weights>;  // the routed experts'
  using shared_operands_type = operands_for<false>;
  // Every rule the type's fixed values can break fails here, with its id.
  static_assert(rules::check<Config>());
  static_assert(!rounds_operands || std::is_same_v<scalar, float>,
                "megamoe: the bf16, FP8 and FP4 recipes keep fp32 master weights");

  /// One rank (dispatch::local): `layer_number` names the parameters (decoder.layers.{i}); `given`
  /// supplies what the type left to start-up (sizes, a run-time router). Every configuration rule
  /// is checked here.
  explicit moe_layer(int layer_number = 0, startup_values const& given = {}) requires(!distributed)
      : moe_layer(nullptr, layer_number, given) {}

  /// On the process groups of a job, collective over the stage (TP x DP x CP): a broken rule is
  /// the same agreed error on every rank. The degrees come from the groups' layout. This rank holds
  /// experts [first_expert(), first_expert() + local_experts()), each as its ETP shard: 1/ETP of
  /// the FFN width (fc1 rows, fc2 columns). Its tokens are its own sequence-parallel shard.
  moe_layer(parallel::process_groups const& groups, int layer_number = 0,
            startup_values const& given = {})
      : moe_layer(&groups, layer_number, given) {}

  [[nodiscard]] config_values const& values() const noexcept { return values_; }
  [[nodiscard]] int hidden_size() const noexcept { return values_.shape.hidden; }
  [[nodiscard]] int num_experts() const noexcept { return values_.shape.experts; }
  /// This rank's experts: [first_expert(), first_expert() + local_experts()).
  [[nodiscard]] int first_expert() const noexcept { return first_expert_; }
  [[nodiscard]] int local_experts() const noexcept { return experts_.sizes().experts; }
  /// This rank's ETP shard of each local expert: FFN columns [ffn_offset(), + local ffn()).
  [[nodiscard]] int ffn_offset() const noexcept { return ffn_offset_; }
  [[nodiscard]] int local_ffn() const noexcept { return experts_.sizes().ffn; }
  /// The layer's dispatcher (its bookkeeping describes the last forward).
  [[nodiscard]] dispatcher_type const& dispatcher() const noexcept { return dispatcher_; }
  [[nodiscard]] router_type& router() noexcept { return router_; }
  [[nodiscard]] router_type const& router() const noexcept { return router_; }
  [[nodiscard]] bool has_shared_expert() const noexcept { return values_.shape.shared_ffn > 0; }
  [[nodiscard]] bool has_shared_gate() const noexcept {
    return has_shared_expert() && expert_settings.shared_expert_gate;
  }
  /// The permutation of the last forward (rows grouped by expert), with dispatch::local.
  [[nodiscard]] dispatch::permutation const& permutation() const noexcept
      requires(dispatcher_kind == dispatch::dispatcher::local) {
    return dispatcher_.local_rows().permutation();
  }

  /// Draws every weight from N(0, std^2) as a function of (seed, parameter, element); biases 0.
  /// Parameters and elements are numbered as on one rank, so every parallel mapping starts from
  /// the same weights.
  void initialize(std::uint64_t seed, double std = 0.02) {
    if constexpr (quantized_weights)
      if (!experts_.holds_weights())
        throw input_error(
            "moe_layer: initialize() draws fp32 expert weights, and an optimizer already holds "
            "them (memory::quantized_weights): initialize before constructing the optimizer");
    visit_parameters([&](std::string_view name, row_matrix_map<scalar> value,
                         row_matrix_map<scalar>, parameter_kind, std::uint64_t index,
                         element_numbering const& numbering) {
      bool const bias = name.find(".bias") != std::string_view::npos;
      for (Eigen::Index r = 0; r < value.rows(); ++r)
        for (Eigen::Index c = 0; c < value.cols(); ++c)
          value(r, c) = bias ? scalar(0)
                             : static_cast<scalar>(
                                   std * standard_normal(seed + index, numbering.global(r, c)));
    });
    if constexpr (quantized_weights) refresh_weight_codes();
  }

  /// Calls f(name, value, grad, kind) for every parameter this rank holds, with value and grad as
  /// row-major maps (biases as [1, n]), named as the reference names them on one rank (experts by
  /// their global number; with ETP > 1 each is this rank's shard).
  template <class F>
  void for_each_parameter(F&& f) {
    visit_parameters([&](std::string_view name, row_matrix_map<scalar> value,
                         row_matrix_map<scalar> grad, parameter_kind kind, std::uint64_t,
                         element_numbering const&) { f(name, value, grad, kind); });
  }

  // --- memory::quantized_weights: the routed experts' weights held as codes ---------------------
  //
  // The recipe's codes (both copies where they differ) are the routed experts' primary weights:
  // forward and backward dequantize them, nothing re-quantizes them per micro-batch. The fp32
  // values drawn by initialize() (or written through for_each_parameter) stay until an optimizer
  // takes its shard of them as the fp32 master (optim::distributed_adamw does, then calls
  // release_weight_values()); after each update the optimizer hands every whole tensor back
  // through for_each_quantized_weight, which quantizes it. With per-tensor scales both calls that
  // quantize are collective over the expert-tensor-parallel group (the amax reduction).

  /// Quantizes the codes from the fp32 values the layer holds: initialize() calls it; call it after
  /// writing weights through for_each_parameter.
  void refresh_weight_codes() requires quantized_weights {
    if (!experts_.holds_weights())
      throw input_error(
          "moe_layer: refresh_weight_codes() needs the fp32 expert weights, which an optimizer "
          "holds now");
    int const L = local_experts(), H = hidden_size(), F = local_ffn();
    routed_ops_.store_weights(expert::linear::fc1, experts_.fc1_data(0), fc1_width(F), H, 0, L);
    routed_ops_.store_weights(expert::linear::fc2, experts_.fc2_data(0), H, F, 0, L);
  }
  /// Frees the fp32 values of the routed experts' weights (their codes stay): for_each_parameter
  /// then shows them as 0-row maps.
  void release_weight_values() requires quantized_weights { experts_.release_weights(); }
  [[nodiscard]] bool holds_weight_values() const noexcept { return experts_.holds_weights(); }
  /// Calls f(name, store) for every parameter of kind quantized_expert, in for_each_parameter's
  /// order; store(w) quantizes that tensor's codes from w, its whole fp32 values row-major.
  template <class F>
  void for_each_quantized_weight(F&& f) requires quantized_weights {
    int const L = local_experts(), H = hidden_size(), Fl = local_ffn(), W1 = fc1_width(Fl);
    for (int e = 0; e < L; ++e)
      f(std::string_view(names_[static_cast<std::size_t>(1 + e)]), [&, e](scalar const* w) {
        routed_ops_.store_weights(expert::linear::fc1, w, W1, H, e, e + 1);
      });
    for (int e = 0; e < L; ++e)
      f(std::string_view(names_[static_cast<std::size_t>(1 + L + e)]), [&, e](scalar const* w) {
        routed_ops_.store_weights(expert::linear::fc2, w, H, Fl, e, e + 1);
      });
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
    router::pass const mode = ctx.step.mode;
    // Whatever happens below, the previous forward's state is gone: no backward may follow a
    // forward that failed.
    awaiting_backward_ = false;
    // On a job, every rank of the stage hears of a bad input here, before any collective.
    agree([&] {
      if (seq_length < 1 || micro_batch_size < 1)
        throw input_error("moe_layer: the micro-batch needs S >= 1 and B >= 1, got S = " +
                          std::to_string(seq_length) + ", B = " + std::to_string(micro_batch_size));
      if (x.rows() != std::int64_t{seq_length} * micro_batch_size || x.cols() != H)
        throw input_error(
            "moe_layer: input has shape " + router::detail::shape_text(x.rows(), x.cols()) +
            ", expected " +
            router::detail::shape_text(std::int64_t{seq_length} * micro_batch_size, H) +
            " (S*B tokens x hidden size)");
      if (mode == router::pass::recompute)
        throw input_error(
            "moe_layer: pass::recompute is the layer's own; forward in training or eval");
      if constexpr (quantized_weights)
        if (!routed_ops_.holds_weights(fc1_width(local_ffn()), H, local_ffn()))
          throw input_error(
              "moe_layer: memory::quantized_weights: the expert weights have no codes yet; call "
              "initialize(), or refresh_weight_codes() after writing the weights");
    });
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
    agree([&] {
      if (!awaiting_backward_)
        throw input_error("moe_layer: backward needs a training forward first (once per forward)");
      router::require_shape(dy, tokens_, H, "moe_layer: output gradient");
    });
    awaiting_backward_ = false;
    auto& exec = ctx.executor<scalar>();
    auto& pool = ctx.pool();
    auto& stages = ctx.stages;
    bind_operands(ctx);
    if (memory_settings.moe_layer) {
      compute_forward(ctx, router::pass::recompute, false);
    } else {
      if (memory_settings.moe_act)
        stages.time(layer_stage::experts, [&] {
          int const n = dispatcher_.expert_rows();
          routed_mlp_.recompute_activation(
              exec, rows(ctx),
              buf(ctx, scratch_slot::routed_fc1).reserve(std::size_t(n) * fc1_width(local_ffn())),
              buf(ctx, scratch_slot::routed_act).reserve(std::size_t(n) * local_ffn()),
              routed_ops_);
        });
      if (memory_settings.shared_experts && has_shared_expert())
        stages.time(layer_stage::shared_expert, [&] { shared_forward(ctx); });
    }
    int const N = dispatcher_.expert_rows();
    int const W1 = fc1_width(local_ffn()), F = local_ffn();
    // Combine backward is a dispatch: each row takes its token's gradient.
    scalar* grad_rows = ctx.scratch<scalar>(scratch_slot::grad_rows).reserve(std::size_t(N) * H);
    scalar* grad_probs_rows =
        ctx.scratch<scalar>(scratch_slot::grad_row_probs).reserve(std::size_t(N));
    scalar* grad_act = ctx.scratch<scalar>(scratch_slot::grad_act).reserve(std::size_t(N) * F);
    scalar* grad_fc1 = ctx.scratch<scalar>(scratch_slot::grad_fc1).reserve(std::size_t(N) * W1);
    // The experts' backward from their output gradients (in grad_rows) to their input gradients
    // (in place) and prob gradients, for local experts [first, last).
    auto experts_backward = [&](int first, int last) {
      routed_mlp_.backward(exec, experts_, rows(ctx), buf(ctx, scratch_slot::routed_rows).data(),
                           buf(ctx, scratch_slot::routed_fc1).data(),
                           buf(ctx, scratch_slot::routed_act).data(), grad_rows, grad_act, grad_fc1,
                           grad_rows, grad_probs_rows, {first, last}, routed_ops_);
    };
    auto grad_input = grad_input_.matrix(tokens_, H);
    if constexpr (overlapped) {
      // Combine backward (a dispatch of dy), the experts and dispatch backward (a combine),
      // pipelined by pieces of local experts.
      stages.time(layer_stage::experts, [&] {
        grad_input.setZero();
        grad_probs_.setZero(tokens_, E);
        dispatcher_.dispatch_compute_combine_grad(pool, dy.data(), grad_rows, grad_probs_rows,
                                                  grad_input.data(), grad_probs_, experts_backward);
      });
    } else {
      // Combine backward is a dispatch: each row takes its token's gradient.
      stages.time(layer_stage::unpermute,
                  [&] { dispatcher_.dispatch(pool, dy.data(), grad_rows); });
      stages.time(layer_stage::experts, [&] { experts_backward(0, local_experts()); });
      // Dispatch backward is a combine: each token adds its rows' gradients, in row order, and the
      // probs' gradients go back to their tokens.
      stages.time(layer_stage::permute, [&] {
        grad_input.setZero();
        grad_probs_.setZero(tokens_, E);
        dispatcher_.combine_grad(pool, grad_rows, grad_probs_rows, grad_input.data(), grad_probs_);
      });
    }
    // Then through the router (attached losses included) and its gating.
    stages.time(layer_stage::router, [&] { router_backward(ctx, grad_input); });
    if (has_shared_expert())
      stages.time(layer_stage::shared_expert,
                  [&] { shared_backward(ctx, dy.data(), grad_input.data()); });
    if constexpr (rounds_operands) {
      routed_ops_.end_of_step();
      shared_ops_.end_of_step();
    }
    return {grad_input_.data(), tokens_, H};
  }

  /// The routed experts' GEMM operands of the last step under a precision recipe (codes, scales,
  /// delayed-scaling state), for inspection.
  [[nodiscard]] operands_type const& routed_operands() const noexcept requires rounds_operands {
    return routed_ops_;
  }
  [[nodiscard]] shared_operands_type const& shared_operands() const noexcept requires
      rounds_operands {
    return shared_ops_;
  }
  /// Keeps every operand copy's codes of the last step for inspection (precision::
  /// grouped_operands::keep_all_codes).
  void keep_all_operand_codes(bool on) noexcept requires rounds_operands {
    routed_ops_.keep_all_codes(on);
    shared_ops_.keep_all_codes(on);
  }

  /// Once per global batch (after its last backward): the router's expert-bias update from the
  /// token counts summed over TP x DP x CP. Collective over that group on a job.
  void finish_global_batch() {
    router_.state().finish_global_batch(
        router::reduction_groups<parallel::communicator_sum, parallel::communicator_sum>{
            tp_cp_, tp_dp_cp_});
  }

  /// Bytes kept from forward to backward under this layer's memory policy: the input copy, and the
  /// rows, fc1 output, activation and routing bookkeeping the policy does not recompute. Scratch
  /// (shared by all layers through the context) is not counted.
  [[nodiscard]] std::size_t saved_activation_bytes() const {
    std::size_t bytes = input_.used_bytes();
    for (std::size_t s = 0; s < own_.size(); ++s)
      if (is_saved(static_cast<scratch_slot>(s))) bytes += own_[s].used_bytes();
    if (!memory_settings.moe_layer) {
      bytes += dispatcher_.saved_bytes();
      bytes += gate_.size() * sizeof(scalar);
      bytes += static_cast<std::size_t>(router_.output().probs.size()) * (sizeof(logit) + 1);
      if constexpr (rounds_operands) {
        bytes += routed_ops_.saved_bytes(dispatcher_.expert_rows(), fc1_width(local_ffn()));
        if (has_shared_expert() && !memory_settings.shared_experts)
          bytes += shared_ops_.saved_bytes(tokens_, fc1_width(values_.shape.shared_ffn));
      }
    }
    return bytes;
  }

 private:
  static constexpr auto slot_count = static_cast<std::size_t>(scratch_slot::count);

  /// Kept by the layer between forward and backward (else taken from the context's scratch).
  /// Under a precision recipe the experts' GEMM inputs and fc1 outputs are kept by the operands
  /// (as codes and BF16), so the fp32 rows, fc1 outputs and activations need no keeping.
  static constexpr bool is_saved(scratch_slot s) {
    bool const whole_layer = memory_settings.moe_layer;
    switch (s) {
      case scratch_slot::row_probs: return !whole_layer;
      case scratch_slot::routed_rows:
      case scratch_slot::routed_fc1: return !whole_layer && !rounds_operands;
      case scratch_slot::routed_act:
        return !whole_layer && !memory_settings.moe_act && !rounds_operands;
      case scratch_slot::shared_fc1:
      case scratch_slot::shared_act:
        return !whole_layer && !memory_settings.shared_experts && !rounds_operands;
      case scratch_slot::shared_out:
        return !whole_layer && !memory_settings.shared_experts &&
               expert_settings.shared_expert_gate;
      default: return false;
    }
  }

  moe_layer(parallel::process_groups const* groups, int layer_number, startup_values const& given)
      : groups_(groups),
        values_(agreed_values(groups, given)),
        layer_number_(layer_number),
        router_(router_settings(values_), values_.shape.experts,
                Config::precision::value.padding_multiple),
        experts_(routed_sizes(values_)),
        routed_mlp_(routed_sizes(values_)),
        shared_(shared_sizes(values_)),
        shared_mlp_(shared_sizes(values_)),
        routed_ops_(
            make_operands<operands_type>(routed_sizes(values_).experts, 2 * layer_number + 1,
                                         groups == nullptr ? nullptr : &groups->expert_tp())),
        shared_ops_(make_operands<shared_operands_type>(
            1, 2 * layer_number + 2, groups == nullptr ? nullptr : &groups->tp_cp())),
        dispatcher_(make_dispatcher(groups, values_)),
        router_weight_(values_.shape.experts, values_.shape.hidden),
        router_weight_grad_(row_matrix<scalar>::Zero(values_.shape.experts, values_.shape.hidden)),
        problem_(1) {
    if (groups != nullptr) {
      first_expert_ = groups->ep().rank() * local_experts();
      if constexpr (rounds_operands) routed_ops_.number_experts_from(first_expert_);
      ffn_offset_ = groups->expert_tp().rank() * local_ffn();
      tp_cp_ = parallel::communicator_sum(groups->tp_cp());
      tp_dp_cp_ = parallel::communicator_sum(groups->tp_dp_cp());
    }
    if (has_shared_gate()) {
      gate_weight_ = row_matrix<scalar>::Zero(1, values_.shape.hidden);
      gate_weight_grad_ = row_matrix<scalar>::Zero(1, values_.shape.hidden);
    }
    router_weight_.setZero();
    name_parameters();
  }

  /// On a job every rank of the stage checks, and a broken rule is the same agreed error on all.
  static config_values agreed_values(parallel::process_groups const* groups,
                                     startup_values const& given) {
    if (groups == nullptr) return checked_values(nullptr, given);
    config_values v;
    parallel::check_on_every_rank(groups->tp_dp_cp(), [&] { v = checked_values(groups, given); });
    return v;
  }

  static config_values checked_values(parallel::process_groups const* groups,
                                      startup_values given) {
    if (groups != nullptr) {
      auto const& l = groups->layout();
      given.world_size = l.world_size;
      given.tp = l.tp;
      given.cp = l.cp;
      given.pp = l.pp;
      given.etp = l.etp;
      given.ep = l.ep;
    }
    config_values v = resolve<Config>(given);
    if (!v.router) throw config_error(rules::id::values_resolved, "moe_layer: give the run-time router's settings");
    if (auto const why = expert::unavailable_reason(expert_settings.backend); !why.empty())
      throw input_error(
          "moe_layer: expert::" + std::string(expert::name_of(expert_settings.backend)) +
          " cannot run here: " + why);
    if (dispatcher_kind == dispatch::dispatcher::local &&
        (v.parallel.ep != 1 || v.parallel.etp != 1))
      throw config_error(rules::id::local_dispatch_needs_one_expert_rank,
                         "moe_layer with dispatch::local runs its experts on one rank: EP and "
                         "ETP must be 1 (EP " +
                             std::to_string(v.parallel.ep) + ", ETP " +
                             std::to_string(v.parallel.etp) + ")");
    return v;
  }

  static dispatcher_type make_dispatcher(parallel::process_groups const* groups,
                                         config_values const& v) {
    if constexpr (overlapped) {
      return dispatcher_type(
          dispatch::expert_groups(*groups, v.shape.experts), v.shape.hidden, overlap_pieces,
          std::size_t{1024} * dispatch::overlap_min_piece_kib_of<typename Config::dispatch>());
    } else if constexpr (distributed) {
      return dispatcher_type(dispatch::expert_groups(*groups, v.shape.experts), v.shape.hidden);
    } else {
      return dispatcher_type(v.shape.hidden);
    }
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

  /// This rank's experts: E/EP of them, each 1/ETP of the FFN width.
  static expert::mlp_sizes routed_sizes(config_values const& v) {
    return {v.shape.experts / v.parallel.ep, v.shape.hidden, v.shape.ffn / v.parallel.etp,
            activation, expert_settings.bias};
  }
  static expert::mlp_sizes shared_sizes(config_values const& v) {
    // Without a shared expert these sizes are a placeholder that is never run.
    return {1, v.shape.hidden, std::max(1, v.shape.shared_ffn), activation, false};
  }
  static constexpr int fc1_width(int ffn) { return expert::fc1_width(activation, ffn); }

  template <class Operands>
  static Operands make_operands(int experts, std::uint64_t seed,
                                boost::mpi::communicator const* amax_group) {
    if constexpr (rounds_operands) {
      return Operands(experts, splitmix64(seed),
                      amax_group == nullptr ? parallel::communicator_max()
                                            : parallel::communicator_max(*amax_group));
    } else {
      return {};
    }
  }

  /// Points the recipe's operands at the context's workspaces (before each forward and backward).
  void bind_operands(context& ctx) {
    if constexpr (rounds_operands) {
      auto& a = ctx.scratch<float>(scratch_slot::operand_a);
      auto& b = ctx.scratch<float>(scratch_slot::operand_b);
      auto& w = ctx.scratch<float>(scratch_slot::operand_weights);
      routed_ops_.bind(ctx.pool(), a, b, w);
      shared_ops_.bind(ctx.pool(), a, b, w);
    }
  }

  static row_matrix_map<scalar> map(row_matrix<scalar>& m) {
    return {m.data(), m.rows(), m.cols()};
  }

  void name_parameters() {
    std::string const prefix = "decoder.layers." + std::to_string(layer_number_) + ".mlp.";
    names_.push_back(prefix + "router.weight");
    auto experts = [&](char const* what) {
      for (int e = 0; e < local_experts(); ++e)
        names_.push_back(prefix + "experts." + what + std::to_string(first_expert_ + e));
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

  /// How element (r, c) of this rank's copy or shard of a parameter is numbered in the whole
  /// parameter (row-major): ETP shards are row and column offsets; a SwiGLU fc1 shard holds rows of
  /// the gate half and of the linear half.
  struct element_numbering {
    std::int64_t global_cols = 0;
    std::int64_t col_offset = 0;
    std::int64_t half_rows = 0;  // > 0: local rows [0, half_rows) are the gate's, the rest linear
    std::int64_t first_row = 0, second_row = 0;

    [[nodiscard]] std::uint64_t global(Eigen::Index r, Eigen::Index c) const {
      std::int64_t const row =
          half_rows == 0 || r < half_rows ? first_row + r : second_row + (r - half_rows);
      return static_cast<std::uint64_t>(row * global_cols + col_offset + c);
    }
  };

  /// f(name, value, grad, kind, index, numbering) for every parameter this rank holds; index is the
  /// parameter's number on one rank (1 = router weight).
  template <class Visitor>
  void visit_parameters(Visitor&& f) {
    std::size_t n = 0;
    auto visit = [&](row_matrix_map<scalar> value, row_matrix_map<scalar> grad, parameter_kind k,
                     std::uint64_t index, element_numbering const& numbering) {
      f(std::string_view(names_[n++]), value, grad, k, index, numbering);
    };
    std::int64_t const E = num_experts(), H = hidden_size(), Ffull = values_.shape.ffn;
    std::int64_t const Fl = local_ffn(), first = first_expert_;
    bool const glu = expert::fc1_width(activation, 1) == 2;
    visit(map(router_weight_), map(router_weight_grad_), parameter_kind::dense, 1, {H});
    element_numbering const fc1 =
        glu ? element_numbering{H, 0, Fl, ffn_offset_, Ffull + ffn_offset_}
            : element_numbering{H, 0, 0, ffn_offset_, 0};
    element_numbering const fc2{Ffull, ffn_offset_};
    int const L = local_experts();
    constexpr parameter_kind weights =
        quantized_weights ? parameter_kind::quantized_expert : parameter_kind::expert;
    for (int e = 0; e < L; ++e)
      visit(experts_.fc1(e), experts_.grad_fc1(e), weights,
            static_cast<std::uint64_t>(2 + first + e), fc1);
    for (int e = 0; e < L; ++e)
      visit(experts_.fc2(e), experts_.grad_fc2(e), weights,
            static_cast<std::uint64_t>(2 + E + first + e), fc2);
    std::uint64_t next = static_cast<std::uint64_t>(2 + 2 * E);
    if (expert_settings.bias) {  // ETP = 1 (R014): whole vectors
      for (int e = 0; e < L; ++e)
        visit(experts_.fc1_bias(e), experts_.grad_fc1_bias(e), parameter_kind::expert,
              next + static_cast<std::uint64_t>(first + e), {experts_.fc1_bias(e).cols()});
      for (int e = 0; e < L; ++e)
        visit(experts_.fc2_bias(e), experts_.grad_fc2_bias(e), parameter_kind::expert,
              next + static_cast<std::uint64_t>(E + first + e), {H});
      next += static_cast<std::uint64_t>(2 * E);
    }
    if (has_shared_expert()) {
      visit(shared_.fc1(0), shared_.grad_fc1(0), parameter_kind::dense, next, {H});
      visit(shared_.fc2(0), shared_.grad_fc2(0), parameter_kind::dense, next + 1,
            {values_.shape.shared_ffn});
      if (has_shared_gate())
        visit(map(gate_weight_), map(gate_weight_grad_), parameter_kind::dense, next + 2, {H});
    }
  }

  [[nodiscard]] bool fast_gating() const {
    return std::is_same_v<logit, scalar> &&
           !(router_.config().input_jitter_eps && *router_.config().input_jitter_eps > 0.0);
  }

  /// Through the router (attached losses included) and its gating: dx += dz Wr, dWr += dz^T x.
  void router_backward(context& ctx, row_matrix_map<scalar> grad_input) {
    int const H = hidden_size(), E = num_experts();
    auto& exec = ctx.executor<scalar>();
    if constexpr (std::is_same_v<logit, scalar>) {
      if (fast_gating()) {
        auto const& grad_logits = router_.backward(grad_probs_, ctx.step.loss_backward_scale);
        run_one<expert::gemm_op::nn>(exec, {tokens_, H, E, grad_logits.data(), E,
                                            router_weight_.data(), H, grad_input.data(), H, true});
        run_one<expert::gemm_op::tn>(exec, {E, H, tokens_, grad_logits.data(), E, input_.data(), H,
                                            router_weight_grad_.data(), H, true});
        return;
      }
    }
    auto const input = const_row_matrix_map<scalar>(input_.data(), tokens_, H);
    row_matrix<scalar> grad_weight(E, H), grad_hidden(tokens_, H);
    router_.backward(grad_probs_, ctx.step.loss_backward_scale, input, router_weight_, grad_hidden,
                     grad_weight);
    grad_input += grad_hidden;
    router_weight_grad_ += grad_weight;
  }

  buffer<scalar>& buf(context& ctx, scratch_slot s) {
    return is_saved(s) ? own_[static_cast<std::size_t>(s)] : ctx.scratch<scalar>(s);
  }

  expert::grouped_rows<scalar> rows(context& ctx) {
    return {dispatcher_.expert_rows(), dispatcher_.tokens_per_local_expert(),
            buf(ctx, scratch_slot::row_probs).data()};
  }

  template <expert::gemm_op Op>
  void run_one(expert::executor<scalar>& exec, expert::gemm_problem<scalar> const& p) {
    problem_[0] = p;
    router_backend::template run<Op>(exec, std::span<expert::gemm_problem<scalar> const>(problem_));
  }

  /// Route, permute and run the experts (and the shared expert) from the kept input; the training
  /// and eval forward also combine into the output.
  void compute_forward(context& ctx, router::pass mode, bool combine) {
    int const H = hidden_size(), E = num_experts();
    auto& exec = ctx.executor<scalar>();
    bind_operands(ctx);
    auto const input = const_row_matrix_map<scalar>(input_.data(), tokens_, H);
    router::route_options options;
    options.mode = mode;
    options.jitter_key = jitter_key_;
    auto& stages = ctx.stages;
    auto& pool = ctx.pool();
    router::reduction_groups<parallel::communicator_sum, parallel::communicator_sum> const groups{
        tp_cp_, tp_dp_cp_};
    // A routing failure on this rank (say a NaN in its tokens) goes to the dispatcher's plan,
    // whose exchange makes it an error on every rank instead of a rank missing from a collective.
    std::exception_ptr routing_failure;
    stages.time(layer_stage::router, [&] {
      try {
        if constexpr (std::is_same_v<logit, scalar>) {
          if (fast_gating()) {
            logits_.resize(tokens_, E);
            run_one<expert::gemm_op::nt>(
                exec, {tokens_, E, H, input_.data(), H, router_weight_.data(), H, logits_.data(), E,
                       false});
            router_.route(logits_, batch_, options, groups);
            return;
          }
        }
        router_.route(input, router_weight_, batch_, options, groups);
      } catch (...) {
        routing_failure = std::current_exception();
      }
    });
    auto const& routing = router_.output();
    int const W1 = fc1_width(local_ffn()), F = local_ffn();
    scalar* routed_rows = nullptr;
    stages.time(layer_stage::permute, [&] {
      dispatcher_.plan(pool, routing.routing_map,
                       router_.config().pad_to_capacity ? routing.capacity : 0, routing_failure);
      int const N = dispatcher_.expert_rows();
      routed_rows = buf(ctx, scratch_slot::routed_rows).reserve(std::size_t(N) * H);
      buf(ctx, scratch_slot::row_probs).reserve(std::size_t(N));
    });
    int const N = dispatcher_.expert_rows();
    scalar* routed_out = ctx.scratch<scalar>(scratch_slot::routed_out).reserve(std::size_t(N) * H);
    scalar* fc1 = buf(ctx, scratch_slot::routed_fc1).reserve(std::size_t(N) * W1);
    scalar* act = buf(ctx, scratch_slot::routed_act).reserve(std::size_t(N) * F);
    auto experts_forward = [&](int first, int last) {
      routed_mlp_.forward(exec, experts_, rows(ctx), routed_rows, fc1, act, routed_out,
                          {first, last}, routed_ops_);
    };
    auto output = output_.matrix(tokens_, H);
    if constexpr (overlapped) {
      if (combine) {  // dispatch, experts and combine pipelined by pieces of local experts
        stages.time(layer_stage::experts, [&] {
          dispatcher_.dispatch_compute_combine(pool, input_.data(), routed_rows, routing.probs,
                                               buf(ctx, scratch_slot::row_probs).data(), routed_out,
                                               output.data(), experts_forward);
        });
      }
    }
    if (!overlapped || !combine) {
      stages.time(layer_stage::permute, [&] {
        dispatcher_.dispatch(pool, input_.data(), routed_rows, routing.probs,
                             buf(ctx, scratch_slot::row_probs).data());
      });
      stages.time(layer_stage::experts, [&] { experts_forward(0, local_experts()); });
    }
    if (has_shared_expert()) stages.time(layer_stage::shared_expert, [&] { shared_forward(ctx); });
    if (!combine) return;
    if (!overlapped)
      stages.time(layer_stage::unpermute,
                  [&] { dispatcher_.combine(pool, routed_out, output.data()); });
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

  /// Runs `check` locally on one rank, or on every rank of the stage with agreement on failure.
  template <class Check>
  void agree(Check&& check) const {
    if (groups_ != nullptr)
      parallel::check_on_every_rank(groups_->tp_dp_cp(), std::forward<Check>(check));
    else
      check();
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
        buf(ctx, scratch_slot::shared_out).reserve(std::size_t(tokens_) * H), {}, shared_ops_);
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
        grad_out, grad_probs_rows, {}, shared_ops_);
    exec.parallel_rows(tokens_, [&](int begin, int end) {
      for (int t = begin; t < end; ++t)
        row_matrix_map<scalar>(grad_input + std::ptrdiff_t{t} * H, 1, H) +=
            const_row_matrix_map<scalar>(grad_out + std::ptrdiff_t{t} * H, 1, H);
    });
  }

  parallel::process_groups const* groups_ = nullptr;
  config_values values_;
  int layer_number_;
  router_type router_;
  expert::expert_parameters<scalar> experts_;
  mlp_type routed_mlp_;
  expert::expert_parameters<scalar> shared_;
  mlp_type shared_mlp_;
  operands_type routed_ops_;
  shared_operands_type shared_ops_;
  dispatcher_type dispatcher_;
  int first_expert_ = 0, ffn_offset_ = 0;
  parallel::communicator_sum tp_cp_, tp_dp_cp_;  // the router's reduction groups
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
  std::vector<scalar> gate_, gate_grad_, shared_ones_;
  std::array<std::int64_t, 1> shared_count_{};
  std::vector<expert::gemm_problem<scalar>> problem_;
};

}  // namespace megamoe
