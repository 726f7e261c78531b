// SPDX-License-Identifier: Apache-2.0
// The MoE layer against the plain reference (tests/reference/moe_reference.hpp), by finite
// differences in double through the whole layer, across backends, activations, router kinds and
// memory policies; its parameter names; and that a step allocates nothing after the first.
#include "reference/moe_reference.hpp"
#include "support/allocation_counter.hpp"
#include "support/layer_helpers.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/expert/tensor_gemm.hpp>
#include <megamoe/model/moe_layer.hpp>

#include <gtest/gtest.h>

#include <iostream>
#include <limits>
#include <utility>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace mm = megamoe;
namespace ref = megamoe::reference;

namespace {

using mm::dispatch::local;
namespace ex = mm::expert;
namespace rt = mm::router;
namespace mem = mm::memory;

using mm::testing::random_matrix;
using mm::testing::relative_error;
using mm::testing::to_mat;
using mm::testing::trailing_index;
using mm::testing::weights_of;

/// The reference gradient of a parameter by its name.
ref::mat reference_gradient(std::string_view name, ref::moe_gradients const& g) {
  auto index = [&](std::string_view prefix) {
    return static_cast<std::size_t>(trailing_index(name, prefix));
  };
  if (name.ends_with("router.weight")) return g.router;
  if (name.ends_with("shared_experts.linear_fc1.weight")) return g.shared_fc1;
  if (name.ends_with("shared_experts.linear_fc2.weight")) return g.shared_fc2;
  if (name.ends_with("shared_experts.gate_weight")) return {g.gate};
  if (name.find("linear_fc1.weight") != std::string_view::npos)
    return g.fc1[index("linear_fc1.weight")];
  if (name.find("linear_fc2.weight") != std::string_view::npos)
    return g.fc2[index("linear_fc2.weight")];
  if (name.find("linear_fc1.bias") != std::string_view::npos)
    return {g.fc1_bias[index("linear_fc1.bias")]};
  if (name.find("linear_fc2.bias") != std::string_view::npos)
    return {g.fc2_bias[index("linear_fc2.bias")]};
  ADD_FAILURE() << "no reference gradient for " << name;
  return {};
}

void add_into(ref::mat& total, ref::mat const& part) {
  if (total.empty()) {
    total = part;
    return;
  }
  for (std::size_t r = 0; r < part.size(); ++r)
    for (std::size_t c = 0; c < part[r].size(); ++c) total[r][c] += part[r][c];
}

struct case_setup {
  int seq_length = 6, micro_batch_size = 2;
  int micro_batches = 2;
  double weight_std = 0.5;
  /// Routes every token to expert 0 first (k = 1: the other experts get no token).
  bool one_expert_takes_all = false;
  double loss_scale = 0.7;
};

/// Runs `micro_batches` forward + backward steps and compares the output, dx and every accumulated
/// weight gradient with the plain reference; `tolerance` bounds each relative error.
template <class Config>
void expect_matches_reference(double tolerance, case_setup const& setup = {}) {
  using layer_type = mm::moe_layer<Config>;
  using T = typename layer_type::scalar;
  mm::context ctx(2);
  layer_type layer(1);
  layer.initialize(11, setup.weight_std);
  int const H = layer.hidden_size(), S = setup.seq_length, B = setup.micro_batch_size, N = S * B;
  std::uint64_t seed = 100;
  // Biases start at 0 in the reference's initialisation; give them values to check their paths.
  layer.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    if (name.find(".bias") != std::string_view::npos)
      value = random_matrix<T>(static_cast<int>(value.rows()), static_cast<int>(value.cols()),
                               ++seed, 0.3);
  });
  if (setup.one_expert_takes_all)
    layer.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
      if (name.ends_with("router.weight")) value(0, 0) = T(8);
    });
  auto const weights = weights_of(layer);
  ctx.step.loss_backward_scale = setup.loss_scale;
  layer.zero_grad();
  std::map<std::string, ref::mat, std::less<>> expected;
  for (int step = 0; step < setup.micro_batches; ++step) {
    auto x = random_matrix<T>(N, H, 1000 + step);
    if (setup.one_expert_takes_all) x.col(0).setConstant(T(2));
    auto const dy = random_matrix<T>(N, H, 2000 + step);
    auto const out = layer.forward(ctx, x, S, B);
    mm::row_matrix<T> const y = out.y;
    mm::row_matrix<T> const dx = layer.backward(ctx, dy);
    auto const want = ref::moe_forward_backward(weights, layer.router().config(),
                                                layer.router().state().expert_bias, to_mat(x),
                                                to_mat(dy), B, setup.loss_scale);
    EXPECT_LT(relative_error(y, want.y), tolerance) << "output, micro-batch " << step;
    EXPECT_LT(relative_error(dx, want.grad.x), tolerance) << "dx, micro-batch " << step;
    auto const& map = layer.router().output().routing_map;
    for (int t = 0; t < N; ++t)
      for (int e = 0; e < layer.num_experts(); ++e)
        ASSERT_EQ(map(t, e),
                  want.routing.map[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)])
            << "routing of token " << t;
    if (setup.one_expert_takes_all) {
      EXPECT_EQ(layer.permutation().tokens_per_expert[0], N);
    }
    layer.for_each_parameter([&](std::string_view name, auto, auto, mm::parameter_kind) {
      add_into(expected[std::string(name)], reference_gradient(name, want.grad));
    });
  }
  int checked = 0;
  layer.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
    ++checked;
    EXPECT_LT(relative_error(grad, expected.find(name)->second), tolerance) << name;
  });
  EXPECT_EQ(checked, static_cast<int>(expected.size()));
}

