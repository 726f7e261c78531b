// SPDX-License-Identifier: Apache-2.0
// megamoe/model/transformer.hpp — a decoder-only MoE language model with explicit forward and
// backward: token embedding, L pre-norm blocks (RMSNorm, causal attention with RoPE, or
// multi-head latent attention under model::multi_latent_attention, RMSNorm, then the MoE layer of
// `Config` or a dense SwiGLU FFN, each with a residual), a final RMSNorm and the output layer with
// cross-entropy. With model::multi_token_prediction (MTP) D depths follow on the output layer's
// stage: depth k (1-based) joins RMSNorm(embedding of the ids k places ahead) and RMSNorm(depth
// k - 1's hidden state; depth 0's is the decoder's output after its final norm) through eh_proj
// [H, 2H], runs one layer of the last decoder layer's kind (`mtp.layers.{k-1}.transformer_layer`)
// and its own final RMSNorm, and predicts the targets k places ahead through the shared output
// layer (the last k positions of each sequence have none). The objective adds
// mtp_loss_scaling_factor / D times the sum of the depths' mean losses.
//
// Every size comes from the configuration type: `Config::model` (layers, heads, vocabulary, dense
// FFN width, the MoE layer pattern, norm epsilon, RoPE base) and `Config::shape`; what the type
// leaves `dynamic` is given at start-up (startup_values), where the same rules run with the same
// ids. The model runs with any TP (with sequence parallelism), CP and PP; the MoE layers may use
// EP, ETP and EDP (the process-groups constructor). Under PP (parallel/pipeline.hpp) a rank holds
// the layers of its chunks only (the embedding on virtual stage 0, the final norm and output
// layer on the last), and a schedule runs them chunk by chunk (forward_chunk, backward_chunk).
// With MTP the last stage embeds ids too: it holds a copy of the embedding's table (the same
// vocabulary part as stage 0's at its TP rank), which is not a parameter. The pipeline's runner
// (train/pipeline.hpp) refreshes it from stage 0's before each run and adds its gradient into
// stage 0's after it, so the optimizer, the gradient norm and checkpoints see the table once.
// Tokens of a micro-batch are S positions x B sequences, flattened t = s*B + b. Under context
// parallelism every rank of a CP group is given the whole micro-batch and keeps its two of the 2 CP
// chunks of each sequence (chunks r and 2 CP - 1 - r, the reference's load balancing): the rank's
// rows are S / CP positions, its chunks in that order, t = s*B + b over them.
//
// Its parts: the layers and the choice of each one's modules (decoder_block.hpp), the rows'
// movements under TP and CP (sequence_parallel.hpp), the MTP depths' modules and inputs
// (mtp.hpp), the configuration resolved for a whole model (model_values.hpp); a schedule that
// interleaves two micro-batches block by block is train/pipeline.hpp's.
#pragma once

