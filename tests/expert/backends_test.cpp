// SPDX-License-Identifier: Apache-2.0
// GEMM backends (expert/backends.hpp): each fp32 backend (per_expert, grouped, tensor) runs every
// problem of a batch, in fp32 and fp64 and every orientation, including problems without rows and
// with zero depth, against the plain double-precision product; the grouped backend's splits cut
// the work into contiguous shares of rows; the executor's per-thread workspaces; the backend tags'
// classes; and the tile backend under the experts' FFN: on the emulated, AVX512-BF16 and AMX units,
// a SwiGLU FFN under every BF16, FP8 and FP4 recipe equals the grouped backend's.
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/expert/mlp.hpp>
#include <megamoe/expert/tensor_gemm.hpp>
#include <megamoe/expert/tile_gemm.hpp>
#include <megamoe/precision/operands.hpp>

#include "expert/gemm_checks.hpp"
#include "expert/tile_units.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace ex = megamoe::expert;
namespace pr = megamoe::precision;
namespace tl = megamoe::expert::tiles;

using ex::gemm_op;
using ex::gemm_problem;
using megamoe::testing::amx_skip_reason;
using megamoe::testing::avx512_bf16_skip_reason;
using megamoe::testing::expect_product;
using megamoe::testing::label;
using megamoe::testing::operands;
using megamoe::testing::sizes;

// --- The fp32 backends ---------------------------------------------------------------------------

/// A batch as the experts' FFN gives one: experts without rows, zero depth (an expert without
/// tokens in wgrad), tails everywhere, one problem larger than the others.
std::vector<sizes> const batch = {{0, 7, 5},    {13, 17, 19}, {40, 9, 0},   {1, 1, 1},
                                  {70, 33, 65}, {5, 64, 128}, {200, 24, 40}};

/// Runs the batch on Backend with orientation Op and checks every problem.
template <class Backend, gemm_op Op, class T>
void expect_batch(megamoe::thread_pool& pool, bool padded) {
  ex::executor<T> exec(pool);
  std::vector<operands<T>> ops;
  std::vector<std::vector<T>> before;
  std::vector<gemm_problem<T>> problems;
  std::uint64_t seed = 100 * static_cast<std::uint64_t>(Op);
  for (std::size_t i = 0; i < batch.size(); ++i) ops.emplace_back(Op, batch[i], seed++, padded);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    before.push_back(ops[i].c);
    problems.push_back(ops[i].problem(i % 2 == 1));  // every other problem accumulates
  }
  Backend::template run<Op>(exec, std::span<gemm_problem<T> const>(problems));
  for (std::size_t i = 0; i < ops.size(); ++i)
    expect_product(ops[i], before[i], i % 2 == 1, label(Op, batch[i], i % 2 == 1));
}

template <class Backend, class T>
void expect_every_orientation(megamoe::thread_pool& pool, bool padded) {
  expect_batch<Backend, gemm_op::nt, T>(pool, padded);
  expect_batch<Backend, gemm_op::nn, T>(pool, padded);
  expect_batch<Backend, gemm_op::tn, T>(pool, padded);
}

TEST(GemmBackends, EveryFp32BackendComputesEveryProblemOfABatch) {
  for (int threads : {1, 3}) {
    megamoe::thread_pool pool(threads);
    SCOPED_TRACE(std::to_string(threads) + " threads");
    // Operands as the experts' FFN passes them: every leading dimension its row length.
    {
      SCOPED_TRACE("per_expert");
      expect_every_orientation<ex::per_expert_gemm, float>(pool, false);
      expect_every_orientation<ex::per_expert_gemm, double>(pool, false);
    }
    {
      SCOPED_TRACE("grouped");
      expect_every_orientation<ex::grouped_gemm, float>(pool, false);
      expect_every_orientation<ex::grouped_gemm, double>(pool, false);
    }
    {
      SCOPED_TRACE("tensor");
      expect_every_orientation<ex::tensor_gemm, float>(pool, false);
      expect_every_orientation<ex::tensor_gemm, double>(pool, false);
    }
  }
}

