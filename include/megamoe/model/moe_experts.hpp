// SPDX-License-Identifier: Apache-2.0
// megamoe/model/moe_experts.hpp — an MoE layer's expert stage: this rank's routed experts (E/EP of
// them, each its 1/ETP shard of the FFN width) on the rows the dispatcher groups by expert, and
// the shared expert on every token with its sigmoid gate; forward, backward, recomputation, the
// recipe's operands and the quantized primary weights.
//
// The rows the dispatcher fills and the buffers backward reads are explicit views
// (`routed_rows`); what the memory policy keeps lives in the stage, the rest is scratch taken from
// the context's frames.
#pragma once

#include <megamoe/core/buffer.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/scratch.hpp>
#include <megamoe/core/stage_times.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/mlp.hpp>
#include <megamoe/memory/saved.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/model/linear.hpp>
#include <megamoe/model/moe_setup.hpp>
#include <megamoe/model/moe_types.hpp>
#include <megamoe/model/parameter_layout.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/process_groups.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megamoe {

/// What the experts keep from a forward for their backward (core/stash.hpp): the kept buffers and
/// the shared expert's values; compiled once for float and double (model/moe_experts.ipp).
template <class T>
using experts_stash = activation_stash<std::array<buffer<T>, 7>, T*, T*, T*, std::vector<T>>;
#if !MEGAMOE_HEADER_ONLY
extern template class activation_stash<std::array<buffer<float>, 7>, float*, float*, float*,
                                       std::vector<float>>;
extern template class activation_stash<std::array<buffer<double>, 7>, double*, double*, double*,
                                       std::vector<double>>;
#endif

/// The routed experts' rows of one step, as views: inputs [N,H] and their probs [N] (filled by the
/// dispatcher), fc1's output [N,W1], the activation times prob [N,F] and the outputs [N,H]; in
/// backward the gradients of the outputs (then of the inputs, in place) [N,H], of the probs [N],
/// of the activation [N,F] and of fc1's output [N,W1].
template <class T>
struct routed_rows {
  int count = 0;  // N
  T* rows = nullptr;
  T* probs = nullptr;
  T* fc1 = nullptr;
  T* act = nullptr;
  T* out = nullptr;
  T* grad_rows = nullptr;
  T* grad_probs = nullptr;
  T* grad_act = nullptr;
  T* grad_fc1 = nullptr;
};

/// What the layer asks of an expert stage X over rows of T: the routed experts [first, last) on
/// their rows forward and backward (the dispatcher calls them, once or per piece).
template <class X, class T>
concept expert_stage_of = requires(X& x, expert::executor<T>& exec,
                                   std::span<std::int64_t const> counts,
                                   routed_rows<T> const& rows) {
  x.forward(exec, counts, rows, 0, 1);
  x.backward(exec, counts, rows, 0, 1);
  { x.local_experts() } -> std::convertible_to<int>;
};

template <class Types>
class expert_stage {
 public:
  using scalar = typename Types::scalar;
  using routed_operands = typename Types::routed_operands;
  using shared_operands = typename Types::shared_operands;
  static constexpr auto activation = Types::activation;
  static constexpr bool rounds_operands = Types::rounds_operands;
  static constexpr bool quantized_weights = Types::quantized_weights;
  using frame = typename scratch_stack<scalar>::frame;
  using setup = moe_setup<typename Types::config>;

  expert_stage(config_values const& v, int layer_number, std::string prefix,
               parallel::process_groups const* groups)
      : values_(v),
        experts_(setup::routed_sizes(v)),
        routed_mlp_(setup::routed_sizes(v)),
        shared_(setup::shared_sizes(v)),
        shared_mlp_(setup::shared_sizes(v)),
        routed_ops_(
            make_operands<routed_operands>(setup::routed_sizes(v).experts, 2 * layer_number + 1,
                                           groups == nullptr ? nullptr : &groups->expert_tp())),
        shared_ops_(make_operands<shared_operands>(1, 2 * layer_number + 2,
                                                   groups == nullptr ? nullptr : &groups->tp_cp())),
        prefix_(std::move(prefix)) {
    if (groups != nullptr) {
      routed_replicas_ = parallel::communicator_max(groups->expert_dp());
      shared_replicas_ = parallel::communicator_max(groups->dp());
      first_expert_ = groups->ep().rank() * local_experts();
      if constexpr (rounds_operands) routed_ops_.number_experts_from(first_expert_);
      etp_ = {groups->expert_tp().size(), groups->expert_tp().rank()};
    }
    if (has_gate()) {
      gate_weight_ = row_matrix<scalar>::Zero(1, v.shape.hidden);
      gate_weight_grad_ = row_matrix<scalar>::Zero(1, v.shape.hidden);
    }
    name_parameters();
  }

