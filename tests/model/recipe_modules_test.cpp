// SPDX-License-Identifier: Apache-2.0
// Attention's projections and the dense FFN under every precision recipe (model/linear.hpp): one
// step of the fp32 module against the same module in double whose GEMMs read the fp32 module's
// own codes, dequantized (replay_operands). The double module computes everything between the
// GEMMs itself (RoPE, the attention core, SwiGLU), and each value it hands a GEMM is checked to
// quantize to those codes within the recipe's quantization error; so the whole module, not only
// its products, is checked. A short training run of a tiny model per recipe against fp32.
#include "reference/recipe_reference.hpp"
#include "support/expert_codes.hpp"
#include "support/layer_helpers.hpp"
#include "support/sample_data.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/tile_gemm.hpp>
#include <megamoe/model/attention.hpp>
#include <megamoe/model/dense_mlp.hpp>
#include <megamoe/model/linear.hpp>
#include <megamoe/model/mla.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/precision/operands.hpp>
#include <megamoe/train/token_data.hpp>
#include <megamoe/train/trainer.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mm = megamoe;
namespace pr = megamoe::precision;
namespace ex = megamoe::expert;
namespace ref = megamoe::reference;

namespace {

using mm::testing::random_matrix;
using mm::testing::relative_error;
using mm::testing::to_mat;

/// How far a value may sit from its quantized copy (relative L2), by recipe.
double quantization_tolerance(pr::settings const& s) {
  switch (s.recipe) {
    case pr::recipe_id::bf16: return 1e-2;
    case pr::recipe_id::fp8_delayed:
    case pr::recipe_id::fp8_current: return 0.1;  // E5M2 gradients
    case pr::recipe_id::nvfp4: return 0.4;        // E2M1, stochastic rounding
    default: return 0.06;
  }
}

/// ||a - b|| / ||b|| over n values.
double relative_l2(double const* a, std::vector<double> const& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

/// One linear's operands as a recipe's module used them, dequantized, row-major: the fprop input
/// [n, in], the weight for fprop and for dgrad [out, in], the dgrad gradient [n, out], and the
/// wgrad copies over n' rows (n' = n, or padded where a transform needs whole chunks).
struct linear_values {
  std::vector<double> x, w_row, w_col, g, g_wgrad, x_wgrad;
  std::array<std::int64_t, 2> wgrad_rows{};
};

/// The double module's operands: the fp32 module's dequantized codes. Each hook also measures how
/// far the double module's own value is from those codes (its largest relative L2, `drift`).
struct replay_operands {
  using usage = pr::operand_usage;
  std::array<linear_values, 2> linears;
  std::vector<double> kept_fc1_output;  // the dense FFN's fc1 output as kept (BF16)
  double drift = 0.0;
  std::string drift_at;

  linear_values const& of(ex::linear l) const { return linears[static_cast<std::size_t>(l)]; }
  void measure(double const* own, std::vector<double> const& codes, char const* what,
               ex::linear l) {
    double const d = relative_l2(own, codes);
    if (d > drift) {
      drift = d;
      drift_at = std::string(what) + (l == ex::linear::fc1 ? " of linear 1" : " of linear 2");
    }
  }

  double const* input(ex::linear l, double const* x, int, std::span<std::int64_t const>, int, int) {
    measure(x, of(l).x, "input", l);
    return of(l).x.data();
  }
  double const* weight(ex::linear l, usage u, double const* w, int, int, int, int) {
    measure(w, of(l).w_row, "weight", l);
    return u == usage::rowwise ? of(l).w_row.data() : of(l).w_col.data();
  }
  void fc1_output(double* h, int, std::span<std::int64_t const>, int, int) {
    measure(h, kept_fc1_output, "fc1 output", ex::linear::fc1);
    std::copy(kept_fc1_output.begin(), kept_fc1_output.end(), h);
  }
  double* saved_fc1_output(double* h, int, std::span<std::int64_t const>, int, int) { return h; }
  double const* grad(ex::linear l, double const* g, int, std::span<std::int64_t const>, int, int) {
    measure(g, of(l).g, "gradient", l);
    return of(l).g.data();
  }
  static float unit(ex::operand_buffer, int) { return 1.0F; }
  ex::exact_operands::wgrad_operands<double> wgrad(ex::linear l, double const*, int, double const*,
                                                   int, std::span<std::int64_t const>, int, int) {
    auto const& v = of(l);
    return {v.g_wgrad.data(), v.x_wgrad.data(), std::span<std::int64_t const>(v.wgrad_rows)};
  }
};

template <pr::operand_format F>
std::vector<double> dequantized_values(pr::quantized_matrix const& q) {
  auto const v = pr::dequantized<F>(q);
  return {v.begin(), v.end()};
}

/// q [cols, n'] (a columnwise copy) as [n', cols].
template <pr::operand_format F>
std::vector<double> dequantized_transposed(pr::quantized_matrix const& q) {
  auto const v = pr::dequantized<F>(q);
  std::vector<double> out(v.size());
  auto const rows = static_cast<std::size_t>(q.rows), cols = static_cast<std::size_t>(q.cols);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) out[c * rows + r] = v[r * cols + c];
  return out;
}

/// Linear l's operands from a recipe's operands `ops` (one "expert") after a step.
template <class Ops>
linear_values values_of(Ops const& ops, ex::linear l) {
  using role = pr::operand_role;
  using usage = pr::operand_usage;
  constexpr auto recipe = Ops::recipe;
  linear_values v;
  v.x = dequantized_values<Ops::input_row>(ops.codes_of(l, role::input, usage::rowwise, 0));
  v.w_row = dequantized_values<Ops::weight_row>(ops.codes_of(l, role::weight, usage::rowwise, 0));
  if constexpr (pr::same_copies(recipe, role::weight))
    v.w_col = v.w_row;
  else
    v.w_col = dequantized_transposed<Ops::weight_col>(
        ops.codes_of(l, role::weight, usage::columnwise, 0));
  v.g = dequantized_values<Ops::grad_row>(ops.codes_of(l, role::grad, usage::rowwise, 0));
  auto const& gq = ops.codes_of(
      l, role::grad, pr::same_copies(recipe, role::grad) ? usage::rowwise : usage::columnwise, 0);
  if constexpr (pr::same_copies(recipe, role::grad)) {
    v.g_wgrad = v.g;
    v.wgrad_rows = {0, gq.rows};
  } else {
    v.g_wgrad = dequantized_transposed<Ops::grad_col>(gq);
    v.wgrad_rows = {0, gq.cols};
  }
  if constexpr (pr::same_copies(recipe, role::input))
    v.x_wgrad = v.x;
  else
    v.x_wgrad =
        dequantized_transposed<Ops::input_col>(ops.codes_of(l, role::input, usage::columnwise, 0));
  return v;
}

}  // namespace

/// The double attention's projections on the replayed codes, written apart from the library's
/// linear_products (plain loops over the dequantized values), so that a slip in how the library
/// wires a recipe's hooks to its products shows against it.
template <>
class megamoe::linear_products<double, replay_operands> {
 public:
  linear_products() = default;
  explicit linear_products(replay_operands ops) : ops_(std::move(ops)) {}
  replay_operands& operands() noexcept { return ops_; }

