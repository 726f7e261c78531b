// SPDX-License-Identifier: Apache-2.0
// megamoe/train/pipeline_runner.hpp — runs a pipeline schedule (parallel/pipeline_schedule.hpp) on a transformer:
// the passes of one rank in the schedule's order, activations forward and gradients backward
// between virtual stages by point-to-point messages on the PP communicator.
//
// A received activation lands in its own buffer, which stays until that micro-batch's backward
// of the chunk; a received gradient becomes the chunk's output gradient; a sent message is copied
// once into a send buffer, free again when its send has completed. A chunk's modules set each
// micro-batch's saved values aside after its forward and bring them back for its backward
// (core/stash.hpp), so no forward runs twice. A model that cannot (a precision recipe's operands
// keep one micro-batch's codes) keeps one micro-batch per chunk: a backward whose micro-batch was
// not the chunk's last forward repeats that forward first from the kept input
// (router::pass::recompute: same values, statistics not counted twice).
//
// Each pass's receive and the next pass's are posted before the pass computes; sends do not
// block, and are completed before the step ends. Open MPI moves a large message only while both
// ends are inside MPI, so while messages are in flight the pool's waiting thread tests them during
// the rank's compute (parallel::exchange_progress). The time a rank spends waiting for its
// receives, for its sends to complete and, after its last pass, for the other stages to end
// theirs is its pipeline wait.
//
// With multi-token prediction the last stage embeds ids too, through its copy of stage 0's
// embedding table (model/transformer.hpp): a training run starts by sending stage 0's table to
// the last stage (share_embedding) and ends by adding the copy's gradient into stage 0's, before
// the data-parallel reduction; no pipeline message is in flight at either point.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/parallel/pipeline_schedule.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/parallel/progress.hpp>
#include <megamoe/parallel/traffic.hpp>
#include <megamoe/parallel/watchdog.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/request.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace megamoe::train {

template <class Model>
class pipeline_runner {
 public:
  using scalar = typename Model::scalar;

  /// What the runner hands back after each training forward of a chunk (its router losses and,
  /// on the output layer's chunk, the cross-entropy).
  struct chunk_result {
    int micro_batch = 0, chunk = 0;
    transformer_output output;
  };

  /// `groups` may be null when the model has one stage (no messages).
  pipeline_runner(parallel::process_groups const* groups, Model& model)
      : pp_(groups ? &groups->pp() : nullptr), model_(model) {}

  /// Keeps every event of the next steps (pipeline_event) in trace().
  void record_trace(bool on) { tracing_ = on; }
  [[nodiscard]] std::vector<parallel::pipeline_event> const& trace() const noexcept {
    return trace_;
  }
  /// Seconds blocked on the pipeline's messages in the last run.
  [[nodiscard]] double wait_seconds() const noexcept { return wait_; }

  /// The passes of every step from now on, in order (a schedule's ops for this rank).
  void set_schedule(std::vector<parallel::pipeline_op> ops) {
    ops_ = std::move(ops);
    if constexpr (Model::parks_micro_batches)
      repeats_.assign(ops_.size(), 0);
    else
      parallel::repeated_forwards(ops_, model_.pipeline().vpp(), repeats_);
  }
  [[nodiscard]] std::vector<parallel::pipeline_op> const& schedule() const noexcept { return ops_; }
  /// Per op of schedule(): 1 where that backward repeats its forward first.
  [[nodiscard]] std::span<char const> repeated_forwards() const noexcept { return repeats_; }

