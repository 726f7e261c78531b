// SPDX-License-Identifier: Apache-2.0
// megamoe/optim/adamw.hpp — AdamW with sharded state (the reference's distributed optimizer),
// global-norm clipping and the warmup + cosine learning-rate schedule.
//
// Gradients arrive reduced (parallel::reduce_gradients: dense over TPxDPxCP, expert over EDP,
// tensor-parallel shards over DPxCP), so every rank of a group holds the same gradient. The
// optimizer flattens each kind's parameters separately; each rank of the dense group (TPxDPxCP)
// owns a contiguous 1/n of the dense elements, each rank of the expert-DP group 1/n of its expert
// elements, each rank of the DPxCP group 1/n of its TP shards' elements, and keeps Adam's moments
// only for those. One step: the squared gradient norm of every rank's shards,
// summed over the world, counts each parameter element exactly once; the clip factor follows;
// each rank updates its shards; an all-gather per group gives every rank the whole updated
// parameters. On one rank (no groups) the shard is everything.
//
// Weights of a quantized kind (memory::quantized_weights: the module's primary copy is a recipe's
// codes; quantized_expert, quantized_dense, quantized_tensor_parallel) are sharded like the kind
// they are reduced as (over EDP, TP x DP x CP, DP x CP), but this optimizer keeps the fp32 master
// of its shard itself: it copies the shard at construction (then collective over those groups)
// and has the model free its fp32 values. After each update every whole tensor is gathered from
// the shards, one tensor at a time in the model's order, and handed to the model, which quantizes
// it (step(lr, model)). So a rank holds its shard of those weights in fp32 and all of them as
// codes.
//
// The moments are kept as the Moments policy says: in the parameters' precision by default, or in
// BF16 (bf16_moments, the reference's precision-aware optimizer with --exp-avg-dtype bf16
// --exp-avg-sq-dtype bf16), which halves their bytes; the update's arithmetic stays fp32.
//
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * p)   (wd on matrices only)
#pragma once

#include <megamoe/core/bf16.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/optim/adamw_kernels.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/process_groups.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe::optim {

struct adamw_settings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;
  double clip_grad = 1.0;  // global-norm clipping threshold (<= 0: none)
};

/// Linear warmup from 0 to `peak` over `warmup` steps, then cosine decay to `minimum` at `total`.
struct lr_schedule {
  double peak = 1e-3, minimum = 1e-4;
  int warmup = 0, total = 1;
  /// The learning rate of step `step` (1-based).
  [[nodiscard]] double at(int step) const;
};

/// Whether AdamW's decoupled weight decay applies: matrices, not norms, biases or vectors.
MEGAMOE_DECL bool decays(std::string_view name, Eigen::Index rows);

/// Models whose weights of a quantized kind an optimizer holds the fp32 masters of: they free
/// their fp32 values and take whole updated tensors back, in the order for_each_parameter gives
/// them (megamoe::moe_layer and transformer with memory::quantized_weights).
template <class Model>
concept holds_quantized_weights = requires(Model& m) {
  m.release_weight_values();
  m.for_each_quantized_weight([](std::string_view, auto&&) {});
};

/// Where Adam's moments are stored: exp_avg as ExpAvg, exp_avg_sq as ExpAvgSq (the reference's
/// --exp-avg-dtype and --exp-avg-sq-dtype). For fp32 parameters each may be float or bfloat16.
template <class ExpAvg, class ExpAvgSq = ExpAvg>
struct moments {
  using exp_avg = ExpAvg;
  using exp_avg_sq = ExpAvgSq;
};
/// Moments in the parameters' precision: float for float parameters (fp32 master state), double
/// for double.
template <class T>
using master_moments = moments<std::conditional_t<std::is_same_v<T, double>, double, float>>;
/// Both moments in BF16.
using bf16_moments = moments<bfloat16>;
/// Whether a moment may be stored as S for parameters of type T.
template <class T, class S>
inline constexpr bool moment_storage_for = std::is_same_v<S, T> || (std::is_same_v<T, float> &&
                                                                    std::is_same_v<S, bfloat16>);