  void forward(expert::executor<double>&, expert::linear l, int n, int out, int in, double const* x,
               double const* w, double* y, int ldy) {
    auto const& v = ops_.of(l);
    ops_.measure(x, v.x, "input", l);
    ops_.measure(w, v.w_row, "weight", l);
    for (int t = 0; t < n; ++t)
      for (int o = 0; o < out; ++o) {
        double sum = 0.0;
        for (int i = 0; i < in; ++i) sum += v.x[idx(t, in, i)] * v.w_row[idx(o, in, i)];
        y[idx(t, ldy, o)] = sum;
      }
  }
  void backward(expert::executor<double>&, expert::linear l, int n, int out, int in,
                double const* dy, int ldy, double const*, double const*, double* dx, int ldx,
                double* dw) {
    auto const& v = ops_.of(l);
    std::vector<double> own(static_cast<std::size_t>(n) * static_cast<std::size_t>(out));
    for (int t = 0; t < n; ++t)
      for (int o = 0; o < out; ++o) own[idx(t, out, o)] = dy[idx(t, ldy, o)];
    ops_.measure(own.data(), v.g, "gradient", l);
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < in; ++i) {
        double sum = 0.0;
        for (int o = 0; o < out; ++o) sum += v.g[idx(t, out, o)] * v.w_col[idx(o, in, i)];
        dx[idx(t, ldx, i)] = sum;
      }
    auto const rows = static_cast<int>(v.wgrad_rows[1]);
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i) {
        double sum = 0.0;
        for (int t = 0; t < rows; ++t) sum += v.g_wgrad[idx(t, out, o)] * v.x_wgrad[idx(t, in, i)];
        dw[idx(o, in, i)] += sum;
      }
  }

 private:
  static std::size_t idx(int r, int ld, int c) {
    return static_cast<std::size_t>(r) * static_cast<std::size_t>(ld) + static_cast<std::size_t>(c);
  }
  replay_operands ops_;
};

