// SPDX-License-Identifier: Apache-2.0
// The MoE layer under every precision recipe: output and gradients against a plain double
// reference that dequantizes the layer's own codes (tests/reference/recipe_reference.hpp), the
// output against the fp32 layer, saved bytes, and a short training run per recipe.
#include "reference/recipe_reference.hpp"
#include "support/allocation_counter.hpp"
#include "support/expert_codes.hpp"
#include "support/layer_helpers.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/model/moe_layer.hpp>
#include <megamoe/optim/adamw.hpp>
#include <megamoe/precision/operands.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mm = megamoe;
namespace ref = megamoe::reference;
namespace pr = megamoe::precision;

namespace {

using mm::testing::operands_of;
using mm::testing::random_matrix;
using mm::testing::relative_error;
using mm::testing::relative_l2_error;
using mm::testing::to_mat;
using mm::testing::trailing_index;
namespace ex = mm::expert;
namespace rt = mm::router;

// 160 = 128 + 32 columns: partial 1x128 and 128x128 blocks, whole 1x32 and 1x16 ones.
using recipe_shape = mm::shape<mm::hidden<160>, mm::ffn<48>, mm::experts<4>>;
template <class Precision, class Mlp = ex::mlp<ex::swiglu, ex::grouped>,
          class Memory = mm::memory::keep_all>
using recipe_config = mm::make_config<recipe_shape, rt::top_k<2, rt::aux_loss<1e-2>>,
                                      mm::dispatch::local, Mlp, Precision, Memory>;
/// fc1's output kept as codes (memory::quantized_activations).
template <class Precision>
using quantized_activations_config =
    recipe_config<Precision, ex::mlp<ex::swiglu, ex::grouped>,
                  mm::memory::plan<mm::memory::quantized_activations>>;

/// How far a recipe's quantized gradient may sit from the value it quantizes (relative L2).
constexpr double quantization_tolerance(pr::settings const& s) {
  switch (s.recipe) {
    case pr::recipe_id::bf16: return 1e-2;
    case pr::recipe_id::fp8_delayed:
    case pr::recipe_id::fp8_current: return 0.1;  // E5M2 gradients
    case pr::recipe_id::nvfp4: return 0.4;        // E2M1 with stochastic rounding
    default: return 0.06;
  }
}

/// One training step of the layer against the reference on the layer's own codes.
template <class Precision, class Config = recipe_config<Precision>>
void expect_matches_codes_reference() {
  using layer_type = mm::moe_layer<Config>;
  mm::context ctx(2);
  layer_type layer(0);
  layer.keep_all_operand_codes(true);
  layer.initialize(21, 0.1);
  int const S = 16, B = 6, T = S * B, H = layer.hidden_size();
  double const loss_scale = 0.5;
  ctx.step.loss_backward_scale = loss_scale;
  // Two steps: the second runs on the scales delayed scaling derived from the first.
  for (int step = 0; step < 2; ++step) {
    layer.zero_grad();
    auto const x = random_matrix<float>(T, H, 300 + step);
    auto const dy = random_matrix<float>(T, H, 400 + step, 0.01);
    mm::row_matrix<float> const y = layer.forward(ctx, x, S, B).y;
    mm::row_matrix<float> const dx = layer.backward(ctx, dy);

    auto const& perm = layer.permutation();
    auto const& probs = layer.router().output().probs;
    ref::recipe_rows rows{perm.source_token, perm.row_expert, {}};
    for (int j = 0; j < perm.rows(); ++j)
      rows.row_prob.push_back(
          static_cast<double>(probs(perm.source_token[static_cast<std::size_t>(j)],
                                    perm.row_expert[static_cast<std::size_t>(j)])));
    std::vector<ref::expert_operands> ops;
    std::int64_t first_row = 0;
    for (int e = 0; e < layer.num_experts(); ++e) {
      ops.push_back(operands_of(layer, e, first_row));
      first_row += perm.tokens_per_expert[static_cast<std::size_t>(e)];
    }
    ref::mat router_weight;
    layer.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
      if (name.ends_with("router.weight")) router_weight = to_mat(value);
    });
    auto const want = ref::recipe_forward_backward(
        layer_type::activation, router_weight, layer.router().config(),
        layer.router().state().expert_bias, to_mat(x), B, loss_scale, rows, ops);
    auto const& map = layer.router().output().routing_map;
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < layer.num_experts(); ++e)
        ASSERT_EQ(map(t, e),
                  want.routing.map[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)]);
    std::string const at = std::string(Precision::name) + ", step " + std::to_string(step);
    EXPECT_LT(relative_error(y, want.y), 1e-5) << "output, " << at;
    EXPECT_LT(relative_error(dx, want.grad.x), 1e-5) << "dx, " << at;
    layer.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind) {
      ref::mat const* expected = nullptr;
      if (name.ends_with("router.weight")) expected = &want.grad.router;
      if (name.find("linear_fc1.weight") != std::string_view::npos)
        expected =
            &want.grad.fc1[static_cast<std::size_t>(trailing_index(name, "linear_fc1.weight"))];
      if (name.find("linear_fc2.weight") != std::string_view::npos)
        expected =
            &want.grad.fc2[static_cast<std::size_t>(trailing_index(name, "linear_fc2.weight"))];
      ASSERT_NE(expected, nullptr) << name;
      EXPECT_LT(relative_error(grad, *expected), 1e-5) << name << ", " << at;
    });
    // Around the codes: fc1's product (kept in BF16) and the gradient that fc1's dgrad quantized.
    ref::mat h_kept, dh_used;
    for (auto const& o : ops) {
      h_kept.insert(h_kept.end(), o.h.begin(), o.h.end());
      dh_used.insert(dh_used.end(), o.g1_row.begin(), o.g1_row.end());
    }
    auto const as_matrix = [](ref::mat const& m) {
      mm::row_matrix<double> out(static_cast<Eigen::Index>(m.size()),
                                 static_cast<Eigen::Index>(m.empty() ? 0 : m[0].size()));
      for (std::size_t r = 0; r < m.size(); ++r)
        for (std::size_t c = 0; c < m[r].size(); ++c)
          out(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)) = m[r][c];
      return out;
    };
    // The kept fc1 output is fc1's product in BF16, or in the recipe's input format.
    if constexpr (layer_type::memory_settings.quantized_activations) {
      EXPECT_LT(relative_l2_error(as_matrix(h_kept), want.h_fprop),
                quantization_tolerance(Precision::value))
          << "fc1 output, " << at;
    } else {
      EXPECT_LT(relative_error(as_matrix(h_kept), want.h_fprop), 5e-3) << "fc1 output, " << at;
    }
    EXPECT_LT(relative_l2_error(as_matrix(dh_used), want.dh),
              quantization_tolerance(Precision::value))
        << "fc1 output gradient, " << at;
  }
}