  [[nodiscard]] int local_experts() const noexcept { return experts_.sizes().experts; }
  [[nodiscard]] int local_ffn() const noexcept { return experts_.sizes().ffn; }
  [[nodiscard]] int first_expert() const noexcept { return first_expert_; }
  [[nodiscard]] int ffn_offset() const noexcept { return etp_.part * local_ffn(); }
  /// Whether the layer has a shared expert: known at compile time unless the configuration's
  /// shape leaves shared_ffn to start-up.
  [[nodiscard]] bool has_shared() const noexcept {
    if constexpr (constexpr int by_type = Types::config::shape::value.shared_ffn; by_type != dynamic)
      return by_type > 0;
    else
      return values_.shape.shared_ffn > 0;
  }
  [[nodiscard]] bool has_gate() const noexcept {
    return has_shared() && Types::expert_settings.shared_expert_gate;
  }
  [[nodiscard]] routed_operands& routed_ops() noexcept { return routed_ops_; }
  [[nodiscard]] routed_operands const& routed_ops() const noexcept { return routed_ops_; }
  [[nodiscard]] shared_operands& shared_ops() noexcept { return shared_ops_; }
  [[nodiscard]] shared_operands const& shared_ops() const noexcept { return shared_ops_; }

  /// The recipe's operands write their dequantized GEMM operands into three scratch buffers of
  /// `f` (before each forward and backward).
  void bind_operands(context& ctx, frame& f) {
    if constexpr (rounds_operands) {
      auto& a = f.next();
      auto& b = f.next();
      auto& w = f.next();
      routed_ops_.bind(ctx.pool(), a, b, w);
      shared_ops_.bind(ctx.pool(), a, b, w);
      // An evaluation records no amaxes: evaluating does not change training.
      routed_ops_.record_amaxes(ctx.step.mode != router::pass::eval);
      shared_ops_.record_amaxes(ctx.step.mode != router::pass::eval);
    }
  }
  /// End of a step for the recipe's operands (delayed scaling's histories).
  void end_of_step() {
    if constexpr (rounds_operands) {
      routed_ops_.end_of_step(routed_replicas_);
      shared_ops_.end_of_step(shared_replicas_);
    }
  }

  /// Keeps, and brings back for a recomputed global batch, the state the recipe's operands end
  /// every micro-batch's step with (steps taken, delayed scaling's histories and scales).
  void begin_global_batch() {
    if constexpr (rounds_operands) {
      routed_ops_.begin_global_batch();
      shared_ops_.begin_global_batch();
    }
  }
  void discard_global_batch() {
    if constexpr (rounds_operands) {
      routed_ops_.discard_global_batch();
      shared_ops_.discard_global_batch();
    }
  }

  /// The most rows a forward can bring (the layer's bound from the configuration): every row
  /// buffer is reserved for that many, so a step bringing more rows than any before takes no new
  /// memory.
  void bound_rows(int rows) noexcept { rows_bound_ = rows; }
  /// The forward views of N rows: the buffers the memory policy keeps in the stage, the others
  /// from `f`; none for the output where the dispatcher gives its rows (`OutputInPlace`).
  template <bool OutputInPlace>
  routed_rows<scalar> forward_rows(frame& f, int n) {
    auto r = views(n, [&](memory::layer_buffer b, std::size_t per_row) {
      return rows_of(Types::keeps(b) ? kept_[static_cast<std::size_t>(b)] : f.next(), n, per_row);
    });
    if constexpr (!OutputInPlace) r.out = rows_of(f.next(), n, hidden());
    return r;
  }
  /// The forward's views of N rows in backward: the kept buffers; `f`'s where the policy keeps
  /// none (the recipe's operands keep codes instead, or backward recomputes into them).
  routed_rows<scalar> kept_rows(frame& f, int n) {
    return views(n, [&](memory::layer_buffer b, std::size_t per_row) {
      return Types::keeps(b) ? kept_[static_cast<std::size_t>(b)].data()
                             : rows_of(f.next(), n, per_row);
    });
  }
  /// The gradients' views of `rows` from `f`; none for the outputs' gradients where the
  /// dispatcher gives their rows (`OutputInPlace`).
  template <bool OutputInPlace>
  routed_rows<scalar> with_gradients(frame& f, routed_rows<scalar> rows) {
    auto const H = hidden(), F = static_cast<std::size_t>(local_ffn());
    if constexpr (!OutputInPlace) rows.grad_rows = rows_of(f.next(), rows.count, H);
    rows.grad_probs = rows_of(f.next(), rows.count, 1);
    rows.grad_act = rows_of(f.next(), rows.count, F);
    rows.grad_fc1 = rows_of(f.next(), rows.count, static_cast<std::size_t>(fc1_width(local_ffn())));
    return rows;
  }