template <class... P>
using config = mm::make_config<P...>;
using small_shape = mm::shape<mm::hidden<12>, mm::ffn<10>, mm::experts<4>>;
using shared_shape = mm::shape<mm::hidden<12>, mm::ffn<10>, mm::experts<4>, mm::shared_ffn<7>>;
using wide_shape = mm::shape<mm::hidden<10>, mm::ffn<6>, mm::experts<8>, mm::shared_ffn<5>>;

// Pairs of (backend, activation, router kind, memory policy, extras), not the full product.
using swiglu_grouped_aux_z_shared_gate =
    config<shared_shape, rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>, local,
           ex::mlp<ex::swiglu, ex::grouped, ex::shared_expert_gate>, mm::precision::fp64>;
using gelu_per_expert_bias_sigmoid_groups_moe_act =
    config<wide_shape, rt::aux_loss_free<4, rt::group_limit<4, 2>, rt::seq_aux_loss<1e-3>>, local,
           ex::mlp<ex::gelu, ex::per_expert, ex::with_bias>, mm::precision::fp64,
           mem::recompute<mem::moe_act>>;
using squared_relu_tensor_presoftmax_whole_layer =
    config<shared_shape, rt::top_k<1, rt::softmax_before_topk, rt::aux_loss<1e-2>>, local,
           ex::mlp<ex::squared_relu, ex::tensor_contraction>, mm::precision::fp64,
           mem::recompute<mem::moe_layer>>;
using swiglu_tensor_drop_and_pad =
    config<small_shape, rt::top_k<2, rt::capacity<1.0>, rt::pad_to_capacity, rt::aux_loss<1e-2>>,
           local, ex::mlp<ex::swiglu, ex::tensor_contraction, ex::with_bias>, mm::precision::fp64>;
using gelu_grouped_dropping_recompute_shared =
    config<wide_shape, rt::top_k<2, rt::capacity<0.5, rt::drop_position>, rt::z_loss<1e-2>>, local,
           ex::mlp<ex::gelu, ex::grouped, ex::shared_expert_gate>, mm::precision::fp64,
           mem::recompute<mem::moe_act, mem::shared_experts>>;
using squared_relu_per_expert_sqrtsoftplus_bias =
    config<small_shape, rt::top_k<2, rt::sqrtsoftplus, rt::expert_bias<>, rt::aux_loss<1e-2>>,
           local, ex::mlp<ex::squared_relu, ex::per_expert>, mm::precision::fp64>;
using one_expert_takes_all = config<small_shape, rt::top_k<1, rt::softmax_before_topk>, local,
                                    ex::mlp<ex::swiglu, ex::grouped>, mm::precision::fp64>;
using float_swiglu_grouped = config<shared_shape, rt::top_k<2, rt::aux_loss<1e-2>>, local,
                                    ex::mlp<ex::swiglu, ex::grouped, ex::shared_expert_gate>>;
using float_gelu_per_expert =
    config<wide_shape, rt::top_k<2>, local, ex::mlp<ex::gelu, ex::per_expert, ex::with_bias>>;
