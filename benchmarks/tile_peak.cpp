// SPDX-License-Identifier: Apache-2.0
// tile_peak — this machine's BF16 matrix peak on each unit megamoe's tile GEMM runs on, and the
// tile GEMM against it in the same run.
//
//   tile_peak [--threads 1,2] [--repeats 5] [--seconds 0.3] [--size 2048]
//
// Units: amx (TDPBF16PS on the AMX tile unit) and avx512_bf16 (VDPBF16PS on the vector units).
// Peak: each pool thread issues the unit's BF16 product on independent accumulators held in
// registers, operands in registers too (amx: four tiles from two A and two B tiles, 16 x 16 x 32
// multiply-adds each; avx512_bf16: 24 accumulators, 32 multiply-adds each), no memory traffic.
// GEMM: C = A B at size^3 in BF16 (expert/tile_gemm.hpp, packed once), rows of A split over the
// threads. One JSON line per unit and thread count: unit, threads, peak_tflops_median,
// gemm_tflops_median, gemm_fraction_of_peak. A unit this process may not use (not in the CPU, the
// OS refused, MEGAMOE_DISABLE_AMX / MEGAMOE_DISABLE_AVX512) prints one line
// {"unit":...,"available":false,"reason":...}; the program exits 0 either way, so it runs anywhere.
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/expert/tile_gemm.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace tl = megamoe::expert::tiles;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#if MEGAMOE_HAS_AMX_INTRINSICS
/// `iterations` rounds of four tile products on registers; returns the multiply-adds done.
MEGAMOE_AMX_TARGET double amx_peak_loop(long iterations) {
  tl::hardware_tiles tiles;
  tiles.configure();
  alignas(64) static thread_local std::uint16_t data[16 * 32] = {};
  tiles.load_a(0, data, 64);
  tiles.load_a(1, data, 64);
  tiles.load_b(0, data);
  tiles.load_b(1, data);
  tiles.zero();
  for (long i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  tiles.release();
  return 4.0 * 16 * 16 * 32 * static_cast<double>(iterations);
}

/// `iterations` rounds of 24 independent VDPBF16PS; returns the multiply-adds done.
MEGAMOE_AVX512_BF16_TARGET double avx512_bf16_peak_loop(long iterations) {
  constexpr int chains = 24;  // enough independent sums to cover the instruction's latency
  __m512 acc[chains];
  for (auto& v : acc) v = _mm512_setzero_ps();
  auto a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3F803F80));  // (1, 1)
  auto const b = a;
  for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 24
    for (int c = 0; c < chains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __asm__ volatile("" : "+v"(a));  // keeps the loop from being folded
  }
  alignas(64) float lanes[16];
  for (auto const& v : acc) {
    _mm512_store_ps(lanes, v);
    __asm__ volatile("" : : "m"(lanes));  // the sums are used
  }
  return 32.0 * chains * static_cast<double>(iterations);
}
#endif

struct options {
  std::vector<int> thread_counts{1, 2};
  int repeats = 5, size = 2048;
  double seconds = 0.3;
};