/// What one step did.
struct step_report {
  double grad_norm = 0.0;  // global L2 norm before clipping
  double clip_factor = 1.0;
  bool finite = true;  // false: a non-finite gradient; nothing was updated
};

template <class T, class Moments = master_moments<T>>
class distributed_adamw {
 public:
  using exp_avg_type = typename Moments::exp_avg;
  using exp_avg_sq_type = typename Moments::exp_avg_sq;
  static_assert(moment_storage_for<T, exp_avg_type> && moment_storage_for<T, exp_avg_sq_type>,
                "megamoe: Adam's moments are kept in the parameters' precision, or in bfloat16 "
                "for float parameters");

  /// One rank: the model's parameters, all in this rank's shard.
  template <class Model>
  distributed_adamw(Model& model, adamw_settings const& settings) : settings_(settings) {
    collect(model);
    for (auto& k : kinds_) place(k, 0, 1);
    take_masters(model);
  }

  /// On a job: dense state sharded over TPxDPxCP, expert state over EDP, tensor-parallel shards'
  /// over DPxCP; the norm over the world.
  template <class Model>
  distributed_adamw(parallel::process_groups const& groups, Model& model,
                    adamw_settings const& settings)
      : settings_(settings), world_(boost::mpi::communicator()) {
    collect(model);
    for (std::size_t kind = 0; kind < kinds_.size(); ++kind) {
      auto& k = kinds_[kind];
      switch (reduced_as(static_cast<parameter_kind>(kind))) {
        case parameter_kind::expert: k.group = &groups.expert_dp(); break;
        case parameter_kind::tensor_parallel: k.group = &groups.dp_cp(); break;
        default: k.group = &groups.tp_dp_cp(); break;
      }
      place(k, k.group->rank(), k.group->size());
    }
    take_masters(model);
  }

  /// Elements whose moments this rank keeps (dense + expert).
  [[nodiscard]] std::int64_t state_elements() const noexcept {
    std::int64_t n = 0;
    for (auto const& k : kinds_) n += k.end - k.begin;
    return n;
  }
  /// Bytes of the fp32 masters this optimizer keeps for weights of a quantized kind (its shard).
  [[nodiscard]] std::size_t master_bytes() const noexcept {
    std::size_t bytes = 0;
    for (auto const& k : kinds_) bytes += k.master.size() * sizeof(T);
    return bytes;
  }
  /// Bytes of Adam's moments on this rank.
  [[nodiscard]] std::size_t state_bytes() const noexcept {
    return static_cast<std::size_t>(state_elements()) *
           (sizeof(exp_avg_type) + sizeof(exp_avg_sq_type));
  }
  /// Bytes the moments' storage saves on this rank against moments in the parameters' precision.
  [[nodiscard]] std::size_t state_bytes_saved() const noexcept {
    return static_cast<std::size_t>(2 * state_elements()) * sizeof(T) - state_bytes();
  }
  [[nodiscard]] int steps() const noexcept { return step_; }

  /// What this rank owns of one parameter (its shard's piece of it): local elements
  /// [first, first + count) of the parameter's [rows, cols] copy, their values (the fp32 masters
  /// for weights of a quantized kind) and Adam's moments. A checkpoint saves exactly these pieces,
  /// so every element of the model is saved once, and loads them back.
  struct shard_piece {
    std::string_view name;
    parameter_kind kind;
    std::int64_t rows, cols, first, count;
    T* values;
    exp_avg_type* exp_avg;
    exp_avg_sq_type* exp_avg_sq;
  };
  /// Calls f(shard_piece) for every parameter piece this rank owns.
  template <class F>
  void for_each_shard_piece(F&& f) {
    for (std::size_t kind = 0; kind < kinds_.size(); ++kind) {
      auto& k = kinds_[kind];
      bool const masters = !k.master.empty();
      for_shard(k, [&](entry& e, std::int64_t first, std::int64_t count, std::int64_t at) {
        f(shard_piece{e.name, static_cast<parameter_kind>(kind), e.grad.rows(), e.grad.cols(),
                      first, count, masters ? k.master.data() + at : e.value.data() + first,
                      k.m.data() + at, k.v.data() + at});
      });
    }
  }
  /// Sets the steps taken (Adam's bias corrections follow it), as a loaded checkpoint says.
  void set_steps(int steps) {
    if (steps < 0) throw input_error("distributed_adamw: negative step count");
    step_ = steps;
  }
  /// After this rank's shards were written (a checkpoint load): every rank of each group gets
  /// the whole parameters, and `models` holding quantized weights their re-quantized tensors.
  template <class... Models>
  void publish(Models&... models) {
    gather_values();
    (hand_back(models), ...);
  }