namespace {

template <class Recipe>
using recipe_ops = mm::linear_operands_t<Recipe>;

template <class T>
mm::const_row_matrix_map<T> in(mm::row_matrix<T> const& m) {
  return {m.data(), m.rows(), m.cols()};
}
template <class T>
mm::row_matrix_map<T> out(mm::row_matrix<T>& m) {
  return {m.data(), m.rows(), m.cols()};
}

/// Attention (grouped queries, QK layernorm) under Recipe on GEMM backend Backend: two steps
/// (delayed scaling's second runs on the scales its first derived), each against the double
/// module on its codes.
template <class Recipe, class Backend = ex::grouped_gemm>
void attention_matches_its_codes() {
  using ops_type = recipe_ops<Recipe>;
  constexpr int H = 160, heads = 4, groups = 2, S = 16, B = 3, N = S * B;
  mm::context ctx(2);
  mm::causal_attention<float, true, mm::parallel::cp_comm_type::p2p, ops_type, Backend> module(
      H, heads, groups, 10000.0, 1e-5, 1, mm::make_linear_operands<ops_type>(5, nullptr));
  mm::causal_attention<double, true, mm::parallel::cp_comm_type::p2p, replay_operands> twin(
      H, heads, groups, 10000.0, 1e-5, 1);
  module.linears().operands().keep_all_codes(true);
  std::uint64_t seed = 40;
  module.for_each_parameter("a", [&](std::string const& name, auto value, auto) {
    if (name.ends_with("layernorm.weight"))
      value = (1.0F + 0.1F * random_matrix<float>(static_cast<int>(value.rows()),
                                                  static_cast<int>(value.cols()), ++seed)
                                 .array())
                  .matrix();
    else
      value = random_matrix<float>(static_cast<int>(value.rows()), static_cast<int>(value.cols()),
                                   ++seed, 0.08);
  });
  for (int step = 0; step < 2; ++step) {
    module.zero_grad();
    twin.zero_grad();
    auto const x = random_matrix<float>(N, H, 300 + step);
    auto const dy = random_matrix<float>(N, H, 400 + step, 0.01);
    mm::row_matrix<float> y(N, H), dx(N, H);
    {
      auto f = ctx.scratch<float>().open();
      module.linears().bind(ctx, f);
      module.forward(ctx.executor<float>(), in(x), S, B, out(y));
      module.backward(ctx.executor<float>(), in(dy), out(dx));
    }
    module.linears().end_of_step(mm::parallel::communicator_max());
    // The double module: the fp32 weights, the fp32 module's codes as its operands.
    std::vector<mm::row_matrix<float>> grads;
    module.for_each_parameter(
        "a", [&](std::string const&, auto, auto grad) { grads.emplace_back(grad); });
    std::vector<mm::row_matrix<float>> values;
    module.for_each_parameter(
        "a", [&](std::string const&, auto value, auto) { values.emplace_back(value); });
    std::size_t at = 0;
    twin.for_each_parameter("a", [&](std::string const&, auto value, auto) {
      value = values[at++].template cast<double>();
    });
    auto& replay = twin.linears().operands();
    for (auto l : {ex::linear::fc1, ex::linear::fc2})
      replay.linears[static_cast<std::size_t>(l)] = values_of(module.linears().operands(), l);
    replay.drift = 0.0;
    mm::row_matrix<double> const xd = x.cast<double>(), dyd = dy.cast<double>();
    mm::row_matrix<double> yd(N, H), dxd(N, H);
    twin.forward(ctx.executor<double>(), in(xd), S, B, out(yd));
    twin.backward(ctx.executor<double>(), in(dyd), out(dxd));
    std::string const where = std::string(Recipe::name) + ", step " + std::to_string(step);
    EXPECT_LT(relative_error(y, to_mat(yd)), 1e-5) << "output, " << where;
    EXPECT_LT(relative_error(dx, to_mat(dxd)), 1e-5) << "dx, " << where;
    at = 0;
    twin.for_each_parameter("a", [&](std::string const& name, auto, auto grad) {
      EXPECT_LT(relative_error(grads[at++], to_mat(grad)), 1e-5) << name << ", " << where;
    });
    EXPECT_LT(replay.drift, quantization_tolerance(Recipe::value))
        << replay.drift_at << ", " << where;
    EXPECT_GT(replay.drift, 0.0) << "the codes should differ from the values, " << where;
  }
}

/// Multi-head latent attention under Recipe, as attention_matches_its_codes: its five linears in
/// three operands objects, each against the double module on that object's codes.
template <class Recipe>
void latent_attention_matches_its_codes() {
  using ops_type = recipe_ops<Recipe>;
  constexpr int H = 160, heads = 4, S = 16, B = 3, N = S * B;
  mm::mla_dims const dims{.q_lora_rank = 48,
                          .kv_lora_rank = 32,
                          .qk_head_dim = 32,
                          .qk_pos_emb_head_dim = 16,
                          .v_head_dim = 32};
  mm::context ctx(2);
  mm::latent_attention<float, true, mm::parallel::cp_comm_type::p2p, ops_type> module(
      H, heads, dims, 10000.0, 1e-5, 1,
      mm::mla_operands<ops_type>{mm::make_linear_operands<ops_type>(5, nullptr),
                                 mm::make_linear_operands<ops_type>(6, nullptr),
                                 mm::make_linear_operands<ops_type>(7, nullptr)});
  mm::latent_attention<double, true, mm::parallel::cp_comm_type::p2p, replay_operands> twin(
      H, heads, dims);
  module.for_each_linears([](std::string_view, auto& l) { l.operands().keep_all_codes(true); });
  std::uint64_t seed = 80;
  module.for_each_parameter("a", [&](std::string const& name, auto value, auto) {
    auto const r = random_matrix<float>(static_cast<int>(value.rows()),
                                        static_cast<int>(value.cols()), ++seed);
    if (name.ends_with("layernorm.weight"))
      value = (1.0F + 0.1F * r.array()).matrix();
    else
      value = 0.08F * r;
  });
  for (int step = 0; step < 2; ++step) {
    module.zero_grad();
    twin.zero_grad();
    auto const x = random_matrix<float>(N, H, 700 + step);
    auto const dy = random_matrix<float>(N, H, 800 + step, 0.01);
    mm::row_matrix<float> y(N, H), dx(N, H);
    {
      auto f = ctx.scratch<float>().open();
      module.for_each_linears([&](std::string_view, auto& l) { l.bind(ctx, f); });
      module.forward(ctx.executor<float>(), in(x), S, B, out(y));
      module.backward(ctx.executor<float>(), in(dy), out(dx));
    }
    module.for_each_linears(
        [](std::string_view, auto& l) { l.end_of_step(mm::parallel::communicator_max()); });
    std::vector<mm::row_matrix<float>> grads, values;
    module.for_each_parameter("a", [&](std::string const&, auto value, auto grad) {
      values.emplace_back(value);
      grads.emplace_back(grad);
    });
    std::size_t at = 0;
    twin.for_each_parameter("a", [&](std::string const&, auto value, auto) {
      value = values[at++].template cast<double>();
    });
    // Each operands object's codes replayed by the twin's object of the same part (proj's
    // second slot is unused).
    std::vector<replay_operands*> replays;
    twin.for_each_linears([&](std::string_view, auto& l) { replays.push_back(&l.operands()); });
    std::size_t part = 0;
    module.for_each_linears([&](std::string_view name, auto& l) {
      auto& replay = *replays[part++];
      for (auto lin : {ex::linear::fc1, ex::linear::fc2})
        if (lin == ex::linear::fc1 || name != ".proj")
          replay.linears[static_cast<std::size_t>(lin)] = values_of(l.operands(), lin);
      replay.drift = 0.0;
    });
    mm::row_matrix<double> const xd = x.cast<double>(), dyd = dy.cast<double>();
    mm::row_matrix<double> yd(N, H), dxd(N, H);
    twin.forward(ctx.executor<double>(), in(xd), S, B, out(yd));
    twin.backward(ctx.executor<double>(), in(dyd), out(dxd));
    std::string const where = std::string(Recipe::name) + ", step " + std::to_string(step);
    EXPECT_LT(relative_error(y, to_mat(yd)), 1e-5) << "output, " << where;
    EXPECT_LT(relative_error(dx, to_mat(dxd)), 1e-5) << "dx, " << where;
    at = 0;
    twin.for_each_parameter("a", [&](std::string const& name, auto, auto grad) {
      EXPECT_LT(relative_error(grads[at++], to_mat(grad)), 1e-5) << name << ", " << where;
    });
    for (auto const* replay : replays) {
      EXPECT_LT(replay->drift, quantization_tolerance(Recipe::value))
          << replay->drift_at << ", " << where;
      EXPECT_GT(replay->drift, 0.0) << "the codes should differ from the values, " << where;
    }
  }
}

/// The dense FFN (SwiGLU) under Recipe on Backend, as attention_matches_its_codes.
template <class Recipe, class Backend = ex::grouped_gemm>
void dense_matches_its_codes() {
  using ops_type = recipe_ops<Recipe>;
  constexpr int H = 160, F = 96, N = 40;
  mm::context ctx(2);
  mm::dense_mlp<float, ex::activation_function::swiglu, Backend, ops_type> module(
      H, F, mm::make_linear_operands<ops_type>(6, nullptr));
  mm::dense_mlp<double, ex::activation_function::swiglu, ex::grouped_gemm, replay_operands> twin(H,
                                                                                                 F);
  module.operands().keep_all_codes(true);
  std::uint64_t seed = 70;
  module.for_each_parameter("m", [&](std::string const&, auto value, auto) {
    value = random_matrix<float>(static_cast<int>(value.rows()), static_cast<int>(value.cols()),
                                 ++seed, 0.08);
  });
  for (int step = 0; step < 2; ++step) {
    module.zero_grad();
    twin.zero_grad();
    auto const x = random_matrix<float>(N, H, 500 + step);
    auto const dy = random_matrix<float>(N, H, 600 + step, 0.01);
    mm::row_matrix<float> y(N, H), dx(N, H);
    {
      auto f = ctx.scratch<float>().open();
      module.bind_operands(ctx, f);
      module.forward(ctx.executor<float>(), in(x), out(y));
      module.backward(ctx.executor<float>(), in(dy), out(dx));
    }
    module.end_of_step(mm::parallel::communicator_max());
    std::vector<mm::row_matrix<float>> grads, values;
    module.for_each_parameter("m", [&](std::string const&, auto value, auto grad) {
      values.emplace_back(value);
      grads.emplace_back(grad);
    });
    std::size_t at = 0;
    twin.for_each_parameter("m", [&](std::string const&, auto value, auto) {
      value = values[at++].template cast<double>();
    });
    auto& replay = twin.operands();
    for (auto l : {ex::linear::fc1, ex::linear::fc2})
      replay.linears[static_cast<std::size_t>(l)] = values_of(module.operands(), l);
    auto const kept = module.operands().fc1_output_kept();
    replay.kept_fc1_output.assign(static_cast<std::size_t>(N) * 2 * F, 0.0);
    for (std::size_t i = 0; i < replay.kept_fc1_output.size(); ++i)
      replay.kept_fc1_output[i] = pr::from_bf16_bits(kept[i]);
    replay.drift = 0.0;
    mm::row_matrix<double> const xd = x.cast<double>(), dyd = dy.cast<double>();
    mm::row_matrix<double> yd(N, H), dxd(N, H);
    twin.forward(ctx.executor<double>(), in(xd), out(yd));
    twin.backward(ctx.executor<double>(), in(dyd), out(dxd));
    std::string const where = std::string(Recipe::name) + ", step " + std::to_string(step);
    EXPECT_LT(relative_error(y, to_mat(yd)), 1e-5) << "output, " << where;
    EXPECT_LT(relative_error(dx, to_mat(dxd)), 1e-5) << "dx, " << where;
    at = 0;
    twin.for_each_parameter("m", [&](std::string const& name, auto, auto grad) {
      EXPECT_LT(relative_error(grads[at++], to_mat(grad)), 1e-5) << name << ", " << where;
    });
    EXPECT_LT(replay.drift, quantization_tolerance(Recipe::value))
        << replay.drift_at << ", " << where;
    EXPECT_GT(replay.drift, 0.0) << where;
  }
}

using fp8_delayed = pr::fp8_tensorwise<pr::delayed>;
using fp8_current = pr::fp8_tensorwise<pr::current>;

TEST(RecipeModules, AttentionMatchesItsCodesBf16) {
  attention_matches_its_codes<pr::bf16>();
}
TEST(RecipeModules, AttentionMatchesItsCodesFp8Delayed) {
  attention_matches_its_codes<fp8_delayed>();
}
TEST(RecipeModules, AttentionMatchesItsCodesFp8Current) {
  attention_matches_its_codes<fp8_current>();
}
TEST(RecipeModules, AttentionMatchesItsCodesFp8Blockwise) {
  attention_matches_its_codes<pr::fp8_blockwise>();
}
TEST(RecipeModules, AttentionMatchesItsCodesMxfp8) {
  attention_matches_its_codes<pr::mxfp8>();
}
TEST(RecipeModules, AttentionMatchesItsCodesNvfp4) {
  attention_matches_its_codes<pr::nvfp4>();
}
TEST(RecipeModules, LatentAttentionMatchesItsCodesFp8Current) {
  latent_attention_matches_its_codes<fp8_current>();
}
TEST(RecipeModules, LatentAttentionMatchesItsCodesMxfp8) {
  latent_attention_matches_its_codes<pr::mxfp8>();
}
TEST(RecipeModules, LatentAttentionMatchesItsCodesNvfp4) {
  latent_attention_matches_its_codes<pr::nvfp4>();
}
TEST(RecipeModules, DenseMatchesItsCodesBf16) {
  dense_matches_its_codes<pr::bf16>();
}
TEST(RecipeModules, DenseMatchesItsCodesFp8Delayed) {
  dense_matches_its_codes<fp8_delayed>();
}
TEST(RecipeModules, DenseMatchesItsCodesFp8Current) {
  dense_matches_its_codes<fp8_current>();
}
TEST(RecipeModules, DenseMatchesItsCodesFp8Blockwise) {
  dense_matches_its_codes<pr::fp8_blockwise>();
}
TEST(RecipeModules, DenseMatchesItsCodesMxfp8) {
  dense_matches_its_codes<pr::mxfp8>();
}
TEST(RecipeModules, DenseMatchesItsCodesNvfp4) {
  dense_matches_its_codes<pr::nvfp4>();
}

#if MEGAMOE_HAS_AMX_INTRINSICS
/// Both modules under bf16 and NVFP4 on BF16 unit B (the products of BF16 values exact, sums in
/// fp32): the same check against the double module on their codes.
template <ex::gemm_backend B>
bool on_bf16_unit_matches_its_codes() {
  if (!ex::unavailable_reason(B).empty()) return false;
  using backend = ex::backend_t<B>;
  attention_matches_its_codes<pr::bf16, backend>();
  attention_matches_its_codes<pr::nvfp4, backend>();
  dense_matches_its_codes<pr::bf16, backend>();
  dense_matches_its_codes<pr::nvfp4, backend>();
  return true;
}
TEST(RecipeModules, OnAvx512Bf16TheModulesMatchTheirCodes) {
  if (!on_bf16_unit_matches_its_codes<ex::gemm_backend::avx512_bf16>())
    GTEST_SKIP() << ex::unavailable_reason(ex::gemm_backend::avx512_bf16);
}
TEST(RecipeModules, OnAmxTheModulesMatchTheirCodes) {
  if (!on_bf16_unit_matches_its_codes<ex::gemm_backend::amx>())
    GTEST_SKIP() << ex::unavailable_reason(ex::gemm_backend::amx);
}
#endif

/// A tiny whole model (an MoE layer, then a dense one) under Precision: every linear quantized.
namespace rt = mm::router;
namespace md = mm::model;
template <class Precision>
using tiny_model = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<64>, mm::experts<4>>,
                                   rt::top_k<2, rt::aux_loss<1e-2>>, mm::dispatch::local,
                                   mm::expert::mlp<mm::expert::swiglu>, Precision,
                                   md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<256>,
                                               md::dense_ffn<128>, md::moe_layer_freq<2>>>;

/// Held-out bits per byte after a short run on the shipped sample.
template <class Precision>
double heldout_after_training() {
  auto const corpus = mm::testing::sample_data(32);
  mm::transformer<tiny_model<Precision>> model;
  model.initialize(1, 0.05);
  megamoe::train::train_settings settings;
  settings.seq_length = 32;
  settings.micro_batch = 8;
  settings.steps = 120;
  settings.schedule = {3e-3, 3e-4, 8, settings.steps};
  megamoe::train::trainer<tiny_model<Precision>> trainer(model, corpus, settings);
  mm::context ctx(2);
  for (int i = 0; i < settings.steps; ++i) EXPECT_FALSE(trainer.step(ctx).skipped);
  return trainer.heldout_bits_per_byte(ctx, 64);
}

// The layer issue's bounds on the whole model: within 5 % of fp32 for bf16, 15 % for FP8, 40 %
// for NVFP4; and every recipe learns (below the sample's unigram baseline).
TEST(RecipeModules, ATinyModelTrainsCloseToFp32UnderEveryRecipe) {
  double const fp32 = heldout_after_training<pr::fp32>();
  auto const unigram = mm::testing::sample_data(32).unigram_bits_per_byte(0, 64, 4096);
  auto expect = [&](char const* name, double bpb, double bound) {
    std::cout << name << ": held-out " << bpb << " bits per byte (fp32 " << fp32 << ", "
              << 100.0 * (bpb / fp32 - 1.0) << " %)\n";
    EXPECT_LT(std::abs(bpb / fp32 - 1.0), bound) << name;
    EXPECT_LT(bpb, unigram) << name;
  };
  EXPECT_LT(fp32, unigram);
  expect("bf16", heldout_after_training<pr::bf16>(), 0.05);
  expect("fp8_delayed", heldout_after_training<fp8_delayed>(), 0.15);
  expect("fp8_current", heldout_after_training<fp8_current>(), 0.15);
  expect("fp8_blockwise", heldout_after_training<pr::fp8_blockwise>(), 0.15);
  expect("mxfp8", heldout_after_training<pr::mxfp8>(), 0.15);
  expect("nvfp4", heldout_after_training<pr::nvfp4>(), 0.40);
}

}  // namespace

