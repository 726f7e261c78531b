// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/tile_gemm.hpp — BF16 products with fp32 accumulation on a tile unit: AMX, or
// AVX512-BF16 dot products where the CPU has no AMX.
//
// C[M, N] = alpha * A[M, K] B[K, N] (+ C), A and B in BF16, packed first:
//   - A as BF16 rows [M padded to 16][K padded to 32], zeros in the padding;
//   - B in the tiles' VNNI layout: for each block of 16 columns and each step of 32 along K, one
//     1 KB tile of 16 rows, row r holding (B[2r][n], B[2r+1][n]) for the block's 16 columns n.
// Packing reads an operand in memory in either orientation (operand_view), so one packer serves
// fprop (weights [N, K]), dgrad and wgrad (transposed operands), and rounds fp32 to BF16 (exact
// for values already in BF16, and for every FP8 / FP4 code times its power-of-2 or E4M3 block
// scale): with AVX-512 where the CPU has it, else element by element (the same bits).
//
// The product runs on a Tiles unit: hardware_tiles issues the AMX instructions (compiled with a
// function-level target attribute; only call it where cpu().use_amx()), vector_tiles computes the
// same products with VDPBF16PS (only where cpu().use_avx512_bf16()), emulated_tiles computes the
// tile operations in software (TDPBF16PS: input denormals as zero, each product added in fp32 with
// round to nearest even, output denormals flushed), so the packing and blocking are tested on any
// CPU. AMX register use: tmm0-3 accumulate a 32 x 32 block of C, tmm4-5 hold A's two 16-row tiles,
// tmm6-7 B's two 16-column tiles; B is walked in panels of 128 columns so a panel stays in L2
// while every row block of A passes over it.
#pragma once

#include <megamoe/core/bf16.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/core/vector_math.hpp>
#include <megamoe/expert/sgemm_avx512.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MEGAMOE_HAS_AMX_INTRINSICS 1
#define MEGAMOE_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define MEGAMOE_AVX512_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))
#else
#define MEGAMOE_HAS_AMX_INTRINSICS 0
#define MEGAMOE_AMX_TARGET
#define MEGAMOE_AVX512_BF16_TARGET
#endif

