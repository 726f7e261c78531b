// SPDX-License-Identifier: Apache-2.0
// flash_attention against a plain loop statement of causal softmax attention (every score, then
// softmax, in double): outputs and log-sum-exp for grouped queries, differing head sizes, position
// offsets, RoPE on and off and sequences that end inside a block; gradients against central
// finite differences in double; the fp32 kernels (portable, and AVX-512 where the CPU has it)
// against the double results; BF16 operands: BF16 values stored, BF16 precision kept.
#include <megamoe/core/random.hpp>
#include <megamoe/model/flash_attention.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

namespace at = megamoe::attention;

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(megamoe::standard_normal(seed, i));
  return v;
}

/// Token-major buffers of one call: q [T, heads*dk], k [Tk, groups*dk], v [Tk, groups*dv].
struct problem {
  at::attention_shape shape;
  double rope_base = 10000.0;
  std::vector<double> q, k, v;

  problem(at::attention_shape s, double base, std::uint64_t seed) : shape(s), rope_base(base) {
    auto const tq = std::size_t(s.seq) * s.batch, tk = std::size_t(s.keys()) * s.batch;
    q = random_values<double>(tq * s.heads * s.qk_head, seed);
    k = random_values<double>(tk * s.groups() * s.qk_head, seed + 1);
    v = random_values<double>(tk * s.groups() * s.value_head(), seed + 2);
  }
  [[nodiscard]] std::int64_t ldq() const { return std::int64_t(shape.heads) * shape.qk_head; }
  [[nodiscard]] std::int64_t ldk() const { return std::int64_t(shape.groups()) * shape.qk_head; }
  [[nodiscard]] std::int64_t ldv() const {
    return std::int64_t(shape.groups()) * shape.value_head();
  }
  [[nodiscard]] std::int64_t ldo() const { return std::int64_t(shape.heads) * shape.value_head(); }
  [[nodiscard]] std::size_t out_size() const {
    return std::size_t(shape.seq) * shape.batch * ldo();
  }
  [[nodiscard]] std::size_t lse_size() const {
    return std::size_t(shape.batch) * shape.heads * shape.seq;
  }
};

/// RoPE of one row at `position`, as the design states it (rotate half).
std::vector<double> rotated(double const* u, int n, int position, double base) {
  std::vector<double> r(u, u + n);
  if (base <= 0) return r;
  for (int i = 0; i < n / 2; ++i) {
    double const angle = position * std::pow(base, -2.0 * i / n);
    r[i] = u[i] * std::cos(angle) - u[i + n / 2] * std::sin(angle);
    r[i + n / 2] = u[i + n / 2] * std::cos(angle) + u[i] * std::sin(angle);
  }
  return r;
}

/// Every score, the causal softmax and the weighted values, one query row at a time.
void attention_by_loops(problem const& p, std::vector<double>& out, std::vector<double>& lse) {
  auto const& s = p.shape;
  int const B = s.batch, dk = s.qk_head, dv = s.value_head(), per = s.heads / s.groups();
  out.assign(p.out_size(), 0.0);
  lse.assign(p.lse_size(), 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.seq; ++i) {
        auto const qi = rotated(&p.q[(std::size_t(i) * B + b) * p.ldq() + h * dk], dk,
                                s.query_offset + i, p.rope_base);
        std::vector<double> score;
        for (int j = 0; j < s.keys() && s.key_offset + j <= s.query_offset + i; ++j) {
          auto const kj = rotated(&p.k[(std::size_t(j) * B + b) * p.ldk() + (h / per) * dk], dk,
                                  s.key_offset + j, p.rope_base);
          double dot = 0;
          for (int c = 0; c < dk; ++c) dot += qi[c] * kj[c];
          score.push_back(dot * s.score_scale());
        }
        double top = -INFINITY, sum = 0;
        for (double x : score) top = std::max(top, x);
        for (double x : score) sum += std::exp(x - top);
        lse[(std::size_t(b) * s.heads + h) * s.seq + i] = top + std::log(sum);
        for (std::size_t j = 0; j < score.size(); ++j)
          for (int c = 0; c < dv; ++c)
            out[(std::size_t(i) * B + b) * p.ldo() + h * dv + c] +=
                std::exp(score[j] - top) / sum * p.v[(j * B + b) * p.ldv() + (h / per) * dv + c];
      }
}

template <class T>
struct run_result {
  std::vector<T> out, lse, dq, dk, dv;
};