TEST(RecipeLayer, Bf16MatchesItsCodes) {
  expect_matches_codes_reference<pr::bf16>();
}
TEST(RecipeLayer, Fp8DelayedMatchesItsCodes) {
  expect_matches_codes_reference<pr::fp8_tensorwise<pr::delayed>>();
}
TEST(RecipeLayer, Fp8CurrentMatchesItsCodes) {
  expect_matches_codes_reference<pr::fp8_tensorwise<pr::current>>();
}
TEST(RecipeLayer, Fp8BlockwiseMatchesItsCodes) {
  expect_matches_codes_reference<pr::fp8_blockwise>();
}
TEST(RecipeLayer, Mxfp8MatchesItsCodes) {
  expect_matches_codes_reference<pr::mxfp8>();
}
TEST(RecipeLayer, QuantizedActivationsMatchTheirCodes) {
  // fc1's output kept as codes: backward's activation reads the dequantized codes.
  expect_matches_codes_reference<pr::fp8_tensorwise<pr::delayed>,
                                 quantized_activations_config<pr::fp8_tensorwise<pr::delayed>>>();
  expect_matches_codes_reference<pr::fp8_blockwise,
                                 quantized_activations_config<pr::fp8_blockwise>>();
  expect_matches_codes_reference<pr::nvfp4, quantized_activations_config<pr::nvfp4>>();
}
TEST(RecipeLayer, Nvfp4MatchesItsCodes) {
  expect_matches_codes_reference<pr::nvfp4>();
}

/// The recipe's layer output against the fp32 layer's on the same weights and input.
/// Delayed scaling quantizes its first step with scale 1; `warm_up` steps first give it scales.
template <class Precision, class Mlp = ex::mlp<ex::gelu, ex::grouped>>
double output_error_against_fp32(int warm_up = 0) {
  mm::context ctx(2);
  mm::moe_layer<recipe_config<mm::precision::fp32, Mlp>> exact(0);
  mm::moe_layer<recipe_config<Precision, Mlp>> layer(0);
  exact.initialize(5, 0.05);
  layer.initialize(5, 0.05);
  auto const x = random_matrix<float>(128, exact.hidden_size(), 77);
  for (int i = 0; i < warm_up; ++i) {
    layer.forward(ctx, x, 32, 4);
    layer.backward(ctx, random_matrix<float>(128, exact.hidden_size(), 79, 0.01));
  }
  mm::row_matrix<float> const want = exact.forward(ctx, x, 32, 4).y;
  mm::row_matrix<float> const got = layer.forward(ctx, x, 32, 4).y;
  return (got - want).norm() / want.norm();
}