#include <megamoe/config/config.hpp>
#include <megamoe/config/error.hpp>
#include <megamoe/config/resolve.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
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
#include <megamoe/parallel/pipeline.hpp>
#include <megamoe/parallel/process_groups.hpp>

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
    if (!keeps_bf16_layers) return false;
    if (layer >= values_.model.layers)
      return Config::precision::value.recipe == precision::recipe_id::nvfp4;
    return layer < bf16_at_start_ || layer >= values_.model.layers - bf16_at_end_;
  }

  /// Context-parallel ranks (the CP degree; 1 without).
  [[nodiscard]] int context_parallel() const noexcept { return values_.parallel.cp; }
  /// Tensor-parallel ranks of attention, the dense FFN, embedding and output layer (1 without).
  [[nodiscard]] int tensor_parallel() const noexcept { return values_.parallel.tp; }

  /// R046 and R049 for a sequence length: throws the rule's config_error where this layout
  /// cannot cut it (every rank is given the same length, so every rank throws alike).
  void check_sequence(int seq) const {
    int const cp = context_parallel(), tp = tensor_parallel();
    if (cp > 1 && seq % (2 * cp) != 0)
      throw config_error(rules::id::context_chunks_divide_sequence,
                         "sequence length " + std::to_string(seq) + ", CP " + std::to_string(cp));
    if (tp > 1 && (seq / cp) % tp != 0)
      throw config_error(rules::id::tp_divides_sequence_shard,
                         "sequence length " + std::to_string(seq) + ", CP " + std::to_string(cp) +
                             ", TP " + std::to_string(tp));
  }

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
    run_blocks(ctx, 0, decoder_blocks(), out);
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

  /// Forward of chunk v of a micro-batch: tokens and targets as forward() takes them (every
  /// chunk is given them; the embedding's and the output layer's chunks read them), `input` the
  /// previous virtual stage's output rows (unused by the embedding's chunk). Returns the chunk's
  /// router losses and, on the output layer's chunk, the cross-entropy; any other chunk leaves
  /// its output rows in chunk_output(). `ctx.step.mode` may be recompute: the same forward again
  /// (the MoE layers do not count it twice), for a model that does not park micro-batches.
  transformer_output forward_chunk(context& ctx, int v, std::span<std::int32_t const> tokens,
                                   std::span<std::int32_t const> targets, int seq, int batch,
                                   const_row_matrix_map<scalar> input) {
    begin_micro_batch(tokens, targets, seq, batch);
    transformer_output out;
    start_chunk(ctx, v, input);
    auto const [first, last] = chunk_blocks_[static_cast<std::size_t>(v)];
    run_blocks(ctx, first, last, out);
    end_chunk(ctx, v, out);
    return out;
  }
  // ---- a chunk's passes block by block, for a schedule that runs two micro-batches' passes
  // in turn (train/pipeline.hpp's merged pass) ----
  /// Begins chunk v's forward of a micro-batch, as forward_chunk takes it: the embedding, or the
  /// previous virtual stage's rows.
  void begin_chunk(context& ctx, int v, std::span<std::int32_t const> tokens,
                   std::span<std::int32_t const> targets, int seq, int batch,
                   const_row_matrix_map<scalar> input) {
    begin_micro_batch(tokens, targets, seq, batch);
    start_chunk(ctx, v, input);
  }
  /// Chunk v's blocks, [first, last) of this rank's.
  [[nodiscard]] std::pair<int, int> chunk_blocks(int v) const {
    return chunk_blocks_[static_cast<std::size_t>(v)];
  }
  /// Set aside under `key` and brought back: the values the embedding, block i, or the output
  /// layer's stage (its norm, the output layer, the MTP depths) keep for their backward.
  void park_embedding(std::uint64_t key) requires parks_micro_batches { embedding_.park(key); }
  void restore_embedding(std::uint64_t key) requires parks_micro_batches {
    embedding_.restore(key);
  }
  void park_block(int i, std::uint64_t key) requires parks_micro_batches {
    decoder_.for_each_block_module(i, [&](auto& m) { m.park(key); });
  }
  void restore_block(int i, std::uint64_t key) requires parks_micro_batches {
    decoder_.for_each_block_module(i, [&](auto& m) { m.restore(key); });
  }
  void park_head(std::uint64_t key) requires parks_micro_batches {
    for_each_head_module([&](auto& m) { m.park(key); });
  }
  void restore_head(std::uint64_t key) requires parks_micro_batches {
    for_each_head_module([&](auto& m) { m.restore(key); });
  }
  /// The rows the last forward_chunk of a chunk without the output layer produced.
  [[nodiscard]] row_matrix<scalar>& chunk_output() noexcept { return residual_; }
  /// Where the gradient of a chunk's output rows is received before backward_chunk.
  row_matrix<scalar>& chunk_output_gradient(std::int64_t rows) {
    grad_.resize(rows, hidden_size());
    return grad_;
  }
  /// Backward of chunk v's last forward (or of the one restore_chunk brought back): from the
  /// cross-entropy (times `scale`) on the output layer's chunk, otherwise from
  /// chunk_output_gradient(). Leaves the gradient of the chunk's input rows in
  /// chunk_input_gradient() (the embedding's chunk: in the embedding's weights).
  void backward_chunk(context& ctx, int v, scalar scale) {
    if (chunk_has_head(v)) head_backward(ctx, scale);
    auto const [first, last] = chunk_blocks_[static_cast<std::size_t>(v)];
    backward_blocks(ctx, first, last);
    if (chunk_embeds(v)) embed_backward(ctx);
  }
  [[nodiscard]] row_matrix<scalar>& chunk_input_gradient() noexcept { return grad_; }
  /// Sets what chunk v's last training forward keeps for its backward aside under `key` (a
  /// micro-batch; core/stash.hpp), so other micro-batches may run through the chunk first;
  /// restore_chunk(v, key) brings it back before that micro-batch's backward_chunk. The
  /// micro-batch's shape is the same for every micro-batch of a schedule's run.
  void park_chunk(int v, std::uint64_t key) requires parks_micro_batches {
    for_each_saving_module(v, [&](auto& m) { m.park(key); });
  }
  void restore_chunk(int v, std::uint64_t key) requires parks_micro_batches {
    for_each_saving_module(v, [&](auto& m) { m.restore(key); });
  }
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
    return mtp_.at(static_cast<std::size_t>(k - 1)).pass.token_loss;
  }
  [[nodiscard]] std::span<std::int32_t const> mtp_targets(int k) const {
    return mtp_.at(static_cast<std::size_t>(k - 1)).pass.targets;
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
    int const cp = context_parallel(), tp = tensor_parallel(), B = batch_;
    int const L = seq_ / (cp > 1 ? 2 : 1), chunk = position / L;
    int owner = 0, row = position;
    if (cp > 1) {
      owner = chunk < cp ? chunk : 2 * cp - 1 - chunk;
      row = (chunk < cp ? 0 : L) + position % L;
    }
    auto const V = static_cast<std::size_t>(values_.model.vocabulary);
    std::vector<double> out(V);
    if (cp == 1 || groups_->cp().rank() == owner) {
      auto const& l = logits();
      std::vector<double> mine(static_cast<std::size_t>(l.cols()));
      for (Eigen::Index v = 0; v < l.cols(); ++v)
        mine[static_cast<std::size_t>(v)] = static_cast<double>(l(std::int64_t(row) * B + b, v));
      if (tp > 1) {
        std::vector<std::int64_t> parts(static_cast<std::size_t>(tp));
        for (int k = 0; k < tp; ++k) parts[static_cast<std::size_t>(k)] = vocabulary_part(k).rows;
        parallel::all_gather_v(groups_->tp(), mine.data(), out.data(),
                               std::span<std::int64_t const>(parts), 1);
      } else {
        out = mine;
      }
    }
    if (cp > 1)
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

  void zero_grad() {
    embedding_.zero_grad();
    decoder_.zero_grad();
    final_norm_.zero_grad();
    head_.zero_grad();
    for (auto& d : mtp_) d.zero_grad();
  }

  /// f(name, value, grad, kind) for every parameter this rank holds, named as the reference
  /// names them (`embedding.word_embeddings.weight`, `decoder.layers.{i}....`,
  /// `decoder.final_layernorm.weight`, `output_layer.weight`).
  template <class F>
  void for_each_parameter(F&& f) {
    auto dense = [&](std::string const& name, row_matrix_map<scalar> value,
                     row_matrix_map<scalar> grad) {
      f(std::string_view(name), value, grad, parameter_kind::dense);
    };
    // Attention's, the dense FFN's, the embedding's and the output layer's weights: TP shards
    // (QK layernorm's weights stay whole).
    auto split = [&](std::string const& name, row_matrix_map<scalar> value,
                     row_matrix_map<scalar> grad) {
      f(std::string_view(name), value, grad, kind_of(name));
    };
    // A module's linear weights held as codes (memory::quantized_weights): their quantized kind.
    auto split_of = [&]<class Module>(Module const&) {
      return
          [&](std::string const& name, row_matrix_map<scalar> value, row_matrix_map<scalar> grad) {
            parameter_kind kind = kind_of(name);
            if constexpr (Module::quantized_weights)
              if (!name.ends_with("layernorm.weight")) kind = quantized_kind_of(kind);
            f(std::string_view(name), value, grad, kind);
          };
    };
    if (holds_embedding_) embedding_.for_each_parameter("embedding.word_embeddings", split);
    for (auto& b : decoder_.blocks()) {
      std::string const prefix = layer_prefix(b.layer);
      b.input_norm.for_each_parameter(prefix + ".input_layernorm", dense);
      decoder_.with_attention(
          b, [&](auto& a) { a.for_each_parameter(prefix + ".self_attention", split_of(a)); });
      b.pre_mlp_norm.for_each_parameter(prefix + ".pre_mlp_layernorm", dense);
      decoder_.with_ffn(b, [&](auto& ffn) {
        if constexpr (is_moe_layer_v<std::remove_cvref_t<decltype(ffn)>>)
          ffn.for_each_parameter(f);
        else
          ffn.for_each_parameter(prefix + ".mlp", split_of(ffn));
      });
    }
    if (!holds_head_) return;
    final_norm_.for_each_parameter("decoder.final_layernorm", dense);
    head_.for_each_parameter("output_layer", split);
    for (std::size_t k = 0; k < mtp_.size(); ++k)
      mtp_[k].for_each_parameter("mtp.layers." + std::to_string(k), dense);
  }

  /// f(name, value, grad, kind, numbering) for every parameter this rank holds, with where its
  /// elements lie in the whole parameter (the dense ones are whole copies).
  template <class F>
  void for_each_numbered_parameter(F&& f) {
    for_each_parameter([&](std::string_view name, row_matrix_map<scalar> value,
                           row_matrix_map<scalar> grad, parameter_kind kind) {
      if (reduced_as(kind) == parameter_kind::tensor_parallel)
        f(name, value, grad, kind, numbering_of(name, grad.rows(), grad.cols()));
      else if (reduced_as(kind) == parameter_kind::dense)
        f(name, value, grad, kind, element_numbering{grad.cols()});
    });
    for_each_moe_layer([&](auto& m, int) {
      m.for_each_numbered_parameter([&](std::string_view name, row_matrix_map<scalar> value,
                                        row_matrix_map<scalar> grad, parameter_kind kind,
                                        element_numbering const& numbering) {
        if (kind != parameter_kind::dense) f(name, value, grad, kind, numbering);
      });
    });
  }
  /// f(persistent_state) for the state besides parameters: the MoE layers' (moe_layer) and, under
  /// delayed scaling, each attention's and dense FFN's amax histories and scales (named
  /// `decoder.layers.{i}.self_attention.fp8_delayed_state`, `....mlp.fp8_delayed_state`; none
  /// for a layer kept in BF16).
  template <class F>
  void for_each_persistent_state(F&& f) {
    for_each_moe_layer([&](auto& m, int) { m.for_each_persistent_state(f); });
    for (auto& b : decoder_.blocks()) {
      std::string const prefix = layer_prefix(b.layer);
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
  /// Training steps the recipe's operands have ended (all modules alike).
  [[nodiscard]] std::uint64_t operand_steps() const noexcept { return decoder_.operand_steps(); }
  void set_operand_steps(std::uint64_t steps) noexcept { decoder_.set_operand_steps(steps); }

  /// Weights from N(0, std^2) as a function of (seed, parameter name, element), norms at 1 (QK
  /// layernorm's too, which take no number), so
  /// every mapping starts from the same model. Parameter n of the model draws from seed + n, or
  /// from layer_seed + n inside layer i (layer_seed = seed + 1000003 (i + 1)); an MoE layer numbers
  /// its own from layer_seed + 500000, far from any n, so no two parameters share a seed.
  void initialize(std::uint64_t seed, double std = 0.02) {
    // n counts the tensors drawn before, in the whole model's order (embedding; per layer
    // attention's linears (linear_qkv, linear_proj, or MLA's five or four) and a dense FFN's fc1,
    // fc2; output layer), whichever stage holds them.
    auto const& mla = values_.model.mla;
    std::uint64_t const attention_tensors = !mla.enabled() ? 2 : mla.q_lora_rank > 0 ? 5 : 4;
    auto drawn_before = [&](int layer) {
      std::uint64_t n = 1;
      for (int j = 0; j < layer; ++j) n += attention_tensors + (is_moe(j) ? 0 : 2);
      return n;
    };
    std::uint64_t index = 0;
    auto fill_whole = [&](std::string const& name, row_matrix_map<scalar> value,
                          std::uint64_t from) {
      fill(value, numbering_of(name, value.rows(), value.cols()), from, ++index, std);
    };
    // The last stage's copy (MTP under PP) is drawn as stage 0's table is.
    if (holds_embedding_ || embedding_copy_)
      embedding_.for_each_parameter(
          "embedding.word_embeddings",
          [&](std::string const& name, auto value, auto) { fill_whole(name, value, seed); });
    for (auto& b : decoder_.blocks()) {
      index = drawn_before(b.layer);
      std::uint64_t const layer_seed = seed + 1000003ULL * static_cast<std::uint64_t>(b.layer + 1);
      // A module holding its weights as codes quantizes them once drawn.
      auto codes_follow = [](auto& module) {
        if constexpr (std::remove_reference_t<decltype(module)>::quantized_weights)
          module.refresh_weight_codes();
      };
      decoder_.with_attention(b, [&](auto& a) {
        a.for_each_parameter("self_attention", [&](std::string const& name, auto value, auto) {
          if (name.ends_with("layernorm.weight"))
            value.setOnes();
          else
            fill_whole(name, value, layer_seed);
        });
        codes_follow(a);
      });
      decoder_.with_ffn(b, [&](auto& ffn) {
        if constexpr (is_moe_layer_v<std::remove_cvref_t<decltype(ffn)>>) {
          ffn.initialize(layer_seed + 500000, std);
        } else {
          ffn.for_each_parameter("mlp", [&](std::string const& name, auto value, auto) {
            fill_whole(name, value, layer_seed);
          });
          codes_follow(ffn);
        }
      });
    }
    index = drawn_before(layers());
    if (holds_head_)
      head_.for_each_parameter("output_layer", [&](std::string const& name, auto value, auto) {
        fill_whole(name, value, seed);
      });
    // An MTP depth's eh_proj draws past its layer's tensors, from its layer's seed.
    for (std::size_t k = 0; k < mtp_.size(); ++k) {
      int const layer = layers() + static_cast<int>(k);
      index = drawn_before(layer + 1);
      std::uint64_t const layer_seed = seed + 1000003ULL * static_cast<std::uint64_t>(layer + 1);
      mtp_[k].for_each_parameter("mtp.layers." + std::to_string(k),
                                 [&](std::string const& name, auto value, auto) {
                                   if (name.ends_with("norm.weight"))
                                     value.setOnes();
                                   else
                                     fill_whole(name, value, layer_seed);
                                 });
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
  /// f(module, prefix) for the modules whose weights are held as codes, in for_each_parameter's
  /// order: each recipe layer's attention (prefix `decoder.layers.{i}.self_attention`), then its
  /// MoE layer or dense FFN (`decoder.layers.{i}.mlp`).
  template <class F>
  void for_each_code_module(F&& f) {
    for (auto const& b : decoder_.blocks()) {
      std::string const prefix = layer_prefix(b.layer);
      auto visit = [&](auto& m, char const* name) {
        if constexpr (std::remove_reference_t<decltype(m)>::quantized_weights) f(m, prefix + name);
      };
      decoder_.with_attention(b, [&](auto& a) { visit(a, ".self_attention"); });
      decoder_.with_ffn(b, [&](auto& ffn) { visit(ffn, ".mlp"); });
    }
  }

  // ---- the passes forward(), backward() and the chunks are made of ----
 public:
  /// Forward of this rank's block i in the micro-batch begun: each FFN's output joins the
  /// residual stream in the next norm's pass (add_forward), so the last one's is left pending.
  void forward_block(context& ctx, int i, transformer_output& out) {
    int const seq = seq_, batch = batch_, N = seq * batch;
    auto& times = ctx.step_stages;
    using stage = step_stage;
    auto& b = decoder_[i];
    norm_of_residual(ctx, b.input_norm);
    times.time(stage::attention, [&] {
      auto f = ctx.scratch<scalar>().open();
      decoder_.with_attention(b, [&](auto& a) {
        a.for_each_linears([&](std::string_view, auto& l) { l.bind(ctx, f); });
        a.forward(ctx.executor<scalar>(), sp_.all_rows(const_view(normed_)), seq, batch,
                  sp_.whole_output(view(branch_), N));
      });
      sp_.sum_to_my_rows(view(branch_));
    });
    times.time(stage::norms_residuals, [&] {
      b.pre_mlp_norm.add_forward(ctx.pool(), view(residual_), const_view(branch_), view(normed_));
    });
    decoder_.with_ffn(b, [&](auto& ffn) {
      if constexpr (is_moe_layer_v<std::remove_cvref_t<decltype(ffn)>>) {
        auto const result = ffn.forward(ctx, normed_, seq / tensor_parallel(), batch);
        pending_ = result.y.data();
        for (auto const& l :
             {result.losses.aux_loss, result.losses.seq_aux_loss, result.losses.global_aux_loss})
          if (l) out.aux_loss += static_cast<double>(l->value);
        if (result.losses.z_loss) out.z_loss += static_cast<double>(result.losses.z_loss->value);
        out.router_losses = out.aux_loss + out.z_loss;
      } else {
        times.time(stage::dense_ffn, [&] {
          auto f = ctx.scratch<scalar>().open();
          ffn.bind_operands(ctx, f);
          ffn.forward(ctx.executor<scalar>(), sp_.all_rows(const_view(normed_)),
                      sp_.whole_output(view(branch_), N));
          sp_.sum_to_my_rows(view(branch_));
        });
        pending_ = branch_.data();
      }
    });
  }
  /// Backward of block i from the residual stream's gradient (chunk_output_gradient()); the
  /// norms' input gradients add into it.
  void backward_block(context& ctx, int i) {
    auto& pool = ctx.pool();
    int const N = seq_ * batch_;
    grad_normed_.resize(grad_.rows(), grad_.cols());
    auto& times = ctx.step_stages;
    using stage = step_stage;
    auto& b = decoder_[i];
    decoder_.with_ffn(b, [&](auto& ffn) {
      if constexpr (is_moe_layer_v<std::remove_cvref_t<decltype(ffn)>>) {
        auto const dx = ffn.backward(ctx, grad_);
        times.time(stage::norms_residuals,
                   [&] { b.pre_mlp_norm.backward(pool, dx, view(grad_), true); });
      } else {
        times.time(stage::dense_ffn, [&] {
          auto f = ctx.scratch<scalar>().open();
          ffn.bind_operands(ctx, f);
          ffn.backward(ctx.executor<scalar>(), sp_.all_gradient_rows(const_view(grad_)),
                       sp_.whole_output(view(grad_normed_), N));
          sp_.sum_to_my_rows(view(grad_normed_));
        });
        times.time(stage::norms_residuals, [&] {
          b.pre_mlp_norm.backward(pool, const_view(grad_normed_), view(grad_), true);
        });
      }
    });
    times.time(stage::attention, [&] {
      auto f = ctx.scratch<scalar>().open();
      decoder_.with_attention(b, [&](auto& a) {
        a.for_each_linears([&](std::string_view, auto& l) { l.bind(ctx, f); });
        a.backward(ctx.executor<scalar>(), sp_.all_gradient_rows(const_view(grad_)),
                   sp_.whole_output(view(grad_normed_), N));
      });
      sp_.sum_to_my_rows(view(grad_normed_));
    });
    times.time(stage::norms_residuals,
               [&] { b.input_norm.backward(pool, const_view(grad_normed_), view(grad_), true); });
  }
  /// Ends chunk v's forward: the output layer, or the last FFN's output joins the stream before
  /// it leaves.
  void end_chunk(context& ctx, int v, transformer_output& out) {
    if (chunk_has_head(v)) {
      finish_with_head(ctx, out);
    } else if (pending_ != nullptr) {
      residual_ += const_row_matrix_map<scalar>(pending_, residual_.rows(), residual_.cols());
      pending_ = nullptr;
    }
  }
  /// The output layer's stage's backward (its MTP depths', the output layer's and the final
  /// norm's) into the residual stream's gradient, from the cross-entropy times `scale`.
  void head_backward(context& ctx, scalar scale) {
    int const N = seq_ * batch_, rows = N / tensor_parallel(), H = hidden_size();
    grad_.resize(rows, H);
    grad_normed_.resize(rows, H);
    if constexpr (mtp_depths > 0) mtp_backward(ctx, scale);
    ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
      head_.backward(ctx.executor<scalar>(), scale, sp_.whole_output(view(grad_normed_), N));
      sp_.sum_to_my_rows(view(grad_normed_));
      if constexpr (mtp_depths > 0) grad_normed_ += mtp_carry_;
    });
    ctx.step_stages.time(step_stage::norms_residuals, [&] {
      final_norm_.backward(ctx.pool(), const_view(grad_normed_), view(grad_));
    });
  }
  /// The embedding's backward from the residual stream's gradient, into its weights.
  void embed_backward(context& ctx) {
    ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
      embedding_.backward(ctx.pool(), sp_.all_gradient_rows(const_view(grad_)));
    });
  }

 private:
  /// f(module) for every module of chunk v that keeps values from forward to backward.
  template <class F>
  void for_each_saving_module(int v, F&& f) {
    if (chunk_embeds(v)) f(embedding_);
    auto const [first, last] = chunk_blocks_[static_cast<std::size_t>(v)];
    for (int i = first; i < last; ++i) decoder_.for_each_block_module(i, f);
    if (chunk_has_head(v)) for_each_head_module(f);
  }
  /// f(module) for the output layer's stage's modules that keep values: the final norm, the
  /// output layer and each MTP depth's own (its norms, eh_proj's inputs, its pass of the output
  /// layer) and its layer's.
  template <class F>
  void for_each_head_module(F&& f) {
    f(final_norm_);
    f(head_);
    for (auto& d : mtp_) {
      f(d);
      decoder_.for_each_block_module(d.block, f);
    }
  }
  /// A chunk's first step: the embedding, or the previous virtual stage's rows.
  void start_chunk(context& ctx, int v, const_row_matrix_map<scalar> input) {
    if (chunk_embeds(v)) {
      embed(ctx);
      return;
    }
    if (input.rows() != residual_.rows() || input.cols() != residual_.cols())
      throw input_error("transformer: chunk input of " + std::to_string(input.rows()) + " x " +
                        std::to_string(input.cols()) + " rows, expected " +
                        std::to_string(residual_.rows()) + " x " +
                        std::to_string(residual_.cols()));
    residual_ = input;
  }
  /// Checks the micro-batch, keeps this rank's CP chunks of it and sizes the residual stream.
  void begin_micro_batch(std::span<std::int32_t const> tokens,
                         std::span<std::int32_t const> targets, int seq, int batch) {
    if (seq < 1 || batch < 1 || std::ssize(tokens) != std::int64_t{seq} * batch ||
        (!targets.empty() && targets.size() != tokens.size()))
      throw input_error("transformer: " + std::to_string(tokens.size()) + " tokens and " +
                        std::to_string(targets.size()) + " targets for S = " + std::to_string(seq) +
                        ", B = " + std::to_string(batch));
    check_sequence(seq);
    int const cp = context_parallel(), cp_rank = cp > 1 ? groups_->cp().rank() : 0;
    if constexpr (mtp_depths > 0)
      if (holds_head_ && !targets.empty())
        mtp_inputs_.shift(tokens, targets, seq, batch, cp, cp_rank);
    if (cp > 1) {
      keep_context_chunks(tokens, seq, batch, cp, cp_rank, local_tokens_);
      tokens = local_tokens_;
      if (!targets.empty()) {
        keep_context_chunks(targets, seq, batch, cp, cp_rank, local_targets_);
        targets = local_targets_;
      }
      seq /= cp;
    }
    tokens_ = tokens;
    targets_ = targets;
    // This rank's rows: its CP chunks' N = S/CP * B tokens, of which it keeps N / TP in the
    // residual stream (sequence parallelism); attention, the dense FFN and the output layer see
    // all N, gathered over TP.
    int const rows = seq * batch / tensor_parallel(), H = hidden_size();
    seq_ = seq;
    batch_ = batch;
    residual_.resize(rows, H);
    normed_.resize(rows, H);
    branch_.resize(rows, H);
    sp_.set_rows(rows);
    pending_ = nullptr;
  }

  void embed(context& ctx) {
    int const N = seq_ * batch_;
    ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
      embedding_.forward(ctx.pool(), tokens_, sp_.whole_output(view(residual_), N));
      sp_.sum_to_my_rows(view(residual_));
    });
  }

  /// The norm of the residual stream, to which the last FFN's output (pending_) is added first.
  void norm_of_residual(context& ctx, rms_norm<scalar>& norm) {
    ctx.step_stages.time(step_stage::norms_residuals, [&] {
      if (pending_ == nullptr)
        norm.forward(ctx.pool(), const_view(residual_), view(normed_));
      else
        norm.add_forward(ctx.pool(), view(residual_),
                         const_row_matrix_map<scalar>(pending_, residual_.rows(), residual_.cols()),
                         view(normed_));
      pending_ = nullptr;
    });
  }

  /// Forward of blocks [first, last).
  void run_blocks(context& ctx, int first, int last, transformer_output& out) {
    for (int i = first; i < last; ++i) forward_block(ctx, i, out);
  }

  void finish_with_head(context& ctx, transformer_output& out) {
    norm_of_residual(ctx, final_norm_);
    ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
      auto const hidden = sp_.all_rows(const_view(normed_));
      final_hidden_ = hidden.data();  // for logits()
      if (!targets_.empty())
        out.cross_entropy = head_.forward(ctx.executor<scalar>(), hidden, targets_);
      if constexpr (mtp_depths > 0) {  // the depths write over the gathered rows and normed_
        final_rows_ = hidden;
        final_hidden_ = final_rows_.data();
      }
    });
    if constexpr (mtp_depths > 0)
      if (!targets_.empty()) mtp_forward(ctx, out);
  }

  /// The MTP depths' forward from the decoder's normed output (normed_, this rank's rows): each
  /// depth's loss is its valid targets' summed cross-entropy over the whole micro-batch's valid
  /// shifted targets per CP rank (B (S - k) / CP without ignored targets), so the mean over CP
  /// ranks is one rank's.
  void mtp_forward(context& ctx, transformer_output& out) {
    auto& pool = ctx.pool();
    int const N = seq_ * batch_, H = hidden_size(), rows = N / tensor_parallel();
    int const cp = context_parallel();
    for (int k = 1; k <= mtp_depths; ++k) {
      auto& d = mtp_[static_cast<std::size_t>(k - 1)];
      d.ids = mtp_inputs_.ids(k);
      ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
        mtp_embedding_.resize(rows, H);
        embedding_.lookup(pool, d.ids, sp_.whole_output(view(mtp_embedding_), N));
        sp_.sum_to_my_rows(view(mtp_embedding_));
      });
      ctx.step_stages.time(step_stage::norms_residuals, [&] {
        d.normed_embedding.resize(rows, H);
        d.normed_hidden.resize(rows, H);
        d.enorm.forward(pool, const_view(mtp_embedding_), view(d.normed_embedding));
        d.hnorm.forward(pool, const_view(normed_), view(d.normed_hidden));
        // eh_proj: the embedding's half of its columns, then the hidden state's, added.
        auto& exec = ctx.executor<scalar>();
        residual_.resize(rows, H);
        threaded_product<expert::gemm_op::nt>(exec, rows, H, H, d.normed_embedding.data(), H,
                                              d.eh_weight.data(), 2 * H, residual_.data(), H);
        threaded_product<expert::gemm_op::nt>(exec, rows, H, H, d.normed_hidden.data(), H,
                                              d.eh_weight.data() + H, 2 * H, residual_.data(), H,
                                              true);
      });
      pending_ = nullptr;
      forward_block(ctx, d.block, out);
      norm_of_residual(ctx, d.final_norm);
      ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
        double const divisor = std::max(1.0, mtp_inputs_.valid(k)) / cp;
        out.mtp_loss += head_.forward(ctx.executor<scalar>(), d.pass,
                                      sp_.all_rows(const_view(normed_)), mtp_inputs_.targets(k),
                                      divisor) /
                        mtp_depths;
      });
    }
  }

  /// The MTP depths' backward, the last depth first, each from its loss times `scale` x
  /// mtp_loss_scaling_factor / D: leaves the gradient of the decoder's normed output in
  /// mtp_carry_ and adds into the embedding's and every MTP weight's gradient.
  void mtp_backward(context& ctx, scalar scale) {
    auto& pool = ctx.pool();
    int const N = seq_ * batch_, H = hidden_size(), rows = N / tensor_parallel();
    auto const weight = static_cast<scalar>(static_cast<double>(scale) *
                                            values_.model.mtp_loss_scaling_factor / mtp_depths);
    mtp_carry_.resize(rows, H);
    mtp_grad_embedding_.resize(rows, H);
    mtp_grad_hidden_.resize(rows, H);
    for (int k = mtp_depths; k >= 1; --k) {
      auto& d = mtp_[static_cast<std::size_t>(k - 1)];
      ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
        head_.backward(ctx.executor<scalar>(), d.pass, weight,
                       sp_.whole_output(view(grad_normed_), N));
        sp_.sum_to_my_rows(view(grad_normed_));
      });
      ctx.step_stages.time(step_stage::norms_residuals, [&] {
        if (k < mtp_depths) grad_normed_ += mtp_carry_;  // from depth k + 1's hnorm
        d.final_norm.backward(pool, const_view(grad_normed_), view(grad_));
      });
      backward_block(ctx, d.block);  // grad_: the gradient of eh_proj's output
      ctx.step_stages.time(step_stage::norms_residuals, [&] {
        auto& exec = ctx.executor<scalar>();
        using expert::gemm_op;
        scalar* const w = d.eh_weight.data();
        scalar* const g = d.eh_grad.data();
        threaded_product<gemm_op::nn>(exec, rows, H, H, grad_.data(), H, w, 2 * H,
                                      mtp_grad_embedding_.data(), H);
        threaded_product<gemm_op::nn>(exec, rows, H, H, grad_.data(), H, w + H, 2 * H,
                                      mtp_grad_hidden_.data(), H);
        threaded_product<gemm_op::tn>(exec, H, H, rows, grad_.data(), H, d.normed_embedding.data(),
                                      H, g, 2 * H, true);
        threaded_product<gemm_op::tn>(exec, H, H, rows, grad_.data(), H, d.normed_hidden.data(), H,
                                      g + H, 2 * H, true);
        d.enorm.backward(pool, const_view(mtp_grad_embedding_), view(mtp_grad_embedding_));
        d.hnorm.backward(pool, const_view(mtp_grad_hidden_), view(mtp_carry_));
      });
      ctx.step_stages.time(step_stage::embedding_output_loss, [&] {
        embedding_.add_gradient(pool, d.ids, sp_.all_gradient_rows(const_view(mtp_grad_embedding_)));
      });
    }
  }

  /// Backward of blocks [first, last) from grad_, last first.
  void backward_blocks(context& ctx, int first, int last) {
    for (int i = last - 1; i >= first; --i) backward_block(ctx, i);
  }

  /// This rank's decoder layers (the decoder's blocks hold the MTP depths' after them).
  [[nodiscard]] int decoder_blocks() const noexcept {
    return decoder_.size() - static_cast<int>(mtp_.size());
  }
  /// The reference's name of layer i: `decoder.layers.{i}`, or an MTP depth's
  /// `mtp.layers.{k}.transformer_layer` past num_layers.
  [[nodiscard]] std::string layer_prefix(int layer) const {
    int const L = layers();
    return layer < L ? "decoder.layers." + std::to_string(layer)
                     : "mtp.layers." + std::to_string(layer - L) + ".transformer_layer";
  }
  /// Of all the model's MoE layers, how many come before layer i.
  [[nodiscard]] int moe_ordinal(int layer) const {
    int n = 0;
    for (int j = 0; j < layer; ++j) n += is_moe(j) ? 1 : 0;
    return n;
  }

  /// N(0, std^2) by (seed + index, element of the whole tensor): every TP layout draws the same.
  static void fill(row_matrix_map<scalar> value, element_numbering const& numbering,
                   std::uint64_t seed, std::uint64_t index, double std) {
    for (Eigen::Index r = 0; r < value.rows(); ++r)
      for (Eigen::Index c = 0; c < value.cols(); ++c)
        value(r, c) =
            static_cast<scalar>(std * standard_normal(seed + index, numbering.global(r, c)));
  }

  /// Which of the names for_each_parameter gives are TP shards (with TP above 1).
  /// The norms, MLA's down projections and MTP's eh_proj are whole on every TP rank.
  [[nodiscard]] parameter_kind kind_of(std::string_view name) const noexcept {
    bool const replicated =
        name.ends_with("layernorm.weight") || name.ends_with(".linear_q_down_proj.weight") ||
        name.ends_with(".linear_kv_down_proj.weight") || name.ends_with(".eh_proj.weight");
    return tensor_parallel() > 1 && !replicated ? parameter_kind::tensor_parallel
                                                : parameter_kind::dense;
  }
  /// Where a parameter of the transformer's own modules (not the MoE layers') lies in the whole
  /// one: linear_qkv (MLA's up projections and linear_q_proj) and the dense FFN's fc1 by rows
  /// (fc1's gate and linear halves each),
  /// linear_proj and fc2 by columns, the embedding and output layer by vocabulary rows; the rest
  /// whole.
  [[nodiscard]] element_numbering numbering_of(std::string_view name, std::int64_t rows,
                                               std::int64_t cols) const {
    int const tp = tensor_parallel(), part = tp > 1 ? groups_->tp().rank() : 0;
    element_numbering n{cols};
    if (kind_of(name) != parameter_kind::tensor_parallel) return n;
    if (name.ends_with("linear_qkv.weight") || name.ends_with(".linear_q_up_proj.weight") ||
        name.ends_with(".linear_kv_up_proj.weight") || name.ends_with(".linear_q_proj.weight")) {
      n.first_row = part * rows;
      n.global_rows = rows * tp;
    } else if (name.ends_with("linear_proj.weight") || name.ends_with("mlp.linear_fc2.weight")) {
      n.global_cols = cols * tp;
      n.col_offset = part * cols;
    } else if (name.ends_with("mlp.linear_fc1.weight")) {  // SwiGLU: gate rows, then linear rows
      std::int64_t const half = rows / 2, ffn = half * tp;
      n.half_rows = half;
      n.first_row = part * half;
      n.second_row = ffn + part * half;
      n.global_rows = 2 * ffn;
    } else {  // embedding, output layer
      n.first_row = vocabulary_part(part).first;
      n.global_rows = values_.model.vocabulary;
    }
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
    bf16_at_start_ = given_.bf16_layers_at_start.value_or(0);
    bf16_at_end_ = given_.bf16_layers_at_end.value_or(0);
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
      if (i >= m.layers) mtp_.emplace_back(H, m.norm_epsilon, decoder_.size());
      decoder_.add(i, is_bf16_layer(i), is_moe(i), values_, groups, layer_given);
    }
    if (groups != nullptr) sp_.attach(&groups->tp());
  }

  startup_values given_;
  config_values values_;
  token_embedding<scalar> embedding_{1, 1};
  decoder_layers<Config> decoder_;
  int bf16_at_start_ = 0, bf16_at_end_ = 0;  // layers kept in BF16 (keeps_bf16_layers)
  rms_norm<scalar> final_norm_{1};
  lm_head<scalar> head_{1, 1};
  parallel::process_groups const* groups_ = nullptr;        // kept by reference; null on one rank
  int seq_ = 0, batch_ = 0;                                 // this rank's positions, sequences
  std::vector<std::int32_t> local_tokens_, local_targets_;  // this rank's chunks under CP
  // Under TP, the residual stream's rows gathered and reduced (none where the type fixes TP 1).
  sequence_parallel<scalar, Config::parallel::value.tp != 1> sp_;
  scalar const* final_hidden_ = nullptr;  // the last forward's final hidden states, all N rows
  row_matrix<scalar> final_rows_;         // a copy of them with MTP (its depths reuse the buffers)
  // Multi-token prediction: the depths, each depth's shifted ids and targets of this micro-batch
  // (this rank's CP chunks), and working rows.
  std::vector<mtp_depth<scalar>> mtp_;
  mtp_inputs<mtp_depths> mtp_inputs_;
  row_matrix<scalar> mtp_embedding_, mtp_grad_embedding_, mtp_grad_hidden_, mtp_carry_;
  // The pipeline: the layout, this rank's place, its chunks' blocks [first, last), and which ends
  // of the model it holds.
  parallel::pipeline_layout pipeline_;
  int pp_rank_ = 0;
  std::vector<std::pair<int, int>> chunk_blocks_;
  bool holds_embedding_ = true, holds_head_ = true;
  bool embedding_copy_ = false;  // the last stage's copy of the table (MTP under PP)
  // The micro-batch being run (this rank's CP chunks) and the last FFN output not yet added.
  std::span<std::int32_t const> tokens_, targets_;
  scalar const* pending_ = nullptr;
  row_matrix<scalar> residual_, normed_, branch_, grad_, grad_normed_;
};

}  // namespace megamoe
