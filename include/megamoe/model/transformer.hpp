// SPDX-License-Identifier: Apache-2.0
// megamoe/model/transformer.hpp — a decoder-only MoE language model with explicit forward and
// backward: token embedding, L pre-norm blocks (RMSNorm, causal attention with RoPE, or
// multi-head latent attention under model::multi_latent_attention, RMSNorm, then the MoE layer of
// `Config` or a dense SwiGLU FFN, each with a residual), a final RMSNorm and the output layer with
// cross-entropy; with model::multi_token_prediction, D depths on the output layer's stage
// (mtp.hpp), whose mean loss times mtp_loss_scaling_factor joins the objective.
//
// Every size comes from the configuration type: `Config::model` (layers, heads, vocabulary, dense
// FFN width, the MoE layer pattern, norm epsilon, RoPE base) and `Config::shape`; what the type
// leaves `dynamic` is given at start-up (startup_values), where the same rules run with the same
// ids. The model runs with any TP (with sequence parallelism), CP and PP; the MoE layers may use
// EP, ETP and EDP (the process-groups constructor). Under PP (parallel/pipeline_schedule.hpp) a
// rank holds the layers of its chunks only (the embedding on virtual stage 0, the final norm and
// output layer on the last), and the pipeline's runner (train/pipeline_runner.hpp) runs them
// chunk by chunk. With MTP the last stage embeds ids too: it holds a copy of the embedding's
// table (the same vocabulary part as stage 0's at its TP rank), which is not a parameter; the
// runner refreshes it from stage 0's before each run and adds its gradient into stage 0's after
// it, so the optimizer, the gradient norm and checkpoints see the table once. Tokens of a
// micro-batch are S positions x B sequences, flattened t = s*B + b; under CP a rank keeps its two
// of the 2 CP chunks of each sequence, its rows S / CP positions (sequence_parallel.hpp).
//
// Its parts: the layers and the one choice of each one's modules (decoder_block.hpp), the
// residual stream and its rows' movements under TP and CP (sequence_parallel.hpp), MTP's depths
// and passes (mtp.hpp), the parameters' names, cuts and numbering (parameter_layout.hpp), the
// configuration resolved for a whole model (model_values.hpp).
#pragma once

#include <megamoe/config/config.hpp>
#include <megamoe/config/resolve.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/parameter_list.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/stash.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/model/counts.hpp>
#include <megamoe/model/decoder_block.hpp>
#include <megamoe/model/embedding.hpp>
#include <megamoe/model/lm_head.hpp>
#include <megamoe/model/model_values.hpp>
#include <megamoe/model/moe_layer.hpp>
#include <megamoe/model/mtp.hpp>
#include <megamoe/model/norm.hpp>
#include <megamoe/model/products.hpp>
#include <megamoe/model/sequence_parallel.hpp>
#include <megamoe/parallel/pipeline_schedule.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/policy/error.hpp>

#include <boost/mpi/collectives/broadcast.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe {

/// What one forward of a micro-batch gives: the mean cross-entropy (nats per token) and the sum
/// of the MoE layers' attached router losses (their values, before any backward scale).
struct transformer_output {
  double cross_entropy = 0.0;
  double router_losses = 0.0;  // all of them
  double aux_loss = 0.0;       // of which load-balancing (aux, sequence aux, global aux)
  double z_loss = 0.0;         // of which z-loss
  double mtp_loss = 0.0;  // the mean over the MTP depths of their mean cross-entropies (0 without)
};

template <class Config>
class transformer {
  static_assert(rules::check<Config>());

 public:
  /// The MoE layers under the configuration's recipe.
  using moe_type = moe_layer<Config>;
  using scalar = typename moe_type::scalar;
  /// Under an FP8 or FP4 recipe the first and last layers may be kept in BF16 (the reference's
  /// first_last_layers_bf16; startup_values::bf16_layers_at_start / _end, R053): their modules
  /// are those of bf16_layer_config_t<Config>.
  static constexpr bool keeps_bf16_layers = decoder_layers<Config>::keeps_bf16_layers;
  /// How context parallelism moves keys and values (the mapping's cp_comm_type).
  static constexpr parallel::cp_comm_type cp_comm = Config::parallel::cp_comm;
  /// Whether a chunk sets each micro-batch's saved values aside between its forward and backward
  /// (a schedule then never repeats a forward): not under a precision recipe.
  static constexpr bool parks_micro_batches = moe_layer<Config>::parks_micro_batches;
  /// memory::quantized_weights: the linear weights of the layers under the recipe (attention's
  /// projections, the dense FFNs, the routed experts) are held as the recipe's codes, their fp32
  /// masters in the optimizer; a layer kept in BF16 keeps its fp32 weights.
  static constexpr bool quantized_weights = moe_type::quantized_weights;
  /// Multi-token prediction depths (model::multi_token_prediction; 0 without).
  static constexpr int mtp_depths = Config::model::value.mtp_num_layers;

  /// One rank (the MoE layers' dispatcher must be local): `given` supplies what the type leaves
  /// to start-up; degrees it leaves dynamic are 1.
  explicit transformer(startup_values const& given = {}) requires(!moe_type::distributed)
      : given_(startup_on_one_rank(given)), values_(resolve_model<Config>(given_)) {
    build(nullptr);
  }

  /// On a job: the degrees come from the groups' layout, the rest from the type and `given`;
  /// every rank of the stage checks, and a broken rule is the same agreed error on all.
  transformer(parallel::process_groups const& groups, startup_values const& given = {})
      : given_(startup_on_job(groups, given)),
        values_(resolve_model_on_job<Config>(groups, given_)) {
    build(&groups);
  }