/// The peak of `peak_loop` and the tile GEMM on Tiles, one JSON line per thread count.
template <class Tiles, class PeakLoop>
int measure(char const* unit, options const& o, PeakLoop const& peak_loop) {
  int const size = o.size;
  // The GEMM's operands, packed once: BF16 values from N(0, 1).
  tl::packed_b b;
  tl::pack_b(
      size, size,
      [&](int r, int c) {
        return static_cast<float>(megamoe::standard_normal(2, std::uint64_t(r) * size + c));
      },
      b);
  for (int threads : o.thread_counts) {
    if (threads < 1) {
      std::cerr << "tile_peak: thread counts must be positive\n";
      return 2;
    }
    megamoe::thread_pool pool(threads);
    std::vector<tl::packed_a> a(static_cast<std::size_t>(threads));
    std::vector<std::vector<float>> c(static_cast<std::size_t>(threads));
    for (int t = 0; t < threads; ++t) {
      int const first = size * t / threads, rows = size * (t + 1) / threads - first;
      tl::pack_a(
          rows, size,
          [&](int r, int k) {
            return static_cast<float>(
                megamoe::standard_normal(1, std::uint64_t(first + r) * size + k));
          },
          a[static_cast<std::size_t>(t)]);
      c[static_cast<std::size_t>(t)].resize(static_cast<std::size_t>(rows) * size);
    }
    // Calibrate the peak loop to about `seconds`.
    long iterations = 1 << 12;
    for (;;) {
      auto const t0 = std::chrono::steady_clock::now();
      peak_loop(iterations);
      double const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > o.seconds / 4 || iterations > (1L << 40)) {
        iterations =
            static_cast<long>(static_cast<double>(iterations) * o.seconds / std::max(s, 1e-9));
        break;
      }
      iterations *= 4;
    }
    std::vector<double> peak, gemm;
    for (int r = 0; r < o.repeats; ++r) {
      std::vector<double> done(static_cast<std::size_t>(threads));
      auto const t0 = std::chrono::steady_clock::now();
      pool.run(threads, [&](int t) { done[static_cast<std::size_t>(t)] = peak_loop(iterations); });
      auto const t1 = std::chrono::steady_clock::now();
      pool.run(threads, [&](int t) {
        Tiles tiles;
        auto const i = static_cast<std::size_t>(t);
        tl::gemm(tiles, a[i], b, c[i].data(), size);
      });
      auto const t2 = std::chrono::steady_clock::now();
      double multiply_adds = 0.0;
      for (double d : done) multiply_adds += d;
      peak.push_back(2.0 * multiply_adds / std::chrono::duration<double>(t1 - t0).count() / 1e12);
      gemm.push_back(2.0 * size * double(size) * size /
                     std::chrono::duration<double>(t2 - t1).count() / 1e12);
    }
    nlohmann::ordered_json j;
    j["unit"] = unit;
    j["threads"] = threads;
    j["size"] = size;
    j["peak_tflops_median"] = median(peak);
    j["gemm_tflops_median"] = median(gemm);
    j["gemm_fraction_of_peak"] = median(gemm) / median(peak);
    j["repeats"] = o.repeats;
    std::cout << j.dump() << std::endl;
  }
  return 0;
}

void unavailable(char const* unit, std::string const& reason) {
  nlohmann::ordered_json j;
  j["unit"] = unit;
  j["available"] = false;
  j["reason"] = reason;
  std::cout << j.dump() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tile_peak: BF16 matrix peaks (AMX, AVX512-BF16) and the tile GEMM against them"};
  options o;
  app.add_option("--threads", o.thread_counts, "thread counts")->delimiter(',');
  app.add_option("--repeats", o.repeats, "measurements per thread count")
      ->check(CLI::PositiveNumber);
  app.add_option("--seconds", o.seconds, "length of one peak measurement")
      ->check(CLI::PositiveNumber);
  app.add_option("--size", o.size, "M = N = K of the GEMM")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  auto const& cpu = megamoe::cpu();
#if MEGAMOE_HAS_AMX_INTRINSICS
  if (cpu.use_amx()) {
    if (int const code = measure<tl::hardware_tiles>("amx", o, amx_peak_loop)) return code;
  } else {
    unavailable("amx", cpu.amx_unavailable_reason());
  }
  if (cpu.use_avx512_bf16()) {
    if (int const code = measure<tl::vector_tiles>("avx512_bf16", o, avx512_bf16_peak_loop))
      return code;
  } else {
    unavailable("avx512_bf16", cpu.avx512_bf16_unavailable_reason());
  }
#else
  unavailable("amx", "this compiler has no x86 intrinsics");
  unavailable("avx512_bf16", "this compiler has no x86 intrinsics");
  (void)cpu;
#endif
  return 0;
}