namespace megamoe::expert::tiles {

inline constexpr int tile_rows = 16;     // rows of every tile
inline constexpr int tile_depth = 32;    // BF16 values along K in one A row / B tile
inline constexpr int tile_columns = 16;  // fp32 columns of C in one tile
inline constexpr int panel_columns = 128;

constexpr int round_up(int n, int multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

/// A packed: BF16 bits [rows_padded][depth_padded], zero padding.
struct packed_a {
  int rows = 0, depth = 0, rows_padded = 0, depth_padded = 0;
  std::vector<std::uint16_t> bits;

  /// Sized for M x K and zeroed (the buffer only grows).
  void reset(int m, int k);
  void set(int m, int k, float v) {
    bits[static_cast<std::size_t>(m) * static_cast<std::size_t>(depth_padded) +
         static_cast<std::size_t>(k)] = to_bf16_bits(v);
  }
};

/// B packed in VNNI tiles (see the file comment).
struct packed_b {
  int depth = 0, cols = 0, depth_padded = 0, cols_padded = 0;
  std::vector<std::uint16_t> bits;

  void reset(int k, int n);
  /// Where the tile of column block `n_block` and depth step `k_step` starts.
  [[nodiscard]] std::size_t tile_offset(int n_block, int k_step) const {
    return (static_cast<std::size_t>(n_block) *
                static_cast<std::size_t>(depth_padded / tile_depth) +
            static_cast<std::size_t>(k_step)) *
           static_cast<std::size_t>(tile_rows * tile_depth);
  }
  void set(int k, int n, float v) {
    std::size_t const within = static_cast<std::size_t>((k % tile_depth) / 2) * tile_depth +
                               static_cast<std::size_t>((n % tile_columns) * 2 + (k % 2));
    bits[tile_offset(n / tile_columns, k / tile_depth) + within] = to_bf16_bits(v);
  }
};

/// Packs A [M, K] from value(m, k).
template <class Value>
void pack_a(int m, int k, Value const& value, packed_a& out) {
  out.reset(m, k);
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < k; ++c) out.set(r, c, value(r, c));
}
/// Packs B [K, N] from value(k, n).
template <class Value>
void pack_b(int k, int n, Value const& value, packed_b& out) {
  out.reset(k, n);
  for (int r = 0; r < k; ++r)
    for (int c = 0; c < n; ++c) out.set(r, c, value(r, c));
}

/// How a GEMM operand lies in memory: row-major with leading dimension `ld`, `transposed` when
/// it is stored the other way round (A as [K, M], B as [N, K]); its values are divided by `unit`
/// (the per-tensor factor) before rounding to BF16.
struct operand_view {
  float const* data = nullptr;
  std::ptrdiff_t ld = 0;
  bool transposed = false;
  float unit = 1.0F;
  /// Element (r, c) of the operand over its unit.
  [[nodiscard]] float at(int r, int c) const {
    return (transposed ? data[c * ld + r] : data[r * ld + c]) / unit;
  }
};

#if MEGAMOE_HAS_AVX512_KERNELS
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace detail {
using avx512::detail::lanes;

/// 16 values from `p` (lanes past `count` zero) over `unit`, as BF16 bits in each 32-bit lane's
/// low half: the same rounding as to_bf16_bits, NaN included.
MEGAMOE_TARGET_AVX512 inline __m512i bf16_lanes(float const* p, int count, float unit) {
  __m512 x = _mm512_maskz_loadu_ps(lanes(count), p);
  if (unit != 1.0F) x = _mm512_div_ps(x, _mm512_set1_ps(unit));
  return simd::bf16_bits(x);
}
/// Rows r and r + 1 of a row-major matrix at columns [c, c + count) as BF16 pairs: lane j holds
/// (row r, row r + 1) of column c + j, the VNNI order; `pair_rows` = 1 leaves the second zero.
MEGAMOE_TARGET_AVX512 inline __m512i vnni_pairs(operand_view const& v, int r, int pair_rows, int c,
                                                int count) {
  __m512i const first = bf16_lanes(v.data + r * v.ld + c, count, v.unit);
  if (pair_rows < 2) return first;
  __m512i const second = bf16_lanes(v.data + (r + 1) * v.ld + c, count, v.unit);
  return _mm512_or_si512(first, _mm512_slli_epi32(second, 16));
}
/// 32 consecutive values of one row (from `count` valid ones) as 16 BF16 pairs.
MEGAMOE_TARGET_AVX512 inline __m512i row_pairs(float const* p, int count, float unit) {
  __m256i const low = _mm512_cvtepi32_epi16(bf16_lanes(p, count, unit));
  __m256i const high = _mm512_cvtepi32_epi16(bf16_lanes(p + 16, count - 16, unit));
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}
MEGAMOE_TARGET_AVX512 inline void transpose_16x16(__m512i (&rows)[16]) {
  __m512 f[16];
  for (int i = 0; i < 16; ++i) f[i] = _mm512_castsi512_ps(rows[i]);
  avx512::detail::transpose_16x16(f);
  for (int i = 0; i < 16; ++i) rows[i] = _mm512_castps_si512(f[i]);
}

MEGAMOE_DECL MEGAMOE_TARGET_AVX512 void pack_a_avx512(operand_view const& v, int m, int k,
                                                      packed_a& out);
MEGAMOE_DECL MEGAMOE_TARGET_AVX512 void pack_b_avx512(operand_view const& v, int k, int n,
                                                      packed_b& out);
}  // namespace detail
#pragma GCC diagnostic pop
#endif

/// Packs A [M, K] from `v` (AVX-512 where the CPU runs it, else element by element; the same
/// bits either way).
MEGAMOE_DECL void pack_a(operand_view const& v, int m, int k, packed_a& out);
/// Packs B [K, N] from `v`, as pack_a.
MEGAMOE_DECL void pack_b(operand_view const& v, int k, int n, packed_b& out);

/// Tile products issued by this process (every Tiles unit counts its own; gemm adds them here).
MEGAMOE_DECL std::atomic<std::uint64_t>& products_issued();

/// The tile operations in software, with TDPBF16PS's numerics.
class emulated_tiles {
 public:
  void configure() {}
  void release() {}
  void zero() {
    for (auto& t : c_)
      for (auto& row : t) std::fill(std::begin(row), std::end(row), 0.0F);
  }
  void load_a(int i, std::uint16_t const* p, std::size_t stride_bytes) {
    load(a_[i], p, stride_bytes);
  }
  void load_b(int j, std::uint16_t const* p) { load(b_[j], p, tile_depth * 2); }
  /// C tile (i, j) += A tile i x B tile j.
  void multiply(int i, int j) {
    auto& c = c_[2 * i + j];
    for (int m = 0; m < tile_rows; ++m)
      for (int pair = 0; pair < tile_rows; ++pair)
        for (int n = 0; n < tile_columns; ++n) {
          float t = c[m][n];
          t += value(a_[i][m][2 * pair]) * value(b_[j][pair][2 * n]);
          t += value(a_[i][m][2 * pair + 1]) * value(b_[j][pair][2 * n + 1]);
          c[m][n] = flush(t);
        }
    ++products;
  }
  void store(int i, int j, float* p, std::size_t stride_bytes) const {
    for (int m = 0; m < tile_rows; ++m)
      std::copy_n(c_[2 * i + j][m], tile_columns,
                  reinterpret_cast<float*>(reinterpret_cast<char*>(p) + m * stride_bytes));
  }
  std::uint64_t products = 0;