  /// One step's passes in the schedule's order. batch(m) gives micro-batch m's tokens and targets
  /// (every rank of every stage is given them), key(m) its router key; `scale` multiplies the
  /// cross-entropy's gradient; on_forward(chunk_result) sees each training forward.
  template <class Batch, class Key, class OnForward>
  void run(context& ctx, int micro_batches, int seq, int batch_size, scalar scale, Batch&& batch,
           Key&& key, OnForward&& on_forward) {
    start_run(ctx.pool(), micro_batches, seq, batch_size);
    share_embedding();
    auto const& ops = ops_;
    // The watchdog names the pass a hang happens in.
    auto& watch = parallel::watchdog::instance();
    for (std::size_t i = 0; i < ops.size(); ++i) {
      auto const& op = ops[i];
      // This pass's message and the next one's are posted now: the next arrives while this one
      // computes.
      post_receive(op);
      if (i + 1 < ops.size()) post_receive(ops[i + 1]);
      auto const [tokens, targets] = batch(op.micro_batch);
      ctx.step.micro_batch_key = key(op.micro_batch);
      watch.set_pass(op.micro_batch, model_.pipeline().stage(model_.pipeline_rank(), op.chunk));
      if constexpr (Model::parks_micro_batches)
        if (op.merged) {
          if (i + 2 < ops.size()) post_receive(ops[i + 2]);
          auto const& back = ops[++i];  // the backward merged with this forward
          merged(ctx, op, back, tokens, targets, seq, batch_size, key(back.micro_batch), scale,
                 on_forward);
          continue;
        }
      if (op.kind == parallel::pipeline_op::forward) {
        ctx.step.mode = router::pass::training;
        chunk_result r{op.micro_batch, op.chunk,
                       forward(ctx, op.micro_batch, op.chunk, tokens, targets, seq, batch_size)};
        on_forward(std::as_const(r));
        if constexpr (Model::parks_micro_batches)
          park(ctx.step.micro_batch_key, chunk_modules(op.chunk));
        continue;
      }
      int const m = op.micro_batch, v = op.chunk;
      receive(op);
      if (repeats_[i] != 0) {
        ctx.step.mode = router::pass::recompute;
        forward_chunk(ctx, v, tokens, targets, seq, batch_size, input_of(m, v));
      }
      ctx.step.mode = router::pass::training;
      if constexpr (Model::parks_micro_batches) restore(ctx.step.micro_batch_key, chunk_modules(v));
      note(parallel::pipeline_event::backward, m, v);
      backward_chunk(ctx, v, scale);
      send_input_gradient(m, v);
    }
    watch.set_pass(-1, -1);
    finish_sends();
    wait_for_stages();
    return_embedding_gradient();
  }

  /// The last stage's copy of the embedding's table made equal to stage 0's (MTP under PP;
  /// otherwise nothing): run() does it first, a forward-only run after the weights changed
  /// needs it first. Collective over the first and last stages of each pipeline.
  void share_embedding() {
    if constexpr (Model::mtp_depths > 0) {
      if (!copies_embedding()) return;
      auto table = model_.embedding_table();
      parallel::watched_collective const watch(MPI_Comm(*pp_), "pp_share_embedding", table.size());
      if (pp_->rank() == 0) {
        pp_->send(pp_->size() - 1, embedding_tag, table.data(), static_cast<int>(table.size()));
        parallel::traffic::instance().add(MPI_Comm(*pp_),
                                          static_cast<std::int64_t>(table.size() * sizeof(scalar)));
      } else {
        pp_->recv(0, embedding_tag, table.data(), static_cast<int>(table.size()));
      }
    }
  }

  /// Forward of one micro-batch through every chunk of this rank, in eval mode (held-out loss):
  /// the output layer's chunk returns the cross-entropy.
  void run_forward_only(context& ctx, std::span<std::int32_t const> tokens,
                        std::span<std::int32_t const> targets, int seq, int batch_size) {
    start_run(ctx.pool(), 1, seq, batch_size);
    for (int v = 0; v < model_.pipeline().vpp(); ++v)
      forward(ctx, 0, v, tokens, targets, seq, batch_size);
    for (int v = 0; v < model_.pipeline().vpp(); ++v) release_input(0, v);
    finish_sends();
  }

