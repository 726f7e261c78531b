// SPDX-License-Identifier: Apache-2.0
// megamoe/precision/quantize.hpp — megamoe's quantizer: one matrix in any operand format of a
// recipe, codes + scales as stored, and back, bit-exact to docs/spec/precision.md §2-§6.
//
//   quantized_matrix            codes + scales of one matrix (FP4: two codes per byte)
//   quantize<F>(...)            a row-major [rows, cols] matrix in operand format F (blocks along
//                               cols; a columnwise copy is this on the transpose)
//   dequantize<F>(q, store)     store(row, col, value) for every element
//   tensor_factor<F>(q)         the per-tensor part of q's scale (what the tile units take apart)
//
// The scale arithmetic is precision/scaling.hpp; element codes come from the integer encoders of
// formats.hpp. F is a template argument, so the element loops carry no format switch.
#pragma once

#include <megamoe/core/bf16.hpp>
#include <megamoe/precision/formats.hpp>
#include <megamoe/precision/recipe.hpp>
#include <megamoe/precision/scaling.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <vector>

namespace megamoe::precision {

/// One quantized matrix [rows, cols] (blocks along cols), as stored.
struct quantized_matrix {
  int rows = 0, cols = 0;
  std::vector<std::uint8_t> codes;        // FP8: 1 byte per element, FP4: 2 per byte, BF16: 2 bytes
  std::vector<float> scale_inv;           // per-tensor: one; blockwise FP8: one per block
  std::vector<std::uint8_t> scale_codes;  // MXFP8: E8M0 per block; NVFP4: E4M3 per block
  float global_amax = 0.0F;               // NVFP4: the tensor amax the block scales sit under
  bool has_global_amax = false;