TEST(GemmBackends, EveryFp32BackendHonoursLeadingDimensions) {
  megamoe::thread_pool pool(3);
  expect_every_orientation<ex::per_expert_gemm, float>(pool, true);
  expect_every_orientation<ex::grouped_gemm, float>(pool, true);
  expect_every_orientation<ex::grouped_gemm, double>(pool, true);
  expect_every_orientation<ex::tensor_gemm, float>(pool, true);
  expect_every_orientation<ex::tensor_gemm, double>(pool, true);
}

TEST(GroupedGemm, SplitsCutTheWorkIntoContiguousSharesOfRows) {
  megamoe::thread_pool pool(4);
  ex::executor<float> exec(pool);
  std::vector<operands<float>> ops;
  std::vector<gemm_problem<float>> problems;
  for (std::size_t i = 0; i < batch.size(); ++i)
    ops.emplace_back(gemm_op::nn, batch[i], 7 + i, false);
  for (auto& o : ops) problems.push_back(o.problem(false));
  ex::grouped_gemm::run<gemm_op::nn>(exec, std::span<gemm_problem<float> const>(problems));
  auto const splits = exec.splits();
  int const count = static_cast<int>(problems.size());
  ASSERT_EQ(splits.size(), 5U);
  EXPECT_EQ(splits[0].problem, 0);
  EXPECT_EQ(splits[0].row, 0);
  EXPECT_EQ(splits[4].problem, count);
  EXPECT_EQ(splits[4].row, 0);
  for (std::size_t t = 1; t < splits.size(); ++t) {
    auto const& a = splits[t - 1];
    auto const& b = splits[t];
    EXPECT_TRUE(a.problem < b.problem || (a.problem == b.problem && a.row <= b.row)) << t;
    if (b.problem < count) {
      int const m = problems[static_cast<std::size_t>(b.problem)].m;
      EXPECT_TRUE(b.row % ex::grouped_gemm::row_granularity == 0 || b.row == m) << t;
      EXPECT_LE(b.row, m);
    }
  }
  // The cuts fall inside the work: not every share is empty but the first.
  EXPECT_GT(splits[1].problem + splits[1].row, 0);
}

TEST(Executor, OneWorkspacePerPoolThread) {
  megamoe::thread_pool pool(3);
  ex::executor<double> exec(pool);
  EXPECT_EQ(exec.threads(), 3);
  EXPECT_EQ(&exec.pool(), &pool);
  EXPECT_EQ(exec.splits().size(), 4U);
  EXPECT_EQ(exec.workspace_bytes(), 0U);
  operands<double> o(gemm_op::nt, {64, 64, 64}, 1, false);
  std::vector<gemm_problem<double>> const problems{o.problem(false)};
  exec.reserve_for(problems);
  std::size_t const grown = exec.workspace_bytes();
  EXPECT_GT(grown, 0U);
  EXPECT_EQ(grown % 3, 0U);  // every thread's workspace grew alike
  exec.reserve_for(problems);
  EXPECT_EQ(exec.workspace_bytes(), grown);  // grow-only: no second allocation
  // Outside the pool the caller gets the first workspace; a pool thread the one of its index.
  ex::gemm_workspace<double>* const first = &exec.workspace();
  std::vector<std::ptrdiff_t> index(3, -1);
  pool.run(3, [&](int i) {
    index[static_cast<std::size_t>(i)] = &exec.workspace() - first;
    EXPECT_EQ(index[static_cast<std::size_t>(i)], pool.current_thread());
  });
  for (auto at : index) {
    EXPECT_GE(at, 0);
    EXPECT_LT(at, 3);
  }
}