  /// Clips by the global norm and applies one AdamW step with learning rate `lr`. A non-finite
  /// gradient norm (on any rank: the norm is summed over the world) skips the step on every rank.
  /// `models` are the ones given at construction where they hold quantized weights: their updated
  /// tensors go back to them (collective over EDP, and over ETP inside the model).
  template <class... Models>
  step_report step(double lr, Models&... models) {
    return step_on(nullptr, lr, models...);
  }
  /// The same, with the norm's and the update's element loops on `pool`'s threads.
  template <class... Models>
  step_report step(thread_pool& pool, double lr, Models&... models) {
    return step_on(&pool, lr, models...);
  }
  /// `step` that leaves every gradient zero when it updates, for the next backward to accumulate
  /// into: the shard's gradients are zeroed in the update's own pass, the rest of the model's
  /// beside it. A skipped step (non-finite norm) leaves the gradients as they are.
  template <class... Models>
  step_report step_and_zero_grad(thread_pool& pool, double lr, Models&... models) {
    return apply_and_zero_grad(pool, lr, global_norm(&pool), models...);
  }

  /// The global L2 norm of the gradients (collective over the world: every rank gets the same
  /// value), for a caller that checks it before applying the step (`apply_and_zero_grad`).
  double grad_norm(thread_pool& pool) { return global_norm(&pool); }
  /// step_and_zero_grad with the norm `grad_norm` returned for these gradients: nothing is summed
  /// again.
  template <class... Models>
  step_report apply_and_zero_grad(thread_pool& pool, double lr, double norm, Models&... models) {
    auto const report = apply<kernels::gradient_after::zeroed>(&pool, lr, norm, models...);
    if (report.finite)
      for (auto& k : kinds_) zero_outside_shard(pool, k);
    return report;
  }

  /// Zeroes every parameter's gradient (the whole model's, not only this rank's shard), in chunks
  /// on the pool's threads.
  void zero_grad(thread_pool& pool) {
    for (auto& k : kinds_) {
      zero_outside_shard(pool, k);
      for_each_chunk(&pool, k, [&](int, segment const& s) {
        std::fill_n(k.entries[s.entry].grad.data() + s.first, s.count, T(0));
      });
    }
  }

 private:
  template <class... Models>
  step_report step_on(thread_pool* pool, double lr, Models&... models) {
    return apply<kernels::gradient_after::kept>(pool, lr, global_norm(pool), models...);
  }
  double global_norm(thread_pool* pool) {
    double squares = 0.0;
    for (auto& k : kinds_) squares += shard_squares(pool, k);
    if (world_) parallel::all_reduce_sum(*world_, std::span<double>(&squares, 1));
    return std::sqrt(squares);
  }
  template <kernels::gradient_after After, class... Models>
  step_report apply(thread_pool* pool, double lr, double norm, Models&... models) {
    if (quantized_total() > 0 && sizeof...(Models) == 0)
      throw input_error(
          "distributed_adamw: this optimizer holds the fp32 masters of quantized weights; call "
          "step(lr, model) so that the updated weights reach the model");
    step_report report;
    report.grad_norm = norm;
    report.finite = std::isfinite(report.grad_norm);
    if (!report.finite) return report;
    if (settings_.clip_grad > 0.0 && report.grad_norm > settings_.clip_grad)
      report.clip_factor = settings_.clip_grad / (report.grad_norm + 1e-6);
    ++step_;
    kernels::adamw_step const constants{report.clip_factor,
                                        settings_.beta1,
                                        settings_.beta2,
                                        1.0 - std::pow(settings_.beta1, step_),
                                        1.0 - std::pow(settings_.beta2, step_),
                                        settings_.eps,
                                        settings_.weight_decay,
                                        lr};
    for (auto& k : kinds_) update<After>(pool, k, constants);
    gather_values();
    (hand_back(models), ...);
    return report;
  }