  /// Bytes of codes and scales.
  [[nodiscard]] std::size_t bytes() const noexcept {
    return codes.size() + scale_inv.size() * sizeof(float) + scale_codes.size() +
           (has_global_amax ? sizeof(float) : 0);
  }
};

namespace detail {

template <element_kind E>
struct element_type_of;
template <>
struct element_type_of<element_kind::e4m3> {
  using type = e4m3;
};
template <>
struct element_type_of<element_kind::e5m2> {
  using type = e5m2;
};
template <>
struct element_type_of<element_kind::e2m1> {
  using type = e2m1;
};

/// Calls fn(r, first, end, block) for every row r of a [rows, cols] matrix in blocks of br x bc and
/// every block the row crosses: columns [first, end) of row r lie in block `block` (row-major
/// block numbering). The loops the quantizers run, without a division per element.
template <class Fn>
void for_each_row_segment(int rows, int cols, int br, int bc, Fn&& fn) {
  int const col_blocks = (cols + bc - 1) / bc;
  for (int r = 0; r < rows; ++r) {
    auto const first_block =
        static_cast<std::size_t>(r / br) * static_cast<std::size_t>(col_blocks);
    for (int cb = 0; cb < col_blocks; ++cb)
      fn(r, cb * bc, std::min(cols, (cb + 1) * bc), first_block + static_cast<std::size_t>(cb));
  }
}

/// dst[c * dst_ld + r] = src[r * src_ld + c] for a [rows, cols] source, in 32 x 32 tiles so that
/// both sides stay in cache.
inline void transpose_into(float const* src, int rows, int cols, std::ptrdiff_t src_ld, float* dst,
                           std::ptrdiff_t dst_ld) {
  constexpr int tile = 32;
  for (int r0 = 0; r0 < rows; r0 += tile)
    for (int c0 = 0; c0 < cols; c0 += tile) {
      int const r1 = std::min(rows, r0 + tile), c1 = std::min(cols, c0 + tile);
      for (int r = r0; r < r1; ++r)
        for (int c = c0; c < c1; ++c) dst[c * dst_ld + r] = src[r * src_ld + c];
    }
}

/// The amax of each block of a [rows, cols] matrix in blocks of br x bc (NaN propagates).
inline void block_amax_into(float const* v, int rows, int cols, int br, int bc,
                            std::vector<float>& amax) {
  int const col_blocks = (cols + bc - 1) / bc;
  amax.assign(static_cast<std::size_t>((rows + br - 1) / br) * col_blocks, 0.0F);
  for_each_row_segment(rows, cols, br, bc, [&](int r, int first, int end, std::size_t b) {
    float const* row = v + static_cast<std::ptrdiff_t>(r) * cols;
    float m = amax[b];
    bool nan = std::isnan(m);
    for (int c = first; c < end; ++c) {
      float const a = std::fabs(row[c]);
      nan |= a != a;
      m = a > m ? a : m;
    }
    amax[b] = nan ? std::numeric_limits<float>::quiet_NaN() : m;
  });
}

}  // namespace detail

/// The fp8 maximum of an element kind (448, 57344, 6; 0 for BF16 and fp32).
constexpr float max_of(element_kind e) {
  switch (e) {
    case element_kind::e4m3: return max_finite<e4m3>;
    case element_kind::e5m2: return max_finite<e5m2>;
    case element_kind::e2m1: return max_finite<e2m1>;
    default: return 0.0F;
  }
}

/// Per-tensor codes of n values of a per-tensor format F: encode(v * tensor_scale), as quantize<F>
/// writes them (and dispatch::fp8_wire's senders, whose codes must be the experts' own).
template <operand_format F>
  requires(F.scale == scale_kind::per_tensor && F.element != element_kind::bf16 &&
           F.element != element_kind::fp32)
void encode_per_tensor(float const* v, std::size_t n, float tensor_scale, std::uint8_t* out) {
  using E = typename detail::element_type_of<F.element>::type;
  for (std::size_t i = 0; i < n; ++i) out[i] = encode<E>(v[i] * tensor_scale);
}

/// Quantizes a row-major [rows, cols] matrix in format F. `tensor_scale` is the per-tensor scale
/// (per-tensor formats only); `seed` drives stochastic rounding; `global_amax` is the amax NVFP4's
/// block scales sit under (default: the matrix's own).
template <operand_format F>
void quantize(float const* v, int rows, int cols, float tensor_scale, std::uint64_t seed,
              quantized_matrix& q, std::optional<float> global_amax = std::nullopt) {
  static_assert(F.element != element_kind::fp32, "fp32 operands are not quantized");
  auto const n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  q.rows = rows;
  q.cols = cols;
  q.scale_inv.clear();
  q.scale_codes.clear();
  q.global_amax = 0.0F;
  q.has_global_amax = F.scale == scale_kind::nvfp4_blocks;
  if constexpr (F.element == element_kind::bf16) {
    q.codes.resize(2 * n);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t const bits = to_bf16_bits(v[i]);
      std::memcpy(q.codes.data() + 2 * i, &bits, 2);
    }
  } else {
    using E = typename detail::element_type_of<F.element>::type;
    constexpr int br = F.block_rows, bc = F.block_cols;
    if constexpr (F.scale == scale_kind::per_tensor) {
      q.codes.resize(n);
      encode_per_tensor<F>(v, n, tensor_scale, q.codes.data());
      q.scale_inv.assign(1, 1.0F / tensor_scale);
    } else if constexpr (F.scale == scale_kind::fp32_blocks) {
      detail::block_amax_into(v, rows, cols, br, bc, q.scale_inv);
      for (float& s : q.scale_inv) s = scale_from_amax(s, max_finite<E>, F.power_of_2);
      q.codes.resize(n);
      detail::for_each_row_segment(rows, cols, br, bc,
                                   [&](int r, int first, int end, std::size_t b) {
                                     float const scale = q.scale_inv[b];
                                     auto const row = static_cast<std::size_t>(r) * cols;
                                     for (auto i = row + first; i < row + end; ++i)
                                       q.codes[i] = encode<E>(v[i] * scale);
                                   });
      for (float& s : q.scale_inv) s = 1.0F / s;
    } else if constexpr (F.scale == scale_kind::e8m0_blocks) {
      std::vector<float> amax;
      detail::block_amax_into(v, rows, cols, br, bc, amax);
      q.scale_codes.resize(amax.size());
      for (std::size_t b = 0; b < amax.size(); ++b) q.scale_codes[b] = mxfp8_scale<E>(amax[b]);
      q.codes.resize(n);
      detail::for_each_row_segment(rows, cols, br, bc,
                                   [&](int r, int first, int end, std::size_t b) {
                                     float const factor = e8m0_reciprocal(q.scale_codes[b]);
                                     auto const row = static_cast<std::size_t>(r) * cols;
                                     for (auto i = row + first; i < row + end; ++i)
                                       q.codes[i] = encode<E>(v[i] * factor);
                                   });
    } else {
      static_assert(F.scale == scale_kind::nvfp4_blocks);
      q.global_amax = global_amax.value_or(amax_of(std::span<float const>(v, n)));
      auto const g = nvfp4_global(q.global_amax);
      std::vector<float> amax;
      detail::block_amax_into(v, rows, cols, br, bc, amax);
      q.scale_codes.resize(amax.size());
      std::vector<float> s_enc_b(amax.size());
      for (std::size_t b = 0; b < amax.size(); ++b) {
        auto const scale = nvfp4_block(amax[b], g);
        q.scale_codes[b] = scale.e4m3_code;
        s_enc_b[b] = scale.s_enc_b;
      }
      q.codes.assign((n + 1) / 2, 0);
      detail::for_each_row_segment(
          rows, cols, br, bc, [&](int r, int first, int end, std::size_t b) {
            float const factor = s_enc_b[b];
            auto const row = static_cast<std::size_t>(r) * cols;
            for (auto i = row + first; i < row + end; ++i) {
              float const y = nvfp4_scaled(v[i], factor);
              std::uint8_t code = 0;
              if constexpr (F.stochastic) {
                code = encode_e2m1_stochastic(y, uniform_of(seed, i));
              } else {
                code = encode<e2m1>(y);
              }
              q.codes[i / 2] |= static_cast<std::uint8_t>(code << (4 * (i % 2)));
            }
          });
    }
  }
}