  /// Local experts [first, last) on their rows (counts: rows per local expert).
  void forward(expert::executor<scalar>& exec, std::span<std::int64_t const> counts,
               routed_rows<scalar> const& r, int first, int last) {
    routed_mlp_.forward(exec, experts_, {r.count, counts, r.probs}, r.rows, r.fc1, r.act, r.out,
                        {first, last}, routed_ops_);
  }
  /// Their backward: from the outputs' gradients in r.grad_rows to the inputs' gradients (in place)
  /// and the probs' gradients; adds the weight gradients.
  void backward(expert::executor<scalar>& exec, std::span<std::int64_t const> counts,
                routed_rows<scalar> const& r, int first, int last) {
    routed_mlp_.backward(exec, experts_, {r.count, counts, r.probs}, r.rows, r.fc1, r.act,
                         r.grad_rows, r.grad_act, r.grad_fc1, r.grad_rows, r.grad_probs,
                         {first, last}, routed_ops_);
  }
  /// memory::moe_act: the activation times prob of `rows` again (into rows.act), from fc1's
  /// kept output.
  void recompute_activation(expert::executor<scalar>& exec, std::span<std::int64_t const> counts,
                            routed_rows<scalar> const& r) {
    routed_mlp_.recompute_activation(exec, {r.count, counts, r.probs}, r.fc1, r.act, routed_ops_);
  }

  // --- The shared expert
  // --------------------------------------------------------------------------

  /// The shared expert on every token of x [T,H] (prob 1) and its gate sigma(x g); the output
  /// before the gate stays in the stage's view until `add_shared`.
  void shared_forward(context& ctx, frame& f, const_row_matrix_map<scalar> x) {
    int const T = static_cast<int>(x.rows()), Fs = values_.shape.shared_ffn;
    auto& exec = ctx.executor<scalar>();
    auto const N = static_cast<std::size_t>(T);
    shared_fc1_ = take(f, memory::layer_buffer::shared_fc1_output, N * fc1_width(Fs));
    shared_act_ = take(f, memory::layer_buffer::shared_activation, N * Fs);
    shared_out_ = take(f, memory::layer_buffer::shared_output, N * hidden());
    if (ones_.size() != N) ones_.assign(N, scalar(1));
    count_[0] = T;
    shared_mlp_.forward(exec, shared_, {T, count_, ones_.data()}, x.data(), shared_fc1_,
                        shared_act_, shared_out_, {}, shared_ops_);
    if (has_gate()) {
      gate_.resize(N);
      exec.parallel_rows(T, [&](int begin, int end) {
        for (int t = begin; t < end; ++t) {
          scalar const z = x.row(t).dot(gate_weight_.row(0));
          gate_[static_cast<std::size_t>(t)] = scalar(1) / (scalar(1) + std::exp(-z));
        }
      });
    }
  }
  /// out [T,H] += gate * the shared expert's output.
  void add_shared(expert::executor<scalar>& exec, row_matrix_map<scalar> out) const {
    int const H = static_cast<int>(out.cols());
    exec.parallel_rows(static_cast<int>(out.rows()), [&](int begin, int end) {
      for (int t = begin; t < end; ++t) {
        scalar const g = has_gate() ? gate_[static_cast<std::size_t>(t)] : scalar(1);
        out.row(t) += g * const_row_matrix_map<scalar>(shared_out_ + std::ptrdiff_t{t} * H, 1, H);
      }
    });
  }
  /// Ends a forward that backward will not repeat: the shared expert's values the policy does not
  /// keep are gone with the forward's frame.
  void forget_scratch() {
    for (auto b : {memory::layer_buffer::shared_fc1_output, memory::layer_buffer::shared_activation,
                   memory::layer_buffer::shared_output})
      if (!Types::keeps(b)) shared_view(b) = nullptr;
  }