 private:
  /// Whether this rank is an end of a pipeline whose last stage copies the embedding's table.
  [[nodiscard]] bool copies_embedding() const {
    if (pp_ == nullptr || pp_->size() == 1) return false;
    return pp_->rank() == 0 || pp_->rank() == pp_->size() - 1;
  }
  /// After a training run: the last stage's copy's gradient added into stage 0's table's, and
  /// the copy's zeroed for the next run.
  void return_embedding_gradient() {
    if constexpr (Model::mtp_depths > 0) {
      if (!copies_embedding()) return;
      auto grad = model_.embedding_table_gradient();
      parallel::watched_collective const watch(MPI_Comm(*pp_), "pp_embedding_gradient",
                                               grad.size());
      if (pp_->rank() == 0) {
        received_gradient_.resize(grad.rows(), grad.cols());
        pp_->recv(pp_->size() - 1, embedding_tag + 1, received_gradient_.data(),
                  static_cast<int>(received_gradient_.size()));
        grad += received_gradient_;
      } else {
        pp_->send(0, embedding_tag + 1, grad.data(), static_cast<int>(grad.size()));
        parallel::traffic::instance().add(MPI_Comm(*pp_),
                                          static_cast<std::int64_t>(grad.size() * sizeof(scalar)));
        grad.setZero();
      }
    }
  }

  void start_run(thread_pool& pool, int micro_batches, int seq, int batch_size) {
    pool_ = &pool;
    int const V = model_.pipeline().vpp();
    rows_ = model_.boundary_rows(seq, batch_size);
    inputs_.resize(static_cast<std::size_t>(micro_batches) * V);
    wait_ = 0.0;
    if (tracing_) trace_.clear();
  }

  transformer_output forward(context& ctx, int m, int v, std::span<std::int32_t const> tokens,
                             std::span<std::int32_t const> targets, int seq, int batch_size) {
    receive({parallel::pipeline_op::forward, m, v});
    note(parallel::pipeline_event::forward, m, v);
    auto out = forward_chunk(ctx, v, tokens, targets, seq, batch_size, input_of(m, v));
    send_output(m, v);
    return out;
  }

  /// A merged pass (parallel::merged_one_f_one_b): the forward `op` and the backward `back` layer
  /// by layer in turn, after both their messages have arrived.
  template <class OnForward>
  void merged(context& ctx, parallel::pipeline_op const& op, parallel::pipeline_op const& back,
              std::span<std::int32_t const> tokens, std::span<std::int32_t const> targets, int seq,
              int batch_size, std::uint64_t backward_key, scalar scale, OnForward&& on_forward) {
    int const m = op.micro_batch, v = op.chunk;
    note(parallel::pipeline_event::merged, m, v);
    receive(op);
    receive(back);
    note(parallel::pipeline_event::forward, m, v);
    note(parallel::pipeline_event::backward, back.micro_batch, back.chunk);
    ctx.step.mode = router::pass::training;
    chunk_result r{m, v,
                   merged_pass(ctx, v, tokens, targets, seq, batch_size, input_of(m, v), back.chunk,
                               backward_key, scale)};
    send_output(m, v);
    on_forward(std::as_const(r));
    send_input_gradient(back.micro_batch, back.chunk);
  }
  /// The forward of chunk `v` of one micro-batch (ctx.step.micro_batch_key's) and the backward of
  /// chunk `backward_v` of another (key `backward_key`), block by block in turn: each block's
  /// forward values are set aside right after its forward, the other micro-batch's brought back
  /// right before its backward. The model keeps the two in separate buffers (the residual stream,
  /// its gradient), so each gives what forward_chunk and backward_chunk give; the forward's
  /// values stay set aside, the backward leaves the model's chunk_input_gradient().
  transformer_output merged_pass(context& ctx, int v, std::span<std::int32_t const> tokens,
                                 std::span<std::int32_t const> targets, int seq, int batch_size,
                                 const_row_matrix_map<scalar> input, int backward_v,
                                 std::uint64_t backward_key, scalar scale) {
    std::uint64_t const forward_key = ctx.step.micro_batch_key;
    auto as = [&](std::uint64_t key) { ctx.step.micro_batch_key = key; };
    transformer_output out;
    model_.begin_chunk(ctx, v, tokens, targets, seq, batch_size, input);
    if (model_.chunk_embeds(v)) park(forward_key, embedding_modules());
    as(backward_key);
    if (model_.chunk_has_head(backward_v)) {
      restore(backward_key, head_modules());
      model_.head_backward(ctx, scale);
    }
    auto const [first, last] = model_.chunk_blocks(v);
    auto const [back_first, back_last] = model_.chunk_blocks(backward_v);
    for (int k = 0; k < std::max(last - first, back_last - back_first); ++k) {
      if (first + k < last) {
        as(forward_key);
        model_.forward_block(ctx, first + k, out);
        park(forward_key, block_modules(first + k));
      }
      if (back_last - 1 - k >= back_first) {
        as(backward_key);
        restore(backward_key, block_modules(back_last - 1 - k));
        model_.backward_block(ctx, back_last - 1 - k);
      }
    }
    as(forward_key);
    model_.end_chunk(ctx, v, out);
    if (model_.chunk_has_head(v)) park(forward_key, head_modules());
    if (model_.chunk_embeds(backward_v)) {
      restore(backward_key, embedding_modules());
      model_.embed_backward(ctx);
    }
    return out;
  }
  /// Forward of chunk v of a micro-batch (`input`: the previous virtual stage's rows): its router
  /// losses and, on the output layer's chunk, the cross-entropy; any other chunk leaves its rows in
  /// chunk_output(). `ctx.step.mode` may be recompute: the same forward again (the MoE layers do
  /// not count it twice), for a model that does not park micro-batches.
  transformer_output forward_chunk(context& ctx, int v, std::span<std::int32_t const> tokens,
                                   std::span<std::int32_t const> targets, int seq, int batch_size,
                                   const_row_matrix_map<scalar> input) {
    transformer_output out;
    model_.begin_chunk(ctx, v, tokens, targets, seq, batch_size, input);
    auto const [first, last] = model_.chunk_blocks(v);
    for (int i = first; i < last; ++i) model_.forward_block(ctx, i, out);
    model_.end_chunk(ctx, v, out);
    return out;
  }
  /// Backward of chunk v's last forward (or of the one restored): from the cross-entropy (times
  /// `scale`) on the output layer's chunk, otherwise from chunk_output_gradient(); leaves the
  /// gradient of the chunk's input rows in chunk_input_gradient() (the embedding's chunk: in the
  /// embedding's weights).
  void backward_chunk(context& ctx, int v, scalar scale) {
    if (model_.chunk_has_head(v)) model_.head_backward(ctx, scale);
    auto const [first, last] = model_.chunk_blocks(v);
    for (int i = last - 1; i >= first; --i) model_.backward_block(ctx, i);
    if (model_.chunk_embeds(v)) model_.embed_backward(ctx);
  }

