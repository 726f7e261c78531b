// SPDX-License-Identifier: Apache-2.0
// megamoe/model/context.hpp — what every layer of a training step shares: the thread pool, the GEMM
// workspaces of its threads, scratch memory, and the settings of the current step.
//
//   megamoe::context ctx;                        // MEGAMOE_NUM_THREADS threads (or cores / ranks)
//   ctx.step.mode = megamoe::router::pass::training;
//   ctx.step.loss_backward_scale = megamoe::router::loss_backward_scale(1.0, cp, micro_batches);
//   auto out = layer.forward(ctx, x, S, B);
//   auto const& dx = layer.backward(ctx, dy);
//
// Scratch is memory a layer needs only inside one forward or one backward (or everything, when it
// recomputes): layers take it from the context by slot, so the layers of a model share one copy.
#pragma once

#include <megamoe/core/buffer.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/parallel/threads.hpp>
#include <megamoe/router/router.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace megamoe {

/// The scratch slots of the context; each is one grow-only buffer per scalar type.
enum class scratch_slot : int {
  routed_rows,      // [N,H] permuted tokens (recomputed under memory::moe_layer)
  routed_fc1,       // [N,W1] fc1 output
  routed_act,       // [N,F] activation times prob
  routed_out,       // [N,H] expert outputs, before the combine
  row_probs,        // [N] probs of the permuted rows
  grad_rows,        // [N,H] and [T,H] gradients of rows
  grad_act,         // [N,F] gradient of the activation output
  grad_fc1,         // [N,W1] gradient of fc1's output
  grad_row_probs,   // [N] gradient of the row probs
  shared_fc1,       // [T,W1s] shared expert's fc1 output
  shared_act,       // [T,Fs] shared expert's activation
  shared_out,       // [T,H] shared expert's output before its gate
  operand_a,        // a precision recipe's dequantized GEMM operands: rows of one operand,
  operand_b,        //   rows of the other (wgrad reads two),
  operand_weights,  //   and the weights [E, out, in]
  count
};

/// The stages of an MoE layer, for the time spent in each.
enum class layer_stage : int {
  router,         // gating, routing, losses; their backward
  permute,        // permutation and gathering rows; in backward, adding rows' gradients to tokens
  experts,        // the expert FFNs (GEMMs and activations), forward, recomputation and backward
  unpermute,      // adding expert rows to tokens; in backward, gathering the output gradient
  shared_expert,  // the shared expert and its gate
  count
};

/// Seconds per stage, summed over forward, recomputation and backward since the last clear().
struct stage_times {
  std::array<double, static_cast<std::size_t>(layer_stage::count)> seconds{};
  void clear() { seconds.fill(0.0); }
  [[nodiscard]] double operator[](layer_stage s) const {
    return seconds[static_cast<std::size_t>(s)];
  }
  /// Runs f() and adds its wall time to stage s (steady_clock: no allocation, no system call on
  /// Linux).
  template <class F>
  void time(layer_stage s, F&& f) {
    auto const start = std::chrono::steady_clock::now();
    f();
    seconds[static_cast<std::size_t>(s)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

/// Settings of the current step, read by every layer.
struct step_settings {
  /// training, recompute (never set by hand: layers use it internally) or eval.
  router::pass mode = router::pass::training;
  /// The gradient scale of the attached router losses (router::loss_backward_scale).
  double loss_backward_scale = 1.0;
  /// Makes router input jitter reproducible; give each micro-batch its own key.
  std::uint64_t micro_batch_key = 0;
};

class context {
 public:
  explicit context(int num_threads = num_threads_from_environment())
      : pool_(num_threads), float_exec_(pool_), double_exec_(pool_) {}

  context(context const&) = delete;
  context& operator=(context const&) = delete;

  [[nodiscard]] thread_pool& pool() noexcept { return pool_; }
  [[nodiscard]] int threads() const noexcept { return pool_.size(); }

  /// The pool with one GEMM workspace per thread, for scalar type T.
  template <class T>
  [[nodiscard]] expert::executor<T>& executor() noexcept {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
    if constexpr (std::is_same_v<T, float>) {
      return float_exec_;
    } else {
      return double_exec_;
    }
  }

  /// The scratch buffer of `slot` for scalar type T.
  template <class T>
  [[nodiscard]] buffer<T>& scratch(scratch_slot slot) noexcept {
    auto const i = static_cast<std::size_t>(slot);
    if constexpr (std::is_same_v<T, float>) {
      return float_scratch_[i];
    } else {
      return double_scratch_[i];
    }
  }

  /// Bytes of scratch and GEMM workspaces held (they grow to the largest step and stay).
  [[nodiscard]] std::size_t scratch_bytes() const noexcept {
    std::size_t total = float_exec_.workspace_bytes() + double_exec_.workspace_bytes();
    for (auto const& b : float_scratch_) total += b.capacity_bytes();
    for (auto const& b : double_scratch_) total += b.capacity_bytes();
    return total;
  }

  step_settings step;
  stage_times stages;

 private:
  static constexpr auto slots = static_cast<std::size_t>(scratch_slot::count);
  thread_pool pool_;
  expert::executor<float> float_exec_;
  expert::executor<double> double_exec_;
  std::array<buffer<float>, slots> float_scratch_;
  std::array<buffer<double>, slots> double_scratch_;
};

}  // namespace megamoe
