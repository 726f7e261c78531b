// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. The distributed optimizer against the one-rank optimizer: a model with dense
// parameters (the same on every rank) and expert parameters (E/EP experts per rank, the same on
// the ranks of an expert-DP group), with reduced gradients given as functions of (parameter,
// element). Checked on every rank for three steps:
//   - the global gradient norm equals the one computed here over every element once;
//   - the parameters equal a one-rank optimizer's given the same (globally clipped) gradients;
//   - this rank keeps moments for 1/(TPxDPxCP) of the dense and 1/EDP of its expert elements;
//   - with the expert weights of kind quantized_expert (their fp32 masters in the optimizer, the
//     model holding what the optimizer hands back after each step, as a layer holds codes), the
//     whole tensors handed back equal the one-rank optimizer's, and the masters kept here are
//     this rank's 1/EDP of the expert elements.
//
//   mpiexec -n 4 megamoe_optimizer_mpi --ep 2
#include "support/tally.hpp"

#include <megamoe/optim/adamw.hpp>
#include <megamoe/parallel/process_groups.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mo = megamoe::optim;

namespace {

constexpr int experts = 4, rows = 3, cols = 5;

double value_of(int parameter, int element) {
  return std::sin(0.3 * parameter + 0.17 * element);
}
double grad_of(int parameter, int element, int step) {
  return std::cos(0.7 * parameter - 0.11 * element + 0.5 * step);
}

/// Parameter 0: a dense matrix [7, 5]; 1: a norm [1, 5]; 2 + e: expert e's [3, 5].
struct toy_model {
  int first_expert, local;
  mm::parameter_kind expert_kind = mm::parameter_kind::expert;
  bool released = false;
  std::vector<mm::row_matrix<double>> values, grads;
  std::vector<int> ids;
  toy_model(int first, int count) : first_expert(first), local(count) {
    add(0, 7, cols);
    add(1, 1, cols);
    for (int e = 0; e < count; ++e) add(2 + first + e, rows, cols);
  }
  void add(int id, int r, int c) {
    mm::row_matrix<double> v(r, c);
    for (int i = 0; i < r * c; ++i) v.data()[i] = value_of(id, i);
    values.push_back(v);
    grads.push_back(mm::row_matrix<double>::Zero(r, c));
    ids.push_back(id);
  }
  void set_grads(int step, double scale = 1.0) {
    for (std::size_t p = 0; p < grads.size(); ++p)
      for (Eigen::Index i = 0; i < grads[p].size(); ++i)
        grads[p].data()[i] = scale * grad_of(ids[p], static_cast<int>(i), step);
  }
  template <class F>
  void for_each_parameter(F&& f) {
    for (std::size_t p = 0; p < values.size(); ++p)
      f(p == 0   ? "decoder.layers.0.mlp.linear_fc1.weight"
        : p == 1 ? "decoder.layers.0.input_layernorm.weight"
                 : "decoder.layers.0.mlp.experts.linear_fc1.weight",
        mm::row_matrix_map<double>(values[p].data(), p >= 2 && released ? 0 : values[p].rows(),
                                   values[p].cols()),
        mm::row_matrix_map<double>(grads[p].data(), grads[p].rows(), grads[p].cols()),
        p < 2 ? mm::parameter_kind::dense : expert_kind);
  }
};

/// The expert weights as quantized_expert: what the optimizer hands back lands in `values` (a
/// layer would quantize it), and their values are no longer shown once released.
struct toy_codes_model : toy_model {
  toy_codes_model(int first, int count) : toy_model(first, count) {
    expert_kind = mm::parameter_kind::quantized_expert;
  }
  void release_weight_values() {
    released = true;
    for (std::size_t p = 2; p < values.size(); ++p) values[p].setConstant(-1.0);
  }
  template <class F>
  void for_each_quantized_weight(F&& f) {
    for (std::size_t p = 2; p < values.size(); ++p)
      f("decoder.layers.0.mlp.experts.linear_fc1.weight",
        [&, p](double const* w) { std::copy_n(w, values[p].size(), values[p].data()); });
  }
};

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    mm::parallel::degrees d;
    mm::parallel::check_on_every_rank(env.world(), [&] {
      for (int i = 1; i + 1 < argc; i += 2) {
        if (std::string(argv[i]) != "--ep") throw mm::input_error("unknown argument");
        d.ep = std::stoi(argv[i + 1]);
      }
    });
    mm::parallel::process_groups const groups(env.world(), d);
    int const L = experts / groups.ep().size();
    toy_model sharded(groups.ep().rank() * L, L), local(groups.ep().rank() * L, L);
    toy_codes_model codes(groups.ep().rank() * L, L);
    mo::adamw_settings settings;
    settings.clip_grad = 2.0;
    mo::distributed_adamw<double> optimizer(groups, sharded, settings);
    mo::distributed_adamw<double> codes_optimizer(groups, codes, settings);
    mo::adamw_settings no_clip = settings;
    no_clip.clip_grad = 0.0;
    mo::distributed_adamw<double> reference(local, no_clip);
    mm::testing::tally result;
    result.against = "one rank";
    for (int step = 1; step <= 3; ++step) {
      // The norm over every element once: both dense parameters and all experts.
      double squares = 0.0;
      for (int id = 0; id < 2 + experts; ++id) {
        int const count = id == 0 ? 7 * cols : id == 1 ? cols : rows * cols;
        for (int i = 0; i < count; ++i) squares += std::pow(grad_of(id, i, step), 2);
      }
      double const norm = std::sqrt(squares);
      double const clip = norm > 2.0 ? 2.0 / (norm + 1e-6) : 1.0;
      sharded.set_grads(step);
      codes.set_grads(step);
      local.set_grads(step, clip);
      auto const report = optimizer.step(1e-2);
      auto const codes_report = codes_optimizer.step(1e-2, codes);
      reference.step(1e-2);
      result.close("grad norm with quantized experts step " + std::to_string(step),
                   codes_report.grad_norm, norm, norm, 1e-13);
      result.close("grad norm step " + std::to_string(step), report.grad_norm, norm, norm, 1e-13);
      for (std::size_t p = 0; p < sharded.values.size(); ++p)
        for (Eigen::Index i = 0; i < sharded.values[p].size(); ++i)
          result.close("parameter " + std::to_string(sharded.ids[p]), sharded.values[p].data()[i],
                       local.values[p].data()[i], 1.0, 1e-13);
      for (std::size_t p = 0; p < codes.values.size(); ++p)
        for (Eigen::Index i = 0; i < codes.values[p].size(); ++i)
          result.close("handed back " + std::to_string(codes.ids[p]), codes.values[p].data()[i],
                       local.values[p].data()[i], 1.0, 1e-13);
    }
    std::int64_t const dense = 8 * cols, expert = std::int64_t{L} * rows * cols;
    int const n = groups.tp_dp_cp().size(), edp = groups.expert_dp().size(),
              me = groups.tp_dp_cp().rank(), e_me = groups.expert_dp().rank();
    std::int64_t const expected =
        (dense * (me + 1) / n - dense * me / n) + (expert * (e_me + 1) / edp - expert * e_me / edp);
    result.close("state elements", static_cast<double>(optimizer.state_elements()),
                 static_cast<double>(expected), 1.0, 0.0);
    result.close("state elements with quantized experts",
                 static_cast<double>(codes_optimizer.state_elements()),
                 static_cast<double>(expected), 1.0, 0.0);
    double const master_shard =
        static_cast<double>(expert * (e_me + 1) / edp - expert * e_me / edp);
    result.close("master elements", static_cast<double>(codes_optimizer.master_bytes()) / 8.0,
                 master_shard, 1.0, 0.0);
    return result.finish(env.world(),
                         "distributed AdamW on " + std::to_string(env.world().size()) +
                             " ranks (dense over " + std::to_string(n) + ", experts over EDP " +
                             std::to_string(edp) + ")",
                         "all equal the one-rank optimizer");
  });
}