  /// The shared expert's backward from dy [T,H]: gate, then the MLP; adds into grad_input.
  void shared_backward(context& ctx, frame& f, const_row_matrix_map<scalar> x, scalar const* dy,
                       row_matrix_map<scalar> grad_input) {
    int const T = static_cast<int>(x.rows()), Fs = values_.shape.shared_ffn;
    auto const H = hidden();
    auto& exec = ctx.executor<scalar>();
    auto const N = static_cast<std::size_t>(T);
    // Values neither kept nor recomputed (the recipe's operands keep codes): scratch.
    if (shared_fc1_ == nullptr) shared_fc1_ = f.take(N * fc1_width(Fs));
    if (shared_act_ == nullptr) shared_act_ = f.take(N * Fs);
    scalar* grad_out = f.take(N * H);
    if (has_gate()) {
      // d(out) = sigma dy; dz = (dy . out) sigma (1 - sigma); dg += dz x; dx += dz g.
      gate_grad_.resize(N);
      exec.parallel_rows(T, [&](int begin, int end) {
        for (int t = begin; t < end; ++t) {
          auto const d = const_row_matrix_map<scalar>(dy + std::ptrdiff_t{t} * H, 1, H);
          scalar const s = gate_[static_cast<std::size_t>(t)];
          row_matrix_map<scalar>(grad_out + std::ptrdiff_t{t} * H, 1, H) = s * d;
          scalar const dz = d.cwiseProduct(const_row_matrix_map<scalar>(
                                               shared_out_ + std::ptrdiff_t{t} * H, 1, H))
                                .sum() *
                            s * (scalar(1) - s);
          gate_grad_[static_cast<std::size_t>(t)] = dz;
          grad_input.row(t) += dz * gate_weight_;
        }
      });
      for (int t = 0; t < T; ++t)
        gate_weight_grad_ += gate_grad_[static_cast<std::size_t>(t)] * x.row(t);
    } else {
      std::copy_n(dy, N * H, grad_out);
    }
    count_[0] = T;
    scalar* grad_probs = f.take(N);
    shared_mlp_.backward(exec, shared_, {T, count_, ones_.data()}, x.data(), shared_fc1_,
                         shared_act_, grad_out, f.take(N * Fs), f.take(N * fc1_width(Fs)), grad_out,
                         grad_probs, {}, shared_ops_);
    exec.parallel_rows(T, [&](int begin, int end) {
      for (int t = begin; t < end; ++t)
        grad_input.row(t) += const_row_matrix_map<scalar>(grad_out + std::ptrdiff_t{t} * H, 1, H);
    });
  }

  // --- Parameters
  // ---------------------------------------------------------------------------------

  /// f(persistent_state) for the recipe's state that lives across steps (delayed scaling's amax
  /// histories and scales: [experts, floats] for the routed experts, [1, floats] for the shared
  /// one); f may change the values (a checkpoint load).
  template <class F>
  void for_each_persistent_state(F&& f) {
    visit_operand_state(routed_ops_, prefix_ + "experts.fp8_delayed_state", values_.shape.experts,
                        first_expert_, state_owner::expert_replica_first, f);
    if (has_shared())
      visit_operand_state(shared_ops_, prefix_ + "shared_experts.fp8_delayed_state", 1, 0,
                          state_owner::attention_grid_first, f);
  }
  /// Training steps the recipe's operands have ended (stochastic rounding follows it).
  [[nodiscard]] std::uint64_t operand_steps() const noexcept {
    if constexpr (rounds_operands) return routed_ops_.steps_taken();
    return 0;
  }
  void set_operand_steps(std::uint64_t steps) noexcept {
    if constexpr (rounds_operands) {
      routed_ops_.set_steps_taken(steps);
      shared_ops_.set_steps_taken(steps);
    }
  }