TEST(RecipeLayer, OutputCloseToFp32) {
  EXPECT_LT(output_error_against_fp32<pr::bf16>(), 1e-2);
  EXPECT_LT(output_error_against_fp32<pr::fp8_tensorwise<pr::delayed>>(1), 6e-2);
  EXPECT_LT(output_error_against_fp32<pr::fp8_tensorwise<pr::current>>(), 6e-2);
  EXPECT_LT(output_error_against_fp32<pr::fp8_blockwise>(), 6e-2);
  EXPECT_LT(output_error_against_fp32<pr::mxfp8>(), 6e-2);
  // E2M1 leaves 0.096 (1x16) and 0.111 (16x16 weights) relative L2 on Gaussian values; the four
  // quantized operands of the two GEMMs compose to about 0.21.
  EXPECT_LT(output_error_against_fp32<pr::nvfp4>(), 0.25);
  EXPECT_GT(output_error_against_fp32<pr::fp8_tensorwise<pr::current>>(), 1e-4)
      << "the FP8 recipe rounds nothing";
  using swiglu = ex::mlp<ex::swiglu, ex::grouped>;
  std::cout << "SwiGLU output error against fp32: bf16 "
            << output_error_against_fp32<pr::bf16, swiglu>() << ", fp8 current "
            << output_error_against_fp32<pr::fp8_tensorwise<pr::current>, swiglu>() << ", mxfp8 "
            << output_error_against_fp32<pr::mxfp8, swiglu>() << ", nvfp4 "
            << output_error_against_fp32<pr::nvfp4, swiglu>() << "\n";
}

TEST(RecipeLayer, RouterSidePaddingGivesEveryExpertAMultiple) {
  // The router marks extra (token, expert) pairs with prob 0 so that each expert's count is the
  // recipe's multiple; the expert side then pads nothing, and the pairs add nothing to the output.
  using padded =
      mm::make_config<recipe_shape, rt::top_k<2, rt::aux_loss<1e-2>, rt::pad_for_quantization<>>,
                      mm::dispatch::local, ex::mlp<ex::gelu, ex::grouped>,
                      pr::fp8_tensorwise<pr::current>>;
  mm::context ctx(2);
  mm::moe_layer<padded> layer(0);
  mm::moe_layer<recipe_config<pr::fp32, ex::mlp<ex::gelu, ex::grouped>>> exact(0);
  layer.initialize(5, 0.05);
  exact.initialize(5, 0.05);
  auto const x = random_matrix<float>(100, layer.hidden_size(), 90);
  mm::row_matrix<float> const y = layer.forward(ctx, x, 25, 4).y;
  mm::row_matrix<float> const want = exact.forward(ctx, x, 25, 4).y;
  int extra = 0;
  for (auto n : layer.permutation().tokens_per_expert) {
    EXPECT_EQ(n % 16, 0) << n;
    extra += static_cast<int>(n);
  }
  EXPECT_GT(extra, 200) << "padding added pairs";
  EXPECT_LT((y - want).norm() / want.norm(), 6e-2);
  layer.backward(ctx, random_matrix<float>(100, layer.hidden_size(), 91, 0.01));
}

TEST(RecipeLayer, RouterPaddingPastACapacityStaysWithinTheRowBound) {
  // With a capacity and router-side padding (no pad_to_capacity), an expert keeps at most C
  // tokens and padding then rounds that up to the multiple: the experts' row buffers are sized
  // for 4 experts x roundup(C, 16) rows, more than 4 x C.
  using padded = mm::make_config<
      recipe_shape, rt::top_k<2, rt::capacity<1.0>, rt::aux_loss<1e-2>, rt::pad_for_quantization<>>,
      mm::dispatch::local, ex::mlp<ex::gelu, ex::grouped>, pr::fp8_tensorwise<pr::current>>;
  mm::context ctx(2);
  mm::moe_layer<padded> layer(0);
  layer.initialize(5, 0.05);
  layer.forward(ctx, random_matrix<float>(100, layer.hidden_size(), 92), 25, 4);
  int const capacity = 50;  // ceil(100 tokens x top-2 / 4 experts x 1.0)
  std::int64_t rows = 0;
  for (auto n : layer.permutation().tokens_per_expert) {
    EXPECT_EQ(n % 16, 0) << n;
    EXPECT_LE(n, 64) << "at most the capacity, rounded up to 16";
    rows += n;
  }
  EXPECT_GT(rows, 4 * capacity) << "padding past the capacity";
  EXPECT_EQ(layer.expert_rows_bound(capacity), 4 * 64);
  EXPECT_EQ(layer.expert_rows_bound(0), 100 * 4) << "padded: every token may reach every expert";
  layer.backward(ctx, random_matrix<float>(100, layer.hidden_size(), 93, 0.01));
  // The same recipe without the router's padding: a token reaches at most its top-2 experts.
  mm::moe_layer<recipe_config<pr::fp8_tensorwise<pr::current>>> unpadded(0);
  unpadded.initialize(5, 0.05);
  unpadded.forward(ctx, random_matrix<float>(100, unpadded.hidden_size(), 92), 25, 4);
  EXPECT_EQ(unpadded.expert_rows_bound(0), 100 * 2);
  EXPECT_EQ(unpadded.expert_rows_bound(capacity), 100 * 2);
}

