// SPDX-License-Identifier: Apache-2.0
// megamoe/train/trainer.hpp — the training loop: global batches of micro-batches over DP ranks,
// gradient accumulation, the aux-loss backward scale, gradient reduction, the optimizer step,
// the expert-bias update once per global batch, non-finite detection, held-out evaluation. The
// micro-batches' passes run in a pipeline schedule's order (train/pipeline_runner.hpp; one stage
// without PP: forward then backward of each in turn).
//
// Global batch = micro_batch x micro_batches x DP samples, consumed as Megatron's pretraining
// sampler does: step k's global batch is train samples [(k - 1) G, k G), DP rank r's micro-batch m
// holding samples (k - 1) G + [(m*DP + r) * micro_batch, +micro_batch). So one rank with
// micro_batches * DP micro-batches trains on exactly the same global batch as DP ranks with
// micro_batches each.
#pragma once

#include <megamoe/core/error.hpp>
#include <megamoe/model/context.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/optim/adamw.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/gradients.hpp>
#include <megamoe/parallel/pipeline_schedule.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/parallel/watchdog.hpp>
#include <megamoe/train/faults.hpp>
#include <megamoe/train/pipeline_runner.hpp>
#include <megamoe/train/token_data.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe::train {

static_assert(ignored_token == ignored_target);

/// What an evaluation measured, summed over the job.
struct evaluation {
  double nats = 0.0;                // the main head's cross-entropy of the counted targets
  double tokens = 0.0;              // the counted targets
  double bytes = 0.0;               // the UTF-8 bytes of their text
  double mtp_nats_per_token = 0.0;  // the MTP depths' mean (0 without)

  [[nodiscard]] double loss_per_token() const { return nats / std::max(1.0, tokens); }
  [[nodiscard]] double perplexity() const { return std::exp(loss_per_token()); }
  [[nodiscard]] double bits_per_byte() const {
    return nats / std::numbers::ln2 / std::max(1.0, bytes);
  }
  /// The MTP depths' mean in bits per byte (their tokens' bytes taken as the main head's).
  [[nodiscard]] double mtp_bits_per_byte() const {
    return mtp_nats_per_token * tokens / std::numbers::ln2 / std::max(1.0, bytes);
  }
};

struct train_settings {
  int seq_length = 64;
  int micro_batch = 8;    // sequences per micro-batch
  int micro_batches = 1;  // per DP rank and step (gradient accumulation)
  int steps = 100;
  optim::lr_schedule schedule;
  optim::adamw_settings optimizer;
  std::uint64_t seed = 1234;  // the job's: kept in its checkpoints
  // A step fails its checks with a non-finite loss or gradient norm, or with the checks on, a loss
  // (gradient norm) over spike_factor times the largest of the last spike_window updated steps'.
  // A failed step is run again from the same state once (Megatron's --rerun-mode
  // validate_results): the step is deterministic, so a recomputation that differs bit for bit
  // is the machine's fault (transient: the recomputed step goes on if it passes), one that repeats
  // it the model's (persistent). A step that still fails is skipped (no update), or stops the job.
  bool recompute_failed_steps = true;
  bool check_spiky_loss = false;
  bool check_large_grads = false;
  double spike_factor = 10.0;
  int spike_window = 50;
  bool stop_on_failed_check = false;
};

/// What became of a step that failed a check (train_settings).
enum class rerun_outcome {
  none,        // not recomputed: every check passed, or recomputation is off
  transient,   // the recomputation differed from the first pass
  persistent,  // it repeated the first pass's loss and gradient norm bit for bit
};
[[nodiscard]] constexpr char const* name_of(rerun_outcome r) noexcept {
  return r == rerun_outcome::transient    ? "transient"
         : r == rerun_outcome::persistent ? "persistent"
                                          : "none";
}