namespace {

/// What `steps` steps of the tiny model under Precision give: each step's loss and every
/// parameter after. `given` may keep layers in BF16; after_step(trainer, ctx) runs after each step.
struct tiny_run {
  std::vector<double> losses;
  std::vector<float> parameters;
};
template <class Precision, class AfterStep>
tiny_run train_tiny(mm::startup_values const& given, int steps, AfterStep&& after_step) {
  using config = tiny_model<Precision>;
  auto const corpus = mm::testing::sample_data(32);
  mm::transformer<config> model(given);
  model.initialize(1, 0.05);
  megamoe::train::train_settings settings;
  settings.seq_length = 32;
  settings.micro_batch = 4;
  settings.steps = steps;
  megamoe::train::trainer<config> trainer(model, corpus, settings);
  mm::context ctx(2);
  tiny_run run;
  for (int i = 0; i < steps; ++i) {
    run.losses.push_back(trainer.step(ctx).loss);
    after_step(trainer, ctx);
  }
  model.for_each_parameter([&](std::string_view, auto value, auto, auto) {
    run.parameters.insert(run.parameters.end(), value.data(), value.data() + value.size());
  });
  return run;
}

/// Losses of `steps` steps of the tiny model under delayed scaling, with a held-out evaluation
/// after each step or without.
std::vector<double> delayed_losses(bool evaluate, int steps) {
  return train_tiny<fp8_delayed>({}, steps,
                                 [&](auto& trainer, mm::context& ctx) {
                                   if (evaluate) trainer.heldout_bits_per_byte(ctx, 8);
                                 })
      .losses;
}

// An evaluation's forwards quantize with the current scales and record no amaxes: training under
// delayed scaling is the same however often it is evaluated.
TEST(RecipeModules, EvaluatingDoesNotChangeDelayedScaling) {
  EXPECT_EQ(delayed_losses(true, 6), delayed_losses(false, 6));
}

/// train_tiny with `bf16_start` / `bf16_end` layers kept in BF16 (none where not given).
template <class Precision>
tiny_run tiny_run_of(std::optional<int> bf16_start, std::optional<int> bf16_end, int steps = 3) {
  mm::startup_values given;
  given.bf16_layers_at_start = bf16_start;
  given.bf16_layers_at_end = bf16_end;
  return train_tiny<Precision>(given, steps, [](auto&, mm::context&) {});
}

// A layer kept in BF16 under an FP8 or FP4 recipe runs the bf16 recipe's modules: with every
// layer kept, the model trains as the bf16 model does, bit for bit; with none, as the recipe's.
TEST(RecipeModules, LayersKeptInBf16RunTheBf16Recipe) {
  auto const bf16 = tiny_run_of<pr::bf16>({}, {});
  for (auto const& run : {tiny_run_of<pr::nvfp4>(1, 1), tiny_run_of<fp8_delayed>(2, 0),
                          tiny_run_of<pr::mxfp8>(0, 2)}) {
    EXPECT_EQ(run.losses, bf16.losses);
    EXPECT_EQ(run.parameters, bf16.parameters);
  }
  auto const nvfp4 = tiny_run_of<pr::nvfp4>({}, {});
  auto const none = tiny_run_of<pr::nvfp4>(0, 0);
  EXPECT_EQ(none.losses, nvfp4.losses);
  EXPECT_EQ(none.parameters, nvfp4.parameters);
  EXPECT_NE(nvfp4.losses, bf16.losses);
  // One layer of two: neither model's.
  auto const first = tiny_run_of<pr::nvfp4>(1, 0);
  EXPECT_NE(first.losses, bf16.losses);
  EXPECT_NE(first.losses, nvfp4.losses);
}

// Which layers are kept, and the delayed-scaling state only the others have.
TEST(RecipeModules, OnlyLayersUnderTheRecipeKeepDelayedScalingState) {
  using config =
      mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<64>, mm::experts<4>>, rt::top_k<2>,
                      mm::dispatch::local, mm::expert::mlp<mm::expert::swiglu>, fp8_delayed,
                      md::decoder<md::layers<4>, md::heads<4>, md::vocabulary<256>,
                                  md::dense_ffn<128>, md::moe_layer_freq<2>>>;
  mm::startup_values given;
  given.bf16_layers_at_start = 1;
  given.bf16_layers_at_end = 1;
  mm::transformer<config> model(given);
  std::vector<bool> kept;
  for (int i = 0; i < model.layers(); ++i) kept.push_back(model.is_bf16_layer(i));
  EXPECT_EQ(kept, (std::vector<bool>{true, false, false, true}));
  std::vector<std::string> names;
  model.for_each_persistent_state(
      [&](mm::persistent_state const& s) { names.emplace_back(s.name); });
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"decoder.layers.1.mlp.fp8_delayed_state",
                                             "decoder.layers.1.self_attention.fp8_delayed_state",
                                             "decoder.layers.2.mlp.experts.fp8_delayed_state",
                                             "decoder.layers.2.self_attention.fp8_delayed_state"}));
  int moe_layers = 0;
  model.for_each_moe_layer([&](auto const&, int ordinal) { EXPECT_EQ(ordinal, moe_layers++); });
  EXPECT_EQ(moe_layers, 2);
}

