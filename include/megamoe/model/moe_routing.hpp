// SPDX-License-Identifier: Apache-2.0
// megamoe/model/moe_routing.hpp — an MoE layer's routing stage: the gating linear z = x Wr^T and
// the router (scores, top-k, capacity, attached losses), forward and backward.
//
// The gating runs on the layer's GEMM backend (on fp32 values) when the router computes in the
// layer's type without input jitter; otherwise the router's own gating does it. Its reductions
// (aux-loss counts over TPxCP, global-aux and expert-bias counts over TPxDPxCP) go over the job's
// groups.
#pragma once

#include <megamoe/core/parameter.hpp>
#include <megamoe/core/stage_times.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/gemm_problem.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/model/moe_types.hpp>
#include <megamoe/model/parameter_layout.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/router/router.hpp>

#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace megamoe {

template <class Types>
class routing_stage {
 public:
  using scalar = typename Types::scalar;
  using logit = typename Types::logit;
  using router_type = typename Types::router_type;
  using groups_type =
      router::reduction_groups<parallel::communicator_sum, parallel::communicator_sum>;

  routing_stage(router::settings const& settings, int experts, int hidden, int padding_multiple,
                std::string const& prefix, parallel::process_groups const* groups)
      : router_(settings, experts, padding_multiple),
        weight_(row_matrix<scalar>::Zero(experts, hidden)),
        weight_grad_(row_matrix<scalar>::Zero(experts, hidden)),
        name_(prefix + "router.weight"),
        problem_(1) {
    if (groups != nullptr)
      groups_ = {parallel::communicator_sum(groups->tp_cp()),
                 parallel::communicator_sum(groups->tp_dp_cp())};
  }

  [[nodiscard]] router_type& router() noexcept { return router_; }
  [[nodiscard]] router_type const& router() const noexcept { return router_; }
  [[nodiscard]] router::routing_output<logit> const& output() const noexcept {
    return router_.output();
  }

  /// Routes the tokens x [T,H] of a micro-batch. A failure on this rank (say a NaN in its tokens)
  /// is returned, not thrown: the dispatcher's plan makes it an error on every rank instead of a
  /// rank missing from a collective.
  std::exception_ptr forward(context& ctx, const_row_matrix_map<scalar> x,
                             router::batch_shape batch, router::route_options const& options) {
    // The global aux loss reads the running mean of the counts: a recompute reads it as the
    // training forward it repeats left it, even after later micro-batches added to it (a
    // pipeline runs several forwards before their backwards).
    auto& state = router_.state();
    bool const global_aux = router_.config().global_aux_loss_coeff.value_or(0.0) > 0.0;
    global_aux_snapshot* earlier = nullptr;
    if (global_aux && options.mode == router::pass::recompute)
      for (std::size_t i = 0; i < snapshots_used_; ++i)
        if (global_aux_snapshots_[i].key == options.jitter_key) earlier = &global_aux_snapshots_[i];
    if (earlier != nullptr) swap_global_aux(*earlier);
    auto const failure = route(ctx, x, batch, options);
    if (earlier != nullptr) swap_global_aux(*earlier);
    if (global_aux && options.mode == router::pass::training) {
      if (snapshots_used_ == global_aux_snapshots_.size()) global_aux_snapshots_.emplace_back();
      auto& snapshot = global_aux_snapshots_[snapshots_used_++];
      snapshot.key = options.jitter_key;
      snapshot.tokens.assign(state.global_tokens_per_expert.begin(),
                             state.global_tokens_per_expert.end());
      snapshot.steps = state.global_aux_steps;
    }
    return failure;
  }

 private:
  struct global_aux_snapshot {
    std::uint64_t key = 0;
    std::vector<double> tokens;
    int steps = 0;
  };
  void swap_global_aux(global_aux_snapshot& s) {
    std::swap(router_.state().global_tokens_per_expert, s.tokens);
    std::swap(router_.state().global_aux_steps, s.steps);
  }
  std::exception_ptr route(context& ctx, const_row_matrix_map<scalar> x, router::batch_shape batch,
                           router::route_options const& options) {
    std::exception_ptr failure;
    ctx.stages.time(layer_stage::router, [&] {
      try {
        if constexpr (std::is_same_v<logit, scalar>) {
          if (gates_on_backend()) {
            int const T = static_cast<int>(x.rows()), H = static_cast<int>(x.cols());
            int const E = router_.num_experts();
            logits_.resize(T, E);
            run_one<expert::gemm_op::nt>(
                ctx, {T, E, H, x.data(), H, weight_.data(), H, logits_.data(), E, false});
            router_.route(logits_, batch, options, groups_);
            return;
          }
        }
        router_.route(x, weight_, batch, options, groups_);
      } catch (...) {
        failure = std::current_exception();
      }
    });
    return failure;
  }