/// Output, dx and every gradient of two steps, for comparing memory policies.
template <class Config>
std::vector<mm::row_matrix<float>> two_steps() {
  mm::context ctx(2);
  mm::moe_layer<Config> layer(0);
  layer.initialize(31, 0.1);
  std::vector<mm::row_matrix<float>> out;
  for (int step = 0; step < 2; ++step) {
    auto const x = random_matrix<float>(96, layer.hidden_size(), 600 + step);
    out.emplace_back(layer.forward(ctx, x, 24, 4).y);
    out.emplace_back(layer.backward(ctx, random_matrix<float>(96, layer.hidden_size(), 700, 0.01)));
  }
  layer.for_each_parameter(
      [&](std::string_view, auto, auto grad, mm::parameter_kind) { out.emplace_back(grad); });
  return out;
}

template <class Precision, class Memory>
using shared_config =
    mm::make_config<mm::shape<mm::hidden<160>, mm::ffn<48>, mm::experts<4>, mm::shared_ffn<32>>,
                    rt::top_k<2, rt::aux_loss<1e-2>>, mm::dispatch::local,
                    ex::mlp<ex::swiglu, ex::grouped, ex::shared_expert_gate>, Precision, Memory>;

/// Recomputing the activation, the shared expert or the whole layer gives the kept codes again:
/// the same bits as keeping everything (stochastic rounding included: its draws depend on the step,
/// not on how often forward ran).
template <class Precision>
void expect_recomputation_changes_nothing() {
  namespace mem = mm::memory;
  auto const kept = two_steps<shared_config<Precision, mem::keep_all>>();
  auto const act =
      two_steps<shared_config<Precision, mem::recompute<mem::moe_act, mem::shared_experts>>>();
  auto const whole = two_steps<shared_config<Precision, mem::recompute<mem::moe_layer>>>();
  ASSERT_EQ(kept.size(), act.size());
  for (std::size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i], act[i]) << Precision::name << ", result " << i;
    EXPECT_EQ(kept[i], whole[i]) << Precision::name << ", result " << i;
  }
}

TEST(RecipeLayer, RecomputationChangesNothing) {
  expect_recomputation_changes_nothing<pr::bf16>();
  expect_recomputation_changes_nothing<pr::fp8_tensorwise<pr::delayed>>();
  expect_recomputation_changes_nothing<pr::mxfp8>();
  expect_recomputation_changes_nothing<pr::nvfp4>();
}