/// What one step did (the same on every rank).
struct step_metrics {
  int step = 0;
  double loss = 0.0;                    // mean cross-entropy over the global batch (nats per token)
  double router_loss = 0.0;             // mean of the MoE layers' attached losses per micro-batch
  double aux_loss = 0.0, z_loss = 0.0;  // its load-balancing and z-loss parts
  double mtp_loss = 0.0;  // the multi-token prediction depths' mean cross-entropy (0 without)
  double lr = 0.0, grad_norm = 0.0, clip_factor = 1.0;
  double seconds = 0.0, tokens_per_s = 0.0;
  bool skipped = false;  // a failed check: no update
  /// The check the step's first pass failed ("non-finite loss", "non-finite gradient", "spiky
  /// loss", "large gradient"); empty when it passed.
  std::string failed_check;
  rerun_outcome rerun = rerun_outcome::none;
  double first_loss = 0.0, first_grad_norm = 0.0;  // the first pass's, when recomputed
  /// Where the fault showed: for a non-finite gradient the first tensor with a non-finite element
  /// (on the lowest such rank, before the gradients' reduction when a recomputation repeats it),
  /// for a large gradient the tensor holding the largest element; empty otherwise.
  std::string fault_at;
  int fault_rank = -1;
  /// Per MoE layer of the model, the tokens each expert received in this step (summed over the
  /// global batch).
  std::vector<std::vector<double>> expert_load;
  /// The mean over ranks of the share of the schedule's time (its passes and messages) spent
  /// blocked on the pipeline's messages; 0 without PP.
  double pipeline_bubble = 0.0;
};

/// Trains a transformer<Config>; Adam's moments are kept as `Moments` says (optim::moments: in
/// the parameters' precision, or optim::bf16_moments).
template <class Config, class Moments = optim::master_moments<typename transformer<Config>::scalar>>
class trainer {
 public:
  using model_type = transformer<Config>;
  using scalar = typename model_type::scalar;
  using optimizer_type = optim::distributed_adamw<scalar, Moments>;

  /// One rank.
  trainer(model_type& model, token_data const& data, train_settings const& settings)
      : model_(model), data_(data), settings_(settings), optimizer_(model, settings.optimizer) {
    check();
    use_default_schedule();
  }
  /// On a job (DP = world / (TP CP PP)). Every rank of a TP x CP group trains on the same
  /// micro-batches, each on its chunks of the sequences (and under TP its sequence-parallel
  /// part of them).
  trainer(parallel::process_groups const& groups, model_type& model, token_data const& data,
          train_settings const& settings)
      : model_(model),
        data_(data),
        settings_(settings),
        groups_(&groups),
        optimizer_(groups, model, settings.optimizer) {
    check();
    use_default_schedule();
  }

  [[nodiscard]] int dp_size() const { return groups_ ? groups_->dp().size() : 1; }
  [[nodiscard]] int dp_rank() const { return groups_ ? groups_->dp().rank() : 0; }
  [[nodiscard]] int cp_size() const { return groups_ ? groups_->cp().size() : 1; }
  [[nodiscard]] int tp_size() const { return groups_ ? groups_->tp().size() : 1; }
  [[nodiscard]] std::int64_t global_batch_samples() const {
    return std::int64_t{settings_.micro_batch} * settings_.micro_batches * dp_size();
  }
  [[nodiscard]] std::int64_t global_batch_tokens() const {
    return global_batch_samples() * settings_.seq_length;
  }
  [[nodiscard]] token_data const& data() const noexcept { return data_; }
  [[nodiscard]] optimizer_type const& optimizer() const { return optimizer_; }
  [[nodiscard]] optimizer_type& optimizer() { return optimizer_; }
  [[nodiscard]] model_type& model() noexcept { return model_; }
  [[nodiscard]] parallel::process_groups const* groups() const noexcept { return groups_; }
  [[nodiscard]] train_settings const& settings() const noexcept { return settings_; }
  [[nodiscard]] int steps_done() const noexcept { return step_; }
  /// Continues after `steps` global batches (a checkpoint load): the next batch is steps + 1.
  void set_steps_done(int steps) {
    if (steps < 0) throw input_error("training: negative step count");
    step_ = steps;
  }
  /// The learning-rate schedule from now on (a resumed run with more steps recomputes it).
  void set_schedule(optim::lr_schedule const& schedule) { settings_.schedule = schedule; }
  /// Faults a test plants in this rank's gradients (train/faults.hpp).
  void plant(planted_faults const& faults) noexcept { faults_ = faults; }

