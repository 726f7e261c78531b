// SPDX-License-Identifier: Apache-2.0
// megamoe/model/moe_layer.hpp — one MoE layer as its four stages: route (the routing stage),
// dispatch (the dispatcher), compute (the expert stage: routed experts and the shared expert) and
// combine (the dispatcher's combine and the gated shared output), forward and backward, for a
// configuration type; on one rank (dispatch::local) or over a job's process groups (all-to-all,
// all-gather or hierarchical dispatcher, expert and expert-tensor parallelism, sequence-parallel
// input).
//
//   megamoe::context ctx;
//   megamoe::moe_layer<my_config> layer(/*layer_number=*/0);   // or layer(groups, 0)
//   layer.initialize(seed);
//   auto out = layer.forward(ctx, x, S, B);       // x [S*B, H], token t = s*B + b
//   auto dx = layer.backward(ctx, dy);            // adds every weight gradient
//
// The interface is spelled out in docs/layer.md. The stage types come from one builder
// (model/moe_types.hpp); the dispatcher runs the expert stage inside its exchange, once or per
// piece of local experts, so there is one pipeline. Inside a step nothing is dispatched at run time
// and, on one rank after its first step, nothing is allocated. What backward needs is kept or
// recomputed as the memory policy says (memory/saved.hpp).
#pragma once

#include <megamoe/config/resolve.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/core/by_need.hpp>
#include <megamoe/core/buffer.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/model/moe_experts.hpp>
#include <megamoe/model/moe_routing.hpp>
#include <megamoe/model/moe_setup.hpp>
#include <megamoe/model/moe_types.hpp>
#include <megamoe/model/parameter_layout.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/policy/error.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe {

// The sender's half of dispatch::fp8_wire, defined in model/moe_wire.hpp, which a configuration
// choosing it includes (core/by_need.hpp).
template <class Operands>
class fp8_wire_codes;

/// What a forward returns: the layer output and the losses the router attached to it.
template <class T>
struct moe_output {
  const_row_matrix_map<T> y;   // [T,H]; valid until the layer's next forward
  router::loss_values losses;  // coefficient-scaled values and the logged (unscaled) ones
};

template <training_config Config>
class moe_layer {
  // Every rule the type's fixed values can break fails here, with its id.
  static_assert(rules::check<Config>());
  using types = moe_types<Config>;
  using setup = moe_setup<Config>;

 public:
  using scalar = typename types::scalar;
  using logit = typename types::logit;
  using router_type = typename types::router_type;
  using dispatcher_type = typename types::dispatcher_type;
  using backend = typename types::backend;
  using operands_type = typename types::routed_operands;
  using shared_operands_type = typename types::shared_operands;
  static constexpr expert::settings expert_settings = types::expert_settings;
  static constexpr memory::settings memory_settings = types::memory_settings;
  static constexpr auto activation = types::activation;
  static constexpr bool distributed = types::distributed;
  /// The dispatcher overlaps its exchange with the expert stage (dispatch::all_to_all_overlap).
  static constexpr bool overlapped = types::overlap_pieces > 1;
  static constexpr precision::settings recipe = types::recipe;
  static constexpr bool rounds_operands = types::rounds_operands;
  static constexpr bool quantized_weights = types::quantized_weights;
  /// Whether several micro-batches' forwards may precede their backwards (park / restore): not
  /// under a precision recipe, whose operands keep one micro-batch's codes.
  static constexpr bool parks_micro_batches = !rounds_operands;
  /// Whether the dispatcher keeps the layer's input in its shared window (dispatch::shared_memory):
  /// the input's copy is then also the dispatch's publication.
  static constexpr bool input_in_window = requires(dispatcher_type & d) { d.token_rows(); };
  /// The experts' output rows, and their gradients, are the dispatcher's (dispatch::shared_memory
  /// combines from them in place).
  static constexpr bool output_in_place = requires(dispatcher_type & d) { d.expert_output_rows(); };
  /// The forward dispatch carries fc1's FP8 input codes (dispatch::fp8_wire).
  static constexpr bool fp8_wire = types::fp8_wire;
  static_assert(!fp8_wire || by_need::included<by_need::module::fp8_wire, Config>,
                "megamoe: the configuration chooses dispatch::fp8_wire: #include "
                "<megamoe/model/moe_wire.hpp> before its model is instantiated");
  static_assert(expert_stage_of<expert_stage<types>, scalar>);