/// Forward and backward with the kernel `kind` on T copies of the problem; dout = R.
template <class T, class Operands = at::same_operands>
run_result<T> run(problem const& p, at::attention_kernel kind, std::vector<double> const& R) {
  megamoe::thread_pool pool(2);
  at::flash_attention<T, Operands> attention(p.rope_base);
  attention.set_kernel(kind);
  std::vector<T> const q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()),
      v(p.v.begin(), p.v.end()), dout(R.begin(), R.end());
  run_result<T> r;
  r.out.assign(p.out_size(), T(0));
  r.lse.assign(p.lse_size(), T(0));
  r.dq.assign(q.size(), T(7));  // overwritten
  r.dk.assign(k.size(), T(7));
  r.dv.assign(v.size(), T(7));
  attention.forward(pool, p.shape, {q.data(), p.ldq()}, {k.data(), p.ldk()}, {v.data(), p.ldv()},
                    {r.out.data(), p.ldo()}, r.lse.data());
  attention.backward(pool, p.shape, {q.data(), p.ldq()}, {k.data(), p.ldk()}, {v.data(), p.ldv()},
                     {r.out.data(), p.ldo()}, {dout.data(), p.ldo()}, r.lse.data(),
                     {r.dq.data(), p.ldq()}, {r.dk.data(), p.ldk()}, {r.dv.data(), p.ldv()});
  return r;
}