  /// One global batch: forward and backward of every micro-batch, reduction, the checks (once
  /// more from the same state if they fail), clipping, update.
  /// A step starts from zero gradients, which the last step's update left (nothing may add to
  /// the model's gradients between steps). The metrics live in the trainer until the next step:
  /// after the first steps, a step on one rank that passes its checks allocates nothing.
  step_metrics const& step(context& ctx) {
    auto const start = std::chrono::steady_clock::now();
    ++step_;
    parallel::watchdog::instance().set_step(step_);
    // Every field back to its default; the expert loads keep their buffers.
    auto loads = std::move(metrics_.expert_load);
    metrics_ = {};
    metrics_.expert_load = std::move(loads);
    step_metrics& out = metrics_;
    out.step = step_;
    out.lr = settings_.schedule.at(step_);
    auto& times = ctx.step_stages;
    if (settings_.recompute_failed_steps) model_.begin_global_batch();
    auto result = run_global_batch(ctx, out, false);
    char const* failed = failed_check(result);
    if (failed != nullptr) {
      out.failed_check = failed;
      bool const nonfinite = !std::isfinite(result.loss) || !std::isfinite(result.grad_norm);
      if (nonfinite || std::string_view(failed) == large_gradient) locate_fault(out, nonfinite);
      if (settings_.recompute_failed_steps) {
        model_.discard_global_batch();
        gradients_zeroed_ = false;
        auto const again = run_global_batch(ctx, out, nonfinite);
        bool const same =
            std::bit_cast<std::uint64_t>(again.loss) == std::bit_cast<std::uint64_t>(result.loss) &&
            std::bit_cast<std::uint64_t>(again.grad_norm) ==
                std::bit_cast<std::uint64_t>(result.grad_norm);
        out.rerun = same ? rerun_outcome::persistent : rerun_outcome::transient;
        out.first_loss = result.loss;
        out.first_grad_norm = result.grad_norm;
        if (same && nonfinite) agree_on_fault(out, origin_, origin_.empty() ? -1.0 : 1.0, true);
        result = again;
        failed = same ? failed : failed_check(result);
      }
    }
    // The expert-bias updates and the recipe's end of step (delayed scaling's next scales) come
    // before the update: weights held as codes are quantized as the update hands them back, with
    // the scales (and into the amax history slot) a forward of the next step would use.
    model_.finish_global_batch();
    out.grad_norm = result.grad_norm;
    if (failed == nullptr) {
      auto const report = times.time(step_stage::optimizer, [&] {
        return optimizer_.apply_and_zero_grad(ctx.pool(), out.lr, result.grad_norm, model_);
      });
      out.clip_factor = report.clip_factor;
      gradients_zeroed_ = true;
      remember(result);
    } else {
      out.skipped = true;
      if (settings_.stop_on_failed_check)
        throw parallel::agreed_input_error(
            "training: " + out.failed_check + " at step " + std::to_string(step_) +
            (out.rerun == rerun_outcome::none ? std::string()
                                              : " (" + std::string(name_of(out.rerun)) + ")") +
            (out.fault_at.empty()
                 ? std::string()
                 : ", in " + out.fault_at + " on rank " + std::to_string(out.fault_rank)));
    }
    parallel::watchdog::instance().set_step(0);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out.tokens_per_s = static_cast<double>(global_batch_tokens()) / out.seconds;
    return out;
  }