  /// The configuration, resolved: `values().model` holds the decoder's sizes.
  [[nodiscard]] config_values const& values() const noexcept { return values_; }
  [[nodiscard]] model::settings const& model_settings() const noexcept { return values_.model; }
  [[nodiscard]] int layers() const noexcept { return values_.model.layers; }
  [[nodiscard]] int hidden_size() const noexcept { return values_.shape.hidden; }
  /// Whether layer i is an MoE layer; the layers past num_layers are the MTP depths' (layer
  /// num_layers + k is depth k + 1's), of the last decoder layer's kind.
  [[nodiscard]] bool is_moe(int layer) const {
    return values_.model.is_moe(std::min(layer, values_.model.layers - 1));
  }
  /// f(layer, ordinal) for this rank's MoE layers (all of them without PP) in order, with each
  /// one's place among all the model's MoE layers; `layer` is a moe_type, or under
  /// keeps_bf16_layers a BF16 layer's moe_layer<bf16_layer_config_t<Config>>.
  template <class F>
  void for_each_moe_layer(F&& f) {
    for (auto const& b : decoder_.blocks())
      decoder_.with_ffn(b, [&](auto& ffn) {
        if constexpr (is_moe_layer_v<std::remove_cvref_t<decltype(ffn)>>)
          f(ffn, moe_ordinal(b.layer));
      });
  }
  /// f(layer, attention, ffn) for this rank's layers in order: the modules each runs (its
  /// attention, and its moe_layer or dense FFN), to look into, as tests read their operands.
  template <class F>
  void for_each_layer_modules(F&& f) {
    for (auto const& b : decoder_.blocks())
      decoder_.with_attention(
          b, [&](auto& a) { decoder_.with_ffn(b, [&](auto& ffn) { f(b.layer, a, ffn); }); });
  }
  /// This rank's MoE layers that run under the recipe (all but those kept in BF16), in order.
  [[nodiscard]] std::vector<moe_type const*> recipe_moe_layers() const {
    return decoder_.recipe_moe_layers();
  }
  /// MoE layers of the whole model, the MTP depths' included.
  [[nodiscard]] int moe_layer_count() const { return moe_ordinal(layers() + mtp_depths); }
  /// Whether layer i (of the whole model) runs in BF16 rather than under the recipe. The MTP
  /// depths' layers do as the reference's: under an FP8 recipe always in FP8 (the first and last
  /// BF16 layer counts are the decoder's), under NVFP4 in BF16 (the reference keeps FP4 out of
  /// MTP).
  [[nodiscard]] bool is_bf16_layer(int layer) const noexcept {
    return decoder_layers<Config>::is_bf16_layer(values_.model.layers, given_, layer);
  }

  /// Context-parallel ranks (the CP degree; 1 without).
  [[nodiscard]] int context_parallel() const noexcept { return values_.parallel.cp; }
  /// Tensor-parallel ranks of attention, the dense FFN, embedding and output layer (1 without).
  [[nodiscard]] int tensor_parallel() const noexcept { return values_.parallel.tp; }

  /// R046 and R049 for a sequence length: throws the rule's config_error where this layout
  /// cannot cut it (every rank is given the same length, so every rank throws alike).
  void check_sequence(int seq) const { check_sequence_cut(values_, seq); }

  /// Forward of one micro-batch: tokens and targets [S*B] (t = s*B + b), the whole micro-batch
  /// on every rank of a TP x CP group (2 CP must divide S, R046; TP the S / CP positions a rank's
  /// sequences hold, R049). The cross-entropy is the mean over this rank's CP chunks (the same on
  /// every TP rank); the router losses are this rank's share (they sum over the TP x CP group to
  /// the micro-batch's). Training mode (the context's step) keeps what backward needs.
  transformer_output forward(context& ctx, std::span<std::int32_t const> tokens,
                             std::span<std::int32_t const> targets, int seq, int batch) {
    if (pipelined())
      throw input_error("transformer: with PP above 1 the model runs chunk by chunk (a schedule)");
    begin_micro_batch(tokens, targets, seq, batch);
    transformer_output out;
    embed(ctx);
    for (int i = 0; i < decoder_blocks(); ++i) forward_block(ctx, i, out);
    finish_with_head(ctx, out);
    return out;
  }

  // ---- the pipeline: one chunk (virtual stage) of a micro-batch at a time ----
  /// Pipeline ranks (PP) and chunks per rank (V); this rank's place.
  [[nodiscard]] parallel::pipeline_layout const& pipeline() const noexcept { return pipeline_; }
  [[nodiscard]] bool pipelined() const noexcept { return pipeline_.stages() > 1; }
  [[nodiscard]] int pipeline_rank() const noexcept { return pp_rank_; }
  /// Whether chunk v holds the embedding (virtual stage 0) or the output layer (the last).
  [[nodiscard]] bool chunk_embeds(int v) const noexcept {
    return pipeline_.stage(pp_rank_, v) == 0;
  }
  [[nodiscard]] bool chunk_has_head(int v) const noexcept {
    return pipeline_.stage(pp_rank_, v) == pipeline_.stages() - 1;
  }
  /// Whether this rank holds the last stage's copy of the embedding's table (MTP under PP).
  [[nodiscard]] bool holds_embedding_copy() const noexcept { return embedding_copy_; }
  /// This rank's part of the embedding's table and its gradient: stage 0's parameter, or the
  /// last stage's copy (holds_embedding_copy()); empty maps on a rank with neither.
  [[nodiscard]] row_matrix_map<scalar> embedding_table() {
    if (!holds_embedding_ && !embedding_copy_) return {nullptr, 0, hidden_size()};
    return view(embedding_.weight());
  }
  [[nodiscard]] row_matrix_map<scalar> embedding_table_gradient() {
    if (!holds_embedding_ && !embedding_copy_) return {nullptr, 0, hidden_size()};
    return view(embedding_.gradient());
  }
  /// The rows a chunk sends or receives: this rank's residual-stream rows [N / TP, H].
  [[nodiscard]] std::int64_t boundary_rows(int seq, int batch) const noexcept {
    return std::int64_t{seq / context_parallel()} * batch / tensor_parallel();
  }