template <class T>
double max_difference(std::vector<T> const& a, std::vector<double> const& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

/// The shapes tried: one head per group and grouped queries, equal and differing head sizes, a
/// query chunk after its keys (context-parallel offsets), RoPE on and off, sequences ending
/// inside a 64-row block.
std::vector<problem> problems() {
  std::vector<problem> all;
  all.emplace_back(at::attention_shape{.seq = 150, .batch = 2, .heads = 3, .qk_head = 8}, 10000.0,
                   101);
  all.emplace_back(
      at::attention_shape{
          .seq = 70, .batch = 1, .heads = 4, .query_groups = 2, .qk_head = 6, .v_head = 10},
      500.0, 202);
  all.emplace_back(at::attention_shape{.seq = 40,
                                       .key_seq = 130,
                                       .batch = 2,
                                       .heads = 2,
                                       .query_groups = 1,
                                       .qk_head = 4,
                                       .v_head = 3,
                                       .query_offset = 90,
                                       .key_offset = 0,
                                       .scale = 0.3},
                   0.0, 303);
  return all;
}

TEST(FlashAttention, ForwardIsTheLoopStatementInDouble) {
  for (auto const& p : problems()) {
    std::vector<double> out, lse;
    attention_by_loops(p, out, lse);
    std::vector<double> const R(p.out_size(), 1.0);
    auto const r = run<double>(p, at::attention_kernel::portable, R);
    EXPECT_LT(max_difference(r.out, out), 1e-12) << p.shape.seq;
    EXPECT_LT(max_difference(r.lse, lse), 1e-12) << p.shape.seq;
  }
}

TEST(FlashAttention, GradientsMatchFiniteDifferencesInDouble) {
  for (auto p : problems()) {
    auto const R = random_values<double>(p.out_size(), 77);
    auto const r = run<double>(p, at::attention_kernel::portable, R);
    auto loss = [&] {
      std::vector<double> out, lse;
      attention_by_loops(p, out, lse);
      double total = 0;
      for (std::size_t i = 0; i < out.size(); ++i) total += out[i] * R[i];
      return total;
    };
    auto check = [&](char const* what, std::vector<double>& value,
                     std::vector<double> const& grad) {
      int checked = 0;
      for (std::size_t i = 0; i < value.size(); i += 1 + value.size() / 40) {
        double const kept = value[i], step = 1e-6;
        value[i] = kept + step;
        double const up = loss();
        value[i] = kept - step;
        double const down = loss();
        value[i] = kept;
        double const numeric = (up - down) / (2 * step);
        EXPECT_NEAR(grad[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
            << what << " " << i << " (S = " << p.shape.seq << ")";
        ++checked;
      }
      EXPECT_GT(checked, 20) << what;
    };
    check("dq", p.q, r.dq);
    check("dk", p.k, r.dk);
    check("dv", p.v, r.dv);
  }
}

TEST(FlashAttention, Fp32KernelsMatchDouble) {
  std::vector<at::attention_kernel> kinds{at::attention_kernel::portable};
  if (megamoe::cpu().use_avx512() && MEGAMOE_VECTOR_MATH_AVX512)
    kinds.push_back(at::attention_kernel::avx512);
  for (auto const& p : problems()) {
    auto const R = random_values<double>(p.out_size(), 91);
    auto const exact = run<double>(p, at::attention_kernel::portable, R);
    for (auto kind : kinds) {
      auto const r = run<float>(p, kind, R);
      int const which = static_cast<int>(kind);
      EXPECT_LT(max_difference(r.out, exact.out), 2e-5) << which;
      EXPECT_LT(max_difference(r.lse, exact.lse), 2e-5) << which;
      EXPECT_LT(max_difference(r.dq, exact.dq), 1e-4) << which;
      EXPECT_LT(max_difference(r.dk, exact.dk), 1e-4) << which;
      EXPECT_LT(max_difference(r.dv, exact.dv), 1e-4) << which;
    }
  }
}

// Context parallelism's pieces: attention over the keys cut into chunks (key_offset, key_seq),
// merged by log-sum-exp, is attention over all keys; backward over each chunk, given the merged
// output and log-sum-exp, gives that chunk's dk and dv, and dq summed over the chunks.
TEST(FlashAttention, KeyChunksMergedByLogSumExpAreTheWholeAttention) {
  megamoe::thread_pool pool(2);
  for (auto const& p : problems()) {
    auto const R = random_values<double>(p.out_size(), 55);
    auto const whole = run<double>(p, at::attention_kernel::portable, R);
    auto const& s = p.shape;
    int const K = s.keys(), B = s.batch;
    std::vector<int> const cuts{0, K / 3, K / 3 + 1, K - 7, K};  // one chunk of a single key
    at::flash_attention<double> attention(p.rope_base);
    std::vector<double> out(p.out_size()), lse(p.lse_size()), part(p.out_size()),
        part_lse(p.lse_size());
    auto chunk_shape = [&](std::size_t c) {
      at::attention_shape cs = s;
      cs.key_seq = cuts[c + 1] - cuts[c];
      cs.key_offset = s.key_offset + cuts[c];
      return cs;
    };
    auto keys_at = [&](std::vector<double> const& x, std::size_t c, std::int64_t ld) {
      return at::token_view<double const>{x.data() + std::int64_t(cuts[c]) * B * ld, ld};
    };
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
      bool const first = c == 0;
      attention.forward(pool, chunk_shape(c), {p.q.data(), p.ldq()}, keys_at(p.k, c, p.ldk()),
                        keys_at(p.v, c, p.ldv()), {(first ? out : part).data(), p.ldo()},
                        (first ? lse : part_lse).data());
      if (!first)
        at::merge_partial(pool, s, at::token_view<double>{out.data(), p.ldo()}, lse.data(),
                          at::token_view<double const>{part.data(), p.ldo()}, part_lse.data());
    }
    EXPECT_LT(max_difference(out, whole.out), 1e-12) << s.seq;
    EXPECT_LT(max_difference(lse, whole.lse), 1e-12) << s.seq;
    std::vector<double> dq(p.q.size(), 0.0), dk(p.k.size()), dv(p.v.size()), dq_part(p.q.size());
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
      auto const at_k = std::int64_t(cuts[c]) * B;
      attention.backward(pool, chunk_shape(c), {p.q.data(), p.ldq()}, keys_at(p.k, c, p.ldk()),
                         keys_at(p.v, c, p.ldv()), {out.data(), p.ldo()}, {R.data(), p.ldo()},
                         lse.data(), {dq_part.data(), p.ldq()},
                         {dk.data() + at_k * p.ldk(), p.ldk()},
                         {dv.data() + at_k * p.ldv(), p.ldv()});
      for (std::size_t i = 0; i < dq.size(); ++i) dq[i] += dq_part[i];
    }
    EXPECT_LT(max_difference(dq, whole.dq), 1e-12) << s.seq;
    EXPECT_LT(max_difference(dk, whole.dk), 1e-12) << s.seq;
    EXPECT_LT(max_difference(dv, whole.dv), 1e-12) << s.seq;
  }
}

// The reference's linear_qkv layout: one row per token holding, per key/value group, its query
// heads, then its key head, then its value head. Views with heads in blocks read q, k, v from it
// and write the gradients in it; the results are those of separate buffers, bit for bit.
TEST(FlashAttention, HeadsInBlocksReadTheReferenceQkvLayout) {
  megamoe::thread_pool pool(2);
  for (auto const& p : problems()) {
    auto const& s = p.shape;
    auto const R = random_values<double>(p.out_size(), 61);
    auto const plain = run<double>(p, at::attention_kernel::portable, R);
    int const B = s.batch, G = s.groups(), per = s.heads / G, dk = s.qk_head, dv = s.value_head();
    std::int64_t const block = std::int64_t(per + 1) * dk + dv, ld = G * block;
    auto const rows = std::size_t(std::max(s.seq, s.keys())) * B;
    double const nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> fused(rows * ld, nan), grad(rows * ld, nan);
    at::token_view<double> const q{fused.data(), ld, per, block},
        k{fused.data() + per * dk, ld, 1, block}, v{fused.data() + (per + 1) * dk, ld, 1, block},
        dq{grad.data(), ld, per, block}, dkv{grad.data() + per * dk, ld, 1, block},
        dvv{grad.data() + (per + 1) * dk, ld, 1, block};
    // Where the layout puts query head h, and group g's key and value heads, of token t.
    auto at_q = [&](std::int64_t t, int h) { return t * ld + (h / per) * block + (h % per) * dk; };
    auto at_k = [&](std::int64_t t, int g) { return t * ld + g * block + per * dk; };
    auto at_v = [&](std::int64_t t, int g) { return t * ld + g * block + (per + 1) * dk; };
    for (std::int64_t t = 0; t < std::int64_t(s.seq) * B; ++t)
      for (int h = 0; h < s.heads; ++h)
        std::copy_n(&p.q[std::size_t(t * p.ldq() + h * dk)], dk, &fused[std::size_t(at_q(t, h))]);
    for (std::int64_t t = 0; t < std::int64_t(s.keys()) * B; ++t)
      for (int g = 0; g < G; ++g) {
        std::copy_n(&p.k[std::size_t(t * p.ldk() + g * dk)], dk, &fused[std::size_t(at_k(t, g))]);
        std::copy_n(&p.v[std::size_t(t * p.ldv() + g * dv)], dv, &fused[std::size_t(at_v(t, g))]);
      }
    at::flash_attention<double> attention(p.rope_base);
    std::vector<double> out(p.out_size()), lse(p.lse_size());
    auto view = [](at::token_view<double> x) {
      return at::token_view<double const>{x.data, x.ld, x.heads_per_block, x.block_stride};
    };
    attention.forward(pool, s, view(q), view(k), view(v), {out.data(), p.ldo()}, lse.data());
    attention.backward(pool, s, view(q), view(k), view(v), {out.data(), p.ldo()},
                       {R.data(), p.ldo()}, lse.data(), dq, dkv, dvv);
    EXPECT_EQ(max_difference(out, plain.out), 0.0);
    EXPECT_EQ(max_difference(lse, plain.lse), 0.0);
    std::vector<double> got_dq(p.q.size()), got_dk(p.k.size()), got_dv(p.v.size());
    for (std::int64_t t = 0; t < std::int64_t(s.seq) * B; ++t)
      for (int h = 0; h < s.heads; ++h)
        std::copy_n(&grad[std::size_t(at_q(t, h))], dk, &got_dq[std::size_t(t * p.ldq() + h * dk)]);
    for (std::int64_t t = 0; t < std::int64_t(s.keys()) * B; ++t)
      for (int g = 0; g < G; ++g) {
        std::copy_n(&grad[std::size_t(at_k(t, g))], dk, &got_dk[std::size_t(t * p.ldk() + g * dk)]);
        std::copy_n(&grad[std::size_t(at_v(t, g))], dv, &got_dv[std::size_t(t * p.ldv() + g * dv)]);
      }
    EXPECT_EQ(max_difference(got_dq, plain.dq), 0.0);
    EXPECT_EQ(max_difference(got_dk, plain.dk), 0.0);
    EXPECT_EQ(max_difference(got_dv, plain.dv), 0.0);
  }
}

// BF16 operands: everything stored is a BF16 value; the results are within BF16's precision of
// the exact ones (relative to the largest magnitude), and the rounding shows against fp32.
TEST(FlashAttention, Bf16OperandsStoreBf16ValuesWithinBf16Precision) {
  std::vector<at::attention_kernel> kinds{at::attention_kernel::portable};
  if (megamoe::cpu().use_avx512() && MEGAMOE_VECTOR_MATH_AVX512)
    kinds.push_back(at::attention_kernel::avx512);
  auto largest = [](std::vector<double> const& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::abs(x));
    return m;
  };
  auto all_bf16 = [](std::vector<float> const& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return megamoe::round_to_bf16(x) == x; });
  };
  for (auto const& p : problems()) {
    auto const R = random_values<double>(p.out_size(), 93);
    auto const exact = run<double>(p, at::attention_kernel::portable, R);
    for (auto kind : kinds) {
      int const which = static_cast<int>(kind);
      auto const fp32 = run<float>(p, kind, R);
      auto const r = run<float, at::bf16_operands>(p, kind, R);
      EXPECT_TRUE(all_bf16(r.out) && all_bf16(r.dq) && all_bf16(r.dk) && all_bf16(r.dv)) << which;
      EXPECT_FALSE(all_bf16(fp32.out)) << which;
      EXPECT_LT(max_difference(r.out, exact.out), 1e-2 * largest(exact.out)) << which;
      EXPECT_LT(max_difference(r.lse, exact.lse), 2e-2) << which;
      EXPECT_LT(max_difference(r.dq, exact.dq), 1.5e-2 * largest(exact.dq)) << which;
      EXPECT_LT(max_difference(r.dk, exact.dk), 1.5e-2 * largest(exact.dk)) << which;
      EXPECT_LT(max_difference(r.dv, exact.dv), 1.5e-2 * largest(exact.dv)) << which;
      std::vector<double> const out32(fp32.out.begin(), fp32.out.end());
      EXPECT_GT(max_difference(r.out, out32), 1e-3 * largest(exact.out)) << which;
    }
  }
}