using float_squared_relu_tensor = config<small_shape, rt::top_k<2, rt::z_loss<1e-3>>, local,
                                         ex::mlp<ex::squared_relu, ex::tensor_contraction>,
                                         mm::memory::recompute<mem::moe_layer>>;

TEST(MoeLayerReference, SwigluGroupedAuxAndZLossSharedGate) {
  expect_matches_reference<swiglu_grouped_aux_z_shared_gate>(1e-7);
}
TEST(MoeLayerReference, GeluPerExpertBiasSigmoidGroupsRecomputeAct) {
  expect_matches_reference<gelu_per_expert_bias_sigmoid_groups_moe_act>(1e-7);
}
TEST(MoeLayerReference, SquaredReluTensorPreSoftmaxRecomputeLayer) {
  expect_matches_reference<squared_relu_tensor_presoftmax_whole_layer>(1e-7);
}
TEST(MoeLayerReference, SwigluTensorDropAndPad) {
  expect_matches_reference<swiglu_tensor_drop_and_pad>(1e-7);
}
TEST(MoeLayerReference, GeluGroupedDroppingRecomputeShared) {
  expect_matches_reference<gelu_grouped_dropping_recompute_shared>(1e-7);
}
TEST(MoeLayerReference, SquaredReluPerExpertSqrtSoftplusExpertBias) {
  expect_matches_reference<squared_relu_per_expert_sqrtsoftplus_bias>(1e-7);
}
TEST(MoeLayerReference, OneExpertTakesEveryTokenOthersNone) {
  // The router's softmax saturates here, so its gradient is tiny and the reference's central
  // differences carry relatively more rounding: a looser bound for this case.
  expect_matches_reference<one_expert_takes_all>(1e-5, {.one_expert_takes_all = true});
}
TEST(MoeLayerReference, FloatSwigluGrouped) {
  expect_matches_reference<float_swiglu_grouped>(1e-4);
}
TEST(MoeLayerReference, FloatGeluPerExpert) {
  expect_matches_reference<float_gelu_per_expert>(1e-4);
}
TEST(MoeLayerReference, FloatSquaredReluTensorRecomputeLayer) {
  expect_matches_reference<float_squared_relu_tensor>(1e-4);
}

// ---------------------------------------------------------------------------------------------
// Finite differences in double through the whole layer: J = sum(y .* R) + scale * attached losses.

template <class Config>
void expect_gradients_match_finite_differences() {
  using layer_type = mm::moe_layer<Config>;
  mm::context ctx(2);
  layer_type layer(0);
  layer.initialize(5, 0.5);
  std::uint64_t seed = 300;
  layer.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    if (name.find(".bias") != std::string_view::npos)
      value = random_matrix<double>(static_cast<int>(value.rows()), static_cast<int>(value.cols()),
                                    ++seed, 0.3);
  });
  int const S = 5, B = 2, H = layer.hidden_size();
  auto x = random_matrix<double>(S * B, H, 41);
  auto const R = random_matrix<double>(S * B, H, 42);
  double const scale = 0.9;
  ctx.step.loss_backward_scale = scale;
  auto const state = layer.router().state();
  auto objective = [&] {
    layer.router().state() = state;  // counts must not drift between evaluations
    auto const out = layer.forward(ctx, x, S, B);
    double j = out.y.cwiseProduct(R).sum();
    for (auto const& l : {out.losses.aux_loss, out.losses.seq_aux_loss, out.losses.global_aux_loss,
                          out.losses.z_loss})
      if (l) j += scale * l->value;
    return j;
  };
  layer.zero_grad();
  objective();
  mm::row_matrix<double> const dx = layer.backward(ctx, R);
  double const h = 1e-5;
  int checked = 0;
  auto expect_entry = [&](double& entry, double analytic, std::string const& what) {
    double const kept = entry;
    entry = kept + h;
    double const up = objective();
    entry = kept - h;
    double const down = objective();
    entry = kept;
    double const numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic, numeric, 1e-6 * (1.0 + std::abs(numeric))) << what;
    ++checked;
  };
  for (int i = 0; i < 6; ++i) {
    int const t = (7 * i + 3) % (S * B), c = (5 * i + 1) % H;
    expect_entry(x(t, c), dx(t, c), "dx(" + std::to_string(t) + ", " + std::to_string(c) + ")");
  }
  layer.for_each_parameter([&](std::string_view name, auto value, auto grad, mm::parameter_kind) {
    mm::row_matrix<double> const g = grad;  // the entry loop below runs forwards, not backwards
    for (int i = 0; i < 3; ++i) {
      Eigen::Index const at = (37 * i + 11) % value.size();
      expect_entry(value.data()[at], g.data()[at],
                   std::string(name) + "[" + std::to_string(at) + "]");
    }
  });
  EXPECT_GT(checked, 20);
}