  // ---- a chunk's passes block by block, which the pipeline's runner (train/pipeline_runner.hpp)
  // orders: begin_chunk, forward_block for each of its blocks, end_chunk; head_backward on the
  // output layer's chunk, backward_block for each block, last first, embed_backward on the
  // embedding's chunk ----
  /// Begins chunk v's forward of a micro-batch: tokens and targets as forward() takes them (every
  /// chunk is given them; the embedding's and the output layer's chunks read them), `input` the
  /// previous virtual stage's output rows (unused by the embedding's chunk).
  void begin_chunk(context& ctx, int v, std::span<std::int32_t const> tokens,
                   std::span<std::int32_t const> targets, int seq, int batch,
                   const_row_matrix_map<scalar> input) {
    begin_micro_batch(tokens, targets, seq, batch);
    if (chunk_embeds(v)) return embed(ctx);
    if (input.rows() != s_.residual.rows() || input.cols() != s_.residual.cols())
      throw input_error("transformer: chunk input of " + std::to_string(input.rows()) + " x " +
                        std::to_string(input.cols()) + " rows, expected " +
                        std::to_string(s_.residual.rows()) + " x " +
                        std::to_string(s_.residual.cols()));
    s_.residual = input;
  }
  /// Chunk v's blocks, [first, last) of this rank's.
  [[nodiscard]] std::pair<int, int> chunk_blocks(int v) const {
    return chunk_blocks_[static_cast<std::size_t>(v)];
  }
  /// f(module) for each module that keeps values from forward to backward, which the pipeline's
  /// runner sets aside per micro-batch (core/stash.hpp): the embedding; block i's; the output
  /// layer's stage's (its norm, the output layer, each MTP depth's own and its layer's).
  template <class F>
  void for_each_embedding_module(F&& f) {
    f(embedding_);
  }
  template <class F>
  void for_each_block_module(int i, F&& f) {
    decoder_.for_each_block_module(i, f);
  }
  template <class F>
  void for_each_head_module(F&& f) {
    f(final_norm_);
    f(head_);
    mtp_.for_each_depth([&](auto& d) {
      f(d);
      decoder_.for_each_block_module(d.block, f);
    });
  }
  /// The rows the last forward of a chunk without the output layer produced.
  [[nodiscard]] row_matrix<scalar>& chunk_output() noexcept { return s_.residual; }
  /// Where the gradient of a chunk's output rows is received before its backward.
  row_matrix<scalar>& chunk_output_gradient(std::int64_t rows) {
    s_.grad.resize(rows, hidden_size());
    return s_.grad;
  }
  /// The gradient of a chunk's input rows its backward leaves (the embedding's chunk: none).
  [[nodiscard]] row_matrix<scalar>& chunk_input_gradient() noexcept { return s_.grad; }
  /// Model FLOPs of one token's forward + backward in a sequence of `seq` (megamoe::
  /// flops_per_token).
  [[nodiscard]] double flops_per_token(int seq) const {
    return megamoe::flops_per_token(values_, seq);
  }

  /// Each of this rank's tokens' cross-entropy (nats) in the last forward with targets, in its
  /// row order (t = s*B + b over its S / CP positions; every TP rank has them all).
  [[nodiscard]] std::span<double const> token_losses() const noexcept {
    return head_.token_losses();
  }

  /// MTP depth k's (1-based) tokens' cross-entropy (nats; 0 where the target is ignored) and
  /// targets in the last forward with targets, as token_losses() orders them.
  [[nodiscard]] std::span<double const> mtp_token_losses(int k) const {
    return mtp_.depth(k).pass.token_loss;
  }
  [[nodiscard]] std::span<std::int32_t const> mtp_targets(int k) const {
    return mtp_.depth(k).pass.targets;
  }
  /// This rank's targets in the last forward with targets, as token_losses() orders them.
  [[nodiscard]] std::span<std::int32_t const> kept_targets() const noexcept {
    return chunks_.targets();
  }

  /// Logits [rows, V / TP] of the last forward's final hidden states: every row of this rank's
  /// CP chunks, this rank's part of the vocabulary (all of it without TP).
  row_matrix<scalar> const& logits() {
    return head_.logits({final_hidden_, std::int64_t{seq_} * batch_, hidden_size()});
  }