#if MEGAMOE_VECTOR_MATH_AVX512
/// The AVX-512 softmax's exp on 16 lanes of `x`.
MEGAMOE_AVX512_TARGET void exp16_of(float const* x, float* y) {
  _mm512_storeu_ps(y, megamoe::simd::exp16(_mm512_loadu_ps(x)));
}
#endif

// The softmax's exp within relative 1.5e-7 (about 2.5 fp32 ulp) of the double exp over the range of
// shifted scores (seen here: 7.3e-8), and 0 far below it.
TEST(FlashAttention, Avx512ExpIsWithinTwoAndAHalfUlp) {
#if MEGAMOE_VECTOR_MATH_AVX512
  if (!megamoe::cpu().use_avx512()) GTEST_SKIP() << "no AVX-512";
  double worst = 0;
  for (int i = 0; i < 16 * 4000; i += 16) {
    float x[16], y[16];
    for (int l = 0; l < 16; ++l) x[l] = -80.0f + 0.0013f * static_cast<float>(i + l);
    exp16_of(x, y);
    for (int l = 0; l < 16; ++l)
      worst = std::max(worst, std::abs(y[l] / std::exp(static_cast<double>(x[l])) - 1.0));
  }
  EXPECT_LT(worst, 1.5e-7);
  float low[16], out[16];
  std::fill(low, low + 16, -1000.0f);
  exp16_of(low, out);
  EXPECT_LT(out[0], 1e-37f);
#else
  GTEST_SKIP() << "no AVX-512 kernels on this compiler or architecture";
#endif
}

