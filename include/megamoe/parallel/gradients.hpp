// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/gradients.hpp — the data-parallel gradient reduction of a training step.
//
// Dense parameters (router, shared expert, gate) are replicated over the attention grid and each
// rank saw only its own tokens (its sequence-parallel shard of its DP replica's micro-batch), so
// their gradients are summed over TP x DP x CP: the TP all-reduce of sequence-parallel weights and
// the DP x CP reduction in one. Expert parameters are summed over the expert data-parallel group.
// Both are then scaled by 1/(DP*CP), the reference's factor for both kinds.
#pragma once

#include <megamoe/core/parameter.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/process_groups.hpp>

#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace megamoe::parallel {

/// Anything whose parameters can be visited as f(name, value, grad, kind).
template <class M>
concept has_parameters = requires(M& m) {
  typename M::scalar;
  m.for_each_parameter([](std::string_view, auto, auto, parameter_kind) {});
};

/// The gradient reduction of one set of models, set up once: their gradients (the maps stay valid
/// while the models live, as the optimizer's do) and the two buckets the all-reduces run on, so a
/// reduction allocates nothing after the first.
template <class T>
class gradient_reduction {
 public:
  template <has_parameters... Models>
  explicit gradient_reduction(Models&... models) {
    static_assert((std::is_same_v<typename Models::scalar, T> && ...),
                  "gradient_reduction: every model's scalar type must be T");
    (models.for_each_parameter([&](std::string_view, auto, auto grad, parameter_kind kind) {
      gradients_.push_back({row_matrix_map<T>(grad.data(), grad.rows(), grad.cols()), kind});
    }),
     ...);
  }

  /// Collective over the world's stage: every rank must call it for the same models. One
  /// all-reduce per kind, both in flight together; a kind whose group is this rank alone is only
  /// scaled, in place (not at all by 1).
  void operator()(process_groups const& groups) {
    auto const& l = groups.layout();
    double const scale = 1.0 / (static_cast<double>(l.dp) * l.cp);
    bool const dense_alone = groups.tp_dp_cp().size() == 1,
               experts_alone = groups.expert_dp().size() == 1;
    if (dense_alone && experts_alone && scale == 1.0) return;
    auto alone = [&](parameter_kind kind) {
      return kind == parameter_kind::dense ? dense_alone : experts_alone;
    };
    dense_.clear();
    expert_.clear();
    for (auto const& [grad, kind] : gradients_) {
      if (alone(kind)) continue;
      auto& bucket = kind == parameter_kind::dense ? dense_ : expert_;
      bucket.insert(bucket.end(), grad.data(), grad.data() + grad.size());
    }
    {
      request dense_sum, expert_sum;
      if (!dense_alone) dense_sum = all_reduce_sum_start(groups.tp_dp_cp(), std::span<T>(dense_));
      if (!experts_alone)
        expert_sum = all_reduce_sum_start(groups.expert_dp(), std::span<T>(expert_));
    }
    std::size_t at_dense = 0, at_expert = 0;
    for (auto& [grad, kind] : gradients_) {
      if (alone(kind)) {
        if (scale != 1.0)
          for (Eigen::Index i = 0; i < grad.size(); ++i)
            grad.data()[i] = static_cast<T>(grad.data()[i] * scale);
        continue;
      }
      bool const is_dense = kind == parameter_kind::dense;
      auto const& bucket = is_dense ? dense_ : expert_;
      std::size_t& at = is_dense ? at_dense : at_expert;
      for (Eigen::Index i = 0; i < grad.size(); ++i)
        grad.data()[i] = static_cast<T>(bucket[at + static_cast<std::size_t>(i)] * scale);
      at += static_cast<std::size_t>(grad.size());
    }
  }

 private:
  struct gradient {
    row_matrix_map<T> grad;
    parameter_kind kind;
  };
  std::vector<gradient> gradients_;
  std::vector<T> dense_, expert_;
};

/// The reduction of `models`' gradients, once (a training loop keeps a gradient_reduction).
template <has_parameters Model, has_parameters... Models>
void reduce_gradients(process_groups const& groups, Model& model, Models&... models) {
  gradient_reduction<typename Model::scalar>(model, models...)(groups);
}

}  // namespace megamoe::parallel