 private:
  static void load(std::uint16_t (&t)[tile_rows][tile_depth], std::uint16_t const* p,
                   std::size_t stride_bytes) {
    for (int r = 0; r < tile_rows; ++r)
      std::copy_n(reinterpret_cast<std::uint16_t const*>(reinterpret_cast<char const*>(p) +
                                                         r * stride_bytes),
                  tile_depth, t[r]);
  }
  static float value(std::uint16_t bits) {  // input denormals are zero
    return (bits & 0x7F80u) == 0 ? 0.0F : from_bf16_bits(bits);
  }
  static float flush(float x) {  // output denormals are zero
    return (std::bit_cast<std::uint32_t>(x) & 0x7F800000u) == 0 ? 0.0F : x;
  }
  float c_[4][tile_rows][tile_columns];
  std::uint16_t a_[2][tile_rows][tile_depth];
  std::uint16_t b_[2][tile_rows][tile_depth];
};

#if MEGAMOE_HAS_AMX_INTRINSICS
/// The tile products on AVX512-BF16 vector units (VDPBF16PS: each fp32 lane adds the two products
/// of a BF16 pair, input denormals as zero, round to nearest even), for CPUs without AMX; only call
/// it where cpu().use_avx512_bf16(). It takes a whole 32 x 32 block of C over all of K at once
/// (block_product) rather than tile by tile: eight rows of C at a time stay in 16 registers while
/// the packed B rows stream past, one A pair broadcast per row, so nothing is loaded twice per
/// step.
class vector_tiles {
 public:
  /// block[r][c] (32 x 32) = sum over K of A row r x B column c, for a_tiles x 16 rows of A from
  /// `a` (row stride `a_stride` values) and b_tiles x 16 columns of B (column block j's tiles
  /// over K contiguous from b[j]); `pairs` = K / 2 with K padded to 32.
  MEGAMOE_AVX512_BF16_TARGET void block_product(std::uint16_t const* a, std::size_t a_stride,
                                                int a_tiles, std::uint16_t const* const (&b)[2],
                                                int b_tiles, int pairs,
                                                float (&block)[2 * tile_rows][2 * tile_columns]) {
    for (int first = 0; first < a_tiles * tile_rows; first += rows_at_once)
      if (b_tiles == 2)
        rows<2>(a + static_cast<std::size_t>(first) * a_stride, a_stride, b, pairs, block, first);
      else
        rows<1>(a + static_cast<std::size_t>(first) * a_stride, a_stride, b, pairs, block, first);
    products += static_cast<std::uint64_t>(a_tiles * b_tiles) *
                static_cast<std::uint64_t>(pairs / (tile_depth / 2));
  }
  std::uint64_t products = 0;  // in tile products (16 x 16 x 32 multiply-adds) done