  /// One rank (dispatch::local): `layer_number` names the parameters (decoder.layers.{i}, or
  /// past the decoder's num_layers a multi-token prediction depth's, moe_parameter_prefix); `given`
  /// supplies what the type left to start-up. Every configuration rule is checked here.
  explicit moe_layer(int layer_number = 0, startup_values const& given = {}) requires(!distributed)
      : moe_layer(nullptr, layer_number, given) {}

  /// On the process groups of a job, collective over the stage (TP x DP x CP): a broken rule is
  /// the same agreed error on every rank. This rank holds experts [first_expert(), +
  /// local_experts()), each as its ETP shard; its tokens are its own sequence-parallel shard.
  moe_layer(parallel::process_groups const& groups, int layer_number = 0,
            startup_values const& given = {})
      : moe_layer(&groups, layer_number, given) {}

  [[nodiscard]] config_values const& values() const noexcept { return values_; }
  [[nodiscard]] int hidden_size() const noexcept { return values_.shape.hidden; }
  [[nodiscard]] int num_experts() const noexcept { return values_.shape.experts; }
  [[nodiscard]] int first_expert() const noexcept { return experts_.first_expert(); }
  [[nodiscard]] int local_experts() const noexcept { return experts_.local_experts(); }
  [[nodiscard]] int ffn_offset() const noexcept { return experts_.ffn_offset(); }
  [[nodiscard]] int local_ffn() const noexcept { return experts_.local_ffn(); }
  [[nodiscard]] dispatcher_type const& dispatcher() const noexcept { return dispatcher_; }
  [[nodiscard]] router_type& router() noexcept { return routing_.router(); }
  [[nodiscard]] router_type const& router() const noexcept { return routing_.router(); }
  [[nodiscard]] bool has_shared_expert() const noexcept { return experts_.has_shared(); }
  [[nodiscard]] bool has_shared_gate() const noexcept { return experts_.has_gate(); }
  /// The permutation of the last forward (rows grouped by expert), with dispatch::local.
  [[nodiscard]] dispatch::permutation const& permutation() const noexcept
      requires(types::dispatcher_kind == dispatch::dispatcher::local) {
    return dispatcher_.local_rows().permutation();
  }

  /// Draws every weight from N(0, std^2) as a function of (seed, parameter, element); biases 0.
  /// Parameters and elements are numbered as on one rank, so every mapping starts alike.
  void initialize(std::uint64_t seed, double std = 0.02) {
    if constexpr (quantized_weights)
      if (!experts_.holds_weight_values())
        throw input_error(
            "moe_layer: initialize() draws fp32 expert weights, and an optimizer already holds "
            "them (memory::quantized_weights): initialize before constructing the optimizer");
    visit_parameters([&](std::string_view name, row_matrix_map<scalar> value,
                         row_matrix_map<scalar>, parameter_kind, std::uint64_t index,
                         element_numbering const& numbering) {
      draw_parameter(value, seed, index, numbering, std,
                     name.find(".bias") != std::string_view::npos);
    });
    if constexpr (quantized_weights) refresh_weight_codes();
  }

  /// f(name, value, grad, kind) for every parameter this rank holds (row-major maps, biases
  /// [1, n]), named as the reference names them on one rank.
  template <class F>
  void for_each_parameter(F&& f) {
    visit_parameters([&](std::string_view name, row_matrix_map<scalar> value,
                         row_matrix_map<scalar> grad, parameter_kind kind, std::uint64_t,
                         element_numbering const&) { f(name, value, grad, kind); });
  }

  /// f(name, value, grad, kind, numbering) for every parameter this rank holds, with where its
  /// elements lie in the whole parameter (checkpoints).
  template <class F>
  void for_each_numbered_parameter(F&& f) {
    visit_parameters(
        [&](std::string_view name, row_matrix_map<scalar> value, row_matrix_map<scalar> grad,
            parameter_kind kind, std::uint64_t,
            element_numbering const& numbering) { f(name, value, grad, kind, numbering); });
  }
  /// f(persistent_state) for the state that lives across steps besides the parameters: the
  /// router's expert bias and the recipe's delayed-scaling histories; f may change the values.
  template <class F>
  void for_each_persistent_state(F&& f) {
    routing_.for_each_persistent_state(f);
    experts_.for_each_persistent_state(f);
  }
  [[nodiscard]] std::uint64_t operand_steps() const noexcept { return experts_.operand_steps(); }
  void set_operand_steps(std::uint64_t steps) noexcept { experts_.set_operand_steps(steps); }