 public:
  /// The probs' gradient [T,E] the dispatcher's backward fills (entries set), zeroed.
  row_matrix<logit>& grad_probs(int tokens) {
    grad_probs_.setZero(tokens, router_.num_experts());
    return grad_probs_;
  }

  /// Through the router (attached losses included, scaled by ctx.step.loss_backward_scale) and
  /// the gating: grad_input += dz Wr, dWr += dz^T x.
  void backward(context& ctx, const_row_matrix_map<scalar> x, row_matrix_map<scalar> grad_input) {
    ctx.stages.time(layer_stage::router, [&] {
      int const T = static_cast<int>(x.rows()), H = static_cast<int>(x.cols());
      int const E = router_.num_experts();
      double const scale = ctx.step.loss_backward_scale;
      if constexpr (std::is_same_v<logit, scalar>) {
        if (gates_on_backend()) {
          auto const& dz = router_.backward(grad_probs_, scale);
          run_one<expert::gemm_op::nn>(
              ctx, {T, H, E, dz.data(), E, weight_.data(), H, grad_input.data(), H, true});
          run_one<expert::gemm_op::tn>(
              ctx, {E, H, T, dz.data(), E, x.data(), H, weight_grad_.data(), H, true});
          return;
        }
      }
      row_matrix<scalar> grad_weight(E, H), grad_hidden(T, H);
      router_.backward(grad_probs_, scale, x, weight_, grad_hidden, grad_weight);
      grad_input += grad_hidden;
      weight_grad_ += grad_weight;
    });
  }

  /// Once per global batch: the expert-bias update from the counts summed over TPxDPxCP
  /// (collective over that group on a job).
  void finish_global_batch() {
    router_.state().finish_global_batch(groups_);
    snapshots_used_ = 0;
  }
  /// The global batch's forwards will run again (a recomputed step): what they counted is
  /// forgotten, the expert bias kept.
  void discard_global_batch() {
    router_.state().discard_global_batch();
    snapshots_used_ = 0;
  }
  /// The backward of the forward with this key is done: its global-aux snapshot is not needed.
  void release_global_aux(std::uint64_t key) {
    for (std::size_t i = 0; i < snapshots_used_; ++i)
      if (global_aux_snapshots_[i].key == key) {
        std::swap(global_aux_snapshots_[i], global_aux_snapshots_[--snapshots_used_]);
        return;
      }
  }

  void zero_grad() { weight_grad_.setZero(); }

  /// Sets micro-batch `key`'s routing aside (core/stash.hpp), or brings it back.
  void park(std::uint64_t key) { router_.park(key); }
  void restore(std::uint64_t key) { router_.restore(key); }

  /// f(name, value, grad, kind, number, numbering) for the router weight (parameter 1).
  template <class Visitor>
  void visit_parameters(Visitor&& f) {
    f(std::string_view(name_), view(weight_), view(weight_grad_), parameter_kind::dense,
      std::uint64_t{1}, element_numbering{weight_.cols()});
  }

  /// f(persistent_state) for the state the router keeps across global batches: its expert bias
  /// (the token counts start again at every global batch). Every rank holds the same bias.
  template <class F>
  void for_each_persistent_state(F&& f) {
    auto& bias = router_.state().expert_bias;
    if (bias.empty()) return;
    std::string const name = name_.substr(0, name_.rfind('.')) + ".expert_bias";
    f(persistent_state{name, 1, std::ssize(bias), 0, std::span<float>(bias),
                       state_owner::attention_grid_first});
  }

  /// Bytes kept from forward to backward: the probs and the map.
  [[nodiscard]] std::size_t saved_bytes() const {
    return static_cast<std::size_t>(router_.output().probs.size()) * (sizeof(logit) + 1);
  }

 private:
  using router_backend = typename Types::router_backend;

  /// The gating on the layer's GEMM backend: the router computes in the layer's type and adds no
  /// input jitter.
  [[nodiscard]] bool gates_on_backend() const {
    return std::is_same_v<logit, scalar> &&
           !(router_.config().input_jitter_eps && *router_.config().input_jitter_eps > 0.0);
  }

  template <expert::gemm_op Op>
  void run_one(context& ctx, expert::gemm_problem<scalar> const& p) {
    problem_[0] = p;
    router_backend::template run<Op>(ctx.executor<scalar>(),
                                     std::span<expert::gemm_problem<scalar> const>(problem_));
  }

  router_type router_;
  row_matrix<scalar> weight_, weight_grad_;
  std::string name_;
  groups_type groups_{};
  row_matrix<logit> logits_, grad_probs_;
  std::vector<global_aux_snapshot> global_aux_snapshots_;  // [0, snapshots_used_) in flight
  std::size_t snapshots_used_ = 0;
  std::vector<expert::gemm_problem<scalar>> problem_;
};

}  // namespace megamoe