TEST(MoeLayerGradient, SwigluGroupedAuxZSharedGate) {
  expect_gradients_match_finite_differences<swiglu_grouped_aux_z_shared_gate>();
}
TEST(MoeLayerGradient, GeluPerExpertBiasSigmoidGroupsRecomputeAct) {
  expect_gradients_match_finite_differences<gelu_per_expert_bias_sigmoid_groups_moe_act>();
}
TEST(MoeLayerGradient, SquaredReluTensorPreSoftmaxRecomputeLayer) {
  expect_gradients_match_finite_differences<squared_relu_tensor_presoftmax_whole_layer>();
}
TEST(MoeLayerGradient, SwigluTensorDropAndPadWithBias) {
  expect_gradients_match_finite_differences<swiglu_tensor_drop_and_pad>();
}

// ---------------------------------------------------------------------------------------------
// A step allocates nothing once the first has grown the buffers.

/// Heap allocations of each of three steps after two warm-up steps, and the bytes still held after
/// them minus those held before.
struct step_allocations {
  std::vector<std::uint64_t> calls;
  long long retained_bytes = 0;
};

template <class Config>
step_allocations allocations_in_later_steps() {
  using layer_type = mm::moe_layer<Config>;
  using T = typename layer_type::scalar;
  mm::context ctx(2);
  layer_type layer(0);
  layer.initialize(3);
  int const S = 32, B = 2, H = layer.hidden_size();
  auto const x = random_matrix<T>(S * B, H, 1);
  auto const dy = random_matrix<T>(S * B, H, 2);
  auto step = [&] {
    auto const out = layer.forward(ctx, x, S, B);
    auto const dx = layer.backward(ctx, dy);
    return out.y(0, 0) + dx(0, 0);
  };
  step();
  step();
  step_allocations result;
  result.calls.reserve(3);
  auto const start = mm::testing::allocations();
  for (int i = 0; i < 3; ++i) {
    auto const before = mm::testing::allocations();
    step();
    result.calls.push_back(mm::testing::allocations().calls - before.calls);
  }
  result.retained_bytes = static_cast<long long>(mm::testing::allocations().live_bytes) -
                          static_cast<long long>(start.live_bytes);
  return result;
}

using allocation_grouped =
    config<mm::shape<mm::hidden<64>, mm::ffn<48>, mm::experts<8>, mm::shared_ffn<32>>,
           rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>, local,
           ex::mlp<ex::swiglu, ex::grouped, ex::shared_expert_gate>>;
using allocation_per_expert_recompute =
    config<mm::shape<mm::hidden<64>, mm::ffn<48>, mm::experts<8>>,
           rt::aux_loss_free<2, rt::seq_aux_loss<1e-3>>, local,
           ex::mlp<ex::gelu, ex::per_expert, ex::with_bias>, mem::recompute<mem::moe_layer>>;
using allocation_tensor = config<mm::shape<mm::hidden<64>, mm::ffn<48>, mm::experts<8>>,
                                 rt::top_k<2>, local, ex::mlp<ex::swiglu, ex::tensor_contraction>>;

TEST(MoeLayerAllocations, GroupedBackendStepAllocatesNothing) {
  auto const a = allocations_in_later_steps<allocation_grouped>();
  EXPECT_EQ(a.calls, (std::vector<std::uint64_t>{0, 0, 0}));
  EXPECT_EQ(a.retained_bytes, 0);
}
TEST(MoeLayerAllocations, PerExpertBackendWithRecomputationAllocatesNothing) {
  auto const a = allocations_in_later_steps<allocation_per_expert_recompute>();
  EXPECT_EQ(a.calls, (std::vector<std::uint64_t>{0, 0, 0}));
  EXPECT_EQ(a.retained_bytes, 0);
}
// Eigen's threaded Tensor contraction allocates its own bookkeeping and packing memory on every
// call; the layer around it does not. What can be checked: every step allocates the same amount and
// gives it all back.
TEST(MoeLayerAllocations, TensorBackendAllocatesTheSameEveryStepAndKeepsNothing) {
  auto const a = allocations_in_later_steps<allocation_tensor>();
  std::cout << "tensor backend: " << a.calls[0] << " allocations per step (inside Eigen's "
            << "contraction)\n";
  EXPECT_GT(a.calls[0], 0u);
  EXPECT_EQ(a.calls[1], a.calls[0]);
  EXPECT_EQ(a.calls[2], a.calls[0]);
  EXPECT_EQ(a.retained_bytes, 0);
}

