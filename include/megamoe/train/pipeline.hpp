// SPDX-License-Identifier: Apache-2.0
// megamoe/train/pipeline.hpp — runs a pipeline schedule (parallel/pipeline.hpp) on a transformer:
// the passes of one rank in the schedule's order, activations forward and gradients backward
// between virtual stages by point-to-point messages on the PP communicator.
//
// A received activation lands in its own buffer, which stays until that micro-batch's backward
// of the chunk; a sent one is copied once into a send buffer, free again when its send has
// completed. A chunk's modules keep what their backward needs for one micro-batch at a time: a
// backward whose micro-batch was not the chunk's last forward repeats that forward first from the
// kept input (router::pass::recompute: same values, statistics not counted twice), so the last
// stage, whose forward and backward of a micro-batch are adjacent, never repeats one. Receives
// block; sends do not, and are completed before the step ends. The time a rank spends blocked in
// receives and in completing its sends is its pipeline wait.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/parallel/pipeline.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/parallel/traffic.hpp>
#include <megamoe/parallel/watchdog.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/request.hpp>

#include <chrono>
#include <cstdint>
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
    parallel::repeated_forwards(ops_, model_.pipeline().vpp(), repeats_);
  }
  [[nodiscard]] std::vector<parallel::pipeline_op> const& schedule() const noexcept { return ops_; }

  /// One step's passes in the schedule's order. batch(m) gives micro-batch m's tokens and targets
  /// (every rank of every stage is given them), key(m) its router key; `scale` multiplies the
  /// cross-entropy's gradient; on_forward(chunk_result) sees each training forward.
  template <class Batch, class Key, class OnForward>
  void run(context& ctx, int micro_batches, int seq, int batch_size, scalar scale, Batch&& batch,
           Key&& key, OnForward&& on_forward) {
    start_run(micro_batches, seq, batch_size);
    auto const& ops = ops_;
    // The watchdog names the pass a hang happens in.
    auto& watch = parallel::watchdog::instance();
    for (std::size_t i = 0; i < ops.size(); ++i) {
      auto const& op = ops[i];
      auto const [tokens, targets] = batch(op.micro_batch);
      ctx.step.micro_batch_key = key(op.micro_batch);
      watch.set_pass(op.micro_batch, model_.pipeline().stage(model_.pipeline_rank(), op.chunk));
      if (op.kind == parallel::pipeline_op::forward) {
        ctx.step.mode = router::pass::training;
        chunk_result r{op.micro_batch, op.chunk,
                       forward(ctx, op.micro_batch, op.chunk, tokens, targets, seq, batch_size)};
        on_forward(std::as_const(r));
        continue;
      }
      int const m = op.micro_batch, v = op.chunk;
      if (!model_.chunk_has_head(v))
        receive(model_.chunk_output_gradient(rows_), parallel::pipeline_event::recv_gradient, m, v,
                next_rank());
      if (repeats_[i] != 0) {
        ctx.step.mode = router::pass::recompute;
        model_.forward_chunk(ctx, v, tokens, targets, seq, batch_size, input_of(m, v));
      }
      ctx.step.mode = router::pass::training;
      note(parallel::pipeline_event::backward, m, v);
      model_.backward_chunk(ctx, v, scale);
      if (!model_.chunk_embeds(v))
        send(model_.chunk_input_gradient(), parallel::pipeline_event::send_gradient, m, v,
             previous_rank());
      release_input(m, v);
    }
    watch.set_pass(-1, -1);
    finish_sends();
  }

  /// Forward of one micro-batch through every chunk of this rank, in eval mode (held-out loss):
  /// the output layer's chunk returns the cross-entropy.
  void run_forward_only(context& ctx, std::span<std::int32_t const> tokens,
                        std::span<std::int32_t const> targets, int seq, int batch_size) {
    start_run(1, seq, batch_size);
    for (int v = 0; v < model_.pipeline().vpp(); ++v)
      forward(ctx, 0, v, tokens, targets, seq, batch_size);
    for (int v = 0; v < model_.pipeline().vpp(); ++v) release_input(0, v);
    finish_sends();
  }

 private:
  void start_run(int micro_batches, int seq, int batch_size) {
    int const V = model_.pipeline().vpp();
    rows_ = model_.boundary_rows(seq, batch_size);
    inputs_.resize(static_cast<std::size_t>(micro_batches) * V);
    wait_ = 0.0;
    if (tracing_) trace_.clear();
  }

  transformer_output forward(context& ctx, int m, int v, std::span<std::int32_t const> tokens,
                             std::span<std::int32_t const> targets, int seq, int batch_size) {
    if (!model_.chunk_embeds(v)) {
      auto& input = inputs_[slot(m, v)];
      if (input.size() == 0 && !spare_.empty()) {
        input = std::move(spare_.back());
        spare_.pop_back();
      }
      input.resize(rows_, model_.hidden_size());
      receive(input, parallel::pipeline_event::recv_activation, m, v, previous_rank());
    }
    note(parallel::pipeline_event::forward, m, v);
    auto out = model_.forward_chunk(ctx, v, tokens, targets, seq, batch_size, input_of(m, v));
    if (!model_.chunk_has_head(v))
      send(model_.chunk_output(), parallel::pipeline_event::send_activation, m, v, next_rank());
    return out;
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

  void receive(row_matrix<scalar>& into, parallel::pipeline_event::kind_type kind, int m, int v,
               int from) {
    bool const gradient = kind == parallel::pipeline_event::recv_gradient;
    note(kind, m, v);
    auto const start = std::chrono::steady_clock::now();
    {
      parallel::watched_collective const watch(
          MPI_Comm(*pp_), gradient ? "pp_recv_gradient" : "pp_recv_activation", into.size());
      pp_->recv(from, tag(m, v, gradient), into.data(), static_cast<int>(into.size()));
    }
    wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void send(row_matrix<scalar> const& rows, parallel::pipeline_event::kind_type kind, int m, int v,
            int to) {
    bool const gradient = kind == parallel::pipeline_event::send_gradient;
    note(kind, m, v);
    complete_sends(false);
    row_matrix<scalar> buffer;
    if (!spare_.empty()) {
      buffer = std::move(spare_.back());
      spare_.pop_back();
    }
    buffer = rows;
    auto request = pp_->isend(to, tag(m, receiver_chunk(v, gradient), gradient), buffer.data(),
                              static_cast<int>(buffer.size()));
    parallel::traffic::instance().add(MPI_Comm(*pp_),
                                      static_cast<std::int64_t>(buffer.size() * sizeof(scalar)));
    sends_.push_back({std::move(request), std::move(buffer)});
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

  void note(parallel::pipeline_event::kind_type kind, int m, int v) {
    if (tracing_) trace_.push_back({kind, m, v});
  }

  struct pending_send {
    boost::mpi::request request;
    row_matrix<scalar> buffer;
  };

  boost::mpi::communicator const* pp_;
  Model& model_;
  std::int64_t rows_ = 0;
  std::vector<row_matrix<scalar>> inputs_;  // [micro-batch * V + chunk]: the received activation
  std::vector<row_matrix<scalar>> spare_;   // buffers free for the next receive or send
  std::vector<pending_send> sends_;
  std::vector<parallel::pipeline_op> ops_;
  std::vector<char> repeats_;  // per op: a backward that repeats its forward
  std::vector<parallel::pipeline_event> trace_;
  bool tracing_ = false;
  double wait_ = 0.0;
};

}  // namespace megamoe::train