  /// One parameter: its maps and where it starts in its kind's flat order.
  struct entry {
    std::string name;
    row_matrix_map<T> value, grad;
    std::int64_t offset;
    bool decay;
  };
  /// A run of one entry's shard elements inside one chunk: local elements [first, first +
  /// count), at shard position `at`.
  struct segment {
    std::size_t entry;  // in kind_state::entries
    std::int64_t first, count, at;
  };
  static constexpr std::int64_t chunk = std::int64_t{1} << 15;
  /// All parameters of one kind, flattened, and this rank's shard of them.
  struct kind_state {
    std::vector<entry> entries;
    std::int64_t total = 0, begin = 0, end = 0;
    std::vector<std::int64_t> shard_sizes;  // per group rank
    std::vector<exp_avg_type> m;
    std::vector<exp_avg_sq_type> v;
    std::vector<T> flat, mine;               // gather buffers
    std::vector<T> master;                   // a quantized kind: the shard's fp32 values
    std::vector<std::int64_t> shard_pieces;  // per group rank: its part of one tensor
    boost::mpi::communicator const* group = nullptr;
    // The shard cut into chunks of `chunk` elements for the threads (runs of one entry each),
    // once the shard is placed.
    std::vector<segment> segments;
    std::vector<std::size_t> chunk_starts;  // first segment of each chunk, then the end
    std::vector<double> chunk_sums;
    std::vector<segment> outside;  // the gradients outside the shard in pieces of `chunk`
  };
  /// Elements of the quantized kinds' weights (over the whole model).
  [[nodiscard]] std::int64_t quantized_total() const noexcept {
    std::int64_t n = 0;
    for (std::size_t kind = 0; kind < kinds_.size(); ++kind)
      if (holds_codes(static_cast<parameter_kind>(kind))) n += kinds_[kind].total;
    return n;
  }

  template <class Model>
  void collect(Model& model) {
    model.for_each_parameter([&](std::string_view name, row_matrix_map<T> value,
                                 row_matrix_map<T> grad, parameter_kind kind) {
      auto& k = kinds_[static_cast<std::size_t>(kind)];
      if (holds_codes(kind)) {
        if (value.size() != grad.size())
          throw input_error("distributed_adamw: " + std::string(name) +
                            " has no fp32 values: another optimizer holds its master already");
        quantized_order_.push_back({static_cast<std::size_t>(kind), k.entries.size()});
      }
      k.entries.push_back({std::string(name), value, grad, k.total, decays(name, grad.rows())});
      k.total += grad.size();
    });
  }

  /// Copies this rank's shard of the quantized weights' values into the masters, hands them back
  /// once (so the codes follow the values taken, even ones written without refreshing the codes;
  /// collective over the kinds' groups) and has the model free the values.
  template <class Model>
  void take_masters(Model& model) {
    if (quantized_total() == 0) return;
    if constexpr (holds_quantized_weights<Model>) {
      for (std::size_t kind = 0; kind < kinds_.size(); ++kind) {
        if (!holds_codes(static_cast<parameter_kind>(kind))) continue;
        auto& k = kinds_[kind];
        k.master.resize(static_cast<std::size_t>(k.end - k.begin));
        for_shard(k, [&](entry const& e, std::int64_t first, std::int64_t count, std::int64_t at) {
          std::copy_n(e.value.data() + first, count, k.master.begin() + at);
        });
      }
      hand_back(model);
      model.release_weight_values();
    } else {
      throw input_error(
          "distributed_adamw: the model has weights held as codes but cannot release them");
    }
  }

  /// Every rank of each group gets the updated values of the kinds held in fp32.
  void gather_values() {
    for (std::size_t kind = 0; kind < kinds_.size(); ++kind)
      if (!holds_codes(static_cast<parameter_kind>(kind))) gather(kinds_[kind]);
  }

