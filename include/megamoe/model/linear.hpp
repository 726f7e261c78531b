// SPDX-License-Identifier: Apache-2.0
// megamoe/model/linear.hpp — the products of the dense linear layers (attention's linear_qkv and
// linear_proj) under the model's precision recipe: fprop y = x W^T, dgrad dx = dy W and wgrad
// dW += dy^T x, each reading what the recipe's operands give it.
//
//   linear_operands_t<Recipe>   the operands of a dense module under the recipe: the values
//                               themselves (fp32, fp64) or precision::grouped_operands with one
//                               "expert" per module, its two linears in the operands' two slots
//   linear_products<T, Ops>     the three products of a module's linears on the pool
//
// A module's two linears share one operands object, as an expert's fc1 and fc2 do: the same
// hooks, the same kept codes (the inputs' wgrad copies, the weights' copies), the same delayed-
// scaling state per tensor. Per-tensor amaxes are reduced over TP x CP, the ranks that hold parts
// of one tensor (sequence chunks, column or row shards), so every rank quantizes with one scale.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/by_need.hpp>
#include <megamoe/core/scratch.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/gemm_problem.hpp>
#include <megamoe/expert/mlp.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/precision/recipe.hpp>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace megamoe {

/// The operands of the dense modules (attention, dense FFN) under `Recipe` (a precision tag);
/// with `QuantizedWeights` (memory::quantized_weights) the weights' codes are their primary copy.
template <class Recipe, bool QuantizedWeights = false>
using linear_operands_t = std::conditional_t<
    precision::rounds_operands(Recipe::value),
    precision::grouped_operands<Recipe, parallel::communicator_max, false, QuantizedWeights, false>,
    expert::exact_operands>;

/// Whether `Recipe`'s operands can be built here: fp32 and fp64 need nothing; a recipe that
/// quantizes needs <megamoe/precision/operands.hpp> (core/by_need.hpp).
template <class Recipe>
consteval bool recipe_operands_included() {
  constexpr bool ok = !precision::rounds_operands(Recipe::value) ||
                      by_need::included<by_need::module::recipe_operands, Recipe>;
  static_assert(ok,
                "megamoe: the configuration's precision recipe quantizes its GEMMs' operands: "
                "#include <megamoe/precision/operands.hpp> before its model is instantiated");
  return ok;
}

/// Whether Ops quantizes (a recipe's operands) or reads the values themselves.
template <class Ops>
inline constexpr bool rounds_operands_v = !std::is_same_v<Ops, expert::exact_operands>;

/// Whether Ops holds the weights' codes as their primary copy (memory::quantized_weights).
template <class Ops>
inline constexpr bool holds_weight_codes_v = false;
template <class Recipe, class Reduction, bool QuantizedActivations, bool CodesOnWire>
inline constexpr bool holds_weight_codes_v<
    precision::grouped_operands<Recipe, Reduction, QuantizedActivations, true, CodesOnWire>> = true;

/// memory::quantized_weights for a dense module: quantizes linear l's weight [rows, cols] from
/// its fp32 values w into the operands' codes, its primary copy (collective over the operands'
/// amax group). An optimizer holding the module's fp32 masters calls it after each update.
template <class Ops>
void store_linear_weight(Ops& ops, expert::linear l, float const* w, std::int64_t rows,
                         std::int64_t cols) {
  ops.store_weights(l, w, static_cast<int>(rows), static_cast<int>(cols), 0, 1);
}
/// Whether linear l's weight codes of that shape are held.
template <class Ops>
bool holds_linear_weight(Ops const& ops, expert::linear l, std::int64_t rows, std::int64_t cols) {
  auto const& q =
      ops.codes_of(l, precision::operand_role::weight, precision::operand_usage::rowwise, 0);
  return q.rows == rows && q.cols == cols;
}

/// A recipe's operands of `experts` experts (a dense module: one) for one rank, or the values
/// themselves; `seed` drives stochastic rounding; amaxes reduced over `amax_group` (none: this
/// rank alone).
template <class Ops>
Ops make_operands(int experts, std::uint64_t seed, boost::mpi::communicator const* amax_group) {
  if constexpr (rounds_operands_v<Ops>) {
    return Ops(experts, splitmix64(seed),
               amax_group == nullptr ? parallel::communicator_max()
                                     : parallel::communicator_max(*amax_group));
  } else {
    return Ops{};
  }
}
template <class Ops>
Ops make_linear_operands(std::uint64_t seed, boost::mpi::communicator const* amax_group) {
  return make_operands<Ops>(1, seed, amax_group);
}

/// f(persistent_state) for a recipe's operands' state that lives across steps (delayed
/// scaling's amax histories and scales), as rows [first, first + experts) of a whole [rows, ...]
/// tensor named `name`, then the state f may have written (a checkpoint load) set back; nothing
/// where the recipe keeps none.
template <class Ops, class F>
void visit_operand_state(Ops& ops, std::string const& name, std::int64_t rows, std::int64_t first,
                         state_owner owner, F&& f) {
  if constexpr (rounds_operands_v<Ops>) {
    int const width = ops.persistent_floats();
    if (width == 0) return;
    auto state = ops.persistent_state();
    f(persistent_state{name, rows, width, first, std::span<float>(state), owner});
    ops.set_persistent_state(state);
  }
}