  /// Valid samples [first, first + count) in eval mode, dealt as a training step deals its
  /// samples (in rounds of micro_batch x DP, DP rank r's slice r); places of the last round
  /// beyond `count` repeat sample `first` and are not counted, so every mapping measures the same
  /// samples. The main next-token head's losses, and the MTP depths' mean.
  evaluation evaluate(context& ctx, std::int64_t first, std::int64_t count) {
    int const S = settings_.seq_length, B = settings_.micro_batch, DP = dp_size();
    count = std::max<std::int64_t>(count, 1);
    auto const rounds = (count + B * DP - 1) / (B * DP);
    ctx.step.mode = router::pass::eval;
    tokens_.resize(static_cast<std::size_t>(S) * B);
    targets_.resize(tokens_.size());
    bool const has_losses = model_.chunk_has_head(model_.pipeline().vpp() - 1);
    bool const counts_bytes = has_losses && (groups_ == nullptr || groups_->cp().rank() == 0);
    constexpr int depths = model_type::mtp_depths;
    // nats, tokens, bytes; per MTP depth nats and tokens
    std::vector<double> sums(3 + 2 * depths, 0.0);
    runner_.share_embedding();  // the MTP depths' table, as the last update left stage 0's
    for (std::int64_t r = 0; r < rounds; ++r) {
      auto const at = (r * DP + dp_rank()) * B;
      for (int b = 0; b < B; ++b)
        data_.valid_sample(first + (at + b < count ? at + b : 0), B, b, tokens_, targets_);
      runner_.run_forward_only(ctx, tokens_, targets_, S, B);
      if (!has_losses) continue;
      auto const losses = model_.token_losses();  // this rank's S / CP positions
      auto const kept = model_.kept_targets();
      int const positions = S / cp_size();
      for (int b = 0; b < B && at + b < count; ++b) {
        for (int s = 0; s < positions; ++s) {
          auto const t = static_cast<std::size_t>(s) * B + b;
          if (kept[t] == ignored_target) continue;
          sums[0] += losses[t];
          sums[1] += 1.0;
        }
        if (counts_bytes) sums[2] += static_cast<double>(data_.target_bytes(targets_, B, b));
      }
      for (int k = 1; k <= depths; ++k) {  // a depth's targets past its window are ignored
        auto const mtp_losses = model_.mtp_token_losses(k);
        auto const mtp_targets = model_.mtp_targets(k);
        for (int b = 0; b < B && at + b < count; ++b)
          for (int s = 0; s < positions; ++s) {
            auto const t = static_cast<std::size_t>(s) * B + b;
            if (mtp_targets[t] == ignored_target) continue;
            sums[1 + 2 * static_cast<std::size_t>(k)] += mtp_losses[t];
            sums[2 + 2 * static_cast<std::size_t>(k)] += 1.0;
          }
      }
    }
    ctx.step.mode = router::pass::training;
    if (groups_) {
      parallel::all_reduce_sum(groups_->dp_cp(), std::span<double>(sums));
      parallel::all_reduce_sum(groups_->pp(), std::span<double>(sums));
    }
    evaluation out{.nats = sums[0], .tokens = sums[1], .bytes = sums[2]};
    for (int k = 1; k <= depths; ++k)
      out.mtp_nats_per_token += sums[1 + 2 * static_cast<std::size_t>(k)] /
                                std::max(1.0, sums[2 + 2 * static_cast<std::size_t>(k)]) / depths;
    return out;
  }
  /// Bits per UTF-8 byte of the first `count` valid samples' text (evaluate's).
  double heldout_bits_per_byte(context& ctx, std::int64_t count) {
    return evaluate(ctx, 0, count).bits_per_byte();
  }

  /// The schedule of every step from now on (the pipeline's, parallel/pipeline_schedule.hpp): by
  /// default interleaved 1F1B with V chunks per rank, 1F1B otherwise (one stage: forward then
  /// backward of each micro-batch in turn).
  template <class Schedule>
  void use_schedule() {
    static_assert(
        !std::is_same_v<Schedule, parallel::merged_one_f_one_b> || model_type::parks_micro_batches,
        "megamoe: the merged forward-backward schedule needs a model that sets "
        "micro-batches aside (no precision recipe)");
    runner_.set_schedule(Schedule::ops(pipeline_shape()));
  }
  [[nodiscard]] std::vector<parallel::pipeline_op> const& schedule() const noexcept {
    return runner_.schedule();
  }
  [[nodiscard]] pipeline_runner<model_type>& pipeline() noexcept { return runner_; }