  /// f(name, value, grad, kind, number, numbering) for every expert parameter this rank holds,
  /// numbered as on one rank (2.. after the router weight).
  template <class Visitor>
  void visit_parameters(Visitor&& f) {
    std::size_t n = 0;
    auto visit = [&](row_matrix_map<scalar> value, row_matrix_map<scalar> grad, parameter_kind k,
                     std::uint64_t index, element_numbering const& numbering) {
      f(std::string_view(names_[n++]), value, grad, k, index, numbering);
    };
    std::int64_t const E = values_.shape.experts, H = hidden(), Fl = local_ffn();
    std::int64_t const first = first_expert_;
    int const fc1_width = expert::fc1_width(activation, 1);
    element_numbering const fc1 =
        numbering_of(fc1_width == 2 ? parameter_cut::swiglu_rows : parameter_cut::rows,
                     fc1_width * Fl, H, etp_);
    element_numbering const fc2 = numbering_of(parameter_cut::columns, H, Fl, etp_);
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
    if (Types::expert_settings.bias) {  // ETP = 1 (R014): whole vectors
      for (int e = 0; e < L; ++e)
        visit(experts_.fc1_bias(e), experts_.grad_fc1_bias(e), parameter_kind::expert,
              next + static_cast<std::uint64_t>(first + e), {experts_.fc1_bias(e).cols()});
      for (int e = 0; e < L; ++e)
        visit(experts_.fc2_bias(e), experts_.grad_fc2_bias(e), parameter_kind::expert,
              next + static_cast<std::uint64_t>(E + first + e), {H});
      next += static_cast<std::uint64_t>(2 * E);
    }
    if (has_shared()) {
      visit(shared_.fc1(0), shared_.grad_fc1(0), parameter_kind::dense, next, {H});
      visit(shared_.fc2(0), shared_.grad_fc2(0), parameter_kind::dense, next + 1,
            {values_.shape.shared_ffn});
      if (has_gate())
        visit(view(gate_weight_), view(gate_weight_grad_), parameter_kind::dense, next + 2, {H});
    }
  }

  /// Sets micro-batch `key`'s kept rows, fc1 outputs and activations, and the shared expert's,
  /// aside (core/stash.hpp), or brings them back. A precision recipe's operands keep their codes
  /// for one micro-batch, so such a layer does not set micro-batches aside.
  void park(std::uint64_t key) requires(!Types::rounds_operands) {
    stash_.park(key, kept_, shared_fc1_, shared_act_, shared_out_, gate_);
  }
  void restore(std::uint64_t key) requires(!Types::rounds_operands) {
    stash_.restore(key, kept_, shared_fc1_, shared_act_, shared_out_, gate_);
  }

  void zero_grad() {
    experts_.zero_grad();
    shared_.zero_grad();
    gate_weight_grad_.setZero();
  }

  // --- memory::quantized_weights: the routed experts' weights held as codes
  // -----------------------

  [[nodiscard]] bool holds_weight_values() const noexcept { return experts_.holds_weights(); }
  [[nodiscard]] bool holds_weight_codes() const requires quantized_weights {
    return routed_ops_.holds_weights(fc1_width(local_ffn()), hidden(), local_ffn());
  }
  void refresh_weight_codes() requires quantized_weights {
    int const L = local_experts(), H = hidden(), F = local_ffn();
    routed_ops_.store_weights(expert::linear::fc1, experts_.fc1_data(0), fc1_width(F), H, 0, L);
    routed_ops_.store_weights(expert::linear::fc2, experts_.fc2_data(0), H, F, 0, L);
  }
  void release_weight_values() requires quantized_weights { experts_.release_weights(); }
  /// f(name, store) per routed weight tensor, in visit order; store(w) quantizes it from w.
  template <class F>
  void for_each_quantized_weight(F&& f) requires quantized_weights {
    int const L = local_experts(), H = hidden(), Fl = local_ffn(), W1 = fc1_width(Fl);
    for (int e = 0; e < L; ++e)
      f(std::string_view(names_[static_cast<std::size_t>(e)]), [&, e](scalar const* w) {
        routed_ops_.store_weights(expert::linear::fc1, w, W1, H, e, e + 1);
      });
    for (int e = 0; e < L; ++e)
      f(std::string_view(names_[static_cast<std::size_t>(L + e)]), [&, e](scalar const* w) {
        routed_ops_.store_weights(expert::linear::fc2, w, H, Fl, e, e + 1);
      });
  }