TEST(RecipeLayer, SavedActivationsAreCodes) {
  mm::context ctx(2);
  int rows = 0;
  auto saved = [&](auto& layer) {
    layer.initialize(5, 0.05);
    auto const x = random_matrix<float>(128, layer.hidden_size(), 78);
    layer.forward(ctx, x, 32, 4);
    rows = layer.permutation().rows();
    return static_cast<double>(layer.saved_activation_bytes());
  };
  mm::moe_layer<recipe_config<pr::fp32>> fp32(0);
  mm::moe_layer<recipe_config<pr::bf16>> bf16(0);
  mm::moe_layer<recipe_config<pr::fp8_tensorwise<pr::current>>> fp8(0);
  mm::moe_layer<recipe_config<pr::mxfp8>> mx(0);
  mm::moe_layer<recipe_config<pr::nvfp4>> fp4(0);
  double const base = saved(fp32);
  int const H = fp32.hidden_size(), F = fp32.local_ffn(), W1 = 2 * F, E = fp32.num_experts();
  // fp32 keeps the expert rows [N,H], fc1's output [N,W1] and the activation [N,F] in 4 bytes
  // each; the rest (input copy, routing) is the same for every recipe.
  double const fixed = base - 4.0 * rows * (H + W1 + F);
  EXPECT_EQ(saved(bf16) - fixed, 2.0 * rows * (H + W1 + F));
  // Per-tensor FP8: both GEMM inputs in 1 byte plus one fp32 scale per expert, fc1's output BF16.
  EXPECT_EQ(saved(fp8) - fixed, 1.0 * rows * (H + F) + 2.0 * E * 4 + 2.0 * rows * W1);
  // Block scales add at most one byte per 32 (MXFP8) or per 16 (NVFP4, half a byte per code).
  double const mx_bytes = saved(mx) - fixed;
  EXPECT_GE(mx_bytes, 1.0 * rows * (H + F) + 2.0 * rows * W1);
  EXPECT_LE(mx_bytes, (1.0 + 1.0 / 32) * rows * (H + F) + 2.0 * rows * W1 + 2.0 * E * (H + F));
  // NVFP4's wgrad copies hold each expert's rows padded to 128 (zero rows before the transform).
  double const fp4_bytes = saved(fp4) - fixed;
  double padded_rows = 0;
  for (auto n : fp4.permutation().tokens_per_expert)
    padded_rows += static_cast<double>(pr::pad_rows(n, 128));
  EXPECT_GE(fp4_bytes, 0.5 * padded_rows * (H + F) + 2.0 * rows * W1);
  EXPECT_LE(fp4_bytes, (0.5 + 1.0 / 16) * padded_rows * (H + F) + 2.0 * rows * W1 + 8.0 * E);
  // memory::quantized_activations: fc1's output in 1 byte per element instead of 2.
  mm::moe_layer<quantized_activations_config<pr::fp8_tensorwise<pr::current>>> fp8_act(0);
  EXPECT_EQ(saved(fp8_act) - fixed, 1.0 * rows * (H + F + W1) + 3.0 * E * 4);
}

/// The heap bytes a layer holds after a forward, by the allocation counter: what its destruction
/// gives back (weights, gradients, kept activations and codes). The context's scratch and the pool
/// threads' scratch outlive the layer, so they are not counted.
template <class Precision>
std::size_t layer_heap_bytes() {
  mm::context ctx(2);
  auto const x = random_matrix<float>(1024, 160, 80);
  std::size_t held = 0;
  {
    mm::moe_layer<recipe_config<Precision>> layer(0);
    layer.initialize(5, 0.05);
    layer.forward(ctx, x, 256, 4);
    held = mm::testing::allocations().live_bytes;
  }
  return held - mm::testing::allocations().live_bytes;
}

TEST(RecipeLayer, HeapBytesFollowTheCodes) {
  auto const fp32 = layer_heap_bytes<pr::fp32>();
  auto const bf16 = layer_heap_bytes<pr::bf16>();
  auto const fp8 = layer_heap_bytes<pr::fp8_tensorwise<pr::current>>();
  auto const fp4 = layer_heap_bytes<pr::nvfp4>();
  std::cout << "heap bytes of a layer after a forward of 2048 rows: fp32 " << fp32 << ", bf16 "
            << bf16 << ", fp8 " << fp8 << ", nvfp4 " << fp4 << "\n";
  EXPECT_LT(bf16, fp32);
  EXPECT_LT(fp8, bf16);
  EXPECT_LT(fp4, fp8);
}

/// A short run on a fixed regression task (y* = tanh(x A) / 4): Adam on the mean squared error,
/// the mean loss of the first and of the last 10 steps.
struct losses {
  double first = 0.0, last = 0.0;
};
template <class Precision, class Config = recipe_config<Precision>>
losses regression_loss() {
  using layer_type = mm::moe_layer<Config>;
  mm::context ctx(2);
  layer_type layer(0);
  layer.initialize(9, 0.05);
  int const S = 16, B = 4, T = S * B, H = layer.hidden_size();
  mm::row_matrix<float> const a = random_matrix<float>(H, H, 4242, 1.0 / std::sqrt(H));
  std::vector<mm::row_matrix<float>> m1, m2;
  layer.for_each_parameter([&](std::string_view, auto value, auto, mm::parameter_kind) {
    m1.emplace_back(mm::row_matrix<float>::Zero(value.rows(), value.cols()));
    m2.emplace_back(mm::row_matrix<float>::Zero(value.rows(), value.cols()));
  });
  losses out;
  int const steps = 60;
  for (int step = 0; step < steps; ++step) {
    auto const x = random_matrix<float>(T, H, 5000 + static_cast<std::uint64_t>(step % 8));
    mm::row_matrix<float> const target = ((x * a).array().tanh() * 0.25F).matrix();
    layer.zero_grad();
    mm::row_matrix<float> const y = layer.forward(ctx, x, S, B).y;
    mm::row_matrix<float> const diff = y - target;
    double const loss = diff.squaredNorm() / static_cast<double>(diff.size());
    if (step < 10) out.first += loss / 10.0;
    if (step >= steps - 10) out.last += loss / 10.0;
    layer.backward(ctx, (2.0F / static_cast<float>(diff.size())) * diff);
    std::size_t i = 0;
    float const lr = 3e-3F, b1 = 0.9F, b2 = 0.999F;
    float const c1 = 1.0F - std::pow(b1, static_cast<float>(step + 1));
    float const c2 = 1.0F - std::pow(b2, static_cast<float>(step + 1));
    layer.for_each_parameter([&](std::string_view, auto value, auto grad, mm::parameter_kind) {
      auto& u = m1[i];
      auto& v = m2[i++];
      u = b1 * u + (1.0F - b1) * grad;
      v = (b2 * v.array() + (1.0F - b2) * grad.array().square()).matrix();
      value.array() -= lr * (u.array() / c1) / ((v.array() / c2).sqrt() + 1e-8F);
    });
  }
  return out;
}

