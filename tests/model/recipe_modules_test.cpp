// SPDX-License-Identifier: Apache-2.0
// Attention's projections and the dense FFN under every precision recipe (model/linear.hpp): one
// step of the fp32 module against the same module in double whose GEMMs read the fp32 module's
// own codes, dequantized (replay_operands). The double module computes everything between the
// GEMMs itself (RoPE, the attention core, SwiGLU), and each value it hands a GEMM is checked to
// quantize to those codes within the recipe's quantization error; so the whole module, not only
// its products, is checked. A short training run of a tiny model per recipe against fp32.
#include "support/layer_helpers.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/tile_gemm.hpp>
#include <megamoe/model/attention.hpp>
#include <megamoe/model/dense_mlp.hpp>
#include <megamoe/model/linear.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/precision/operands.hpp>
#include <megamoe/train/corpus.hpp>
#include <megamoe/train/trainer.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mm = megamoe;
namespace pr = megamoe::precision;
namespace ex = megamoe::expert;

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
  auto const corpus = megamoe::train::byte_corpus::load(std::filesystem::path(MEGAMOE_TEST_DATA) /
                                                        "corpus_sample.txt");
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
  auto const unigram = megamoe::train::byte_corpus::load(std::filesystem::path(MEGAMOE_TEST_DATA) /
                                                         "corpus_sample.txt")
                           .unigram_bits_per_byte();
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
  auto const corpus = megamoe::train::byte_corpus::load(std::filesystem::path(MEGAMOE_TEST_DATA) /
                                                        "corpus_sample.txt");
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