TEST(GemmBackends, TagsMapToTheirClasses) {
  using b = ex::gemm_backend;
  static_assert(std::is_same_v<ex::backend_t<b::auto_>, ex::grouped_gemm>);
  static_assert(std::is_same_v<ex::backend_t<b::per_expert>, ex::per_expert_gemm>);
  static_assert(std::is_same_v<ex::backend_t<b::grouped>, ex::grouped_gemm>);
  static_assert(std::is_same_v<ex::backend_t<b::tensor_contraction>, ex::tensor_gemm>);
#if MEGAMOE_HAS_AMX_INTRINSICS
  static_assert(std::is_same_v<ex::backend_t<b::amx>, ex::tile_backend<tl::hardware_tiles>>);
  static_assert(std::is_same_v<ex::backend_t<b::avx512_bf16>,
                               ex::tile_backend<tl::vector_tiles, b::avx512_bf16>>);
#endif
  static_assert(ex::per_expert_gemm::id == b::per_expert && ex::grouped_gemm::id == b::grouped &&
                ex::tensor_gemm::id == b::tensor_contraction);
  static_assert(ex::tile_backend<tl::emulated_tiles>::id == b::amx);
  static_assert(ex::tile_backend<tl::emulated_tiles, b::avx512_bf16>::id == b::avx512_bf16);
  static_assert(!ex::multiplies_bf16<ex::per_expert_gemm> &&
                !ex::multiplies_bf16<ex::grouped_gemm> && !ex::multiplies_bf16<ex::tensor_gemm>);
  static_assert(ex::multiplies_bf16<ex::tile_backend<tl::emulated_tiles>>);
  // The fp32 backends run everywhere; the BF16 units say why they cannot, if they cannot.
  for (auto backend : {b::auto_, b::per_expert, b::grouped, b::tensor_contraction})
    EXPECT_EQ(ex::unavailable_reason(backend), "") << ex::name_of(backend);
  EXPECT_EQ(ex::unavailable_reason(b::amx), megamoe::cpu().amx_unavailable_reason());
  EXPECT_EQ(ex::unavailable_reason(b::avx512_bf16),
            megamoe::cpu().avx512_bf16_unavailable_reason());
}

// --- The tile backend under the experts' FFN -----------------------------------------------------

/// Forward and backward of a SwiGLU FFN over three experts (one without rows) under a precision
/// recipe, on Backend; every output and gradient.
template <class Backend, class Recipe>
std::vector<std::vector<float>> ffn_step(megamoe::thread_pool& pool) {
  ex::mlp_sizes const sizes{3, 40, 24, ex::activation_function::swiglu, false};
  int const H = sizes.hidden, F = sizes.ffn, W1 = sizes.fc1_rows();
  std::vector<std::int64_t> const per_expert{5, 0, 37};
  int const N = 42;
  ex::expert_parameters<float> params(sizes);
  for (int e = 0; e < sizes.experts; ++e) {
    auto w1 = params.fc1(e);
    auto w2 = params.fc2(e);
    for (Eigen::Index i = 0; i < w1.size(); ++i)
      w1.data()[i] = 0.2F * static_cast<float>(megamoe::standard_normal(20 + e, i));
    for (Eigen::Index i = 0; i < w2.size(); ++i)
      w2.data()[i] = 0.2F * static_cast<float>(megamoe::standard_normal(30 + e, i));
  }
  auto normal = [](std::size_t n, std::uint64_t seed) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i)
      v[i] = static_cast<float>(megamoe::standard_normal(seed, i));
    return v;
  };
  auto const x = normal(std::size_t(N) * H, 1), dy = normal(std::size_t(N) * H, 2);
  std::vector<float> probs(N);
  for (int i = 0; i < N; ++i) probs[static_cast<std::size_t>(i)] = 0.25F + 0.01F * i;
  ex::grouped_rows<float> const rows{N, per_expert, probs.data()};
  std::vector<float> fc1(std::size_t(N) * W1), act(std::size_t(N) * F), out(std::size_t(N) * H);
  std::vector<float> grad_act(act.size()), grad_fc1(fc1.size()), grad_in(out.size()), grad_p(N);
  megamoe::buffer<float> a, b, w;
  pr::grouped_operands<Recipe> ops(sizes.experts);
  ops.bind(pool, a, b, w);
  ex::executor<float> exec(pool);
  ex::grouped_mlp<ex::activation_function::swiglu, Backend, float> mlp(sizes);
  mlp.forward(exec, params, rows, x.data(), fc1.data(), act.data(), out.data(), {}, ops);
  mlp.backward(exec, params, rows, x.data(), fc1.data(), act.data(), dy.data(), grad_act.data(),
               grad_fc1.data(), grad_in.data(), grad_p.data(), {}, ops);
  std::vector<std::vector<float>> result{out, grad_in, grad_p};
  for (int e = 0; e < sizes.experts; ++e) {
    auto const g1 = params.grad_fc1(e);
    auto const g2 = params.grad_fc2(e);
    result.emplace_back(g1.data(), g1.data() + g1.size());
    result.emplace_back(g2.data(), g2.data() + g2.size());
  }
  return result;
}