/// Calls store(r, c, value) with the dequantized value of every element of q (format F).
template <operand_format F, class Store>
void dequantize(quantized_matrix const& q, Store&& store) {
  int const rows = q.rows, cols = q.cols;
  // Formats without blocks walk whole rows.
  constexpr bool blocked = F.scale == scale_kind::fp32_blocks ||
                           F.scale == scale_kind::e8m0_blocks ||
                           F.scale == scale_kind::nvfp4_blocks;
  detail::for_each_row_segment(
      rows, cols, blocked ? F.block_rows : 1, blocked ? F.block_cols : std::max(cols, 1),
      [&](int r, int first, int end, std::size_t b) {
        auto const row = static_cast<std::size_t>(r) * cols;
        if constexpr (F.element == element_kind::bf16) {
          for (int c = first; c < end; ++c) {
            std::uint16_t bits = 0;
            std::memcpy(&bits, q.codes.data() + 2 * (row + c), 2);
            store(r, c, from_bf16_bits(bits));
          }
        } else {
          using E = typename detail::element_type_of<F.element>::type;
          float factor = 1.0F;
          if constexpr (F.scale == scale_kind::per_tensor) factor = q.scale_inv[0];
          if constexpr (F.scale == scale_kind::fp32_blocks) factor = q.scale_inv[b];
          if constexpr (F.scale == scale_kind::e8m0_blocks) factor = e8m0_value(q.scale_codes[b]);
          if constexpr (F.scale == scale_kind::nvfp4_blocks)
            factor = nvfp4_dequant_factor(q.scale_codes[b], q.global_amax);
          for (int c = first; c < end; ++c) {
            auto const i = row + static_cast<std::size_t>(c);
            if constexpr (F.scale == scale_kind::nvfp4_blocks) {
              auto const code = static_cast<std::uint8_t>((q.codes[i / 2] >> (4 * (i % 2))) & 0xF);
              store(r, c, decode<e2m1>(code) * factor);
            } else {
              store(r, c, decode<E>(q.codes[i]) * factor);
            }
          }
        }
      });
}

/// The per-tensor part of q's dequantization (per-tensor scales, NVFP4's global scale; 1 for the
/// others): q's values over it are codes times block scales, exact BF16 values, which is what the
/// tile backend multiplies (expert::gemm_problem::a_unit). 1 where the tensor has no usable scale.
template <operand_format F>
float tensor_factor(quantized_matrix const& q) {
  float u = 1.0F;
  if constexpr (F.scale == scale_kind::per_tensor) u = q.scale_inv.empty() ? 1.0F : q.scale_inv[0];
  if constexpr (F.scale == scale_kind::nvfp4_blocks) u = q.global_amax * nvfp4_inverse_range;
  return u > 0.0F && std::isfinite(u) ? u : 1.0F;
}