// ---------------------------------------------------------------------------------------------
// Names, kinds, saved bytes per memory policy, errors and eval.

TEST(MoeLayerParameters, NamesShapesAndKindsFollowTheReference) {
  mm::moe_layer<gelu_per_expert_bias_sigmoid_groups_moe_act> routed(7);
  std::vector<std::string> names;
  routed.for_each_parameter(
      [&](std::string_view name, auto value, auto grad, mm::parameter_kind kind) {
        names.emplace_back(name);
        EXPECT_EQ(value.rows(), grad.rows()) << name;
        EXPECT_EQ(value.cols(), grad.cols()) << name;
        bool const expert = name.find(".experts.") != std::string_view::npos;
        EXPECT_EQ(kind, expert ? mm::parameter_kind::expert : mm::parameter_kind::dense) << name;
      });
  ASSERT_EQ(names.size(), 1u + 4 * 8 + 2);  // router, 4 kinds x 8 experts, shared fc1 and fc2
  EXPECT_EQ(names[0], "decoder.layers.7.mlp.router.weight");
  EXPECT_EQ(names[1], "decoder.layers.7.mlp.experts.linear_fc1.weight0");
  EXPECT_EQ(names[9], "decoder.layers.7.mlp.experts.linear_fc2.weight0");
  EXPECT_EQ(names[17], "decoder.layers.7.mlp.experts.linear_fc1.bias0");
  EXPECT_EQ(names[32], "decoder.layers.7.mlp.experts.linear_fc2.bias7");
  EXPECT_EQ(names[33], "decoder.layers.7.mlp.shared_experts.linear_fc1.weight");

  mm::moe_layer<swiglu_grouped_aux_z_shared_gate> shared(0);
  std::vector<std::pair<std::string, std::pair<long, long>>> shapes;
  shared.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    shapes.push_back(
        {std::string(name), {static_cast<long>(value.rows()), static_cast<long>(value.cols())}});
  });
  ASSERT_EQ(shapes.size(), 1u + 2 * 4 + 3);
  EXPECT_EQ(shapes[0].second, (std::pair<long, long>{4, 12}));
  EXPECT_EQ(shapes[1].second, (std::pair<long, long>{20, 12}));  // [2F, H] for SwiGLU
  EXPECT_EQ(shapes[5].second, (std::pair<long, long>{12, 10}));  // [H, F]
  EXPECT_EQ(shapes[9].first, "decoder.layers.0.mlp.shared_experts.linear_fc1.weight");
  EXPECT_EQ(shapes[9].second, (std::pair<long, long>{14, 12}));
  EXPECT_EQ(shapes[10].first, "decoder.layers.0.mlp.shared_experts.linear_fc2.weight");
  EXPECT_EQ(shapes[11].first, "decoder.layers.0.mlp.shared_experts.gate_weight");
  EXPECT_EQ(shapes[11].second, (std::pair<long, long>{1, 12}));
}

template <class Memory>
using policy_config = config<mm::shape<mm::hidden<16>, mm::ffn<24>, mm::experts<4>>, rt::top_k<2>,
                             local, ex::mlp<ex::swiglu, ex::grouped>, Memory>;

template <class Config>
std::size_t saved_bytes_after_forward(int S, int B) {
  mm::context ctx(1);
  mm::moe_layer<Config> layer(0);
  layer.initialize(9);
  layer.forward(ctx, random_matrix<float>(S * B, 16, 3), S, B);
  return layer.saved_activation_bytes();
}