  /// The logits of sequence b at position `position` of the last forward, on every rank
  /// (collective over the TP x CP group: the TP ranks gather their vocabulary parts, the CP rank
  /// that holds the row sends it).
  std::vector<double> logits_at(int position, int b) {
    int const tp = tensor_parallel();
    auto const [owner, row] = chunks_.owner_of(position, seq_ * chunks_.ranks());
    std::vector<double> out(static_cast<std::size_t>(values_.model.vocabulary));
    if (chunks_.rank() == owner) {
      auto const& l = logits();
      std::vector<double> mine(static_cast<std::size_t>(l.cols()));
      for (Eigen::Index v = 0; v < l.cols(); ++v)
        mine[static_cast<std::size_t>(v)] =
            static_cast<double>(l(std::int64_t(row) * batch_ + b, v));
      std::vector<std::int64_t> parts(static_cast<std::size_t>(tp));
      for (int k = 0; k < tp; ++k) parts[static_cast<std::size_t>(k)] = vocabulary_part(k).rows;
      if (tp > 1)
        parallel::all_gather_v(groups_->tp(), mine.data(), out.data(),
                               std::span<std::int64_t const>(parts), 1);
      else
        out = mine;
    }
    if (chunks_.ranks() > 1)
      boost::mpi::broadcast(groups_->cp(), out.data(), static_cast<int>(out.size()), owner);
    return out;
  }

  /// Backward of the last forward: the cross-entropy's gradient times `scale`; the MoE layers add
  /// their router losses' gradients times ctx.step.loss_backward_scale. Adds to every gradient.
  void backward(context& ctx, scalar scale) {
    head_backward(ctx, scale);
    backward_blocks(ctx, 0, decoder_blocks());
    embed_backward(ctx);
  }

  /// Bytes the attention modules keep from the last forward to backward on this rank (their
  /// input rows, this rank's q k v and context columns, log-sum-exp rows, gathered keys).
  [[nodiscard]] std::size_t attention_saved_bytes() const noexcept {
    std::size_t total = 0;
    for (auto const& b : decoder_.blocks())
      decoder_.with_attention(b, [&](auto& a) { total += a.saved_bytes(); });
    return total;
  }

  /// Once per global batch: the MoE layers' expert-bias updates and every module's end of step
  /// for the recipe's operands (delayed scaling's amaxes over the DP replicas; collective on a
  /// job).
  void finish_global_batch() {
    auto const replicas = groups_ == nullptr ? parallel::communicator_max()
                                             : parallel::communicator_max(groups_->dp());
    decoder_.finish_global_batch(replicas);
  }
  /// Before a global batch that may run again: keeps the state its passes change besides the
  /// gradients (the recipe operands' steps and delayed scaling's histories and scales).
  void begin_global_batch() { decoder_.begin_global_batch(); }
  /// The global batch's forwards and backwards will run again from the same state (a recomputed
  /// step): the MoE layers forget their counts, the recipe operands go back to the state
  /// begin_global_batch() kept.
  void discard_global_batch() { decoder_.discard_global_batch(); }

  void zero_grad() {
    embedding_.zero_grad();
    decoder_.zero_grad();
    final_norm_.zero_grad();
    head_.zero_grad();
    mtp_.for_each_depth([](auto& d) { d.zero_grad(); });
  }

  /// f(name, value, grad, kind) for every parameter this rank holds, named as the reference
  /// names them (`embedding.word_embeddings.weight`, `decoder.layers.{i}....`,
  /// `decoder.final_layernorm.weight`, `output_layer.weight`); the kind follows from each
  /// parameter's cut (model/parameter_layout.hpp) and its module holding codes or not.
  template <class F>
  void for_each_parameter(F&& f) {
    walk_parameters(
        [&](std::string const& name, auto value, auto grad, parameter_cut cut, bool codes) {
          f(std::string_view(name), value, grad, kind_of(cut, tp_position(), codes));
        },
        [&](auto& moe) { moe.for_each_parameter(f); });
  }

  /// Every parameter this rank holds, with where its elements lie in the whole parameter: those
  /// of the experts last.
  [[nodiscard]] parameter_list<scalar> numbered_parameters() {
    parameter_list<scalar> out;
    auto add = [&](std::string_view name, row_matrix_map<scalar> value, row_matrix_map<scalar> grad,
                   parameter_kind kind, element_numbering const& n) {
      out.push_back({std::string(name), value, grad, kind, n});
    };
    walk_parameters(
        [&](std::string const& name, auto value, auto grad, parameter_cut cut, bool codes) {
          add(name, value, grad, kind_of(cut, tp_position(), codes),
              numbering_of(cut, grad.rows(), grad.cols(), tp_position()));
        },
        [&](auto& moe) {
          moe.for_each_numbered_parameter([&](std::string_view name, auto value, auto grad,
                                              parameter_kind kind, element_numbering const& n) {
            if (kind == parameter_kind::dense) add(name, value, grad, kind, n);
          });
        });
    for_each_moe_layer([&](auto& m, int) {
      m.for_each_numbered_parameter([&](std::string_view name, auto value, auto grad,
                                        parameter_kind kind, element_numbering const& n) {
        if (kind != parameter_kind::dense) add(name, value, grad, kind, n);
      });
    });
    return out;
  }
  /// f(name, value, grad, kind, numbering) for each of numbered_parameters().
  template <class F>
  void for_each_numbered_parameter(F&& f) {
    for (auto& p : numbered_parameters())
      f(std::string_view(p.name), p.value, p.grad, p.kind, std::as_const(p.numbering));
  }
  /// f(persistent_state) for the state besides parameters: the MoE layers' (moe_layer) and, under
  /// delayed scaling, each attention's and dense FFN's amax histories and scales (named
  /// `decoder.layers.{i}.self_attention.fp8_delayed_state`, `....mlp.fp8_delayed_state`; none
  /// for a layer kept in BF16); f may change the values.
  template <class F>
  void for_each_persistent_state(F&& f) {
    for_each_moe_layer([&](auto& m, int) { m.for_each_persistent_state(f); });
    for (auto const& b : decoder_.blocks()) {
      std::string const prefix = layer_prefix(b.layer, layers());
      auto visit = [&](auto& ops, std::string const& name) {
        visit_operand_state(ops, prefix + name, 1, 0, state_owner::attention_grid_first, f);
      };
      decoder_.with_attention(b, [&](auto& a) {
        a.for_each_linears([&](std::string_view part, auto& l) {
          visit(l.operands(), ".self_attention.fp8_delayed_state" + std::string(part));
        });
      });
      decoder_.with_ffn(b, [&](auto& ffn) {
        if constexpr (!is_moe_layer_v<std::remove_cvref_t<decltype(ffn)>>)
          visit(ffn.operands(), ".mlp.fp8_delayed_state");
      });
    }
  }
  /// A copy of that state, in for_each_persistent_state's order.
  [[nodiscard]] persistent_state_list persistent_states() {
    persistent_state_list out;
    for_each_persistent_state([&](persistent_state const& s) { out.add(s); });
    return out;
  }
  /// Sets the state from `states` (a persistent_states() copy, its values changed).
  void set_persistent_states(persistent_state_list const& states) {
    auto from = states.begin();
    for_each_persistent_state([&](persistent_state const& s) {
      if (from == states.end() || from->values.size() != s.values.size())
        throw input_error("transformer: persistent state differs from the model's");
      std::copy(from->values.begin(), from->values.end(), s.values.begin());
      ++from;
    });
  }
  /// Training steps the recipe's operands have ended (all modules alike).
  [[nodiscard]] std::uint64_t operand_steps() const noexcept { return decoder_.operand_steps(); }
  void set_operand_steps(std::uint64_t steps) noexcept { decoder_.set_operand_steps(steps); }