  /// Gathers each quantized weight from its group's shards and gives it to the model, one tensor
  /// at a time in the model's order (so one tensor's fp32 values are the most this needs at once).
  template <class Model>
  void hand_back(Model& model) {
    if constexpr (holds_quantized_weights<Model>) {
      std::size_t i = 0;
      model.for_each_quantized_weight([&](std::string_view name, auto&& store) {
        if (i >= quantized_order_.size())
          throw input_error("distributed_adamw: " + std::string(name) +
                            " is not a weight this optimizer was built with");
        auto const [kind, index] = quantized_order_[i++];
        auto& k = kinds_[kind];
        entry const& e = k.entries[index];
        if (e.name != name)
          throw input_error("distributed_adamw: the model handed back " + std::string(name) +
                            " where this optimizer holds " + e.name);
        std::int64_t const lo = std::max(k.begin, e.offset);
        std::int64_t const hi = std::max(lo, std::min(k.end, e.offset + e.grad.size()));
        T const* mine = hi > lo ? k.master.data() + (lo - k.begin) : k.master.data();
        if (k.group == nullptr || k.group->size() == 1) {
          store(mine);
          return;
        }
        auto const n = static_cast<std::size_t>(k.group->size());
        k.shard_pieces.resize(n);
        std::int64_t shard_begin = 0;
        for (std::size_t r = 0; r < n; ++r) {
          std::int64_t const shard_end = shard_begin + k.shard_sizes[r];
          k.shard_pieces[r] = std::max<std::int64_t>(
              0, std::min(shard_end, e.offset + e.grad.size()) - std::max(shard_begin, e.offset));
          shard_begin = shard_end;
        }
        k.flat.resize(static_cast<std::size_t>(e.grad.size()));
        parallel::all_gather_v(*k.group, mine, k.flat.data(), k.shard_pieces, 1);
        store(static_cast<T const*>(k.flat.data()));
      });
      if (i != quantized_order_.size())
        throw input_error(
            "distributed_adamw: the model handed back fewer quantized weights than "
            "this optimizer was built with");
    }
  }

  static void place(kind_state& k, int rank, int size) {
    k.shard_sizes.resize(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r)
      k.shard_sizes[static_cast<std::size_t>(r)] = k.total * (r + 1) / size - k.total * r / size;
    k.begin = k.total * rank / size;
    k.end = k.total * (rank + 1) / size;
    k.m.assign(static_cast<std::size_t>(k.end - k.begin), exp_avg_type{});
    k.v.assign(k.m.size(), exp_avg_sq_type{});
    cut_into_chunks(k);
  }

  /// The shard's segments, chunk by chunk, and the pieces of the gradients outside it.
  static void cut_into_chunks(kind_state& k) {
    k.segments.clear();
    k.chunk_starts.clear();
    for_shard(k, [&](entry const& e, std::int64_t first, std::int64_t count, std::int64_t at) {
      auto const index = static_cast<std::size_t>(&e - k.entries.data());
      while (count > 0) {
        auto const c = static_cast<std::size_t>(at / chunk);
        std::int64_t const n = std::min(count, (at / chunk + 1) * chunk - at);
        while (k.chunk_starts.size() <= c) k.chunk_starts.push_back(k.segments.size());
        k.segments.push_back({index, first, n, at});
        first += n;
        at += n;
        count -= n;
      }
    });
    k.chunk_starts.push_back(k.segments.size());
    k.chunk_sums.assign(k.chunk_starts.size() - 1, 0.0);
    k.outside.clear();
    auto outside = [&](std::size_t i, std::int64_t first, std::int64_t last) {
      for (; first < last; first += chunk)
        k.outside.push_back({i, first, std::min(chunk, last - first), 0});
    };
    for (std::size_t i = 0; i < k.entries.size(); ++i) {
      auto const& e = k.entries[i];
      std::int64_t const size = e.grad.size();
      std::int64_t const lo = std::clamp(k.begin - e.offset, std::int64_t{0}, size);
      std::int64_t const hi = std::clamp(k.end - e.offset, lo, size);
      outside(i, 0, lo);
      outside(i, hi, size);
    }
  }

