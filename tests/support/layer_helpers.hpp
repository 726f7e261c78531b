// SPDX-License-Identifier: Apache-2.0
// Helpers of the layer tests: random matrices, conversions to the plain reference's form, errors.
#pragma once

#include "reference/moe_reference.hpp"

#include <megamoe/core/parameter.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

namespace megamoe::testing {

namespace mm = megamoe;
namespace ref = megamoe::reference;

template <class T>
mm::row_matrix<T> random_matrix(int rows, int cols, std::uint64_t seed, double scale = 1.0) {
  mm::row_matrix<T> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = static_cast<T>(scale * mm::standard_normal(seed, static_cast<std::uint64_t>(i)));
  return m;
}

template <class M>
ref::mat to_mat(M const& m) {
  ref::mat out(static_cast<std::size_t>(m.rows()), ref::vec(static_cast<std::size_t>(m.cols())));
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c)
      out[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)] = static_cast<double>(m(r, c));
  return out;
}

/// max |a - b| / max |b| over a tensor (b the reference).
template <class M>
double relative_error(M const& a, ref::mat const& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t r = 0; r < b.size(); ++r)
    for (std::size_t c = 0; c < b[r].size(); ++c) {
      diff = std::max(diff, std::abs(static_cast<double>(a(static_cast<Eigen::Index>(r),
                                                           static_cast<Eigen::Index>(c))) -
                                     b[r][c]));
      scale = std::max(scale, std::abs(b[r][c]));
    }
  return diff / std::max(scale, 1e-30);
}

/// The parameter's index after a name prefix ("...weight3" -> 3).
inline int trailing_index(std::string_view name, std::string_view prefix) {
  return std::stoi(std::string(name.substr(name.find(prefix) + prefix.size())));
}

/// Copies the layer's weights into the reference's form, by the reference's parameter names.
template <class Layer>
ref::moe_weights weights_of(Layer& layer) {
  ref::moe_weights w;
  w.activation = Layer::activation;
  int const E = layer.num_experts();
  w.fc1.resize(static_cast<std::size_t>(E));
  w.fc2.resize(static_cast<std::size_t>(E));
  layer.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    auto const m = to_mat(value);
    if (name.ends_with("router.weight")) w.router = m;
    if (name.find("experts.linear_fc1.weight") != std::string_view::npos &&
        name.find("shared") == std::string_view::npos)
      w.fc1[static_cast<std::size_t>(trailing_index(name, "linear_fc1.weight"))] = m;
    if (name.find("experts.linear_fc2.weight") != std::string_view::npos &&
        name.find("shared") == std::string_view::npos)
      w.fc2[static_cast<std::size_t>(trailing_index(name, "linear_fc2.weight"))] = m;
    if (name.find("linear_fc1.bias") != std::string_view::npos) {
      w.fc1_bias.resize(static_cast<std::size_t>(E));
      w.fc1_bias[static_cast<std::size_t>(trailing_index(name, "linear_fc1.bias"))] = m[0];
    }
    if (name.find("linear_fc2.bias") != std::string_view::npos) {
      w.fc2_bias.resize(static_cast<std::size_t>(E));
      w.fc2_bias[static_cast<std::size_t>(trailing_index(name, "linear_fc2.bias"))] = m[0];
    }
    if (name.ends_with("shared_experts.linear_fc1.weight")) w.shared_fc1 = m;
    if (name.ends_with("shared_experts.linear_fc2.weight")) w.shared_fc2 = m;
    if (name.ends_with("shared_experts.gate_weight")) w.gate = m[0];
  });
  return w;
}

/// ||a - b|| / ||b|| (Frobenius) over a tensor (b the reference).
template <class M>
double relative_l2_error(M const& a, ref::mat const& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t r = 0; r < b.size(); ++r)
    for (std::size_t c = 0; c < b[r].size(); ++c) {
      double const d =
          static_cast<double>(a(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c))) -
          b[r][c];
      diff += d * d;
      norm += b[r][c] * b[r][c];
    }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

}  // namespace megamoe::testing