void expect_close(std::vector<std::vector<float>> const& got,
                  std::vector<std::vector<float>> const& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t t = 0; t < got.size(); ++t) {
    double largest = 0.0, worst = 0.0;
    for (std::size_t i = 0; i < got[t].size(); ++i) {
      largest = std::max(largest, std::abs(static_cast<double>(want[t][i])));
      worst = std::max(worst, std::abs(static_cast<double>(got[t][i]) - want[t][i]));
    }
    EXPECT_LE(worst, 1e-5 * largest) << "tensor " << t;
  }
}

/// Every recipe on Backend against the grouped backend: per-tensor factors (FP8 tensorwise,
/// NVFP4's global scale) come off before the tiles and back on after the product.
template <class Backend>
void every_recipe_as_the_grouped_backend(megamoe::thread_pool& pool) {
  auto one = [&]<class Recipe>(char const* name, Recipe) {
    SCOPED_TRACE(name);
    expect_close(ffn_step<Backend, Recipe>(pool), ffn_step<ex::grouped_gemm, Recipe>(pool));
  };
  one("bf16", pr::bf16{});
  one("fp8 delayed", pr::fp8_tensorwise<pr::delayed>{});
  one("fp8 current", pr::fp8_tensorwise<pr::current>{});
  one("fp8 blockwise", pr::fp8_blockwise{});
  one("mxfp8", pr::mxfp8{});
  one("nvfp4", pr::nvfp4{});
}

TEST(TileBackend, EmulatedTilesRunEveryRecipeAsTheGroupedBackend) {
  megamoe::thread_pool pool(2);
  auto const before = tl::products_issued().load();
  every_recipe_as_the_grouped_backend<ex::tile_backend<tl::emulated_tiles>>(pool);
  EXPECT_GT(tl::products_issued().load(), before);
}

TEST(TileBackend, VectorTilesRunEveryRecipeAsTheGroupedBackend) {
  if (auto const why = avx512_bf16_skip_reason(); !why.empty()) GTEST_SKIP() << why;
#if MEGAMOE_HAS_AMX_INTRINSICS
  megamoe::thread_pool pool(2);
  every_recipe_as_the_grouped_backend<ex::tile_backend<tl::vector_tiles>>(pool);
#endif
}

TEST(TileBackend, AmxTilesRunEveryRecipeAsTheGroupedBackend) {
  if (auto const why = amx_skip_reason(); !why.empty()) GTEST_SKIP() << why;
#if MEGAMOE_HAS_AMX_INTRINSICS
  megamoe::thread_pool pool(2);
  every_recipe_as_the_grouped_backend<ex::backend_t<ex::gemm_backend::amx>>(pool);
#endif
}

}  // namespace
