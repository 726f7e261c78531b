// SPDX-License-Identifier: Apache-2.0
// megamoe/train/upcycle.hpp — an MoE model started from a dense one (the reference's
// upcycling_utils.py), on any layout.
//
// The dense model's weights come from a safetensors file under the reference's names
// (megamoe-train's model.safetensors of a dense model): every parameter the MoE model shares with
// it is copied; at each MoE layer, expert e takes the dense FFN's shard (e mod g) for granularity g
// = dense FFN width / expert width: fc1's rows split in g (for SwiGLU the gate and linear halves
// separately, then paired), fc2's columns split in g, both multiplied by w = a^(1/3) for SwiGLU and
// squared ReLU, a^(1/2) otherwise, with a = E g / k under softmax before top-k and a = g otherwise.
// The router keeps its fresh initialisation but expert e uses row floor(e / g) of it. With g = 1
// every expert is the dense FFN, so where the top-k probabilities sum to one the upcycled model's
// first forward is the dense model's.
//
// A dense model here is one whose FFN at each MoE position is a plain SwiGLU FFN: a decoder without
// MoE layers there, or (megamoe-train's `dense` preset) one expert with top-1 routing, whose
// probability is exactly 1; dense_parameter_name() gives such an expert's weights their dense
// names.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/io/safetensors.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/parallel/environment.hpp>

#include <boost/mpi/communicator.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <type_traits>

namespace megamoe::train {

/// The reference's dense name of a one-expert MoE layer's parameter (`...mlp.experts.linear_fc1.
/// weight0` -> `...mlp.linear_fc1.weight`); nullopt for its router weight, which a dense model
/// has not; the name itself otherwise.
MEGAMOE_DECL std::optional<std::string> dense_parameter_name(std::string const& name);

/// The reference's upcycling scale of fc1 and fc2 (see above).
MEGAMOE_DECL double upcycling_weight_scale(config_values const& v, int granularity);

/// Makes `model` (initialised, no optimizer built yet) the upcycled MoE of the dense model in
/// `file`, collectively over `world` (every rank reads the file). Returns the granularity g.
template <class Config>
int upcycle(transformer<Config>& model, boost::mpi::communicator const& world,
            std::filesystem::path const& file) {
  using scalar = typename transformer<Config>::scalar;
  auto const& v = model.values();
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
    bool const glu = expert::fc1_width(v.expert.activation, 1) == 2;
    std::int64_t const F = v.shape.ffn;
    // The granularity, from the first MoE layer's dense FFN.
    for (int i = 0; i < model.layers() && granularity == 0; ++i)
      if (model.is_moe(i)) {
        auto const& fc2 = source("decoder.layers." + std::to_string(i) + ".mlp.linear_fc2.weight");
        std::int64_t const dense_ffn = fc2.shape.back();
        if (dense_ffn % F != 0 || v.shape.experts % (dense_ffn / F) != 0)
          throw input_error("upcycle: the dense FFN's width " + std::to_string(dense_ffn) +
                            " is not g x the experts' " + std::to_string(F) +
                            " for a g dividing the " + std::to_string(v.shape.experts) +
                            " experts");
        granularity = static_cast<int>(dense_ffn / F);
      }
    if (granularity == 0) throw input_error("upcycle: the model has no MoE layer");
    std::int64_t const g = granularity, dense_ffn = g * F;
    double const w = upcycling_weight_scale(v, granularity);
    static std::regex const expert(
        R"(^((?:decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.mlp\.)experts\.linear_fc([12])\.weight(\d+)$)");
    static std::regex const router(
        R"(^(?:decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.mlp\.router\.weight$)");
    model.for_each_numbered_parameter([&](std::string_view view, row_matrix_map<scalar> value,
                                          row_matrix_map<scalar>, parameter_kind,
                                          element_numbering const& n) {
      std::string const name(view);
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
            value(r, c) = static_cast<scalar>(
                w * static_cast<double>(d.values[static_cast<std::size_t>(row * cols + col)]));
          }
        return;
      }
      if (std::regex_match(name, router)) {
        // Expert e uses row floor(e / g) of the fresh router (rows from the last: a source row
        // is never overwritten before it is read).
        for (Eigen::Index e = value.rows() - 1; e >= 0; --e) value.row(e) = value.row(e / g);
        return;
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
          value(r, c) = static_cast<scalar>(d.values[static_cast<std::size_t>(n.global(r, c))]);
    });
  });
  if constexpr (transformer<Config>::quantized_weights) model.refresh_weight_codes();
  return granularity;
}

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/upcycle.ipp>
#endif
