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
// Scratch is memory a stage needs only inside one forward or one backward (or everything, when it
// recomputes): stages take it from the context's scratch stacks in frames (core/scratch.hpp), so
// the layers of a model share one copy.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/scratch.hpp>
#include <megamoe/core/stage_times.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/parallel/threads.hpp>
#include <megamoe/router/output.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace megamoe {

/// Settings of the current step, read by every layer.
struct step_settings {
  /// training, recompute (a training forward repeated for its backward, as the pipeline repeats
  /// a chunk's: counts and running statistics are not taken twice) or eval.
  router::pass mode = router::pass::training;
  /// The gradient scale of the attached router losses (router::loss_backward_scale).
  double loss_backward_scale = 1.0;
  /// Makes router input jitter reproducible; give each micro-batch its own key.
  std::uint64_t micro_batch_key = 0;
};

class context {
 public:
  explicit context(int num_threads = num_threads_from_environment());

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

  /// The scratch stack of scalar type T (core/scratch.hpp).
  template <class T>
  [[nodiscard]] scratch_stack<T>& scratch() noexcept {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
    if constexpr (std::is_same_v<T, float>) {
      return float_scratch_;
    } else {
      return double_scratch_;
    }
  }

  /// Bytes of scratch and GEMM workspaces held (they grow to the largest step and stay).
  [[nodiscard]] std::size_t scratch_bytes() const noexcept;

  step_settings step;
  stage_times stages;
  /// Time in the parts of the step outside the MoE layers (the transformer and the trainer).
  step_times step_stages;

 private:
  thread_pool pool_;
  expert::executor<float> float_exec_;
  expert::executor<double> double_exec_;
  scratch_stack<float> float_scratch_;
  scratch_stack<double> double_scratch_;
};

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/context.ipp>
#endif