  // What a chunk's modules keep from forward to backward is set aside per micro-batch
  // (core/stash.hpp) and brought back before that micro-batch's backward; park and restore take
  // a visitor of the modules: the embedding's, block i's, the output layer's stage's, or all of
  // chunk v's.
  template <class Visit>
  static void park(std::uint64_t key, Visit&& visit) {
    visit([&](auto& m) { m.park(key); });
  }
  template <class Visit>
  static void restore(std::uint64_t key, Visit&& visit) {
    visit([&](auto& m) { m.restore(key); });
  }
  auto embedding_modules() {
    return [this](auto&& f) { model_.for_each_embedding_module(f); };
  }
  auto block_modules(int i) {
    return [this, i](auto&& f) { model_.for_each_block_module(i, f); };
  }
  auto head_modules() {
    return [this](auto&& f) { model_.for_each_head_module(f); };
  }
  auto chunk_modules(int v) {
    return [this, v](auto&& f) {
      if (model_.chunk_embeds(v)) model_.for_each_embedding_module(f);
      auto const [first, last] = model_.chunk_blocks(v);
      for (int i = first; i < last; ++i) model_.for_each_block_module(i, f);
      if (model_.chunk_has_head(v)) model_.for_each_head_module(f);
    };
  }

  /// After chunk v's forward of micro-batch m: its output rows to the next virtual stage.
  void send_output(int m, int v) {
    if (!model_.chunk_has_head(v))
      send(model_.chunk_output(), parallel::pipeline_event::send_activation, m, v, next_rank());
  }
  /// After chunk v's backward of micro-batch m: its input rows' gradient to the previous virtual
  /// stage, and the micro-batch's input buffer free.
  void send_input_gradient(int m, int v) {
    if (!model_.chunk_embeds(v))
      send(model_.chunk_input_gradient(), parallel::pipeline_event::send_gradient, m, v,
           previous_rank());
    release_input(m, v);
  }

