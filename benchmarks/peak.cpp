// SPDX-License-Identifier: Apache-2.0
// peak — this machine's FP32 FMA peak, so that every fraction of peak is taken against a figure
// from the same run.
//
//   peak [--threads 1,2] [--repeats 7] [--seconds 0.3]
//
// Each pool thread runs independent chains of fused multiply-adds on registers (12 chains: more
// than the FMA latency times the FMA ports, so the ports never wait), with the widest instruction
// set the CPU has: AVX-512, else AVX2+FMA, else scalar (checked once at start-up; the kernels are
// compiled with function-level target attributes, so the program runs on any x86-64). One JSON line
// per thread count: isa, threads, gflops_median, gflops_best, repeats.
#include <megamoe/core/thread_pool.hpp>

#include <CLI/CLI.hpp>
#include <immintrin.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr int chains = 12;

/// FLOPs of one call: chains x lanes x 2 per iteration.
__attribute__((target("avx512f"))) float fma_avx512(long iterations, float seed) {
  __m512 acc[chains];
  for (int c = 0; c < chains; ++c) acc[c] = _mm512_set1_ps(seed + 0.001F * static_cast<float>(c));
  __m512 const mul = _mm512_set1_ps(0.999999F), add = _mm512_set1_ps(1e-7F);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < chains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], mul, add);
  __m512 sum = acc[0];
  for (int c = 1; c < chains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);  // (GCC 12 warns inside _mm512_reduce_add_ps)
  float total = 0.0F;
  for (float v : lanes) total += v;
  return total;
}

__attribute__((target("avx2,fma"))) float fma_avx2(long iterations, float seed) {
  __m256 acc[chains];
  for (int c = 0; c < chains; ++c) acc[c] = _mm256_set1_ps(seed + 0.001F * static_cast<float>(c));
  __m256 const mul = _mm256_set1_ps(0.999999F), add = _mm256_set1_ps(1e-7F);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < chains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], mul, add);
  alignas(32) float lanes[8];
  __m256 sum = acc[0];
  for (int c = 1; c < chains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  _mm256_store_ps(lanes, sum);
  float total = 0.0F;
  for (float v : lanes) total += v;
  return total;
}

float fma_scalar(long iterations, float seed) {
  float acc[chains];
  for (int c = 0; c < chains; ++c) acc[c] = seed + 0.001F * static_cast<float>(c);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < chains; ++c) acc[c] = acc[c] * 0.999999F + 1e-7F;
  float total = 0.0F;
  for (float v : acc) total += v;
  return total;
}

struct kernel {
  std::string isa;
  int lanes;
  float (*run)(long, float);
};

kernel best_kernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {"avx512", 16, fma_avx512};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return {"avx2", 8, fma_avx2};
  return {"scalar", 1, fma_scalar};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"peak: this machine's FP32 FMA peak"};
  std::vector<int> thread_counts{1, 2};
  int repeats = 7;
  double seconds = 0.3;
  app.add_option("--threads", thread_counts, "thread counts")->delimiter(',');
  app.add_option("--repeats", repeats, "measurements per thread count");
  app.add_option("--seconds", seconds, "length of one measurement");
  CLI11_PARSE(app, argc, argv);
  if (repeats < 1 || seconds <= 0.0) {
    std::cerr << "peak: --repeats and --seconds must be positive\n";
    return 2;
  }
  kernel const k = best_kernel();
  volatile float sink = 0.0F;
  // Calibrate: iterations for about `seconds` on one thread.
  long iterations = 1 << 20;
  for (;;) {
    auto const t0 = std::chrono::steady_clock::now();
    sink = sink + k.run(iterations, 1.0F);
    double const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > seconds / 4) {
      iterations = static_cast<long>(static_cast<double>(iterations) * seconds / s);
      break;
    }
    iterations *= 4;
  }
  for (int threads : thread_counts) {
    if (threads < 1) {
      std::cerr << "peak: thread counts must be positive\n";
      return 2;
    }
    megamoe::thread_pool pool(threads);
    std::vector<float> results(static_cast<std::size_t>(threads));
    std::vector<double> gflops;
    for (int r = 0; r < repeats; ++r) {
      auto const t0 = std::chrono::steady_clock::now();
      pool.run(threads, [&](int i) {
        results[static_cast<std::size_t>(i)] = k.run(iterations, 1.0F + static_cast<float>(i));
      });
      double const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (float v : results) sink = sink + v;
      double const flops = 2.0 * chains * k.lanes * static_cast<double>(iterations) * threads;
      gflops.push_back(flops / s / 1e9);
    }
    nlohmann::ordered_json j;
    j["isa"] = k.isa;
    j["threads"] = threads;
    j["gflops_median"] = median(gflops);
    j["gflops_best"] = *std::max_element(gflops.begin(), gflops.end());
    j["repeats"] = repeats;
    std::cout << j.dump() << std::endl;
  }
  return sink == 12345.0F ? 3 : 0;  // keeps the sink alive; never 12345
}