  /// Bytes kept from forward to backward: the kept buffers, the gate, and the recipe's codes.
  [[nodiscard]] std::size_t saved_bytes(int rows, int tokens) const {
    std::size_t bytes = gate_.size() * sizeof(scalar);
    for (std::size_t b = 0; b < kept_.size(); ++b)
      if (Types::keeps(static_cast<memory::layer_buffer>(b))) bytes += kept_[b].used_bytes();
    if constexpr (rounds_operands) {
      bytes += routed_ops_.saved_bytes(rows, fc1_width(local_ffn()));
      if (has_shared() && !Types::memory_settings.shared_experts)
        bytes += shared_ops_.saved_bytes(tokens, fc1_width(values_.shape.shared_ffn));
    }
    return bytes;
  }

 private:
  [[nodiscard]] std::size_t hidden() const {
    return static_cast<std::size_t>(values_.shape.hidden);
  }
  static constexpr int fc1_width(int ffn) { return expert::fc1_width(activation, ffn); }

  /// Buffer b with room for n: the stage's own when the memory policy keeps it, else scratch.
  scalar* take(frame& f, memory::layer_buffer b, std::size_t n) {
    if (Types::keeps(b)) return kept_[static_cast<std::size_t>(b)].reserve(n);
    return f.take(n);
  }
  /// `b` with room for n rows of `per_row` elements, reserved for the bound's rows.
  scalar* rows_of(buffer<scalar>& b, int n, std::size_t per_row) const {
    b.reserve(static_cast<std::size_t>(std::max(n, rows_bound_)) * per_row);
    return b.reserve(static_cast<std::size_t>(n) * per_row);
  }
  /// Rows, probs, fc1 output and activation of N rows, each from pick(buffer, elements per row).
  template <class Pick>
  routed_rows<scalar> views(int n, Pick&& pick) {
    routed_rows<scalar> r;
    r.count = n;
    r.rows = pick(memory::layer_buffer::expert_rows, hidden());
    r.probs = pick(memory::layer_buffer::row_probs, 1);
    r.fc1 = pick(memory::layer_buffer::fc1_output,
                 static_cast<std::size_t>(fc1_width(local_ffn())));
    r.act = pick(memory::layer_buffer::activation, static_cast<std::size_t>(local_ffn()));
    return r;
  }
  scalar*& shared_view(memory::layer_buffer b) {
    if (b == memory::layer_buffer::shared_fc1_output) return shared_fc1_;
    if (b == memory::layer_buffer::shared_activation) return shared_act_;
    return shared_out_;
  }

  void name_parameters() {
    auto experts = [&](char const* what) {
      for (int e = 0; e < local_experts(); ++e)
        names_.push_back(prefix_ + "experts." + what + std::to_string(first_expert_ + e));
    };
    experts("linear_fc1.weight");
    experts("linear_fc2.weight");
    if (Types::expert_settings.bias) {
      experts("linear_fc1.bias");
      experts("linear_fc2.bias");
    }
    if (has_shared()) {
      names_.push_back(prefix_ + "shared_experts.linear_fc1.weight");
      names_.push_back(prefix_ + "shared_experts.linear_fc2.weight");
      if (has_gate()) names_.push_back(prefix_ + "shared_experts.gate_weight");
    }
  }

  config_values values_;
  // Delayed scaling's amaxes are the largest over an expert's replicas (routed: EDP; shared: DP).
  parallel::communicator_max routed_replicas_, shared_replicas_;
  expert::expert_parameters<scalar> experts_;
  typename Types::mlp_type routed_mlp_;
  expert::expert_parameters<scalar> shared_;
  typename Types::mlp_type shared_mlp_;
  routed_operands routed_ops_;
  shared_operands shared_ops_;
  std::string prefix_;
  std::vector<std::string> names_;
  int first_expert_ = 0;
  cut_position etp_;  // the experts' ffn columns are cut over ETP
  row_matrix<scalar> gate_weight_, gate_weight_grad_;
  std::array<buffer<scalar>, 7> kept_;  // by memory::layer_buffer, where the policy keeps it
  scalar* shared_fc1_ = nullptr;        // the shared expert's last forward values
  scalar* shared_act_ = nullptr;
  scalar* shared_out_ = nullptr;
  std::vector<scalar> gate_, gate_grad_, ones_;
  std::array<std::int64_t, 1> count_{};
  int rows_bound_ = 0;  // bound_rows()
  experts_stash<scalar> stash_;
};

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/moe_experts.ipp>
#endif