  [[nodiscard]] std::size_t slot(int m, int v) const {
    return static_cast<std::size_t>(m) * static_cast<std::size_t>(model_.pipeline().vpp()) +
           static_cast<std::size_t>(v);
  }
  const_row_matrix_map<scalar> input_of(int m, int v) const {
    auto const& input = inputs_[slot(m, v)];
    return {input.data(), input.rows(), input.cols()};
  }
  void release_input(int m, int v) {
    auto& input = inputs_[slot(m, v)];
    if (input.size() != 0) spare_.push_back(std::move(input));
    input = row_matrix<scalar>();
  }

  // Any chunk's neighbours: the next virtual stage is rank p + 1's chunk v, or rank 0's chunk
  // v + 1; the previous one the other way round.
  [[nodiscard]] int next_rank() const { return (pp_->rank() + 1) % pp_->size(); }
  [[nodiscard]] int previous_rank() const { return (pp_->rank() + pp_->size() - 1) % pp_->size(); }
  /// The receiving virtual stage's (micro-batch, chunk) names a message: activations by the
  /// receiver's forward, gradients by its backward. Messages between two ranks in one direction
  /// are received in the order they are sent (every rank walks the same order), so tags may wrap.
  [[nodiscard]] int tag(int m, int receiver_chunk, bool gradient) const {
    int const V = model_.pipeline().vpp();
    return 2 * ((m * V + receiver_chunk) % 16384) + (gradient ? 1 : 0);
  }
  [[nodiscard]] int receiver_chunk(int v, bool gradient) const {
    int const p = pp_->rank(), P = pp_->size();
    if (gradient) return p == 0 ? v - 1 : v;
    return p == P - 1 ? v + 1 : v;
  }

  /// Whether pass `op` starts with a receive: a forward of any chunk but the embedding's, a
  /// backward of any but the output layer's.
  [[nodiscard]] bool receives(parallel::pipeline_op const& op) const {
    return op.kind == parallel::pipeline_op::forward ? !model_.chunk_embeds(op.chunk)
                                                     : !model_.chunk_has_head(op.chunk);
  }
  /// Posts the receive of pass `op` (if it has one not posted yet): an activation lands in the
  /// micro-batch's input buffer, a gradient in a buffer of its own.
  void post_receive(parallel::pipeline_op const& op) {
    if (!receives(op)) return;
    bool const gradient = op.kind == parallel::pipeline_op::backward;
    for (auto const& r : receives_)
      if (r.op == op) return;
    pending_receive r{{}, op, {}};
    auto& into = gradient ? r.buffer : inputs_[slot(op.micro_batch, op.chunk)];
    if (into.size() == 0) into = take_spare();
    into.resize(rows_, model_.hidden_size());
    r.request = pp_->irecv(gradient ? next_rank() : previous_rank(),
                           tag(op.micro_batch, op.chunk, gradient), into.data(),
                           static_cast<int>(into.size()));
    receives_.push_back(std::move(r));
    watch_requests();
  }
  /// Waits for pass `op`'s receive (if it has one; posted now if it was not yet); a gradient then
  /// becomes the chunk's output gradient.
  void receive(parallel::pipeline_op const& op) {
    if (!receives(op)) return;
    post_receive(op);
    bool const gradient = op.kind == parallel::pipeline_op::backward;
    auto const at = std::find_if(receives_.begin(), receives_.end(),
                                 [&](pending_receive const& r) { return r.op == op; });
    note(gradient ? parallel::pipeline_event::recv_gradient
                  : parallel::pipeline_event::recv_activation,
         op.micro_batch, op.chunk);
    auto const start = std::chrono::steady_clock::now();
    {
      parallel::watched_collective const watch(MPI_Comm(*pp_),
                                               gradient ? "pp_recv_gradient" : "pp_recv_activation",
                                               rows_ * model_.hidden_size());
      at->request.wait();
    }
    wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (gradient) {
      std::swap(model_.chunk_output_gradient(rows_), at->buffer);
      spare_.push_back(std::move(at->buffer));
    }
    receives_.erase(at);
    watch_requests();
  }
  row_matrix<scalar> take_spare() {
    if (spare_.empty()) return {};
    row_matrix<scalar> b = std::move(spare_.back());
    spare_.pop_back();
    return b;
  }