 private:
  static constexpr int rows_at_once = 8;
  // Never inlined: inside a larger caller (where -march flags allow it) GCC spills the B vectors.
  template <int Columns>
  MEGAMOE_AVX512_BF16_TARGET __attribute__((noinline)) static void rows(
      std::uint16_t const* a, std::size_t a_stride, std::uint16_t const* const (&b)[2], int pairs,
      float (&block)[2 * tile_rows][2 * tile_columns], int first) {
    __m512 acc[rows_at_once][Columns];
#pragma GCC unroll 8
    for (int r = 0; r < rows_at_once; ++r)
#pragma GCC unroll 2
      for (int j = 0; j < Columns; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int pair = 0; pair < pairs; ++pair) {
      // Pair-row `pair` of each column block: 16 lanes of (B[2p][n], B[2p+1][n]).
      __m512bh bv[Columns];
#pragma GCC unroll 2
      for (int j = 0; j < Columns; ++j)
        bv[j] = reinterpret_cast<__m512bh>(
            _mm512_loadu_si512(b[j] + static_cast<std::size_t>(pair) * tile_depth));
#pragma GCC unroll 8
      for (int r = 0; r < rows_at_once; ++r) {
        std::int32_t pair_bits;
        std::memcpy(&pair_bits, a + static_cast<std::size_t>(r) * a_stride + 2 * pair,
                    sizeof pair_bits);
        __m512bh const av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair_bits));
#pragma GCC unroll 2
        for (int j = 0; j < Columns; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, bv[j]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows_at_once; ++r)
#pragma GCC unroll 2
      for (int j = 0; j < Columns; ++j)
        _mm512_storeu_ps(&block[first + r][j * tile_columns], acc[r][j]);
  }
};

/// The AMX tile unit. Its tile state is per thread: configure() and release() bracket each use.
class hardware_tiles {
 public:
  MEGAMOE_AMX_TARGET void configure() {
    config_ config{};
    config.palette = 1;
    for (int t = 0; t < 8; ++t) {
      config.colsb[t] = 64;
      config.rows[t] = tile_rows;
    }
    // GCC 12 does not count LDTILECFG as a read of its operand and drops the stores above as
    // dead (the unit then faults on a half-written configuration): the barrier keeps them.
    __asm__ volatile("" : : "r"(&config) : "memory");
    _tile_loadconfig(&config);
  }
  MEGAMOE_AMX_TARGET void release() { _tile_release(); }
  MEGAMOE_AMX_TARGET void zero() {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  MEGAMOE_AMX_TARGET void load_a(int i, std::uint16_t const* p, std::size_t stride_bytes) {
    if (i == 0)
      _tile_loadd(4, p, stride_bytes);
    else
      _tile_loadd(5, p, stride_bytes);
  }
  MEGAMOE_AMX_TARGET void load_b(int j, std::uint16_t const* p) {
    if (j == 0)
      _tile_loadd(6, p, tile_depth * 2);
    else
      _tile_loadd(7, p, tile_depth * 2);
  }
  MEGAMOE_AMX_TARGET void multiply(int i, int j) {
    switch (2 * i + j) {
      case 0: _tile_dpbf16ps(0, 4, 6); break;
      case 1: _tile_dpbf16ps(1, 4, 7); break;
      case 2: _tile_dpbf16ps(2, 5, 6); break;
      default: _tile_dpbf16ps(3, 5, 7); break;
    }
    ++products;
  }
  MEGAMOE_AMX_TARGET void store(int i, int j, float* p, std::size_t stride_bytes) const {
    switch (2 * i + j) {
      case 0: _tile_stored(0, p, stride_bytes); break;
      case 1: _tile_stored(1, p, stride_bytes); break;
      case 2: _tile_stored(2, p, stride_bytes); break;
      default: _tile_stored(3, p, stride_bytes); break;
    }
  }
  std::uint64_t products = 0;

 private:
  struct alignas(64) config_ {
    std::uint8_t palette = 0, start_row = 0;
    std::uint8_t reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
  };
};
#endif

/// C [M, N] (row stride ldc) = alpha * A B, added to C where `accumulate`. Single-threaded; the
/// grouped products split work across the pool by calling this per piece.
template <class Tiles>
MEGAMOE_AMX_TARGET void gemm(Tiles& tiles, packed_a const& a, packed_b const& b, float* c,
                             std::ptrdiff_t ldc, float alpha = 1.0F, bool accumulate = false) {
  if (a.depth != b.depth)
    throw input_error("tiles::gemm: A has depth " + std::to_string(a.depth) + ", B " +
                      std::to_string(b.depth));
  int const m = a.rows, n = b.cols, k_steps = a.depth_padded / tile_depth;
  if (m == 0 || n == 0) return;
  alignas(64) float block[2 * tile_rows][2 * tile_columns];
  constexpr std::size_t block_stride = sizeof(float) * 2 * tile_columns;
  std::size_t const a_stride = sizeof(std::uint16_t) * static_cast<std::size_t>(a.depth_padded);
  std::uint64_t const before = tiles.products;
  if constexpr (!requires { &Tiles::block_product; }) tiles.configure();
  for (int panel = 0; panel < n; panel += panel_columns) {
    int const panel_end = std::min(n, panel + panel_columns);
    for (int row = 0; row < m; row += 2 * tile_rows) {
      int const a_tiles = row + tile_rows < m ? 2 : 1;
      std::uint16_t const* a0 = a.bits.data() + static_cast<std::size_t>(row) * a.depth_padded;
      std::uint16_t const* a1 = a0 + static_cast<std::size_t>(tile_rows) * a.depth_padded;
      for (int col = panel; col < panel_end; col += 2 * tile_columns) {
        int const b_tiles = col + tile_columns < panel_end ? 2 : 1;
        int const n_block = col / tile_columns;
        if constexpr (requires { &Tiles::block_product; }) {
          // A column block's tiles over K are contiguous (tile_offset).
          std::uint16_t const* const b_blocks[2] = {
              b.bits.data() + b.tile_offset(n_block, 0),
              b.bits.data() + b.tile_offset(b_tiles == 2 ? n_block + 1 : n_block, 0)};
          tiles.block_product(a0, static_cast<std::size_t>(a.depth_padded), a_tiles, b_blocks,
                              b_tiles, a.depth_padded / 2, block);
        } else {
          tiles.zero();
          for (int step = 0; step < k_steps; ++step) {
            tiles.load_a(0, a0 + step * tile_depth, a_stride);
            if (a_tiles == 2) tiles.load_a(1, a1 + step * tile_depth, a_stride);
            tiles.load_b(0, b.bits.data() + b.tile_offset(n_block, step));
            if (b_tiles == 2) tiles.load_b(1, b.bits.data() + b.tile_offset(n_block + 1, step));
            for (int i = 0; i < a_tiles; ++i)
              for (int j = 0; j < b_tiles; ++j) tiles.multiply(i, j);
          }
          for (int i = 0; i < a_tiles; ++i)
            for (int j = 0; j < b_tiles; ++j)
              tiles.store(i, j, &block[i * tile_rows][j * tile_columns], block_stride);
        }
        int const rows_here = std::min(m - row, a_tiles * tile_rows);
        int const cols_here = std::min(panel_end - col, b_tiles * tile_columns);
        for (int r = 0; r < rows_here; ++r) {
          float* out = c + static_cast<std::ptrdiff_t>(row + r) * ldc + col;
          for (int j = 0; j < cols_here; ++j)
            out[j] = alpha * block[r][j] + (accumulate ? out[j] : 0.0F);
        }
      }
    }
  }
  if constexpr (!requires { &Tiles::block_product; }) tiles.release();
  products_issued().fetch_add(tiles.products - before, std::memory_order_relaxed);
}

}  // namespace megamoe::expert::tiles

#if MEGAMOE_HEADER_ONLY
#include <megamoe/expert/tile_gemm.ipp>
#endif