TEST(MoeLayerMemory, SavedBytesFollowThePolicy) {
  int const S = 10, B = 3, T = S * B, N = T * 2, H = 16, F = 24;
  auto const keep = saved_bytes_after_forward<policy_config<mem::keep_all>>(S, B);
  auto const act = saved_bytes_after_forward<policy_config<mem::recompute<mem::moe_act>>>(S, B);
  auto const layer = saved_bytes_after_forward<policy_config<mem::recompute<mem::moe_layer>>>(S, B);
  // moe_act drops the activation [N, F]; moe_layer keeps only the input [T, H].
  EXPECT_EQ(keep - act, std::size_t(N) * F * sizeof(float));
  EXPECT_EQ(layer, std::size_t(T) * H * sizeof(float));
  // keep_all: input, rows [N,H], fc1 [N,2F], act [N,F], probs [N], and the routing bookkeeping.
  std::size_t const activations = (std::size_t(T) * H + std::size_t(N) * (H + 2 * F + F + 1)) * 4;
  EXPECT_GE(keep, activations);
  EXPECT_LT(keep, activations + std::size_t(T) * 4 * 5 + std::size_t(N + T + 1) * 4 * 4);
}

TEST(MoeLayerErrors, BadInputIsRejectedAndLeavesNoBackward) {
  mm::context ctx(1);
  mm::moe_layer<float_swiglu_grouped> layer(0);
  layer.initialize(1);
  auto const x = random_matrix<float>(12, 12, 1);
  EXPECT_THROW(layer.backward(ctx, x), mm::input_error);       // no forward yet
  EXPECT_THROW(layer.forward(ctx, x, 5, 2), mm::input_error);  // S*B != rows
  EXPECT_THROW(layer.forward(ctx, random_matrix<float>(12, 11, 1), 6, 2), mm::input_error);
  EXPECT_THROW(layer.forward(ctx, x, 0, 12), mm::input_error);
  layer.forward(ctx, x, 6, 2);
  EXPECT_THROW(layer.backward(ctx, random_matrix<float>(10, 12, 2)), mm::input_error);
  layer.forward(ctx, x, 6, 2);
  auto bad = x;
  bad(3, 4) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(layer.forward(ctx, bad, 6, 2), mm::input_error);  // non-finite logits
  EXPECT_THROW(layer.backward(ctx, x), mm::input_error);         // the failed forward left none
  try {
    layer.forward(ctx, random_matrix<float>(12, 11, 1), 6, 2);
  } catch (mm::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("[12, 12]"), std::string::npos) << e.what();
  }
}