// The MTP depths' layers as the reference runs them: under FP8 in FP8 whatever the BF16 layer
// counts (their delayed-scaling state is kept and named), under NVFP4 in BF16.
TEST(RecipeModules, MultiTokenPredictionLayersRunInFp8AndNotInFp4) {
  using decoder = md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<256>, md::dense_ffn<128>,
                              md::moe_layer_freq<2>, md::multi_token_prediction<1>>;
  using fp8_config = mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<64>, mm::experts<4>>,
                                     rt::top_k<2>, mm::dispatch::local,
                                     mm::expert::mlp<mm::expert::swiglu>, fp8_delayed, decoder>;
  using fp4_config =
      mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<64>, mm::experts<4>>, rt::top_k<2>,
                      mm::dispatch::local, mm::expert::mlp<mm::expert::swiglu>, pr::nvfp4, decoder>;
  mm::startup_values given;
  given.bf16_layers_at_start = 1;
  given.bf16_layers_at_end = 1;
  mm::transformer<fp8_config> fp8(given);
  EXPECT_EQ((std::vector<bool>{fp8.is_bf16_layer(0), fp8.is_bf16_layer(1), fp8.is_bf16_layer(2)}),
            (std::vector<bool>{true, true, false}));
  std::vector<std::string> names;
  fp8.for_each_persistent_state([&](mm::persistent_state const& s) { names.emplace_back(s.name); });
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{
                       "mtp.layers.0.transformer_layer.mlp.fp8_delayed_state",
                       "mtp.layers.0.transformer_layer.self_attention.fp8_delayed_state"}));
  mm::transformer<fp4_config> fp4;
  EXPECT_EQ((std::vector<bool>{fp4.is_bf16_layer(0), fp4.is_bf16_layer(1), fp4.is_bf16_layer(2)}),
            (std::vector<bool>{false, false, true}));
  // Both train a step: finite losses, the MTP depth's included.
  mm::context ctx(2);
  std::vector<std::int32_t> tokens(16), targets(16);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>((7 * i + 3) % 256);
    targets[i] = static_cast<std::int32_t>((7 * i + 5) % 256);
  }
  auto step = [&](auto& model) {
    model.initialize(3);
    auto const out = model.forward(ctx, tokens, targets, 8, 2);
    model.backward(ctx, 1.0F);
    EXPECT_TRUE(std::isfinite(out.cross_entropy));
    EXPECT_GT(out.mtp_loss, 0.0);
    EXPECT_TRUE(std::isfinite(out.mtp_loss));
  };
  step(fp8);
  step(fp4);
}

// R053: a count outside [0, num_layers], or BF16 layers under a recipe that is not FP8 or FP4.
TEST(RecipeModules, LayersKeptInBf16AreCheckedByR053) {
  auto fails = [](auto make) {
    try {
      make();
    } catch (mm::config_error const& e) {
      return e.which() == mm::rules::id::bf16_edge_layers;
    }
    return false;
  };
  auto given = [](std::optional<int> start, std::optional<int> end) {
    mm::startup_values g;
    g.bf16_layers_at_start = start;
    g.bf16_layers_at_end = end;
    return g;
  };
  EXPECT_TRUE(fails([&] { mm::transformer<tiny_model<pr::nvfp4>> m(given(3, {})); }));
  EXPECT_TRUE(fails([&] { mm::transformer<tiny_model<pr::nvfp4>> m(given({}, -1)); }));
  EXPECT_TRUE(fails([&] { mm::transformer<tiny_model<pr::bf16>> m(given(1, {})); }));
  EXPECT_TRUE(fails([&] { mm::transformer<tiny_model<pr::fp32>> m(given({}, 1)); }));
  EXPECT_FALSE(fails([&] { mm::transformer<tiny_model<pr::fp32>> m(given(0, 0)); }));
  EXPECT_FALSE(fails([&] { mm::transformer<tiny_model<pr::nvfp4>> m(given(2, 2)); }));
}

}  // namespace