  /// Weights from N(0, std^2) as a function of (seed, parameter number, element of the whole
  /// parameter), norms at 1, so every mapping starts from the same model. Parameter n of the model
  /// draws from seed + n, or from layer_seed + n inside layer i (layer_seed = seed + 1000003 (i +
  /// 1)); an MoE layer numbers its own from layer_seed + 500000, far from any n, so no two
  /// parameters share a seed.
  void initialize(std::uint64_t seed, double std = 0.02) {
    // n counts the linear weights drawn before, in the whole model's order (embedding; per layer
    // attention's linears (linear_qkv, linear_proj, or MLA's five or four) and a dense FFN's fc1,
    // fc2; output layer), whichever stage holds them.
    auto const& mla = values_.model.mla;
    std::uint64_t const attention_tensors = !mla.enabled() ? 2 : mla.q_lora_rank > 0 ? 5 : 4;
    auto drawn_before = [&](int layer) {
      std::uint64_t n = 1;
      for (int j = 0; j < layer; ++j) n += attention_tensors + (is_moe(j) ? 0 : 2);
      return n;
    };
    auto layer_seed = [&](int layer) {
      return seed + 1000003ULL * static_cast<std::uint64_t>(layer + 1);
    };
    std::uint64_t index = 0;
    // A module's linear weights each draw from `from` + their number; a module holding its
    // weights as codes quantizes them once drawn.
    auto draw = [&]<class Module>(Module& module, std::string const& prefix, std::uint64_t from) {
      module.for_each_parameter(
          prefix, [&](std::string const&, row_matrix_map<scalar> value, auto, parameter_cut cut) {
            if (!is_linear_weight(cut))
              value.setOnes();
            else
              draw_parameter(value, from, ++index,
                             numbering_of(cut, value.rows(), value.cols(), tp_position()), std);
          });
      if constexpr (holds_codes_v<Module>) module.refresh_weight_codes();
    };
    // The last stage's copy (MTP under PP) is drawn as stage 0's table is.
    if (holds_embedding_ || embedding_copy_) draw(embedding_, "embedding.word_embeddings", seed);
    for (auto& b : decoder_.blocks()) {
      index = drawn_before(b.layer);
      decoder_.with_attention(b, [&](auto& a) { draw(a, "self_attention", layer_seed(b.layer)); });
      decoder_.with_ffn(b, [&](auto& ffn) {
        if constexpr (is_moe_layer_v<std::remove_cvref_t<decltype(ffn)>>)
          ffn.initialize(layer_seed(b.layer) + 500000, std);
        else
          draw(ffn, "mlp", layer_seed(b.layer));
      });
    }
    index = drawn_before(layers());
    if (holds_head_) draw(head_, "output_layer", seed);
    // An MTP depth's eh_proj draws past its layer's tensors, from its layer's seed.
    for (int k = 1; k <= mtp_.size(); ++k) {
      int const layer = layers() + k - 1;
      index = drawn_before(layer + 1);
      draw(mtp_.depth(k), "mtp.layers." + std::to_string(k - 1), layer_seed(layer));
    }
  }