 private:
  void check() {
    auto agree = [&](auto&& body) {
      if (groups_)
        parallel::check_on_every_rank(groups_->tp_dp_cp(), body);
      else
        body();
    };
    // Every stage checks the same values, so every rank of the job throws alike.
    agree([&] {
      if (settings_.seq_length < 1 || settings_.micro_batch < 1 || settings_.micro_batches < 1 ||
          settings_.steps < 0)
        throw input_error("training: seq_length, micro_batch and micro_batches must be >= 1");
      if (settings_.spike_window < 1 || !(settings_.spike_factor > 1.0))
        throw input_error(
            "training: the spike checks need a window of >= 1 steps and a factor > 1");
      model_.check_sequence(settings_.seq_length);
      if (data_.seq_length() != settings_.seq_length)
        throw input_error("training: samples of " + std::to_string(data_.seq_length()) +
                          " tokens for a sequence length of " +
                          std::to_string(settings_.seq_length));
      parallel::check_micro_batches(pipeline_shape());
    });
  }
  void use_default_schedule() {
    if (model_.pipeline().vpp() > 1)
      use_schedule<parallel::interleaved_one_f_one_b>();
    else
      use_schedule<parallel::one_f_one_b>();
  }

  [[nodiscard]] parallel::pipeline_shape pipeline_shape() const {
    auto const& layout = model_.pipeline();
    return {layout.pp(), model_.pipeline_rank(), layout.vpp(), settings_.micro_batches};
  }
  /// The first of micro-batch m's sequences in the global batch (DP rank r's micro-batch m holds
  /// sequences [(m DP + r) B, + B)).
  [[nodiscard]] std::uint64_t first_sequence(int m) const {
    return static_cast<std::uint64_t>((m * dp_size() + dp_rank()) * settings_.micro_batch);
  }

  /// What decides whether a pass over the global batch may update the model.
  struct pass_result {
    double loss = 0.0, grad_norm = 0.0;
  };

