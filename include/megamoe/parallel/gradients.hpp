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

/// Collective over the world's stage: every rank must call it with the same models in the same
/// order. One all-reduce per kind per model, both in flight together.
template <has_parameters... Models>
void reduce_gradients(process_groups const& groups, Models&... models) {
  auto const& l = groups.layout();
  double const scale = 1.0 / (static_cast<double>(l.dp) * l.cp);
  bool const dense_alone = groups.tp_dp_cp().size() == 1,
             experts_alone = groups.expert_dp().size() == 1;
  auto one = [&](auto& model) {
    using scalar = typename std::remove_reference_t<decltype(model)>::scalar;
    // A kind whose group is this rank alone is only scaled, in place (not at all by 1).
    auto alone = [&](parameter_kind kind) {
      return kind == parameter_kind::dense ? dense_alone : experts_alone;
    };
    std::vector<scalar> dense, expert;
    model.for_each_parameter([&](std::string_view, auto, auto grad, parameter_kind kind) {
      if (alone(kind)) return;
      auto& bucket = kind == parameter_kind::dense ? dense : expert;
      bucket.insert(bucket.end(), grad.data(), grad.data() + grad.size());
    });
    {
      request dense_sum, expert_sum;
      if (!dense_alone)
        dense_sum = all_reduce_sum_start(groups.tp_dp_cp(), std::span<scalar>(dense));
      if (!experts_alone)
        expert_sum = all_reduce_sum_start(groups.expert_dp(), std::span<scalar>(expert));
    }
    std::size_t at_dense = 0, at_expert = 0;
    model.for_each_parameter([&](std::string_view, auto, auto grad, parameter_kind kind) {
      if (alone(kind)) {
        if (scale != 1.0)
          for (Eigen::Index i = 0; i < grad.size(); ++i)
            grad.data()[i] = static_cast<scalar>(grad.data()[i] * scale);
        return;
      }
      bool const is_dense = kind == parameter_kind::dense;
      auto const& bucket = is_dense ? dense : expert;
      std::size_t& at = is_dense ? at_dense : at_expert;
      for (Eigen::Index i = 0; i < grad.size(); ++i)
        grad.data()[i] = static_cast<scalar>(bucket[at + static_cast<std::size_t>(i)] * scale);
      at += static_cast<std::size_t>(grad.size());
    });
  };
  (one(models), ...);
}

}  // namespace megamoe::parallel