TEST(MoeLayerModes, EvalAttachesNoLossCountsNothingAndMatchesTraining) {
  mm::context ctx(2);
  mm::moe_layer<squared_relu_per_expert_sqrtsoftplus_bias> layer(0);
  layer.initialize(4, 0.5);
  auto const x = random_matrix<double>(12, 12, 8);
  mm::row_matrix<double> const trained = layer.forward(ctx, x, 6, 2).y;
  auto const counts = layer.router().state().local_tokens_per_expert;
  ctx.step.mode = rt::pass::eval;
  auto const out = layer.forward(ctx, x, 6, 2);
  EXPECT_FALSE(out.losses.aux_loss.has_value());
  EXPECT_EQ(layer.router().state().local_tokens_per_expert, counts);
  EXPECT_LT((out.y - trained).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_THROW(layer.backward(ctx, x), mm::input_error);
}

TEST(MoeLayerMemory, WholeLayerRecomputationCountsRouterStatisticsOnce) {
  using counted =
      config<mm::shape<mm::hidden<8>, mm::ffn<6>, mm::experts<4>>,
             rt::top_k<2, rt::sigmoid, rt::expert_bias<>, rt::global_aux_loss<1e-2>>, local,
             ex::mlp<ex::swiglu, ex::grouped>, mm::precision::fp64, mem::recompute<mem::moe_layer>>;
  mm::context ctx(2);
  mm::moe_layer<counted> layer(0);
  layer.initialize(2, 0.5);
  int const S = 6, B = 2;
  auto const x = random_matrix<double>(S * B, 8, 5);
  layer.forward(ctx, x, S, B);
  layer.backward(ctx, x);
  auto const& state = layer.router().state();
  double counted_tokens = 0.0;
  for (double c : state.local_tokens_per_expert) counted_tokens += c;
  EXPECT_EQ(counted_tokens, S * B * 2);  // once per token and choice, not twice
  EXPECT_EQ(state.global_aux_steps, 1);
}

// ---------------------------------------------------------------------------------------------
// Micro-batches set aside (park / restore, as a pipeline schedule runs them): several forwards
// before their backwards give exactly what forward-backward in turn gives.

template <class Config>
void expect_parked_micro_batches_match_in_turn() {
  using layer_type = mm::moe_layer<Config>;
  using T = typename layer_type::scalar;
  mm::context ctx(2);
  layer_type in_turn(1), parked(1);
  in_turn.initialize(11, 0.5);
  parked.initialize(11, 0.5);
  int const H = in_turn.hidden_size(), S = 6, B = 2, M = 3;
  in_turn.zero_grad();
  parked.zero_grad();
  std::vector<mm::row_matrix<T>> xs, dys, y_in_turn, dx_in_turn, y_parked;
  for (int m = 0; m < M; ++m) {
    xs.push_back(random_matrix<T>(S * B, H, 300 + m));
    dys.push_back(random_matrix<T>(S * B, H, 400 + m));
  }
  for (int m = 0; m < M; ++m) {
    ctx.step.micro_batch_key = static_cast<std::uint64_t>(m);
    y_in_turn.emplace_back(in_turn.forward(ctx, xs[m], S, B).y);
    dx_in_turn.emplace_back(in_turn.backward(ctx, dys[m]));
  }
  for (int m = 0; m < M; ++m) {
    ctx.step.micro_batch_key = static_cast<std::uint64_t>(m);
    y_parked.emplace_back(parked.forward(ctx, xs[m], S, B).y);
    parked.park(static_cast<std::uint64_t>(m));
  }
  EXPECT_THROW(parked.backward(ctx, dys[0]), mm::input_error);  // nothing live after park
  EXPECT_THROW(parked.restore(7), mm::input_error);             // never parked
  for (int m = 0; m < M; ++m) {
    ctx.step.micro_batch_key = static_cast<std::uint64_t>(m);
    parked.restore(static_cast<std::uint64_t>(m));
    mm::row_matrix<T> const dx = parked.backward(ctx, dys[m]);
    EXPECT_EQ((y_parked[m] - y_in_turn[m]).cwiseAbs().maxCoeff(), T(0)) << "y of " << m;
    EXPECT_EQ((dx - dx_in_turn[m]).cwiseAbs().maxCoeff(), T(0)) << "dx of " << m;
  }
  std::map<std::string, mm::row_matrix<T>, std::less<>> grads;
  in_turn.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
    grads[std::string(name)] = grad;
  });
  int checked = 0;
  parked.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
    ++checked;
    EXPECT_EQ((grad - grads.find(name)->second).cwiseAbs().maxCoeff(), T(0)) << name;
  });
  EXPECT_EQ(checked, static_cast<int>(grads.size()));
  EXPECT_EQ(parked.router().state().local_tokens_per_expert,
            in_turn.router().state().local_tokens_per_expert);
}

TEST(MoeLayerPark, SharedGateAuxAndZLoss) {
  expect_parked_micro_batches_match_in_turn<swiglu_grouped_aux_z_shared_gate>();
}
TEST(MoeLayerPark, GroupLimitedSigmoidSeqAuxRecomputedActivation) {
  expect_parked_micro_batches_match_in_turn<gelu_per_expert_bias_sigmoid_groups_moe_act>();
}
TEST(MoeLayerPark, WholeLayerRecomputed) {
  expect_parked_micro_batches_match_in_turn<squared_relu_tensor_presoftmax_whole_layer>();
}
TEST(MoeLayerPark, DropAndPad) {
  expect_parked_micro_batches_match_in_turn<swiglu_tensor_drop_and_pad>();
}
TEST(MoeLayerPark, DroppingRecomputedSharedExpert) {
  expect_parked_micro_batches_match_in_turn<gelu_grouped_dropping_recompute_shared>();
}
TEST(MoeLayerPark, FloatExpertBiasGlobalAux) {
  using counted = config<mm::shape<mm::hidden<8>, mm::ffn<6>, mm::experts<4>>,
                         rt::top_k<2, rt::sigmoid, rt::expert_bias<>, rt::global_aux_loss<1e-2>>,
                         local, ex::mlp<ex::swiglu, ex::grouped>>;
  expect_parked_micro_batches_match_in_turn<counted>();
}

}  // namespace