TEST(FlashAttention, ImpossibleShapesAreInputErrors) {
  megamoe::thread_pool pool(1);
  at::flash_attention<double> attention(10000.0);
  std::vector<double> buffer(1024), lse(64);
  at::token_view<double const> const in{buffer.data(), 12};
  at::token_view<double> const out{buffer.data(), 12};
  auto forward = [&](at::attention_shape s) {
    attention.forward(pool, s, in, in, in, out, lse.data());
  };
  EXPECT_THROW(forward({.seq = 4, .batch = 1, .heads = 3, .query_groups = 2, .qk_head = 4}),
               megamoe::input_error);  // groups do not divide heads
  EXPECT_THROW(forward({.seq = 4, .batch = 1, .heads = 2, .qk_head = 3}),
               megamoe::input_error);  // odd head size under RoPE
  EXPECT_THROW(forward({.seq = 0, .batch = 1, .heads = 2, .qk_head = 4}), megamoe::input_error);
  EXPECT_THROW(forward({.seq = 4, .batch = 1, .heads = 2, .qk_head = 4, .query_offset = -1}),
               megamoe::input_error);
  if (!megamoe::cpu().use_avx512()) {
    at::flash_attention<float> f(0.0);
    EXPECT_THROW(f.set_kernel(at::attention_kernel::avx512), megamoe::input_error);
  }
}

}  // namespace
