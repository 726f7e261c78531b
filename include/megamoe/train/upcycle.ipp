// SPDX-License-Identifier: Apache-2.0
// megamoe/train/upcycle.ipp — the definitions behind upcycle.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/upcycle.hpp>

#include <cmath>
#include <regex>

namespace megamoe::train {

MEGAMOE_DECL std::optional<std::string> dense_parameter_name(std::string const& name) {
  static std::regex const expert(
      R"(^((?:decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.mlp\.)experts\.(linear_fc[12]\.(weight|bias))0$)");
  static std::regex const router(
      R"(^(?:decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.mlp\.router\.(weight|expert_bias)$)");
  std::smatch m;
  if (std::regex_match(name, m, expert)) return m[1].str() + m[2].str();
  if (std::regex_match(name, router)) return std::nullopt;
  return name;
}

MEGAMOE_DECL double upcycling_weight_scale(config_values const& v, int granularity) {
  int const experts = v.shape.experts, top_k = v.router ? v.router->top_k : 1;
  bool const pre_softmax =
      v.router && v.router->score == router::score_function::softmax_before_topk;
  double const a = pre_softmax ? static_cast<double>(experts) * granularity / top_k : granularity;
  bool const cube_root = v.expert.activation == expert::activation_function::swiglu ||
                         v.expert.activation == expert::activation_function::squared_relu;
  return cube_root ? std::cbrt(a) : std::sqrt(a);
}

namespace detail {

template <class Scalar>
int upcycle_parameters_of(parameter_list<Scalar>& parameters, config_values const& v,
                          int first_moe_layer, boost::mpi::communicator const& world,
                          std::filesystem::path const& file) {
  int granularity = 0;
  parallel::check_on_every_rank(world, [&] {
    auto const dense = io::read_safetensors(file);
    auto source = [&](std::string const& name) -> io::tensor_data const& {
      auto const it = dense.find(name);
      if (it == dense.end())
        throw input_error("upcycle: " + file.string() + " holds no " + name +
                          " (a dense model of the same shape, under the reference's names)");
      return it->second;
    };
    if (v.expert.bias)
      throw input_error("upcycle: expert linears with biases are not upcycled here");
    if (v.shape.shared_ffn > 0)
      throw input_error("upcycle: a model with shared experts is not upcycled here");
    if (first_moe_layer < 0) throw input_error("upcycle: the model has no MoE layer");
    bool const glu = expert::fc1_width(v.expert.activation, 1) == 2;
    std::int64_t const F = v.shape.ffn;
    // The granularity, from the first MoE layer's dense FFN.
    auto const& first_fc2 =
        source("decoder.layers." + std::to_string(first_moe_layer) + ".mlp.linear_fc2.weight");
    std::int64_t const first_dense_ffn = first_fc2.shape.back();
    if (first_dense_ffn % F != 0 || v.shape.experts % (first_dense_ffn / F) != 0)
      throw input_error("upcycle: the dense FFN's width " + std::to_string(first_dense_ffn) +
                        " is not g x the experts' " + std::to_string(F) + " for a g dividing the " +
                        std::to_string(v.shape.experts) + " experts");
    granularity = static_cast<int>(first_dense_ffn / F);
    std::int64_t const g = granularity, dense_ffn = g * F;
    double const w = upcycling_weight_scale(v, granularity);
    static std::regex const expert(
        R"(^((?:decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.mlp\.)experts\.linear_fc([12])\.weight(\d+)$)");
    static std::regex const router(
        R"(^(?:decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.mlp\.router\.weight$)");
    for (auto& p : parameters) {
      std::string const& name = p.name;
      row_matrix_map<Scalar> value = p.value;
      element_numbering const& n = p.numbering;
      std::smatch m;
      if (std::regex_match(name, m, expert)) {
        bool const fc1 = m[2].str() == "1";
        std::int64_t const e = std::stoll(m[3].str()), shard = e % g;
        auto const& d = source(m[1].str() + (fc1 ? "linear_fc1.weight" : "linear_fc2.weight"));
        std::int64_t const rows = fc1 ? (glu ? 2 : 1) * dense_ffn : v.shape.hidden;
        std::int64_t const cols = fc1 ? v.shape.hidden : dense_ffn;
        if (d.shape.size() != 2 || d.shape[0] != rows || d.shape[1] != cols)
          throw input_error("upcycle: " + file.string() + " holds " + name + "'s source with " +
                            "another shape than [" + std::to_string(rows) + ", " +
                            std::to_string(cols) + "]");
        for (Eigen::Index r = 0; r < value.rows(); ++r)
          for (Eigen::Index c = 0; c < value.cols(); ++c) {
            std::int64_t const R = n.row(r), C = n.col_offset + c;
            std::int64_t row = R, col = C;
            if (fc1)
              row = R < F ? shard * F + R : dense_ffn + shard * F + (R - F);
            else
              col = shard * F + C;
            value(r, c) = static_cast<Scalar>(
                w * static_cast<double>(d.values[static_cast<std::size_t>(row * cols + col)]));
          }
        continue;
      }
      if (std::regex_match(name, router)) {
        // Expert e uses row floor(e / g) of the fresh router (rows from the last: a source row
        // is never overwritten before it is read).
        for (Eigen::Index e = value.rows() - 1; e >= 0; --e) value.row(e) = value.row(e / g);
        continue;
      }
      // The rest is copied: this rank's elements (a TP shard's by its place in the whole).
      auto const& d = source(name);
      std::int64_t const whole = n.whole_rows(value.rows()) * n.global_cols;
      if (static_cast<std::int64_t>(d.values.size()) != whole)
        throw input_error("upcycle: " + file.string() + " holds " + name + " with " +
                          std::to_string(d.values.size()) + " values, this model's has " +
                          std::to_string(whole));
      for (Eigen::Index r = 0; r < value.rows(); ++r)
        for (Eigen::Index c = 0; c < value.cols(); ++c)
          value(r, c) = static_cast<Scalar>(d.values[static_cast<std::size_t>(n.global(r, c))]);
    }
  });
  return granularity;
}

MEGAMOE_DECL int upcycle_parameters(parameter_list<float>& parameters, config_values const& v,
                                    int first_moe_layer, boost::mpi::communicator const& world,
                                    std::filesystem::path const& file) {
  return upcycle_parameters_of(parameters, v, first_moe_layer, world, file);
}
MEGAMOE_DECL int upcycle_parameters(parameter_list<double>& parameters, config_values const& v,
                                    int first_moe_layer, boost::mpi::communicator const& world,
                                    std::filesystem::path const& file) {
  return upcycle_parameters_of(parameters, v, first_moe_layer, world, file);
}

}  // namespace detail

}  // namespace megamoe::train