/// Binds a recipe's operands' three workspaces (two of rows, one of weights) to the next buffers
/// of scratch frame `f` and the context's pool, and records amaxes only outside evaluation;
/// nothing for the values themselves. Before each forward and backward.
template <class Ops, class Frame>
void bind_operands(Ops& ops, context& ctx, Frame& f) {
  if constexpr (rounds_operands_v<Ops>) {
    auto& a = f.next();
    auto& b = f.next();
    auto& w = f.next();
    ops.bind(ctx.pool(), a, b, w);
    ops.record_amaxes(ctx.step.mode != router::pass::eval);
  }
}

/// The products of a module's linear layers through its operands `Ops` on backend `Backend`
/// (the fp32 grouped GEMM unless a BF16 unit is chosen). Under a recipe every operand is a
/// contiguous [rows, cols] matrix (the hooks quantize whole rows), so x and dy must be.
template <class T, class Ops, class Backend = expert::grouped_gemm>
class linear_products {
 public:
  static constexpr bool rounds = rounds_operands_v<Ops>;

  linear_products() = default;
  explicit linear_products(Ops ops) : ops_(std::move(ops)) {}

  [[nodiscard]] Ops& operands() noexcept { return ops_; }
  [[nodiscard]] Ops const& operands() const noexcept { return ops_; }

  /// Binds the operands' workspaces to buffers of `f` (bind_operands; before each forward and
  /// backward).
  void bind(context& ctx, typename scratch_stack<T>::frame& f) { bind_operands(ops_, ctx, f); }

  /// y [n, out] (leading dimension ldy) = x [n, in] W^T for linear `l`, W [out, in].
  void forward(expert::executor<T>& exec, expert::linear l, int n, int out, int in, T const* x,
               T const* w, T* y, int ldy) {
    rows_[1] = n;
    T const* xs = ops_.input(l, x, in, rows_, 0, 1);
    T const* ws = ops_.weight(l, precision::operand_usage::rowwise, w, out, in, 0, 1);
    run<expert::gemm_op::nt>(exec, {n, out, in, xs, in, ws, in, y, ldy, false},
                             expert::operand_buffer::weights);
  }

  /// dx [n, in] (ldx) = dy W and dW [out, in] += dy^T x, from dy [n, out] (ldy) of the last
  /// forward of `l`, whose input was x [n, in].
  void backward(expert::executor<T>& exec, expert::linear l, int n, int out, int in, T const* dy,
                int ldy, T const* w, T const* x, T* dx, int ldx, T* dw) {
    rows_[1] = n;
    if constexpr (rounds) {
      if (ldy != out)
        throw input_error("linear_products: a recipe's gradient rows must be contiguous");
      // dgrad first: wgrad takes the gradient's scales (and, where the copies are the same, its
      // values) that grad() left.
      T const* g = ops_.grad(l, dy, out, rows_, 0, 1);
      T const* ws = ops_.weight(l, precision::operand_usage::columnwise, w, out, in, 0, 1);
      run<expert::gemm_op::nn>(exec, {n, in, out, g, out, ws, in, dx, ldx, false},
                               expert::operand_buffer::weights);
      auto const wg = ops_.wgrad(l, dy, out, x, in, rows_, 0, 1);
      auto const k = static_cast<int>(wg.offsets[1] - wg.offsets[0]);
      run<expert::gemm_op::tn>(exec, {out, in, k, wg.grad, out, wg.input, in, dw, in, true},
                               expert::operand_buffer::rows_b);
    } else {
      run<expert::gemm_op::tn>(exec, {out, in, n, dy, ldy, x, in, dw, in, true},
                               expert::operand_buffer::rows_b);
      run<expert::gemm_op::nn>(exec, {n, in, out, dy, ldy, w, in, dx, ldx, false},
                               expert::operand_buffer::weights);
    }
  }

  /// End of a step: delayed scaling's amaxes reduced over the module's replicas, then its
  /// histories and scales updated; stochastic rounding's draws move on.
  void end_of_step(parallel::communicator_max const& replicas) {
    if constexpr (rounds) ops_.end_of_step(replicas);
  }

 private:
  template <expert::gemm_op Op>
  void run(expert::executor<T>& exec, expert::gemm_problem<T> p, expert::operand_buffer b) {
    p.a_unit = ops_.unit(expert::operand_buffer::rows_a, 0);
    p.b_unit = ops_.unit(b, 0);
    Backend::template run<Op>(exec, std::span<expert::gemm_problem<T> const>(&p, 1));
  }

  Ops ops_;
  std::array<std::int64_t, 2> rows_{};  // the one "expert"'s row offsets, {0, n}
};

}  // namespace megamoe