TEST(RecipeLayer, TrainsLikeFp32) {
  auto const fp32 = regression_loss<pr::fp32>();
  double const base = fp32.last;
  EXPECT_LT(base, 0.7 * fp32.first) << "the task is learnt, not met from the start";
  auto within = [&](double loss, double fraction) {
    return std::abs(loss - base) <= fraction * base;
  };
  double const bf16 = regression_loss<pr::bf16>().last;
  double const delayed = regression_loss<pr::fp8_tensorwise<pr::delayed>>().last;
  double const current = regression_loss<pr::fp8_tensorwise<pr::current>>().last;
  double const blockwise = regression_loss<pr::fp8_blockwise>().last;
  double const mx = regression_loss<pr::mxfp8>().last;
  double const fp4 = regression_loss<pr::nvfp4>().last;
  double const blockwise_act =
      regression_loss<pr::fp8_blockwise, quantized_activations_config<pr::fp8_blockwise>>().last;
  std::cout << "regression loss after 60 steps: fp32 " << base << ", bf16 " << bf16
            << ", fp8 delayed " << delayed << ", fp8 current " << current << ", fp8 blockwise "
            << blockwise << " (fc1 output as codes: " << blockwise_act << "), mxfp8 " << mx
            << ", nvfp4 " << fp4 << "\n";
  EXPECT_TRUE(within(bf16, 0.05)) << bf16 << " vs " << base;
  EXPECT_TRUE(within(delayed, 0.15)) << delayed << " vs " << base;
  EXPECT_TRUE(within(current, 0.15)) << current << " vs " << base;
  EXPECT_TRUE(within(blockwise, 0.15)) << blockwise << " vs " << base;
  EXPECT_TRUE(within(blockwise_act, 0.15)) << blockwise_act << " vs " << base;
  EXPECT_TRUE(within(mx, 0.15)) << mx << " vs " << base;
  EXPECT_TRUE(within(fp4, 0.40)) << fp4 << " vs " << base;
}

}  // namespace