namespace {

using dmat = mm::row_matrix<double>;

/// RMSNorm in double, forward and backward (model/norm.hpp's formulas), keeping its input.
struct double_norm {
  dmat w, x;
  std::vector<double> r;
  double eps;
  dmat forward(dmat const& in) {
    x = in;
    r.resize(static_cast<std::size_t>(x.rows()));
    dmat y(x.rows(), x.cols());
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      r[static_cast<std::size_t>(t)] =
          1.0 / std::sqrt(x.row(t).squaredNorm() / static_cast<double>(x.cols()) + eps);
      y.row(t) = (x.row(t) * r[static_cast<std::size_t>(t)]).cwiseProduct(w);
    }
    return y;
  }
  dmat backward(dmat const& dy, dmat& dw) const {
    dmat dx(x.rows(), x.cols());
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      double const rt = r[static_cast<std::size_t>(t)];
      dw += (dy.row(t).cwiseProduct(x.row(t)) * rt);
      Eigen::RowVectorXd const g = dy.row(t).cwiseProduct(w);
      double const mean_gx = g.dot(x.row(t)) / static_cast<double>(x.cols());
      dx.row(t) = rt * (g - x.row(t) * (rt * rt * mean_gx));
    }
    return dx;
  }
};

dmat of_ref(ref::mat const& m) {
  dmat out(static_cast<Eigen::Index>(m.size()),
           static_cast<Eigen::Index>(m.empty() ? 0 : m[0].size()));
  for (std::size_t r = 0; r < m.size(); ++r)
    for (std::size_t c = 0; c < m[r].size(); ++c)
      out(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)) = m[r][c];
  return out;
}

/// One training step of the tiny whole model (an MoE layer, then a dense one) under Recipe against
/// a double model on its own codes: the embedding, norms, residuals, attention's core, the
/// router, the activation and the loss in double, every GEMM on the dequantized codes the fp32
/// model's modules used (attention and the dense FFN through their double twins, the MoE layer
/// through the plain reference). The loss and every gradient agree to 1e-5.
template <class Recipe>
void whole_model_matches_its_codes() {
  using config = tiny_model<Recipe>;
  constexpr int S = 16, B = 2, N = S * B;
  constexpr double loss_scale = 0.5;
  mm::context ctx(2);
  mm::transformer<config> model;
  model.initialize(3, 0.05);
  int const H = model.hidden_size(), V = model.values().model.vocabulary;
  std::vector<std::int32_t> tokens(N), targets(N);
  for (int t = 0; t < N; ++t) {
    tokens[static_cast<std::size_t>(t)] = (37 * t + 11) % V;
    targets[static_cast<std::size_t>(t)] = (53 * t + 7) % V;
  }
  model.for_each_layer_modules([](int, auto& attention, auto& ffn) {
    attention.linears().operands().keep_all_codes(true);
    if constexpr (requires { ffn.keep_all_operand_codes(true); })
      ffn.keep_all_operand_codes(true);
    else
      ffn.operands().keep_all_codes(true);
  });
  ctx.step.mode = mm::router::pass::training;
  ctx.step.loss_backward_scale = loss_scale;
  model.zero_grad();
  double const loss = model.forward(ctx, tokens, targets, S, B).cross_entropy;
  model.backward(ctx, 1.0);

  std::map<std::string, dmat> value, grad, want;
  model.for_each_parameter([&](std::string_view name, auto v, auto g, mm::parameter_kind) {
    value[std::string(name)] = v.template cast<double>();
    grad[std::string(name)] = g.template cast<double>();
    want[std::string(name)] = dmat::Zero(g.rows(), g.cols());
  });
  double const eps = model.model_settings().norm_epsilon;
  auto norm_of = [&](std::string const& name) { return double_norm{value.at(name), {}, {}, eps}; };
  auto& exec = ctx.executor<double>();

  // Forward, keeping what each layer's backward needs.
  dmat x(N, H);
  for (int t = 0; t < N; ++t)
    x.row(t) =
        value.at("embedding.word_embeddings.weight").row(tokens[static_cast<std::size_t>(t)]);
  using attention_twin = mm::causal_attention<double, config::model::value.qk_layernorm,
                                              mm::parallel::cp_comm_type::p2p, replay_operands>;
  using dense_twin =
      mm::dense_mlp<double, ex::activation_function::swiglu, ex::grouped_gemm, replay_operands>;
  struct layer_twin {
    std::string prefix;
    double_norm input_norm, pre_mlp_norm;
    std::unique_ptr<attention_twin> attention;
    std::unique_ptr<dense_twin> dense;
    std::optional<ref::recipe_result> moe;
  };
  std::vector<layer_twin> layers;
  model.for_each_layer_modules([&](int layer, auto& attention, auto& ffn) {
    auto& l = layers.emplace_back();
    l.prefix = "decoder.layers." + std::to_string(layer);
    auto const& m = model.model_settings();
    l.input_norm = norm_of(l.prefix + ".input_layernorm.weight");
    l.pre_mlp_norm = norm_of(l.prefix + ".pre_mlp_layernorm.weight");
    l.attention = std::make_unique<attention_twin>(H, m.heads, m.query_groups, m.rope_base, eps, 1);
    std::vector<dmat> values;
    attention.for_each_parameter("a", [&](std::string const&, auto v, auto) {
      values.emplace_back(v.template cast<double>());
    });
    std::size_t at = 0;
    l.attention->for_each_parameter("a",
                                    [&](std::string const&, auto v, auto) { v = values[at++]; });
    for (auto lin : {ex::linear::fc1, ex::linear::fc2})
      l.attention->linears().operands().linears[static_cast<std::size_t>(lin)] =
          values_of(attention.linears().operands(), lin);
    dmat const h = l.input_norm.forward(x);
    dmat a(N, H);
    l.attention->forward(exec, in(h), S, B, out(a));
    x += a;
    dmat const h2 = l.pre_mlp_norm.forward(x);
    if constexpr (requires { ffn.keep_all_operand_codes(true); }) {
      auto const& perm = ffn.permutation();
      auto const& probs = ffn.router().output().probs;
      ref::recipe_rows rows{perm.source_token, perm.row_expert, {}};
      for (int j = 0; j < perm.rows(); ++j)
        rows.row_prob.push_back(
            static_cast<double>(probs(perm.source_token[static_cast<std::size_t>(j)],
                                      perm.row_expert[static_cast<std::size_t>(j)])));
      std::vector<ref::expert_operands> ops;
      std::int64_t first_row = 0;
      for (int e = 0; e < ffn.num_experts(); ++e) {
        ops.push_back(mm::testing::operands_of(ffn, e, first_row));
        first_row += perm.tokens_per_expert[static_cast<std::size_t>(e)];
      }
      l.moe = ref::recipe_forward_backward(std::decay_t<decltype(ffn)>::activation,
                                           to_mat(value.at(l.prefix + ".mlp.router.weight")),
                                           ffn.router().config(), ffn.router().state().expert_bias,
                                           to_mat(h2), B, loss_scale, rows, ops);
      x += of_ref(l.moe->y);
    } else {
      l.dense = std::make_unique<dense_twin>(H, m.dense_ffn);
      values.clear();
      ffn.for_each_parameter("m", [&](std::string const&, auto v, auto) {
        values.emplace_back(v.template cast<double>());
      });
      at = 0;
      l.dense->for_each_parameter("m", [&](std::string const&, auto v, auto) { v = values[at++]; });
      auto& replay = l.dense->operands();
      for (auto lin : {ex::linear::fc1, ex::linear::fc2})
        replay.linears[static_cast<std::size_t>(lin)] = values_of(ffn.operands(), lin);
      auto const kept = ffn.operands().fc1_output_kept();
      replay.kept_fc1_output.assign(static_cast<std::size_t>(N) * 2 * m.dense_ffn, 0.0);
      for (std::size_t i = 0; i < replay.kept_fc1_output.size(); ++i)
        replay.kept_fc1_output[i] = pr::from_bf16_bits(kept[i]);
      dmat f(N, H);
      l.dense->forward(exec, in(h2), out(f));
      x += f;
    }
  });
  ASSERT_EQ(layers.size(), 2U);
  auto final_norm = norm_of("decoder.final_layernorm.weight");
  dmat const hf = final_norm.forward(x);
  dmat const& w_out = value.at("output_layer.weight");
  dmat const logits = hf * w_out.transpose();
  double cross_entropy = 0.0;
  dmat dlogits(N, V);
  for (int t = 0; t < N; ++t) {
    double const top = logits.row(t).maxCoeff();
    double const sum = (logits.row(t).array() - top).exp().sum();
    int const target = targets[static_cast<std::size_t>(t)];
    cross_entropy += top + std::log(sum) - logits(t, target);
    dlogits.row(t) = (logits.row(t).array() - top).exp() / sum / N;
    dlogits(t, target) -= 1.0 / N;
  }
  cross_entropy /= N;

  // Backward.
  want.at("output_layer.weight") = dlogits.transpose() * hf;
  dmat dx = final_norm.backward(dlogits * w_out, want.at("decoder.final_layernorm.weight"));
  for (auto l = layers.rbegin(); l != layers.rend(); ++l) {
    dmat dh2(N, H);
    if (l->moe) {
      dh2 = of_ref(l->moe->grad.x);
      want.at(l->prefix + ".mlp.router.weight") = of_ref(l->moe->grad.router);
      for (std::size_t e = 0; e < l->moe->grad.fc1.size(); ++e) {
        want.at(l->prefix + ".mlp.experts.linear_fc1.weight" + std::to_string(e)) =
            of_ref(l->moe->grad.fc1[e]);
        want.at(l->prefix + ".mlp.experts.linear_fc2.weight" + std::to_string(e)) =
            of_ref(l->moe->grad.fc2[e]);
      }
    } else {
      l->dense->backward(exec, in(dx), out(dh2));
      l->dense->for_each_parameter(
          l->prefix + ".mlp", [&](std::string const& name, auto, auto g) { want.at(name) = g; });
    }
    dx += l->pre_mlp_norm.backward(dh2, want.at(l->prefix + ".pre_mlp_layernorm.weight"));
    dmat dh(N, H);
    l->attention->backward(exec, in(dx), out(dh));
    l->attention->for_each_parameter(
        l->prefix + ".self_attention",
        [&](std::string const& name, auto, auto g) { want.at(name) = g; });
    dx += l->input_norm.backward(dh, want.at(l->prefix + ".input_layernorm.weight"));
  }
  auto& d_embedding = want.at("embedding.word_embeddings.weight");
  for (int t = 0; t < N; ++t) d_embedding.row(tokens[static_cast<std::size_t>(t)]) += dx.row(t);

  std::string const where = std::string(Recipe::name);
  EXPECT_NEAR(loss, cross_entropy, 1e-5 * cross_entropy) << where;
  for (auto const& [name, g] : want)
    EXPECT_LT(relative_error(grad.at(name), to_mat(g)), 1e-5) << name << ", " << where;
  for (auto const& l : layers) {
    EXPECT_GT(l.attention->linears().operands().drift, 0.0) << l.prefix << ", " << where;
    if (l.dense) {
      EXPECT_GT(l.dense->operands().drift, 0.0) << l.prefix << ", " << where;
    }
  }
}