  void send(row_matrix<scalar> const& rows, parallel::pipeline_event::kind_type kind, int m, int v,
            int to) {
    bool const gradient = kind == parallel::pipeline_event::send_gradient;
    note(kind, m, v);
    complete_sends(false);
    row_matrix<scalar> buffer = take_spare();
    buffer = rows;
    auto request = pp_->isend(to, tag(m, receiver_chunk(v, gradient), gradient), buffer.data(),
                              static_cast<int>(buffer.size()));
    parallel::traffic::instance().add(MPI_Comm(*pp_),
                                      static_cast<std::int64_t>(buffer.size() * sizeof(scalar)));
    sends_.push_back({std::move(request), std::move(buffer)});
    watch_requests();
  }
  /// The pool's waiting thread tests the sends and receives in flight (none: the pool's own hook
  /// again).
  void watch_requests() {
    progress_.clear();
    for (auto& s : sends_)
      if (auto handle = s.request.trivial()) progress_.watch(&*handle);
    for (auto& r : receives_)
      if (auto handle = r.request.trivial()) progress_.watch(&*handle);
    if (progress_.empty())
      testing_.reset();
    else if (!testing_)
      testing_.emplace(progress_, *pool_);
  }
  /// Returns the buffers of completed sends to the spares (all of them when `wait`).
  void complete_sends(bool wait) {
    std::size_t done = 0;
    for (; done < sends_.size(); ++done) {
      auto& s = sends_[done];
      if (wait)
        s.request.wait();
      else if (!s.request.test())
        break;
      spare_.push_back(std::move(s.buffer));
    }
    sends_.erase(sends_.begin(), sends_.begin() + static_cast<std::ptrdiff_t>(done));
    watch_requests();
  }
  void finish_sends() {
    if (sends_.empty()) return;
    auto const start = std::chrono::steady_clock::now();
    {
      parallel::watched_collective const watch(MPI_Comm(*pp_), "pp_complete_sends",
                                               static_cast<std::int64_t>(sends_.size()));
      complete_sends(true);
    }
    wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  /// A stage that ends its passes first waits for the others (the schedule's cool-down): counted
  /// as pipeline wait, so the step's bubble is every stage's idle share up to the last one's end.
  void wait_for_stages() {
    if (pp_ == nullptr || pp_->size() == 1) return;
    auto const start = std::chrono::steady_clock::now();
    {
      parallel::watched_collective const watch(MPI_Comm(*pp_), "pp_end_of_schedule", 0);
      MPI_Barrier(MPI_Comm(*pp_));
    }
    wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void note(parallel::pipeline_event::kind_type kind, int m, int v) {
    if (tracing_) trace_.push_back({kind, m, v});
  }

  struct pending_send {
    boost::mpi::request request;
    row_matrix<scalar> buffer;
  };
  struct pending_receive {
    boost::mpi::request request;
    parallel::pipeline_op op;
    row_matrix<scalar> buffer;  // a gradient's (an activation's is its input buffer)
  };

  // The embedding table's messages (no pipeline message is in flight when they are sent).
  static constexpr int embedding_tag = 0;
  boost::mpi::communicator const* pp_;
  Model& model_;
  row_matrix<scalar> received_gradient_;  // stage 0: the last stage's copy's gradient
  std::int64_t rows_ = 0;
  std::vector<row_matrix<scalar>> inputs_;  // [micro-batch * V + chunk]: the received activation
  std::vector<row_matrix<scalar>> spare_;   // buffers free for the next receive or send
  std::vector<pending_send> sends_;
  std::vector<pending_receive> receives_;  // posted ahead of their passes
  thread_pool* pool_ = nullptr;
  parallel::exchange_progress progress_;  // the sends' requests, tested while the pool computes
  std::optional<parallel::exchange_progress::attached> testing_;
  std::vector<parallel::pipeline_op> ops_;
  std::vector<char> repeats_;  // per op: a backward that repeats its forward
  std::vector<parallel::pipeline_event> trace_;
  bool tracing_ = false;
  double wait_ = 0.0;
};

}  // namespace megamoe::train