namespace {

// --- memory::quantized_weights -------------------------------------------------------------------

template <class Precision>
using quantized_weights_config = recipe_config<Precision, ex::mlp<ex::swiglu, ex::grouped>,
                                               mm::memory::plan<mm::memory::quantized_weights>>;

/// Whether two code sets are the same bits and scales.
bool same_codes(pr::quantized_matrix const& a, pr::quantized_matrix const& b) {
  return a.rows == b.rows && a.cols == b.cols && a.codes == b.codes && a.scale_inv == b.scale_inv &&
         a.scale_codes == b.scale_codes && a.global_amax == b.global_amax;
}

/// Codes as the primary weights change nothing: a layer whose weights are codes, with the fp32
/// masters in the optimizer, trains bit for bit as the same recipe quantizing its fp32 weights at
/// every forward (outputs, input gradients, the norms the optimizer sees, the codes).
template <class Precision>
void quantized_weights_train_as_quantizing_every_forward(char const* recipe) {
  SCOPED_TRACE(recipe);
  mm::context ctx(2);
  mm::moe_layer<recipe_config<Precision>> plain(0);
  mm::moe_layer<quantized_weights_config<Precision>> codes(0);
  plain.initialize(9, 0.05);
  codes.initialize(9, 0.05);
  mm::optim::adamw_settings settings;
  settings.weight_decay = 0.01;
  mm::optim::distributed_adamw<float> plain_opt(plain, settings), codes_opt(codes, settings);
  EXPECT_FALSE(codes.holds_weight_values());
  EXPECT_EQ(plain_opt.state_elements(), codes_opt.state_elements());
  int const S = 16, B = 4, H = plain.hidden_size();
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    auto const x = random_matrix<float>(S * B, H, 700 + static_cast<std::uint64_t>(step));
    auto const dy = random_matrix<float>(S * B, H, 900 + static_cast<std::uint64_t>(step));
    plain.zero_grad();
    codes.zero_grad();
    mm::row_matrix<float> const y_plain = plain.forward(ctx, x, S, B).y;
    mm::row_matrix<float> const y_codes = codes.forward(ctx, x, S, B).y;
    EXPECT_EQ((y_plain - y_codes).cwiseAbs().maxCoeff(), 0.0F);
    mm::row_matrix<float> const dx_plain = plain.backward(ctx, dy);
    mm::row_matrix<float> const dx_codes = codes.backward(ctx, dy);
    EXPECT_EQ((dx_plain - dx_codes).cwiseAbs().maxCoeff(), 0.0F);
    auto const a = plain_opt.step(1e-2);
    auto const b = codes_opt.step(1e-2, codes);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
  }
  // The codes the optimizer's last update gave the layer are the ones the plain layer quantizes
  // at its next forward.
  auto const x = random_matrix<float>(S * B, H, 1234);
  mm::row_matrix<float> const y_plain = plain.forward(ctx, x, S, B).y;
  mm::row_matrix<float> const y_codes = codes.forward(ctx, x, S, B).y;
  EXPECT_EQ((y_plain - y_codes).cwiseAbs().maxCoeff(), 0.0F);
  using role = pr::operand_role;
  for (auto l : {ex::linear::fc1, ex::linear::fc2})
    for (auto u : {pr::operand_usage::rowwise, pr::operand_usage::columnwise})
      for (int e = 0; e < plain.local_experts(); ++e)
        EXPECT_TRUE(same_codes(plain.routed_operands().codes_of(l, role::weight, u, e),
                               codes.routed_operands().codes_of(l, role::weight, u, e)))
            << "expert " << e;
}

TEST(RecipeLayer, QuantizedWeightsTrainAsQuantizingEveryForward) {
  quantized_weights_train_as_quantizing_every_forward<pr::fp8_tensorwise<pr::delayed>>(
      "fp8 delayed");
  quantized_weights_train_as_quantizing_every_forward<pr::fp8_tensorwise<pr::current>>(
      "fp8 current");
  quantized_weights_train_as_quantizing_every_forward<pr::fp8_blockwise>("fp8 blockwise");
  quantized_weights_train_as_quantizing_every_forward<pr::mxfp8>("mxfp8");
  quantized_weights_train_as_quantizing_every_forward<pr::nvfp4>("nvfp4");
}

/// The heap bytes a layer gives back on destruction after an optimizer was built on it and a
/// forward ran, and the optimizer's master bytes.
template <class Config>
std::pair<std::size_t, std::size_t> heap_bytes_with_optimizer() {
  mm::context ctx(2);
  auto const x = random_matrix<float>(1024, 160, 80);
  std::optional<mm::moe_layer<Config>> layer(std::in_place, 0);
  layer->initialize(5, 0.05);
  mm::optim::distributed_adamw<float> optimizer(*layer, mm::optim::adamw_settings{});
  layer->forward(ctx, x, 256, 4);
  std::size_t const held = mm::testing::allocations().live_bytes;
  layer.reset();
  return {held - mm::testing::allocations().live_bytes, optimizer.master_bytes()};
}

