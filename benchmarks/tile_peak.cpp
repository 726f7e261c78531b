// SPDX-License-Identifier: Apache-2.0
// tile_peak — this machine's AMX BF16 tile peak, and megamoe's tile GEMM against it in the same
// run.
//
//   tile_peak [--threads 1,2] [--repeats 5] [--seconds 0.3] [--size 2048]
//
// Peak: each pool thread issues TDPBF16PS on four independent accumulator tiles from two A and two
// B tiles held in registers (16 x 16 x 32 multiply-adds each, no memory traffic). GEMM: C = A B at
// size^3 in BF16 (expert/tile_gemm.hpp, packed once), rows of A split over the threads. One JSON
// line per thread count: threads, peak_tflops_median, gemm_tflops_median, gemm_fraction_of_peak.
// Where this process may not use AMX (no tile unit, the OS refused, MEGAMOE_DISABLE_AMX) it prints
// one line {"amx":false,"reason":...} and exits 0, so it can run anywhere.
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

constexpr double flops_per_product = 2.0 * 16 * 16 * 32;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#if MEGAMOE_HAS_AMX_INTRINSICS
/// `iterations` rounds of four tile products on registers; returns the products issued.
MEGAMOE_AMX_TARGET long peak_products(long iterations) {
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
  return 4 * iterations;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tile_peak: the AMX BF16 tile peak and the tile GEMM against it"};
  std::vector<int> thread_counts{1, 2};
  int repeats = 5, size = 2048;
  double seconds = 0.3;
  app.add_option("--threads", thread_counts, "thread counts")->delimiter(',');
  app.add_option("--repeats", repeats, "measurements per thread count")->check(CLI::PositiveNumber);
  app.add_option("--seconds", seconds, "length of one peak measurement")
      ->check(CLI::PositiveNumber);
  app.add_option("--size", size, "M = N = K of the GEMM")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  auto const& cpu = megamoe::cpu();
  if (!cpu.use_amx()) {
    nlohmann::ordered_json j;
    j["amx"] = false;
    j["reason"] = cpu.amx_unavailable_reason();
    std::cout << j.dump() << std::endl;
    return 0;
  }
#if MEGAMOE_HAS_AMX_INTRINSICS
  // The GEMM's operands, packed once: BF16 values from N(0, 1).
  tl::packed_b b;
  tl::pack_b(
      size, size,
      [&](int r, int c) {
        return static_cast<float>(megamoe::standard_normal(2, std::uint64_t(r) * size + c));
      },
      b);
  for (int threads : thread_counts) {
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
    long iterations = 1 << 16;
    for (;;) {
      auto const t0 = std::chrono::steady_clock::now();
      peak_products(iterations);
      double const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > seconds / 4 || iterations > (1L << 40)) {
        iterations =
            static_cast<long>(static_cast<double>(iterations) * seconds / std::max(s, 1e-9));
        break;
      }
      iterations *= 4;
    }
    std::vector<double> peak, gemm;
    for (int r = 0; r < repeats; ++r) {
      auto const t0 = std::chrono::steady_clock::now();
      pool.run(threads, [&](int) { peak_products(iterations); });
      auto const t1 = std::chrono::steady_clock::now();
      pool.run(threads, [&](int t) {
        tl::hardware_tiles tiles;
        auto const i = static_cast<std::size_t>(t);
        tl::gemm(tiles, a[i], b, c[i].data(), size);
      });
      auto const t2 = std::chrono::steady_clock::now();
      peak.push_back(flops_per_product * 4.0 * static_cast<double>(iterations) * threads /
                     std::chrono::duration<double>(t1 - t0).count() / 1e12);
      gemm.push_back(2.0 * size * double(size) * size /
                     std::chrono::duration<double>(t2 - t1).count() / 1e12);
    }
    nlohmann::ordered_json j;
    j["amx"] = true;
    j["threads"] = threads;
    j["size"] = size;
    j["peak_tflops_median"] = median(peak);
    j["gemm_tflops_median"] = median(gemm);
    j["gemm_fraction_of_peak"] = median(gemm) / median(peak);
    j["repeats"] = repeats;
    std::cout << j.dump() << std::endl;
  }
  return 0;
#else
  std::cerr << "tile_peak: AMX is usable, but this compiler has no AMX intrinsics\n";
  return 2;
#endif
}