/// True for an FP8 format whose blocks lie within one row (MXFP8's 1x32, blockwise FP8's 1x128):
/// each row's codes and scales depend on that row alone, so a row can be quantized where it starts
/// and travel as bytes (dispatch::fp8_wire).
template <operand_format F>
inline constexpr bool row_local_blocks =
    (F.scale == scale_kind::fp32_blocks || F.scale == scale_kind::e8m0_blocks) &&
    F.block_rows == 1 && (F.element == element_kind::e4m3 || F.element == element_kind::e5m2);

/// Bytes of one row's block scales of a row-local format F (E8M0 codes, or fp32 scale_inv).
template <operand_format F>
  requires row_local_blocks<F>
constexpr std::size_t row_scale_bytes(int cols) {
  auto const blocks = static_cast<std::size_t>((cols + F.block_cols - 1) / F.block_cols);
  return blocks * (F.scale == scale_kind::fp32_blocks ? sizeof(float) : 1);
}

/// Bytes of one row of `cols` values of a row-local format F as it travels: its codes, then its
/// block scales.
template <operand_format F>
  requires row_local_blocks<F>
constexpr std::size_t row_bytes(int cols) {
  return static_cast<std::size_t>(cols) + row_scale_bytes<F>(cols);
}

/// Writes every row of q (format F) at out, row r at r * row_bytes<F>(q.cols).
template <operand_format F>
  requires row_local_blocks<F>
void rows_to_bytes(quantized_matrix const& q, std::uint8_t* out) {
  auto const cols = static_cast<std::size_t>(q.cols), scale_bytes = row_scale_bytes<F>(q.cols);
  auto const* scales = F.scale == scale_kind::fp32_blocks
                           ? reinterpret_cast<std::uint8_t const*>(q.scale_inv.data())
                           : q.scale_codes.data();
  for (std::size_t r = 0; r < static_cast<std::size_t>(q.rows); ++r) {
    std::memcpy(out, q.codes.data() + r * cols, cols);
    std::memcpy(out + cols, scales + r * scale_bytes, scale_bytes);
    out += cols + scale_bytes;
  }
}

/// q as `rows` rows of `cols` values of format F read from bytes rows_to_bytes<F> wrote.
template <operand_format F>
  requires row_local_blocks<F>
void rows_from_bytes(std::uint8_t const* in, int rows, int cols, quantized_matrix& q) {
  auto const n = static_cast<std::size_t>(cols), scale_bytes = row_scale_bytes<F>(cols);
  auto const count = static_cast<std::size_t>(rows);
  q.rows = rows;
  q.cols = cols;
  q.global_amax = 0.0F;
  q.has_global_amax = false;
  q.codes.resize(count * n);
  std::uint8_t* scales = nullptr;
  if constexpr (F.scale == scale_kind::fp32_blocks) {
    q.scale_codes.clear();
    q.scale_inv.resize(count * scale_bytes / sizeof(float));
    scales = reinterpret_cast<std::uint8_t*>(q.scale_inv.data());
  } else {
    q.scale_inv.clear();
    q.scale_codes.resize(count * scale_bytes);
    scales = q.scale_codes.data();
  }
  for (std::size_t r = 0; r < count; ++r) {
    std::memcpy(q.codes.data() + r * n, in, n);
    std::memcpy(scales + r * scale_bytes, in + n, scale_bytes);
    in += n + scale_bytes;
  }
}

/// The dequantized values of q as a row-major vector (for tests and tools).
template <operand_format F>
std::vector<double> dequantized(quantized_matrix const& q) {
  std::vector<double> out(static_cast<std::size_t>(q.rows) * q.cols);
  dequantize<F>(q,
                [&](int r, int c, float v) { out[static_cast<std::size_t>(r) * q.cols + c] = v; });
  return out;
}

}  // namespace megamoe::precision