TEST(RecipeModules, WholeModelMatchesItsCodesBf16) {
  whole_model_matches_its_codes<pr::bf16>();
}
TEST(RecipeModules, WholeModelMatchesItsCodesFp8Delayed) {
  whole_model_matches_its_codes<fp8_delayed>();
}
TEST(RecipeModules, WholeModelMatchesItsCodesFp8Current) {
  whole_model_matches_its_codes<fp8_current>();
}
TEST(RecipeModules, WholeModelMatchesItsCodesFp8Blockwise) {
  whole_model_matches_its_codes<pr::fp8_blockwise>();
}
TEST(RecipeModules, WholeModelMatchesItsCodesMxfp8) {
  whole_model_matches_its_codes<pr::mxfp8>();
}
TEST(RecipeModules, WholeModelMatchesItsCodesNvfp4) {
  whole_model_matches_its_codes<pr::nvfp4>();
}

}  // namespace

// memory::quantized_weights on the whole model: attention's projections, the dense FFNs and the
// routed experts hold their weights as the recipe's codes, the fp32 masters in the optimizer's
// shards. Against the same model quantizing its fp32 weights at every forward: the same training,
// bit for bit, under every kind of scaling. What the modules hold, and the errors of a model whose
// weights have no codes.
namespace {

/// tiny_model with its linear weights held as codes.
template <class Precision>
using tiny_codes_model =
    mm::make_config<mm::shape<mm::hidden<64>, mm::ffn<64>, mm::experts<4>>,
                    rt::top_k<2, rt::aux_loss<1e-2>>, mm::dispatch::local,
                    mm::expert::mlp<mm::expert::swiglu>, Precision,
                    mm::memory::plan<mm::memory::quantized_weights>,
                    md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<256>,
                                md::dense_ffn<128>, md::moe_layer_freq<2>>>;

/// What `steps` steps of the tiny model give: each step's loss, every parameter's fp32 values by
/// name (for weights held as codes: the optimizer's masters; one rank holds every element) and,
/// after an evaluation (whose forwards quantize the last update's weights where they are not held
/// as codes), the rowwise weight codes of attention's projections and of the dense FFN.
struct codes_run {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> parameters;
  std::vector<std::vector<std::uint8_t>> weight_codes;
  std::size_t master_bytes = 0, freed_bytes = 0;
};
template <class Config>
codes_run train_codes_run(std::optional<int> bf16_start, int steps) {
  auto const corpus = mm::testing::sample_data(32);
  mm::startup_values given;
  given.bf16_layers_at_start = bf16_start;
  mm::transformer<Config> model(given);
  model.initialize(1, 0.05);
  mm::train::train_settings settings;
  settings.seq_length = 32;
  settings.micro_batch = 4;
  settings.steps = steps;
  mm::train::trainer<Config> trainer(model, corpus, settings);
  mm::context ctx(2);
  codes_run run;
  for (int i = 0; i < steps; ++i) run.losses.push_back(trainer.step(ctx).loss);
  model.for_each_parameter([&](std::string_view name, auto value, auto grad, auto kind) {
    if (mm::holds_codes(kind)) run.freed_bytes += static_cast<std::size_t>(grad.size()) * 4;
    if (value.size() > 0)
      run.parameters[std::string(name)].assign(value.data(), value.data() + value.size());
  });
  trainer.optimizer().for_each_shard_piece([&](auto const& piece) {
    if (!mm::holds_codes(piece.kind)) return;
    auto& v = run.parameters[std::string(piece.name)];
    v.resize(static_cast<std::size_t>(piece.rows * piece.cols));
    std::copy_n(piece.values, piece.count, v.begin() + piece.first);
  });
  run.master_bytes = trainer.optimizer().master_bytes();
  trainer.heldout_bits_per_byte(ctx, 8);
  model.for_each_layer_modules([&](int, auto& attention, auto& ffn) {
    using role = pr::operand_role;
    auto keep = [&](auto const& ops) {
      if constexpr (mm::rounds_operands_v<std::decay_t<decltype(ops)>>)
        for (auto l : {mm::expert::linear::fc1, mm::expert::linear::fc2})
          run.weight_codes.push_back(
              ops.codes_of(l, role::weight, pr::operand_usage::rowwise, 0).codes);
    };
    keep(attention.linears().operands());
    if constexpr (requires { ffn.operands(); }) keep(ffn.operands());
  });
  return run;
}

/// Weights held as codes train as the recipe quantizing them at every forward, bit for bit:
/// losses, every fp32 value (the masters) and the weight codes; the modules free their fp32
/// copies of those weights and the optimizer holds them instead.
template <class Precision>
void codes_train_as_quantizing_every_forward(std::optional<int> bf16_start) {
  SCOPED_TRACE(std::string(Precision::name));
  auto const plain = train_codes_run<tiny_model<Precision>>(bf16_start, 4);
  auto const held = train_codes_run<tiny_codes_model<Precision>>(bf16_start, 4);
  EXPECT_EQ(held.losses, plain.losses);
  EXPECT_EQ(held.parameters, plain.parameters);
  ASSERT_FALSE(held.weight_codes.empty());
  EXPECT_EQ(held.weight_codes, plain.weight_codes);
  EXPECT_EQ(plain.master_bytes, 0U);
  EXPECT_EQ(plain.freed_bytes, 0U);
  EXPECT_GT(held.master_bytes, 0U);
  EXPECT_EQ(held.master_bytes, held.freed_bytes);  // one rank: its shard is everything
}

TEST(QuantizedWeights, WholeModelTrainsAsQuantizingEveryForward) {
  // Delayed scaling: each update is quantized after the step's end, with the scale and into the
  // amax history slot of the next step's forwards.
  codes_train_as_quantizing_every_forward<fp8_delayed>({});
  codes_train_as_quantizing_every_forward<fp8_current>({});
  codes_train_as_quantizing_every_forward<pr::mxfp8>({});
  // NVFP4 with the MoE layer kept in BF16 (its weights stay fp32) and the dense layer as codes.
  codes_train_as_quantizing_every_forward<pr::nvfp4>(1);
}

// The kinds and values of a model whose weights are codes, once an optimizer holds them; a
// layer kept in BF16 keeps its fp32 weights.
TEST(QuantizedWeights, ModulesHoldOnlyCodes) {
  using config = tiny_codes_model<fp8_current>;
  auto const corpus = mm::testing::sample_data(32);
  mm::startup_values given;
  given.bf16_layers_at_start = 1;  // layer 0 (MoE) in BF16, layer 1 (dense) under the recipe
  mm::transformer<config> model(given);
  model.initialize(1, 0.05);
  mm::train::train_settings settings;
  settings.seq_length = 32;
  settings.micro_batch = 4;
  mm::train::trainer<config> trainer(model, corpus, settings);
  std::map<std::string, mm::parameter_kind> kinds;
  std::size_t elements = 0;
  model.for_each_parameter([&](std::string_view name, auto value, auto grad, auto kind) {
    kinds[std::string(name)] = kind;
    if (mm::holds_codes(kind)) {
      EXPECT_EQ(value.rows(), 0) << name;
      elements += static_cast<std::size_t>(grad.size());
    } else {
      EXPECT_EQ(value.size(), grad.size()) << name;
    }
  });
  using kind = mm::parameter_kind;
  EXPECT_EQ(kinds.at("decoder.layers.1.self_attention.linear_qkv.weight"), kind::quantized_dense);
  EXPECT_EQ(kinds.at("decoder.layers.1.self_attention.linear_proj.weight"), kind::quantized_dense);
  EXPECT_EQ(kinds.at("decoder.layers.1.mlp.linear_fc1.weight"), kind::quantized_dense);
  EXPECT_EQ(kinds.at("decoder.layers.1.mlp.linear_fc2.weight"), kind::quantized_dense);
  EXPECT_EQ(kinds.at("decoder.layers.1.input_layernorm.weight"), kind::dense);
  EXPECT_EQ(kinds.at("decoder.layers.0.self_attention.linear_qkv.weight"), kind::dense);
  EXPECT_EQ(kinds.at("decoder.layers.0.mlp.experts.linear_fc1.weight0"), kind::expert);
  EXPECT_EQ(kinds.at("embedding.word_embeddings.weight"), kind::dense);
  EXPECT_EQ(kinds.at("output_layer.weight"), kind::dense);
  EXPECT_EQ(trainer.optimizer().master_bytes(), elements * sizeof(float));
  // Drawing the weights again would leave the codes behind: the optimizer holds the values.
  EXPECT_THROW(model.initialize(2), mm::input_error);
  EXPECT_THROW(model.refresh_weight_codes(), mm::input_error);
  EXPECT_THROW((mm::train::trainer<config>(model, corpus, settings)), mm::input_error);
}

// Without codes a forward stops with the reason; weights written through for_each_parameter
// reach the codes with refresh_weight_codes(), and the model then runs as one quantizing them
// at every forward.
TEST(QuantizedWeights, WrittenWeightsNeedTheirCodesRefreshed) {
  std::vector<std::int32_t> tokens(64), targets(64);
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    tokens[t] = static_cast<std::int32_t>((37 * t + 11) % 256);
    targets[t] = static_cast<std::int32_t>((53 * t + 7) % 256);
  }
  mm::context ctx(2);
  ctx.step.mode = mm::router::pass::eval;
  mm::transformer<tiny_codes_model<fp8_current>> held;
  try {
    held.forward(ctx, tokens, targets, 16, 4);
    ADD_FAILURE() << "a forward without codes ran";
  } catch (mm::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("no codes yet"), std::string::npos) << e.what();
  }
  mm::transformer<tiny_model<fp8_current>> plain;
  held.initialize(4, 0.05);
  plain.initialize(4, 0.05);
  auto twice = [](std::string_view, auto value, auto, auto) { value *= 2.0F; };
  held.for_each_parameter(twice);
  plain.for_each_parameter(twice);
  double const stale = held.forward(ctx, tokens, targets, 16, 4).cross_entropy;
  double const want = plain.forward(ctx, tokens, targets, 16, 4).cross_entropy;
  EXPECT_NE(stale, want);
  held.refresh_weight_codes();
  EXPECT_EQ(held.forward(ctx, tokens, targets, 16, 4).cross_entropy, want);
}

}  // namespace