  /// With memory::quantized_weights, for an optimizer holding the fp32 masters of the weights
  /// held as codes: frees their values, and f(name, store) for each of them in for_each_parameter's
  /// order (store(w) quantizes it from w; collective over each module's amax group). A layer kept
  /// in BF16 holds no codes.
  void release_weight_values() requires quantized_weights {
    for_each_code_module([](auto& m, std::string const&) { m.release_weight_values(); });
  }
  template <class F>
  void for_each_quantized_weight(F&& f) requires quantized_weights {
    for_each_code_module([&](auto& m, std::string const& prefix) {
      if constexpr (requires { m.for_each_quantized_weight(prefix, f); })
        m.for_each_quantized_weight(prefix, f);
      else
        m.for_each_quantized_weight(f);
    });
  }
  /// Quantizes every weight held as codes from its fp32 values, after they were written
  /// (initialize() does it itself); the values must still be the model's (no optimizer holds
  /// them).
  void refresh_weight_codes() requires quantized_weights {
    for_each_code_module([](auto& m, std::string const&) { m.refresh_weight_codes(); });
  }

 private:
  template <class Module>
  static constexpr bool holds_codes_v = requires {
    requires Module::quantized_weights;
  };

  /// Where this rank stands in the TP group its modules' parameters are cut over.
  [[nodiscard]] cut_position tp_position() const noexcept {
    int const part = tensor_parallel() > 1 ? groups_->tp().rank() : 0;
    return {tensor_parallel(), part, vocabulary_part(part)};
  }
  /// own(name, value, grad, cut, held_as_codes) for the parameters of this rank's own modules in
  /// the model's order, and moe(layer) in its place for each MoE layer.
  template <class Own, class Moe>
  void walk_parameters(Own&& own, Moe&& moe) {
    auto of = [&]<class Module>(Module& module, std::string const& prefix) {
      module.for_each_parameter(prefix, [&](std::string const& name, row_matrix_map<scalar> value,
                                            row_matrix_map<scalar> grad, parameter_cut cut) {
        own(name, value, grad, cut, holds_codes_v<Module>);
      });
    };
    if (holds_embedding_) of(embedding_, "embedding.word_embeddings");
    for (auto& b : decoder_.blocks()) {
      std::string const prefix = layer_prefix(b.layer, layers());
      decoder_.for_each_named_module(b, [&]<class Module>(Module& m, char const* name) {
        if constexpr (is_moe_layer_v<Module>)
          moe(m);
        else
          of(m, prefix + name);
      });
    }
    if (!holds_head_) return;
    of(final_norm_, "decoder.final_layernorm");
    of(head_, "output_layer");
    for (int k = 1; k <= mtp_.size(); ++k) of(mtp_.depth(k), "mtp.layers." + std::to_string(k - 1));
  }
  /// f(module, prefix) for the modules whose weights are held as codes, in for_each_parameter's
  /// order: each recipe layer's attention (prefix `decoder.layers.{i}.self_attention`), then its
  /// MoE layer or dense FFN (`decoder.layers.{i}.mlp`).
  template <class F>
  void for_each_code_module(F&& f) {
    for (auto& b : decoder_.blocks()) {
      std::string const prefix = layer_prefix(b.layer, layers());
      decoder_.for_each_named_module(b, [&]<class Module>(Module& m, char const* name) {
        if constexpr (holds_codes_v<Module>) f(m, prefix + name);
      });
    }
  }