  /// Forward and backward of every micro-batch from zero gradients, the logged values' sums, the
  /// gradients' reduction and their norm. With `locate`, this rank's first tensor holding a
  /// non-finite gradient before the reduction goes to origin_.
  pass_result run_global_batch(context& ctx, step_metrics& out, bool locate) {
    int const S = settings_.seq_length, B = settings_.micro_batch, M = settings_.micro_batches;
    int const DP = dp_size(), CP = cp_size(), TP = tp_size();
    auto& times = ctx.step_stages;
    // The optimizer's update leaves the gradients zero; before the first step, after a skipped
    // one and before a recomputation they are zeroed here.
    if (!gradients_zeroed_)
      times.time(step_stage::optimizer, [&] { optimizer_.zero_grad(ctx.pool()); });
    gradients_zeroed_ = false;
    ctx.step.mode = router::pass::training;
    ctx.step.loss_backward_scale = router::loss_backward_scale(1.0, CP, M);
    // Every micro-batch's tokens (every stage reads them; the embedding's and the output
    // layer's chunks use them).
    auto const per_batch = static_cast<std::size_t>(S) * static_cast<std::size_t>(B);
    tokens_.resize(per_batch * static_cast<std::size_t>(M));
    targets_.resize(tokens_.size());
    times.time(step_stage::batches, [&] {
      for (int m = 0; m < M; ++m)
        data_.training_batch(
            (step_ - 1) * global_batch_samples() + static_cast<std::int64_t>(first_sequence(m)), S,
            B, std::span(tokens_).subspan(m * per_batch, per_batch),
            std::span(targets_).subspan(m * per_batch, per_batch));
    });
    // Every layer's loads on every rank (a stage without the layer adds zeros), so the sums have
    // one length on all ranks.
    out.expert_load.resize(static_cast<std::size_t>(model_.moe_layer_count()));
    for (auto& layer : out.expert_load)
      layer.assign(static_cast<std::size_t>(model_.values().shape.experts), 0.0);
    model_.for_each_moe_layer([](auto& layer, int) { layer.clear_expert_load(); });
    double loss = 0.0, router_loss = 0.0, aux_loss = 0.0, z_loss = 0.0, mtp_loss = 0.0;
    auto const schedule_start = std::chrono::steady_clock::now();
    runner_.run(
        ctx, M, S, B, static_cast<scalar>(1.0 / M),
        [&](int m) {
          return std::pair{
              std::span<std::int32_t const>(tokens_).subspan(m * per_batch, per_batch),
              std::span<std::int32_t const>(targets_).subspan(m * per_batch, per_batch)};
        },
        [&](int m) { return (static_cast<std::uint64_t>(step_) << 20) + first_sequence(m); },
        [&](auto const& r) {
          loss += r.output.cross_entropy;
          router_loss += r.output.router_losses;
          aux_loss += r.output.aux_loss;
          z_loss += r.output.z_loss;
          mtp_loss += r.output.mtp_loss;
        });
    model_.for_each_moe_layer([&](auto& layer, int ordinal) {
      auto const counts = layer.expert_load();
      std::copy(counts.begin(), counts.end(),
                out.expert_load[static_cast<std::size_t>(ordinal)].begin());
    });
    double const schedule_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - schedule_start).count();
    // A planted fault corrupts this rank's gradients before they are reduced: a NaN on every
    // pass (a fault of the model), a bit flip once (the machine's).
    if (faults_.nan_step == step_) corrupt_gradient(true);
    if (faults_.bit_flip_step == step_) {
      corrupt_gradient(false);
      faults_.bit_flip_step = 0;
    }
    if (locate) origin_ = first_nonfinite();
    // Logged values over the global batch (every rank the same): a CP rank's cross-entropy is
    // the mean over its chunks (the same on each TP rank), its router losses and expert loads
    // its share of the micro-batch's.
    std::vector<double>& sums = sums_;
    // Under PP the output layer's stage alone has the cross-entropy, each stage its layers'
    // router losses and loads (the others' entries zero): summed over the stages too. The
    // pipeline's wait share is averaged over every rank.
    sums.assign({loss, router_loss, aux_loss, z_loss,
                 schedule_seconds > 0.0 ? runner_.wait_seconds() / schedule_seconds : 0.0,
                 mtp_loss});
    for (auto const& layer : out.expert_load) sums.insert(sums.end(), layer.begin(), layer.end());
    if (groups_) {
      parallel::all_reduce_sum(groups_->tp_dp_cp(), std::span<double>(sums));
      parallel::all_reduce_sum(groups_->pp(), std::span<double>(sums));
    }
    int const ranks = groups_ ? groups_->layout().world_size : 1;
    out.loss = sums[0] / (M * DP * CP * TP);
    out.router_loss = sums[1] / (M * DP);
    out.aux_loss = sums[2] / (M * DP);
    out.z_loss = sums[3] / (M * DP);
    out.pipeline_bubble = sums[4] / ranks;
    out.mtp_loss = sums[5] / (M * DP * CP * TP);
    std::size_t at = 6;
    for (auto& layer : out.expert_load)
      for (double& v : layer) v = sums[at++];
    if (groups_) times.time(step_stage::gradient_reduction, [&] { gradients_(*groups_); });
    double const norm =
        times.time(step_stage::optimizer, [&] { return optimizer_.grad_norm(ctx.pool()); });
    return {out.loss, norm};
  }

  static constexpr char const* large_gradient = "large gradient";
  /// The check `r` fails (every rank agrees: the loss and the norm are the job's), or null.
  [[nodiscard]] char const* failed_check(pass_result const& r) const {
    if (!std::isfinite(r.loss)) return "non-finite loss";
    if (!std::isfinite(r.grad_norm)) return "non-finite gradient";
    if (recent_count_ == 0) return nullptr;
    double top_loss = 0.0, top_norm = 0.0;
    for (int i = 0; i < recent_count_; ++i) {
      top_loss = std::max(top_loss, recent_[2 * static_cast<std::size_t>(i)]);
      top_norm = std::max(top_norm, recent_[2 * static_cast<std::size_t>(i) + 1]);
    }
    if (settings_.check_spiky_loss && r.loss > settings_.spike_factor * top_loss)
      return "spiky loss";
    if (settings_.check_large_grads && r.grad_norm > settings_.spike_factor * top_norm)
      return large_gradient;
    return nullptr;
  }
  /// An updated step's loss and norm join the last spike_window's.
  void remember(pass_result const& r) {
    if (settings_.spike_window < 1) return;
    recent_[2 * static_cast<std::size_t>(recent_next_)] = r.loss;
    recent_[2 * static_cast<std::size_t>(recent_next_) + 1] = r.grad_norm;
    recent_next_ = (recent_next_ + 1) % settings_.spike_window;
    recent_count_ = std::min(recent_count_ + 1, settings_.spike_window);
  }

  /// This rank's first tensor (in numbered_parameters' order) holding a non-finite gradient.
  std::string first_nonfinite() { return first_nonfinite_gradient(model_.numbered_parameters()); }
  /// The fault's place after the reduction: the first non-finite gradient, or the tensor holding
  /// the largest element.
  void locate_fault(step_metrics& out, bool nonfinite) {
    if (nonfinite) {
      auto const name = first_nonfinite();
      agree_on_fault(out, name, name.empty() ? -1.0 : 1.0, true);
      return;
    }
    auto const [name, largest] = largest_gradient(model_.numbered_parameters());
    agree_on_fault(out, name, largest, false);
  }
  /// Every rank's candidate `name` with its `score` (< 0: none); the chosen one, the same on every
  /// rank, goes into `out`: the lowest rank with a candidate (`lowest_rank`), else the largest
  /// score.
  void agree_on_fault(step_metrics& out, std::string const& name, double score, bool lowest_rank) {
    int chosen = score < 0 ? -1 : 0;
    std::string chosen_name = name;
    if (groups_) {
      boost::mpi::communicator const world;
      std::vector<double> scores;
      parallel::all_gather_v_checked(world, std::span<double const>(&score, 1), 1, scores, 1);
      chosen = -1;
      for (int r = 0; r < world.size(); ++r) {
        double const sc = scores[static_cast<std::size_t>(r)];
        if (sc < 0) continue;
        if (chosen < 0 || (!lowest_rank && sc > scores[static_cast<std::size_t>(chosen)]))
          chosen = r;
      }
      std::vector<std::uint8_t> names;
      auto const bytes = std::span(reinterpret_cast<std::uint8_t const*>(name.data()), name.size());
      auto const lengths = parallel::all_gather_v_checked(
          world, bytes, static_cast<std::int64_t>(name.size()), names, 1);
      chosen_name.clear();
      if (chosen >= 0) {
        std::int64_t first = 0;
        for (int r = 0; r < chosen; ++r) first += lengths[static_cast<std::size_t>(r)];
        chosen_name.assign(names.begin() + first,
                           names.begin() + first + lengths[static_cast<std::size_t>(chosen)]);
      }
    }
    out.fault_rank = chosen;
    out.fault_at = chosen < 0 ? std::string() : chosen_name;
  }
  /// A planted fault in this rank's first gradient (train/faults.hpp).
  void corrupt_gradient(bool not_a_number) {
    auto parameters = model_.numbered_parameters();
    corrupt_first_gradient(parameters, not_a_number);
  }

  model_type& model_;
  token_data const& data_;
  train_settings settings_;
  parallel::process_groups const* groups_ = nullptr;
  optimizer_type optimizer_;
  parallel::gradient_reduction<scalar> gradients_{model_};
  pipeline_runner<model_type> runner_{groups_, model_};
  std::vector<std::int32_t> tokens_, targets_;
  step_metrics metrics_;
  std::vector<double> sums_;       // the logged values summed over DP
  bool gradients_zeroed_ = false;  // by the last step's update
  int step_ = 0;
  planted_faults faults_;
  std::string origin_;  // a recomputation's first non-finite gradient before the reduction
  // The last spike_window updated steps' (loss, gradient norm), a ring from recent_next_.
  std::vector<double> recent_ =
      std::vector<double>(2 * static_cast<std::size_t>(std::max(0, settings_.spike_window)));
  int recent_next_ = 0, recent_count_ = 0;
};

}  // namespace megamoe::train
