// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/gradients.hpp — the data-parallel gradient reduction of a training step.
//
// Dense parameters (norms, router, shared expert, gate) are replicated over the attention grid and
// each rank saw only its own tokens (its sequence-parallel shard of its DP replica's micro-batch),
// so their gradients are summed over TP x DP x CP: the TP all-reduce of sequence-parallel weights
// and the DP x CP reduction in one. Expert parameters are summed over the expert data-parallel
// group, tensor-parallel shards over DP x CP (each TP rank holds other elements). All are then
// scaled by 1/(DP*CP), the reference's factor for every kind.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/process_groups.hpp>

#include <array>
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
  /// all-reduce per kind (dense over TP x DP x CP, expert over EDP, tensor-parallel shards over
  /// DP x CP), all in flight together; a kind whose group is this rank alone is only scaled, in
  /// place (not at all by 1).
  void operator()(process_groups const& groups);

 private:
  struct gradient {
    row_matrix_map<T> grad;
    parameter_kind kind;
  };
  /// Dense, expert, tensor-parallel (a quantized kind as the kind it is reduced as).
  static std::size_t bucket_of(parameter_kind kind) noexcept {
    switch (reduced_as(kind)) {
      case parameter_kind::dense: return 0;
      case parameter_kind::tensor_parallel: return 2;
      default: return 1;
    }
  }
  std::vector<gradient> gradients_;
  std::array<std::vector<T>, 3> buckets_;
};

/// The reduction of `models`' gradients, once (a training loop keeps a gradient_reduction).
template <has_parameters Model, has_parameters... Models>
void reduce_gradients(process_groups const& groups, Model& model, Models&... models) {
  gradient_reduction<typename Model::scalar>(model, models...)(groups);
}

// Defined outside the class, the reduction is not inline: a program built with
// MEGAMOE_SEPARATE_COMPILATION compiles it once for float and double (parallel/gradients.ipp).
template <class T>
void gradient_reduction<T>::operator()(process_groups const& groups) {
  auto const& l = groups.layout();
  double const scale = 1.0 / (static_cast<double>(l.dp) * l.cp);
  std::array<boost::mpi::communicator const*, 3> const group{&groups.tp_dp_cp(),
                                                             &groups.expert_dp(), &groups.dp_cp()};
  std::array<bool, 3> alone{};
  for (std::size_t b = 0; b < group.size(); ++b) alone[b] = group[b]->size() == 1;
  if (alone[0] && alone[1] && alone[2] && scale == 1.0) return;
  for (auto& bucket : buckets_) bucket.clear();
  for (auto const& [grad, kind] : gradients_) {
    std::size_t const b = bucket_of(kind);
    if (alone[b]) continue;
    buckets_[b].insert(buckets_[b].end(), grad.data(), grad.data() + grad.size());
  }
  {
    std::array<request, 3> sums;
    for (std::size_t b = 0; b < group.size(); ++b)
      if (!alone[b]) sums[b] = all_reduce_sum_start(*group[b], std::span<T>(buckets_[b]));
  }
  std::array<std::size_t, 3> at{};
  for (auto& [grad, kind] : gradients_) {
    std::size_t const b = bucket_of(kind);
    if (alone[b]) {
      if (scale != 1.0)
        for (Eigen::Index i = 0; i < grad.size(); ++i)
          grad.data()[i] = static_cast<T>(grad.data()[i] * scale);
      continue;
    }
    for (Eigen::Index i = 0; i < grad.size(); ++i)
      grad.data()[i] = static_cast<T>(buckets_[b][at[b] + static_cast<std::size_t>(i)] * scale);
    at[b] += static_cast<std::size_t>(grad.size());
  }
}

#if !MEGAMOE_HEADER_ONLY
extern template class gradient_reduction<float>;
extern template class gradient_reduction<double>;
#endif

}  // namespace megamoe::parallel

#if MEGAMOE_HEADER_ONLY
#include <megamoe/parallel/gradients.ipp>
#endif