  // ---- the passes forward(), backward() and the chunks are made of ----
 public:
  /// Forward of this rank's block i in the micro-batch begun: each FFN's output joins the
  /// residual stream in the next norm's pass (add_forward), so the last one's is left pending.
  void forward_block(context& ctx, int i, transformer_output& out) {
    int const seq = seq_, batch = batch_;
    auto& times = ctx.step_stages;
    using stage = step_stage;
    auto& b = decoder_[i];
    s_.norm_of_residual(ctx, b.input_norm);
    times.time(stage::attention, [&] {
      auto f = ctx.scratch<scalar>().open();
      decoder_.with_attention(b, [&](auto& a) {
        a.for_each_linears([&](std::string_view, auto& l) { l.bind(ctx, f); });
        a.forward(ctx.executor<scalar>(), s_.sp.all_rows(const_view(s_.normed)), seq, batch,
                  s_.whole_output(s_.branch));
      });
      s_.sp.sum_to_my_rows(view(s_.branch));
    });
    times.time(stage::norms_residuals, [&] {
      b.pre_mlp_norm.add_forward(ctx.pool(), view(s_.residual), const_view(s_.branch),
                                 view(s_.normed));
    });
    decoder_.with_ffn(b, [&](auto& ffn) {
      if constexpr (is_moe_layer_v<std::remove_cvref_t<decltype(ffn)>>) {
        auto const result = ffn.forward(ctx, s_.normed, seq / tensor_parallel(), batch);
        s_.pending = result.y.data();
        for (auto const& l :
             {result.losses.aux_loss, result.losses.seq_aux_loss, result.losses.global_aux_loss})
          if (l) out.aux_loss += static_cast<double>(l->value);
        if (result.losses.z_loss) out.z_loss += static_cast<double>(result.losses.z_loss->value);
        out.router_losses = out.aux_loss + out.z_loss;
      } else {
        times.time(stage::dense_ffn, [&] {
          auto f = ctx.scratch<scalar>().open();
          ffn.bind_operands(ctx, f);
          ffn.forward(ctx.executor<scalar>(), s_.sp.all_rows(const_view(s_.normed)),
                      s_.whole_output(s_.branch));
          s_.sp.sum_to_my_rows(view(s_.branch));
        });
        s_.pending = s_.branch.data();
      }
    });
  }
  /// Backward of block i from the residual stream's gradient (chunk_output_gradient()); the
  /// norms' input gradients add into it.
  void backward_block(context& ctx, int i) {
    auto& pool = ctx.pool();
    s_.grad_normed.resize(s_.grad.rows(), s_.grad.cols());
    auto& times = ctx.step_stages;
    using stage = step_stage;
    auto& b = decoder_[i];
    decoder_.with_ffn(b, [&](auto& ffn) {
      if constexpr (is_moe_layer_v<std::remove_cvref_t<decltype(ffn)>>) {
        auto const dx = ffn.backward(ctx, s_.grad);
        times.time(stage::norms_residuals,
                   [&] { b.pre_mlp_norm.backward(pool, dx, view(s_.grad), true); });
      } else {
        times.time(stage::dense_ffn, [&] {
          auto f = ctx.scratch<scalar>().open();
          ffn.bind_operands(ctx, f);
          ffn.backward(ctx.executor<scalar>(), s_.sp.all_gradient_rows(const_view(s_.grad)),
                       s_.whole_output(s_.grad_normed));
          s_.sp.sum_to_my_rows(view(s_.grad_normed));
        });
        times.time(stage::norms_residuals, [&] {
          b.pre_mlp_norm.backward(pool, const_view(s_.grad_normed), view(s_.grad), true);
        });
      }
    });
    times.time(stage::attention, [&] {
      auto f = ctx.scratch<scalar>().open();
      decoder_.with_attention(b, [&](auto& a) {
        a.for_each_linears([&](std::string_view, auto& l) { l.bind(ctx, f); });
        a.backward(ctx.executor<scalar>(), s_.sp.all_gradient_rows(const_view(s_.grad)),
                   s_.whole_output(s_.grad_normed));
      });
      s_.sp.sum_to_my_rows(view(s_.grad_normed));
    });
    times.time(stage::norms_residuals, [&] {
      b.input_norm.backward(pool, const_view(s_.grad_normed), view(s_.grad), true);
    });
  }
  /// Ends chunk v's forward: the output layer, or the last FFN's output joins the stream before
  /// it leaves.
  void end_chunk(context& ctx, int v, transformer_output& out) {
    if (chunk_has_head(v))
      finish_with_head(ctx, out);
    else
      s_.settle();
  }
  /// The output layer's stage's backward (its MTP depths', the output layer's and the final
  /// norm's) into the residual stream's gradient, from the cross-entropy times `scale`.
  void head_backward(context& ctx, scalar scale) {
    s_.start_backward();
    if constexpr (mtp_depths > 0) {
      auto const weight = static_cast<scalar>(static_cast<double>(scale) *
                                              values_.model.mtp_loss_scaling_factor / mtp_depths);
      mtp_.backward(ctx, s_, embedding_, head_, weight, [&](int i) { backward_block(ctx, i); });
    }
    ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
      head_.backward(ctx.executor<scalar>(), scale, s_.whole_output(s_.grad_normed));
      s_.sp.sum_to_my_rows(view(s_.grad_normed));
      if constexpr (mtp_depths > 0) s_.grad_normed += mtp_.carry();
    });
    ctx.step_stages.time(step_stage::norms_residuals, [&] {
      final_norm_.backward(ctx.pool(), const_view(s_.grad_normed), view(s_.grad));
    });
  }
  /// The embedding's backward from the residual stream's gradient, into its weights.
  void embed_backward(context& ctx) {
    ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
      embedding_.backward(ctx.pool(), s_.sp.all_gradient_rows(const_view(s_.grad)));
    });
  }

 private:
  /// Checks the micro-batch, keeps this rank's CP chunks of it and sizes the residual stream.
  void begin_micro_batch(std::span<std::int32_t const> tokens,
                         std::span<std::int32_t const> targets, int seq, int batch) {
    if (seq < 1 || batch < 1 || std::ssize(tokens) != std::int64_t{seq} * batch ||
        (!targets.empty() && targets.size() != tokens.size()))
      throw input_error("transformer: " + std::to_string(tokens.size()) + " tokens and " +
                        std::to_string(targets.size()) + " targets for S = " + std::to_string(seq) +
                        ", B = " + std::to_string(batch));
    check_sequence(seq);
    if constexpr (mtp_depths > 0)
      if (holds_head_ && !targets.empty())
        mtp_.inputs().shift(tokens, targets, seq, batch, chunks_.ranks(), chunks_.rank());
    // The loss's divisor: the micro-batch's counted targets over CP (each CP rank holds its
    // chunks' part of the sum).
    counted_targets_ = static_cast<double>(
        std::ranges::count_if(targets, [](std::int32_t id) { return id != ignored_target; }));
    seq = chunks_.keep(tokens, targets, seq, batch);
    // This rank's rows: its CP chunks' N = S/CP * B tokens, of which it keeps N / TP in the
    // residual stream (sequence parallelism); attention, the dense FFN and the output layer see
    // all N, gathered over TP.
    seq_ = seq;
    batch_ = batch;
    s_.start(seq * batch / tensor_parallel(), seq * batch, hidden_size());
  }

  void embed(context& ctx) {
    ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
      embedding_.forward(ctx.pool(), chunks_.tokens(), s_.whole_output(s_.residual));
      s_.sp.sum_to_my_rows(view(s_.residual));
    });
  }

  void finish_with_head(context& ctx, transformer_output& out) {
    s_.norm_of_residual(ctx, final_norm_);
    ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
      auto const hidden = s_.sp.all_rows(const_view(s_.normed));
      final_hidden_ = hidden.data();  // for logits()
      if (!chunks_.targets().empty())
        out.cross_entropy = head_.forward(ctx.executor<scalar>(), hidden, chunks_.targets(),
                                          std::max(1.0, counted_targets_) / context_parallel());
      if constexpr (mtp_depths > 0) {  // the depths write over the gathered rows and s_.normed
        final_rows_ = hidden;
        final_hidden_ = final_rows_.data();
      }
    });
    if constexpr (mtp_depths > 0)
      if (!chunks_.targets().empty())
        out.mtp_loss += mtp_.forward(ctx, s_, embedding_, head_, context_parallel(),
                                     [&](int i) { forward_block(ctx, i, out); });
  }

  /// Backward of blocks [first, last) from s_.grad, last first.
  void backward_blocks(context& ctx, int first, int last) {
    for (int i = last - 1; i >= first; --i) backward_block(ctx, i);
  }

  /// This rank's decoder layers (the decoder's blocks hold the MTP depths' after them).
  [[nodiscard]] int decoder_blocks() const noexcept { return decoder_.size() - mtp_.size(); }
  /// Of all the model's MoE layers, how many come before layer i.
  [[nodiscard]] int moe_ordinal(int layer) const {
    int n = 0;
    for (int j = 0; j < layer; ++j) n += is_moe(j) ? 1 : 0;
    return n;
  }

  /// TP rank `part`'s ids of the vocabulary.
  [[nodiscard]] vocabulary_shard vocabulary_part(int part) const noexcept {
    auto const& m = values_.model;
    int const tp = tensor_parallel();
    return tp == 1 ? vocabulary_shard::all(m.vocabulary)
                   : vocabulary_shard::part_of(m.vocabulary, m.vocab_multiple, tp, part);
  }

  void build(parallel::process_groups const* groups) {
    groups_ = groups;
    // A layer's modules run one recipe: the counts are the model's, not theirs (R053).
    startup_values layer_given = given_;
    layer_given.bf16_layers_at_start = layer_given.bf16_layers_at_end = std::nullopt;
    auto const& m = values_.model;
    int const H = hidden_size();
    pipeline_ = model_pipeline(values_, given_);
    pp_rank_ = pipeline_.pp() > 1 ? groups->pp().rank() : 0;
    // This rank's layers: chunk v's are virtual stage v PP + p's, in order.
    std::vector<int> mine;
    for (int v = 0; v < pipeline_.vpp(); ++v) {
      int const stage = pipeline_.stage(pp_rank_, v), first = pipeline_.first_layer(stage);
      chunk_blocks_.push_back(
          {static_cast<int>(mine.size()), static_cast<int>(mine.size()) + pipeline_.layers(stage)});
      for (int i = first; i < first + pipeline_.layers(stage); ++i) mine.push_back(i);
    }
    int const tp = values_.parallel.tp, part = tp > 1 ? groups->tp().rank() : 0;
    holds_embedding_ = chunk_embeds(0);
    holds_head_ = chunk_has_head(pipeline_.vpp() - 1);
    embedding_copy_ = mtp_depths > 0 && holds_head_ && !holds_embedding_;
    if (holds_embedding_ || embedding_copy_)
      embedding_ = token_embedding<scalar>(vocabulary_part(part), H);
    if (holds_head_) {
      final_norm_ = rms_norm<scalar>(H, m.norm_epsilon);
      head_ = lm_head<scalar>(H, vocabulary_part(part), tp > 1 ? &groups->tp() : nullptr);
    }
    // The MTP depths' layers follow the decoder's on the output layer's stage.
    int const mtp_layers = holds_head_ ? mtp_depths : 0;
    for (int k = 0; k < mtp_layers; ++k) mine.push_back(m.layers + k);
    decoder_.reserve(mine.size());
    for (int i : mine) {
      if (i >= m.layers) mtp_.add_depth(H, m.norm_epsilon, decoder_.size());
      decoder_.add(i, is_bf16_layer(i), is_moe(i), values_, groups, layer_given);
    }
    if (groups != nullptr) {
      s_.sp.attach(&groups->tp());
      chunks_.attach(&groups->cp());
    }
  }

  startup_values given_;
  config_values values_;
  token_embedding<scalar> embedding_{1, 1};
  decoder_layers<Config> decoder_;
  rms_norm<scalar> final_norm_{1};
  lm_head<scalar> head_{1, 1};
  parallel::process_groups const* groups_ = nullptr;  // kept by reference; null on one rank
  int seq_ = 0, batch_ = 0;                           // this rank's positions, sequences
  double counted_targets_ = 0.0;                      // the micro-batch's, for the loss's divisor
  // The micro-batch run: under CP this rank's chunks of it (no CP buffers where the type fixes CP
  // 1).
  context_chunks<Config::parallel::value.cp != 1> chunks_;
  // The micro-batch's residual stream and working rows; under TP, its rows gathered and reduced
  // (no TP buffers where the type fixes TP 1).
  residual_stream<scalar, Config::parallel::value.tp != 1> s_;
  scalar const* final_hidden_ = nullptr;  // the last forward's final hidden states, all N rows
  row_matrix<scalar> final_rows_;         // a copy of them with MTP (its depths reuse the buffers)
  mtp_stack<scalar, mtp_depths> mtp_;     // multi-token prediction's depths (none without)
  // The pipeline: the layout, this rank's place, its chunks' blocks [first, last), and which ends
  // of the model it holds.
  parallel::pipeline_layout pipeline_;
  int pp_rank_ = 0;
  std::vector<std::pair<int, int>> chunk_blocks_;
  bool holds_embedding_ = true, holds_head_ = true;
  bool embedding_copy_ = false;  // the last stage's copy of the table (MTP under PP)
};

}  // namespace megamoe