  static void zero_outside_shard(thread_pool& pool, kind_state& k) {
    parallel_rows(pool, static_cast<int>(k.outside.size()), [&](int begin, int end) {
      for (int i = begin; i < end; ++i) {
        auto const& s = k.outside[static_cast<std::size_t>(i)];
        std::fill_n(k.entries[s.entry].grad.data() + s.first, s.count, T(0));
      }
    });
  }

  /// Calls f(entry, first element in it, count, position in the shard) for the shard's pieces.
  template <class Kind, class F>
  static void for_shard(Kind& k, F&& f) {
    for (auto& e : k.entries) {
      std::int64_t const lo = std::max(k.begin, e.offset);
      std::int64_t const hi = std::min(k.end, e.offset + e.grad.size());
      if (lo < hi) f(e, lo - e.offset, hi - lo, lo - k.begin);
    }
  }

  /// Calls f(chunk, segment) for every segment, chunk by chunk on the pool's threads (the chunks
  /// are fixed by the shard alone, so sums over them do not depend on the thread count).
  template <class F>
  static void for_each_chunk(thread_pool* pool, kind_state& k, F const& f) {
    int const chunks = static_cast<int>(k.chunk_starts.size()) - 1;
    auto body = [&](int c) {
      for (std::size_t i = k.chunk_starts[static_cast<std::size_t>(c)];
           i < k.chunk_starts[static_cast<std::size_t>(c) + 1]; ++i)
        f(c, k.segments[i]);
    };
    if (pool != nullptr && chunks > 1) {
      parallel_rows(*pool, chunks, [&](int begin, int end) {
        for (int c = begin; c < end; ++c) body(c);
      });
    } else {
      for (int c = 0; c < chunks; ++c) body(c);
    }
  }

  static double shard_squares(thread_pool* pool, kind_state& k) {
    std::fill(k.chunk_sums.begin(), k.chunk_sums.end(), 0.0);
    for_each_chunk(pool, k, [&](int c, segment const& s) {
      k.chunk_sums[static_cast<std::size_t>(c)] +=
          kernels::sum_of_squares(k.entries[s.entry].grad.data() + s.first, s.count);
    });
    double sum = 0.0;
    for (double x : k.chunk_sums) sum += x;
    return sum;
  }

  template <kernels::gradient_after After>
  static void update(thread_pool* pool, kind_state& k, kernels::adamw_step const& constants) {
    bool const masters = !k.master.empty();
    for_each_chunk(pool, k, [&](int, segment const& s) {
      entry& e = k.entries[s.entry];
      T* const values = masters ? k.master.data() + s.at : e.value.data() + s.first;
      auto const at = static_cast<std::size_t>(s.at);
      kernels::adamw_update<After>(values, e.grad.data() + s.first, k.m.data() + at,
                                   k.v.data() + at, s.count, constants, e.decay);
    });
  }

  /// Every rank of the group gets every shard's updated values.
  void gather(kind_state& k) {
    if (k.group == nullptr || k.group->size() == 1 || k.total == 0) return;
    k.flat.resize(static_cast<std::size_t>(k.total));
    k.mine.resize(static_cast<std::size_t>(k.end - k.begin));
    auto& mine = k.mine;
    for_shard(k, [&](entry const& e, std::int64_t first, std::int64_t count, std::int64_t at) {
      std::copy_n(e.value.data() + first, count, mine.begin() + at);
    });
    parallel::all_gather_v(*k.group, mine.data(), k.flat.data(), k.shard_sizes, 1);
    for (auto& e : k.entries) std::copy_n(k.flat.data() + e.offset, e.value.size(), e.value.data());
  }

  adamw_settings settings_;
  std::optional<boost::mpi::communicator> world_;  // on a job: the norm's sum
  std::array<kind_state, parameter_kinds> kinds_;
  // The quantized kinds' weights in the model's order: (kind, index into its entries).
  std::vector<std::pair<std::size_t, std::size_t>> quantized_order_;
  int step_ = 0;
};

}  // namespace megamoe::optim

#if MEGAMOE_HEADER_ONLY
#include <megamoe/optim/adamw.ipp>
#endif