TEST(RecipeLayer, QuantizedWeightsHoldOnlyCodes) {
  using precision = pr::fp8_tensorwise<pr::current>;
  auto const [plain, plain_master] = heap_bytes_with_optimizer<recipe_config<precision>>();
  auto const [codes, master] = heap_bytes_with_optimizer<quantized_weights_config<precision>>();
  // Four experts of fc1 [96, 160] and fc2 [160, 48] in fp32.
  std::size_t const fp32_weights = 4 * (96 * 160 + 160 * 48) * sizeof(float);
  std::cout << "layer heap bytes after a forward, FP8 current: fp32 masters in the layer " << plain
            << ", weights as codes only " << codes << " (the optimizer's masters " << master
            << ")\n";
  EXPECT_EQ(plain_master, 0U);
  EXPECT_EQ(master, fp32_weights);  // one rank: the shard is everything
  // The counter sees usable sizes, which glibc rounds to pages or not depending on its dynamic
  // mmap threshold (moved by the frees before): the two layers' other buffers may differ by a few
  // pages.
  EXPECT_NEAR(static_cast<double>(plain) - static_cast<double>(codes),
              static_cast<double>(fp32_weights), 0.1 * static_cast<double>(fp32_weights));

  mm::context ctx(2);
  mm::moe_layer<quantized_weights_config<precision>> layer(0);
  auto const x = random_matrix<float>(64, 160, 81);
  EXPECT_THROW(layer.forward(ctx, x, 16, 4), mm::input_error);  // no codes before initialize()
  layer.initialize(5, 0.05);
  mm::optim::distributed_adamw<float> optimizer(layer, mm::optim::adamw_settings{});
  int quantized = 0;
  layer.for_each_parameter([&](std::string_view name, auto value, auto grad, mm::parameter_kind k) {
    if (k != mm::parameter_kind::quantized_expert) return;
    ++quantized;
    EXPECT_EQ(value.rows(), 0) << name;
    EXPECT_GT(grad.size(), 0) << name;
  });
  EXPECT_EQ(quantized, 8);
  EXPECT_THROW(layer.initialize(5), mm::input_error);
  EXPECT_THROW(layer.refresh_weight_codes(), mm::input_error);
  EXPECT_THROW((mm::optim::distributed_adamw<float>(layer, mm::optim::adamw_settings{})),
               mm::input_error);
  layer.forward(ctx, x, 16, 4);
  layer.backward(ctx, x);
  EXPECT_THROW(optimizer.step(1e-3), mm::input_error);  // the weights would not reach the layer
  EXPECT_TRUE(optimizer.step(1e-3, layer).finite);

  // Weights written through for_each_parameter without refresh_weight_codes(): the optimizer
  // takes them as its masters and the codes follow them.
  mm::moe_layer<recipe_config<precision>> quantized_every_forward(0);
  mm::moe_layer<quantized_weights_config<precision>> written(0);
  quantized_every_forward.initialize(6, 0.05);
  written.initialize(6, 0.05);
  auto twice = [](std::string_view, auto value, auto, mm::parameter_kind) { value *= 2.0F; };
  quantized_every_forward.for_each_parameter(twice);
  written.for_each_parameter(twice);
  mm::optim::distributed_adamw<float> takes(written, mm::optim::adamw_settings{});
  mm::row_matrix<float> const y_plain = quantized_every_forward.forward(ctx, x, 16, 4).y;
  mm::row_matrix<float> const y_written = written.forward(ctx, x, 16, 4).y;
  EXPECT_EQ((y_plain - y_written).cwiseAbs().maxCoeff(), 0.0F);
}

}  // namespace

namespace {

// --- expert::amx and expert::avx512_bf16 ---------------------------------------------------------

/// Where the unit cannot run, the layer stops at construction naming the fp32 backends (and the
/// test skips with that reason); where it can, every recipe's step matches the double reference on
/// the layer's own codes, as on the grouped backend. (Against the grouped backend directly the two
/// differ by fp32 summation order, which can move a re-quantized gradient across a rounding
/// boundary of its format: one code apart, beyond any tight bound.)
template <class Backend>
void tile_backend_stops_or_matches_grouped(bool usable, std::string const& reason,
                                           std::string const& name) {
  if (!usable) {
    try {
      mm::moe_layer<recipe_config<pr::bf16, ex::mlp<ex::swiglu, Backend>>> layer(0);
      ADD_FAILURE() << name << " constructed without a usable unit";
    } catch (mm::input_error const& e) {
      std::string const what = e.what();
      EXPECT_NE(what.find(name + " cannot run here"), std::string::npos) << what;
      EXPECT_NE(what.find("per_expert, grouped, tensor"), std::string::npos) << what;
    }
    GTEST_SKIP() << reason;
  }
  auto one = [&]<class Precision>(Precision) {
    SCOPED_TRACE(std::string(Precision::name) + " on " + name);
    expect_matches_codes_reference<Precision,
                                   recipe_config<Precision, ex::mlp<ex::swiglu, Backend>>>();
  };
  one(pr::bf16{});
  one(pr::fp8_tensorwise<pr::delayed>{});
  one(pr::fp8_tensorwise<pr::current>{});
  one(pr::fp8_blockwise{});
  one(pr::mxfp8{});
  one(pr::nvfp4{});
}

TEST(RecipeLayer, AmxBackendStopsWithAReasonOrMatchesItsCodes) {
  tile_backend_stops_or_matches_grouped<ex::amx>(mm::cpu().use_amx(),
                                                 mm::cpu().amx_unavailable_reason(), "expert::amx");
}

TEST(RecipeLayer, Avx512Bf16BackendStopsWithAReasonOrMatchesItsCodes) {
  tile_backend_stops_or_matches_grouped<ex::avx512_bf16>(mm::cpu().use_avx512_bf16(),
                                                         mm::cpu().avx512_bf16_unavailable_reason(),
                                                         "expert::avx512_bf16");
}

}  // namespace