  // memory::quantized_weights: the routed experts' codes are their primary weights; the fp32
  // values stay until an optimizer takes its shard (then release_weight_values()), and after each
  // update the optimizer hands whole tensors back through for_each_quantized_weight.
  void refresh_weight_codes() requires quantized_weights {
    if (!experts_.holds_weight_values())
      throw input_error(
          "moe_layer: refresh_weight_codes() needs the fp32 expert weights, which an optimizer "
          "holds now");
    experts_.refresh_weight_codes();
  }
  void release_weight_values() requires quantized_weights { experts_.release_weight_values(); }
  [[nodiscard]] bool holds_weight_values() const noexcept { return experts_.holds_weight_values(); }
  template <class F>
  void for_each_quantized_weight(F&& f) requires quantized_weights {
    experts_.for_each_quantized_weight(std::forward<F>(f));
  }

  void zero_grad() {
    routing_.zero_grad();
    experts_.zero_grad();
  }

  /// Forward of S positions x B sequences, x [S*B, H] with token t = s*B + b. In training mode the
  /// router attaches its losses and counts its tokens; backward must follow before the next
  /// training forward of this layer.
  moe_output<scalar> forward(context& ctx, Eigen::Ref<row_matrix<scalar> const> x, int seq_length,
                             int micro_batch_size) {
    int const H = hidden_size();
    router::pass const mode = ctx.step.mode;
    awaiting_backward_ = false;  // whatever happens below, no backward may follow a failed forward
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
      if constexpr (quantized_weights)
        if (!experts_.holds_weight_codes())
          throw input_error(
              "moe_layer: memory::quantized_weights: the expert weights have no codes yet; call "
              "initialize(), or refresh_weight_codes() after writing the weights");
    });
    tokens_ = static_cast<int>(x.rows());
    batch_ = {seq_length, micro_batch_size};
    jitter_key_ = ctx.step.micro_batch_key;
    // The input is kept: the gating's and the shared expert's backward read it. A dispatcher with
    // a shared window keeps it there, where its dispatch reads it without another copy; the router
    // reads x itself until the plan has sized the window.
    if constexpr (input_in_window) {
      if (x.outerStride() == H) {
        input_at_ = x.data();
      } else {
        input_.matrix(tokens_, H) = x;
        input_at_ = input_.data();
      }
    } else {
      input_.matrix(tokens_, H) = x;
      input_at_ = input_.data();
    }
    auto f = ctx.scratch<scalar>().open();
    experts_.bind_operands(ctx, f);
    auto const rows = route_and_plan(ctx, f, mode);
    if constexpr (input_in_window) {
      scalar* kept = dispatcher_.token_rows();
      row_matrix_map<scalar>(kept, tokens_, H) = x;
      input_at_ = kept;
    }
    auto output = output_.matrix(tokens_, H);
    if constexpr (fp8_wire) {
      std::uint8_t* code_rows = encode_for_wire(ctx, rows.count);
      dispatcher_.forward_codes(ctx.pool(), ctx.stages, wire_.codes(), code_rows,
                                routing_.output().probs, rows.probs, rows.out, output.data(),
                                compute_forward(ctx, rows));
    } else {
      dispatcher_.forward(ctx.pool(), ctx.stages, input_at_, rows.rows, routing_.output().probs,
                          rows.probs, rows.out, output.data(), compute_forward(ctx, rows));
    }
    if (has_shared_expert())
      ctx.stages.time(layer_stage::shared_expert, [&] {
        experts_.shared_forward(ctx, f, input());
        experts_.add_shared(ctx.executor<scalar>(), output);
      });
    experts_.forget_scratch();
    if (mode == router::pass::training) {
      auto const& counts = routing_.output().tokens_per_expert;
      load_.resize(counts.size());
      for (std::size_t e = 0; e < counts.size(); ++e) load_[e] += static_cast<double>(counts[e]);
    }
    awaiting_backward_ = mode != router::pass::eval;
    return {const_row_matrix_map<scalar>(output_.data(), tokens_, H), routing_.output().losses};
  }

  /// Backward from dy [T,H] of the last training forward: returns dx [T,H] (valid until the next
  /// backward) and adds every weight gradient (router and experts, attached losses included, scaled
  /// by ctx.step.loss_backward_scale).
  const_row_matrix_map<scalar> backward(context& ctx, Eigen::Ref<row_matrix<scalar> const> dy) {
    int const H = hidden_size();
    agree([&] {
      if (!awaiting_backward_)
        throw input_error("moe_layer: backward needs a training forward first (once per forward)");
      router::require_shape(dy, tokens_, H, "moe_layer: output gradient");
    });
    awaiting_backward_ = false;
    auto& exec = ctx.executor<scalar>();
    auto f = ctx.scratch<scalar>().open();
    experts_.bind_operands(ctx, f);
    // What the memory policy did not keep is recomputed here.
    routed_rows<scalar> rows;
    if constexpr (memory_settings.moe_layer) {
      [[maybe_unused]] int const windows = window_allocations();
      rows = route_and_plan(ctx, f, router::pass::recompute);
      if constexpr (input_in_window)  // the forward's plan sized the window for this one
        if (window_allocations() != windows && input_at_ != input_.data())
          throw std::logic_error(
              "moe_layer: the recomputed plan grew the window holding the input");
      if constexpr (fp8_wire) {
        std::uint8_t* code_rows = encode_for_wire(ctx, rows.count);
        ctx.stages.time(layer_stage::permute, [&] {
          dispatcher_.dispatch_codes(ctx.pool(), wire_.codes(), code_rows, routing_.output().probs,
                                     rows.probs);
        });
      } else {
        ctx.stages.time(layer_stage::permute, [&] {
          dispatcher_.dispatch(ctx.pool(), input_at_, rows.rows, routing_.output().probs,
                               rows.probs);
        });
      }
      ctx.stages.time(layer_stage::experts, [&] {
        experts_.forward(exec, dispatcher_.tokens_per_local_expert(), rows, 0, local_experts());
      });
    } else {
      rows = experts_.kept_rows(f, dispatcher_.expert_rows());
      if constexpr (memory_settings.moe_act)
        ctx.stages.time(layer_stage::experts, [&] {
          experts_.recompute_activation(exec, dispatcher_.tokens_per_local_expert(), rows);
        });
    }
    if ((memory_settings.moe_layer || memory_settings.shared_experts) && has_shared_expert())
      ctx.stages.time(layer_stage::shared_expert,
                      [&] { experts_.shared_forward(ctx, f, input()); });
    rows = experts_.template with_gradients<output_in_place>(f, rows);
    if constexpr (output_in_place)
      rows.grad_rows = dispatcher_.expert_output_rows();  // dy's rows arrive, and leave, in place
    auto grad_input = grad_input_.matrix(tokens_, H);
    grad_input.setZero();
    auto& grad_probs = routing_.grad_probs(tokens_);
    dispatcher_.backward(ctx.pool(), ctx.stages, dy.data(), rows.grad_rows, rows.grad_probs,
                         grad_input.data(), grad_probs, [&](int first, int last) {
                           experts_.backward(exec, dispatcher_.tokens_per_local_expert(), rows,
                                             first, last);
                         });
    routing_.backward(ctx, input(), grad_input);
    routing_.release_global_aux(jitter_key_);
    if (has_shared_expert())
      ctx.stages.time(layer_stage::shared_expert,
                      [&] { experts_.shared_backward(ctx, f, input(), dy.data(), grad_input); });
    experts_.forget_scratch();
    experts_.end_of_step();
    return {grad_input_.data(), tokens_, H};
  }

  /// Sets the last training forward's micro-batch aside under `key` (core/stash.hpp): its input,
  /// routing, plan and the expert values the memory policy keeps. Other micro-batches' forwards
  /// may run before restore(key) brings it back for its backward.
  void park(std::uint64_t key) requires parks_micro_batches {
    if (!awaiting_backward_)
      throw input_error("moe_layer: park needs a training forward whose backward has not run");
    if (input_at_ != input_.data()) {  // kept in the dispatcher's window: the next forward's place
      input_.matrix(tokens_, hidden_size()) = input();
      input_at_ = input_.data();
    }
    stash_.park(key, tokens_, batch_, jitter_key_, input_);
    input_at_ = nullptr;
    routing_.park(key);
    dispatcher_.park(key);
    experts_.park(key);
    awaiting_backward_ = false;
  }
  void restore(std::uint64_t key) requires parks_micro_batches {
    if (awaiting_backward_)
      throw input_error("moe_layer: restore would drop a forward whose backward has not run");
    stash_.restore(key, tokens_, batch_, jitter_key_, input_);
    input_at_ = input_.data();
    routing_.restore(key);
    dispatcher_.restore(key);
    experts_.restore(key);
    awaiting_backward_ = true;
  }

  /// The recipe's GEMM operands of the last step (codes, scales, delayed-scaling state).
  [[nodiscard]] operands_type const& routed_operands() const noexcept requires rounds_operands {
    return experts_.routed_ops();
  }
  [[nodiscard]] shared_operands_type const& shared_operands() const noexcept requires
      rounds_operands {
    return experts_.shared_ops();
  }
  /// Keeps every operand copy's codes of the last step for inspection.
  void keep_all_operand_codes(bool on) noexcept requires rounds_operands {
    experts_.routed_ops().keep_all_codes(on);
    experts_.shared_ops().keep_all_codes(on);
  }

  /// Tokens this rank routed to each expert in the training forwards since clear_expert_load()
  /// (a recomputed forward is not counted again).
  [[nodiscard]] std::span<double const> expert_load() const noexcept { return load_; }
  void clear_expert_load() { std::fill(load_.begin(), load_.end(), 0.0); }

  /// The most expert rows a forward of the last forward's token count can bring this rank with
  /// `capacity` tokens per expert (0: none), from the configuration alone: a token of any of the
  /// ETP x EP ranks reaches each local expert at most once, and at most experts_per_token() of
  /// them; with a capacity, at most C tokens of each rank reach an expert, or C rounded up to the
  /// router's padding multiple. The experts' row buffers are sized by it, so that a step bringing
  /// more rows than any before takes no new memory.
  [[nodiscard]] int expert_rows_bound(int capacity) const {
    std::int64_t const senders = groups_ == nullptr ? 1 : groups_->tp_ep().size();
    auto const local = static_cast<std::int64_t>(local_experts());
    auto const tokens = static_cast<std::int64_t>(tokens_);
    std::int64_t bound = senders * tokens * std::min<std::int64_t>(experts_per_token(), local);
    if (capacity > 0) {
      std::int64_t per_expert = std::min<std::int64_t>(capacity, tokens);
      auto const& router = routing_.router();
      if (router.config().pad_for_quantization) {
        std::int64_t const m = std::max(1, router.padding_multiple());
        per_expert = std::min(tokens, (per_expert + m - 1) / m * m);
      }
      bound = std::min(bound, senders * local * per_expert);
    }
    return static_cast<int>(std::min<std::int64_t>(bound, std::numeric_limits<int>::max()));
  }
  /// The most experts a token reaches: its top-k, or any number where the router pads the
  /// experts' counts with other tokens (pad_to_capacity, pad_for_quantization).
  [[nodiscard]] int experts_per_token() const {
    auto const& c = routing_.router().config();
    return c.pad_to_capacity || c.pad_for_quantization ? values_.shape.experts : c.top_k;
  }

  /// Once per global batch (after its last backward): the router's expert-bias update from the
  /// token counts summed over TP x DP x CP. Collective over that group on a job.
  void finish_global_batch() { routing_.finish_global_batch(); }
  /// Before a global batch that may run again: keeps the recipe operands' state its backwards
  /// change (discard_global_batch brings it back).
  void begin_global_batch() { experts_.begin_global_batch(); }
  /// The global batch's forwards will run again from the same state (a recomputed step): the
  /// router forgets its counts, the experts' operands go back to begin_global_batch's state.
  void discard_global_batch() {
    routing_.discard_global_batch();
    experts_.discard_global_batch();
    clear_expert_load();
  }

  /// Bytes kept from forward to backward under this layer's memory policy: the input copy, and the
  /// rows, fc1 output, activation, routing and recipe codes the policy does not recompute. Scratch
  /// (shared by all layers through the context) is not counted.
  [[nodiscard]] std::size_t saved_activation_bytes() const {
    std::size_t bytes = static_cast<std::size_t>(tokens_) * hidden_size() * sizeof(scalar);
    if (!memory_settings.moe_layer)
      bytes += dispatcher_.saved_bytes() + routing_.saved_bytes() +
               experts_.saved_bytes(dispatcher_.expert_rows(), tokens_);
    return bytes;
  }

 private:
  moe_layer(parallel::process_groups const* groups, int layer_number, startup_values const& given)
      : groups_(groups),
        values_(setup::values(groups, given)),
        routing_(setup::router_settings(values_), values_.shape.experts, values_.shape.hidden,
                 types::recipe.padding_multiple,
                 moe_parameter_prefix(layer_number, mtp_layers_from(values_)), groups),
        dispatcher_(setup::dispatcher(groups, values_)),
        experts_(values_, layer_number,
                 moe_parameter_prefix(layer_number, mtp_layers_from(values_)), groups) {
    if constexpr (fp8_wire)
      dispatcher_.set_code_row_bytes(operands_type::wire_row_bytes(hidden_size()));
    if constexpr (requires { dispatcher_.bound_experts_per_token(1); })
      dispatcher_.bound_experts_per_token(experts_per_token());
  }

  /// Where the multi-token prediction depths' layers begin (their names differ), or -1 without.
  static int mtp_layers_from(config_values const& v) {
    return v.model.mtp_num_layers > 0 ? v.model.layers : -1;
  }
  const_row_matrix_map<scalar> input() const { return {input_at_, tokens_, hidden_size()}; }
  /// Windows the dispatcher allocated so far (0 without one).
  int window_allocations() const {
    if constexpr (input_in_window)
      return dispatcher_.window_allocations();
    else
      return 0;
  }

  /// Routes the kept input and plans the exchange (collective: a routing failure on any rank stops
  /// every rank here); returns the experts' row views for the planned rows.
  routed_rows<scalar> route_and_plan(context& ctx, typename expert_stage<types>::frame& f,
                                     router::pass mode) {
    router::route_options options;
    options.mode = mode;
    options.jitter_key = jitter_key_;
    auto const failure = routing_.forward(ctx, input(), batch_, options);
    auto const& routing = routing_.output();
    ctx.stages.time(layer_stage::permute, [&] {
      dispatcher_.plan(ctx.pool(), routing.routing_map,
                       routing_.router().config().pad_to_capacity ? routing.capacity : 0, failure);
    });
    experts_.bound_rows(expert_rows_bound(routing.capacity));
    auto rows = experts_.template forward_rows<output_in_place>(f, dispatcher_.expert_rows());
    if constexpr (output_in_place)
      rows.out = dispatcher_.expert_output_rows();  // combined in place (dispatch::shared_memory)
    return rows;
  }

  /// dispatch::fp8_wire: this rank's rows as codes (collective over EP, timed as permute), and
  /// where the local experts' codes will arrive, handed to their operands.
  std::uint8_t* encode_for_wire(context& ctx, int expert_rows) requires fp8_wire {
    ctx.stages.time(layer_stage::permute, [&] {
      wire_.encode(ctx.pool(), groups_->ep(), dispatcher_.send_rows(), input_at_, hidden_size(),
                   experts_.routed_ops(), first_expert(), local_experts());
    });
    std::uint8_t* code_rows = wire_.arrivals(expert_rows, hidden_size());
    experts_.routed_ops().arrive_codes(code_rows, wire_.local_amax());
    return code_rows;
  }

  /// The expert stage's forward on the planned rows, as the dispatcher calls it.
  auto compute_forward(context& ctx, routed_rows<scalar> const& rows) {
    return [&ctx, &rows, this](int first, int last) {
      experts_.forward(ctx.executor<scalar>(), dispatcher_.tokens_per_local_expert(), rows, first,
                       last);
    };
  }

  /// f(name, value, grad, kind, number, numbering) for every parameter this rank holds.
  template <class Visitor>
  void visit_parameters(Visitor&& f) {
    routing_.visit_parameters(f);
    experts_.visit_parameters(f);
  }

  /// Runs `check` locally on one rank, or on every rank of the stage with agreement on failure.
  template <class Check>
  void agree(Check&& check) const {
    if (groups_ != nullptr)
      parallel::check_on_every_rank(groups_->tp_dp_cp(), std::forward<Check>(check));
    else
      check();
  }

  parallel::process_groups const* groups_ = nullptr;
  config_values values_;
  routing_stage<types> routing_;
  dispatcher_type dispatcher_;
  expert_stage<types> experts_;

  // Per micro-batch.
  int tokens_ = 0;
  router::batch_shape batch_{};
  std::uint64_t jitter_key_ = 0;
  bool awaiting_backward_ = false;
  buffer<scalar> input_, output_, grad_input_;
  scalar const* input_at_ = nullptr;  // the kept input: in input_, or in the dispatcher's window
  activation_stash<int, router::batch_shape, std::uint64_t, buffer<scalar>> stash_;
  struct no_wire {};
  [[no_unique_address]] std::conditional_t<fp8_wire, fp8_wire_codes<operands_type>, no_wire> wire_;
  std::vector<double> load_;  // across micro-batches: expert_load()
};

}  // namespace megamoe
