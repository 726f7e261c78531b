// SPDX-License-Identifier: Apache-2.0
// megamoe_precision_vectors — every section of the precision vectors file, bit for bit.
//
//   megamoe_precision_vectors [--file F]
//
// The file is MEGAMOE_PRECISION_VECTORS, or else the in-repo tests/data/precision_vectors.json. One
// line per section; a section (or a field inside one) that no check reads fails the run. The one
// statistical section, the stochastic-rounding demonstration, is checked statistically. The
// program is built twice, at -O0 and at -O3 -march=native -ffp-contract=fast, and both must pass.
// The quantizer checked is megamoe's own (precision::quantize<F>, the one the recipes run), in the
// operand format each section describes; the scale arithmetic is precision/scaling.hpp's.
#include "vectors/object_fields.hpp"

#include <megamoe/precision/formats.hpp>
#include <megamoe/precision/quantize.hpp>
#include <megamoe/precision/scaling.hpp>

#include <openssl/evp.h>
#include <nlohmann/json.hpp>

#include <bit>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace mp = megamoe::precision;
namespace vectors = megamoe::vectors;
using json = nlohmann::json;

namespace {

using vectors::mismatch;
using vectors::object_fields;

// --- megamoe's quantizer in a section's format
// -----------------------------------------------------

template <class E>
constexpr mp::element_kind kind_of() {
  if constexpr (std::is_same_v<E, mp::e4m3>) return mp::element_kind::e4m3;
  if constexpr (std::is_same_v<E, mp::e5m2>) return mp::element_kind::e5m2;
  return mp::element_kind::e2m1;
}
template <class E>
constexpr mp::operand_format per_tensor_format{kind_of<E>(), mp::scale_kind::per_tensor};
template <class E>
constexpr mp::operand_format mxfp8_format{kind_of<E>(), mp::scale_kind::e8m0_blocks, 1, 32};
constexpr mp::operand_format blockwise_format(int block_rows, bool power_of_2) {
  return {mp::element_kind::e4m3, mp::scale_kind::fp32_blocks, block_rows, 128, power_of_2};
}
constexpr mp::operand_format nvfp4_format(int block_rows) {
  return {mp::element_kind::e2m1, mp::scale_kind::nvfp4_blocks, block_rows, 16};
}

/// x [rows, cols] quantized by megamoe in format F.
template <mp::operand_format F>
mp::quantized_matrix quantized(std::vector<float> const& x, int rows, int cols,
                               float tensor_scale = 1.0F,
                               std::optional<float> global_amax = std::nullopt) {
  mp::quantized_matrix q;
  mp::quantize<F>(x.data(), rows, cols, tensor_scale, 0, q, global_amax);
  return q;
}

/// The dequantized values of q (format F), row-major.
template <mp::operand_format F>
std::vector<float> dequantized_values(mp::quantized_matrix const& q) {
  std::vector<float> out(static_cast<std::size_t>(q.rows) * q.cols);
  mp::dequantize<F>(
      q, [&](int r, int c, float v) { out[static_cast<std::size_t>(r) * q.cols + c] = v; });
  return out;
}

/// The E2M1 code of element i of an NVFP4 matrix (two per byte, element 2i in the low nibble).
std::uint8_t fp4_code(mp::quantized_matrix const& q, std::size_t i) {
  return static_cast<std::uint8_t>((q.codes[i / 2] >> (4 * (i % 2))) & 0xF);
}

std::vector<float> transposed(std::vector<float> const& x, int rows, int cols) {
  std::vector<float> t(x.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c) * rows + r] = x[static_cast<std::size_t>(r) * cols + c];
  return t;
}

std::uint32_t bits_of(float x) {
  return std::bit_cast<std::uint32_t>(x);
}

std::string hex32(std::uint32_t b) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", b);
  return text;
}

/// A float from the file: decimals of fp32 values, doubles to be cast as F32(x), or Inf/NaN text.
float fp32_of(json const& j, std::string const& what) {
  if (j.is_string()) {
    std::string const s = j.get<std::string>();
    if (s == "Infinity") return std::numeric_limits<float>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<float>::infinity();
    if (s == "NaN") return std::numeric_limits<float>::quiet_NaN();
    throw mismatch(what + ": unexpected string " + s);
  }
  return static_cast<float>(j.get<double>());  // decimals of fp32 values, or doubles cast as F32(x)
}

std::vector<float> floats_of(json const& j, std::string const& what) {
  std::vector<float> out;
  for (auto const& v : j) out.push_back(fp32_of(v, what));
  return out;
}

/// Bit-identical, except that the file writes -0 as 0 (codes carry the sign and are compared
/// exactly).
void same_float(std::string const& what, float mine, float expected) {
  bool const zeros = mine == 0.0F && expected == 0.0F;
  if (bits_of(mine) != bits_of(expected) && !(std::isnan(mine) && std::isnan(expected)) && !zeros)
    throw mismatch(what + ": megamoe " + std::to_string(mine) + " (" + hex32(bits_of(mine)) +
                   "), vectors " + std::to_string(expected) + " (" + hex32(bits_of(expected)) +
                   ")");
}

void same_floats(std::string const& what, std::vector<float> const& mine, json const& expected) {
  auto const want = floats_of(expected, what);
  if (want.size() != mine.size())
    throw mismatch(what + ": " + std::to_string(mine.size()) + " values, vectors " +
                   std::to_string(want.size()));
  for (std::size_t i = 0; i < mine.size(); ++i)
    same_float(what + "[" + std::to_string(i) + "]", mine[i], want[i]);
}

template <class T>
void same_ints(std::string const& what, std::vector<T> const& mine, json const& expected) {
  auto const want = expected.get<std::vector<long long>>();
  if (want.size() != mine.size())
    throw mismatch(what + ": " + std::to_string(mine.size()) + " values, vectors " +
                   std::to_string(want.size()));
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (static_cast<long long>(mine[i]) != want[i])
      throw mismatch(what + "[" + std::to_string(i) + "]: megamoe " +
                     std::to_string(static_cast<long long>(mine[i])) + ", vectors " +
                     std::to_string(want[i]));
}

void same_int(std::string const& what, long long mine, json const& expected) {
  if (mine != expected.get<long long>())
    throw mismatch(what + ": megamoe " + std::to_string(mine) + ", vectors " + expected.dump());
}

void same_bits(std::string const& what, float mine, json const& hex) {
  std::uint32_t const want =
      static_cast<std::uint32_t>(std::stoul(hex.get<std::string>(), nullptr, 16));
  if (bits_of(mine) != want)
    throw mismatch(what + ": megamoe " + hex32(bits_of(mine)) + ", vectors " +
                   hex.get<std::string>());
}

void same_bits_list(std::string const& what, std::vector<float> const& mine, json const& hexes) {
  if (hexes.size() != mine.size()) throw mismatch(what + ": length differs");
  for (std::size_t i = 0; i < mine.size(); ++i)
    same_bits(what + "[" + std::to_string(i) + "]", mine[i], hexes[i]);
}

std::string hex_bytes(std::vector<std::uint8_t> const& bytes, bool nibbles = false) {
  static char const digits[] = "0123456789abcdef";
  std::string out;
  for (auto b : bytes) {
    if (!nibbles) out += digits[b >> 4];
    out += digits[b & 0xF];
  }
  return out;
}

std::string sha256_hex(std::vector<std::uint8_t> const& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) != 1)
    throw mismatch("SHA-256 failed");
  return hex_bytes(std::vector<std::uint8_t>(digest, digest + length));
}

void same_text(std::string const& what, std::string const& mine, json const& expected) {
  if (mine != expected.get<std::string>())
    throw mismatch(what + ": megamoe " + mine.substr(0, 64) + "..., vectors " +
                   expected.get<std::string>().substr(0, 64) + "...");
}

template <class F>
std::vector<std::uint8_t> encode_all(std::vector<float> const& xs, bool saturate = true) {
  std::vector<std::uint8_t> out;
  for (float x : xs) out.push_back(mp::encode<F>(x, saturate));
  return out;
}

/// The input list, with its fp32 bit patterns checked when given.
std::vector<float> inputs(object_fields& f) {
  auto const xs = floats_of(f.take("input"), f.where() + ".input");
  if (f.has("input_bits")) same_bits_list(f.where() + ".input_bits", xs, f.take("input_bits"));
  return xs;
}

// --- sections ------------------------------------------------------------------------------------

void check_meta(json const& j) {
  object_fields f(j, "meta");
  if (f.take("generator").get<std::string>().empty()) throw mismatch("meta.generator is empty");
  // The conventions are the rules this file checks; each one must be stated.
  auto const conventions = f.take("conventions").dump();
  for (char const* needle :
       {"round-to-nearest-even", "saturate", "E2M1", "fp32 bit patterns", "E8M0"})
    if (conventions.find(needle) == std::string::npos)
      throw mismatch(std::string("meta.conventions no longer mention ") + needle);
  f.require_all_handled();
}

/// exp_bits, man_bits and bias of a format entry.
void same_layout(object_fields& f, int exponent_bits, int mantissa_bits, int bias) {
  same_int(f.where() + ".exp_bits", exponent_bits, f.take("exp_bits"));
  same_int(f.where() + ".man_bits", mantissa_bits, f.take("man_bits"));
  same_int(f.where() + ".bias", bias, f.take("bias"));
}

template <class F>
void check_format_traits(json const& j, std::string const& name) {
  object_fields f(j, "formats." + name);
  same_layout(f, F::exponent_bits, F::mantissa_bits, F::bias);
  same_float(f.where() + ".max_finite", mp::max_finite<F>,
             fp32_of(f.take("max_finite"), "max_finite"));
  same_int(f.where() + ".max_finite_code", F::max_code, f.take("max_finite_code"));
  // Smallest normal: exponent field 1, mantissa 0; smallest subnormal: code 1.
  same_float(f.where() + ".min_normal",
             mp::decode<F>(static_cast<std::uint8_t>(1u << F::mantissa_bits)),
             fp32_of(f.take("min_normal"), "min_normal"));
  same_float(f.where() + ".min_subnormal", mp::decode<F>(1),
             fp32_of(f.take("min_subnormal"), "min_subnormal"));
  f.require_all_handled();
}

void check_formats(json const& j) {
  object_fields f(j, "formats");
  check_format_traits<mp::e4m3>(f.take("E4M3"), "E4M3");
  check_format_traits<mp::e5m2>(f.take("E5M2"), "E5M2");
  check_format_traits<mp::e2m1>(f.take("E2M1"), "E2M1");
  {
    object_fields e(f.take("E8M0"), "formats.E8M0");
    same_layout(e, 8, 0, 127);
    same_float("E8M0.min", mp::e8m0_value(0), fp32_of(e.take("min"), "min"));
    same_float("E8M0.max", mp::e8m0_value(0xFE), fp32_of(e.take("max"), "max"));
    same_int("E8M0.nan_code", 0xFF, e.take("nan_code"));
    if (!std::isnan(mp::e8m0_value(0xFF))) throw mismatch("E8M0 0xFF is not NaN");
    e.require_all_handled();
  }
  {
    object_fields b(f.take("BF16"), "formats.BF16");
    same_layout(b, 8, 7, 127);
    same_float("BF16.max_finite", mp::from_bf16_bits(0x7F7F), fp32_of(b.take("max_finite"), "max"));
    same_float("BF16.min_normal", mp::from_bf16_bits(0x0080), fp32_of(b.take("min_normal"), "min"));
    same_float("BF16.min_subnormal", mp::from_bf16_bits(0x0001),
               fp32_of(b.take("min_subnormal"), "sub"));
    b.require_all_handled();
  }
  f.require_all_handled();
}

void check_fp8_cast(json const& j) {
  for (std::size_t i = 0; i < j.size(); ++i) {
    object_fields f(j[i], "fp8_cast[" + std::to_string(i) + "]");
    std::string const format = f.take("format").get<std::string>();
    auto const xs = inputs(f);
    auto run = [&]<class F>() {
      same_ints(f.where() + ".code_satfinite", encode_all<F>(xs, true), f.take("code_satfinite"));
      same_ints(f.where() + ".code_nonsaturating", encode_all<F>(xs, false),
                f.take("code_nonsaturating"));
      std::vector<float> values;
      for (auto c : encode_all<F>(xs, true)) values.push_back(mp::decode<F>(c));
      same_floats(f.where() + ".value_satfinite", values, f.take("value_satfinite"));
    };
    if (format == "E4M3") {
      run.template operator()<mp::e4m3>();
    } else if (format == "E5M2") {
      run.template operator()<mp::e5m2>();
    } else {
      throw mismatch(f.where() + ": unknown format " + format);
    }
    f.require_all_handled();
  }
}

void check_bf16_cast(json const& j) {
  object_fields f(j, "bf16_cast");
  auto const xs = inputs(f);
  std::vector<std::uint16_t> codes;
  std::vector<float> values;
  for (float x : xs) {
    codes.push_back(mp::to_bf16_bits(x));
    values.push_back(mp::round_to_bf16(x));
  }
  same_ints("bf16_cast.code", codes, f.take("code"));
  same_floats("bf16_cast.value", values, f.take("value"));
  f.require_all_handled();
}

void check_e2m1_cast(json const& j) {
  object_fields f(j, "e2m1_cast");
  auto const xs = inputs(f);
  auto const codes = encode_all<mp::e2m1>(xs);
  same_ints("e2m1_cast.code", codes, f.take("code"));
  std::vector<float> values;
  for (auto c : codes) values.push_back(mp::decode<mp::e2m1>(c));
  same_floats("e2m1_cast.value", values, f.take("value"));
  f.require_all_handled();
}

template <class F>
void check_per_tensor_entry(object_fields& f, std::vector<float> const& xs) {
  float const amax = mp::amax_of(xs);
  same_float(f.where() + ".amax", amax, fp32_of(f.take("amax"), "amax"));
  float const scale = mp::scale_from_amax(amax, mp::max_finite<F>);
  same_float(f.where() + ".scale", scale, fp32_of(f.take("scale"), "scale"));
  if (f.has("scale_bits")) same_bits(f.where() + ".scale_bits", scale, f.take("scale_bits"));
  constexpr auto format = per_tensor_format<F>;
  auto const q = quantized<format>(xs, 1, static_cast<int>(xs.size()), scale);
  same_float(f.where() + ".scale_inv", q.scale_inv.at(0),
             fp32_of(f.take("scale_inv"), "scale_inv"));
  if (f.has("scale_inv_bits"))
    same_bits(f.where() + ".scale_inv_bits", q.scale_inv.at(0), f.take("scale_inv_bits"));
  if (f.has("scaled")) {
    std::vector<float> scaled;
    for (float x : xs) scaled.push_back(x * scale);
    same_floats(f.where() + ".scaled", scaled, f.take("scaled"));
  }
  same_ints(f.where() + ".code", q.codes, f.take("code"));
  if (f.has("fp8_value")) {
    std::vector<float> values;
    for (auto c : q.codes) values.push_back(mp::decode<F>(c));
    same_floats(f.where() + ".fp8_value", values, f.take("fp8_value"));
  }
  same_floats(f.where() + ".dequant", dequantized_values<format>(q), f.take("dequant"));
  if (f.has("pow2_scale")) {
    float const pow2 = mp::scale_from_amax(amax, mp::max_finite<F>, true);
    same_float(f.where() + ".pow2_scale", pow2, fp32_of(f.take("pow2_scale"), "pow2_scale"));
    auto const p = quantized<format>(xs, 1, static_cast<int>(xs.size()), pow2);
    same_ints(f.where() + ".pow2_code", p.codes, f.take("pow2_code"));
    same_floats(f.where() + ".pow2_dequant", dequantized_values<format>(p), f.take("pow2_dequant"));
  }
}

void check_per_tensor(json const& j) {
  for (std::size_t i = 0; i < j.size(); ++i) {
    object_fields f(j[i], "per_tensor_current_scaling[" + std::to_string(i) + "]");
    f.describe({"note"});
    std::string const format = f.take("format").get<std::string>();
    auto const xs = inputs(f);
    if (format == "E4M3") {
      check_per_tensor_entry<mp::e4m3>(f, xs);
    } else if (format == "E5M2") {
      check_per_tensor_entry<mp::e5m2>(f, xs);
    } else {
      throw mismatch(f.where() + ": unknown format " + format);
    }
    f.require_all_handled();
  }
}

void check_delayed(json const& j) {
  object_fields f(j, "delayed_scaling");
  auto const before = floats_of(f.take("history_before"), "history_before");
  auto const after = floats_of(f.take("history_after_roll"), "history_after_roll");
  auto const& cases = f.take("cases");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    object_fields c(cases[i], "delayed_scaling.cases[" + std::to_string(i) + "]");
    c.describe({"note"});
    auto const algo = c.take("algo").get<std::string>() == "max"
                          ? mp::delayed_scaling_state::algorithm::max
                          : mp::delayed_scaling_state::algorithm::most_recent;
    mp::delayed_scaling_state state(static_cast<int>(before.size()), algo,
                                    c.take("margin").get<int>());
    state.amax_history =
        c.has("history_before") ? floats_of(c.take("history_before"), "history") : before;
    if (c.has("prev_scale")) state.scale = fp32_of(c.take("prev_scale"), "prev_scale");
    float const amax = state.update(mp::max_finite<mp::e4m3>);
    same_float(c.where() + ".amax", amax, fp32_of(c.take("amax"), "amax"));
    same_float(c.where() + ".scale", state.scale, fp32_of(c.take("scale"), "scale"));
    if (c.has("scale_bits"))
      same_bits(c.where() + ".scale_bits", state.scale, c.take("scale_bits"));
    if (!c.has("history_before"))
      same_floats(c.where() + " rolled history", state.amax_history, f.take("history_after_roll"));
    c.require_all_handled();
  }
  if (after.size() != before.size()) throw mismatch("delayed_scaling: history lengths differ");
  f.require_all_handled();
}

void check_blockwise_row(json const& j) {
  object_fields f(j, "blockwise_1x128_row");
  f.describe({"generator"});
  auto const xs = floats_of(f.take("input"), "input");
  for (std::size_t i = 0; i < xs.size(); ++i) {
    float const expected =
        i < 127 ? static_cast<float>((static_cast<int>(i) % 17) - 8) * 0.3125F : 5.0F;
    same_float("blockwise_1x128_row.input (generator)[" + std::to_string(i) + "]", xs[i], expected);
  }
  same_float("blockwise_1x128_row.amax", mp::amax_of(xs), fp32_of(f.take("amax"), "amax"));
  for (bool pow2 : {true, false}) {
    object_fields v(f.take(pow2 ? "pow2" : "fp32_scale"),
                    pow2 ? "blockwise_1x128_row.pow2" : "blockwise_1x128_row.fp32_scale");
    auto const q = pow2 ? quantized<blockwise_format(1, true)>(xs, 1, 128)
                        : quantized<blockwise_format(1, false)>(xs, 1, 128);
    auto const dequant = pow2 ? dequantized_values<blockwise_format(1, true)>(q)
                              : dequantized_values<blockwise_format(1, false)>(q);
    float const scale = mp::scale_from_amax(mp::amax_of(xs), 448.0F, pow2);
    same_float(v.where() + ".scale", scale, fp32_of(v.take("scale"), "scale"));
    same_float(v.where() + ".scale_inv", q.scale_inv[0], fp32_of(v.take("scale_inv"), "scale_inv"));
    if (v.has("scale_bits")) same_bits(v.where() + ".scale_bits", scale, v.take("scale_bits"));
    if (v.has("scale_inv_bits"))
      same_bits(v.where() + ".scale_inv_bits", q.scale_inv[0], v.take("scale_inv_bits"));
    same_ints(v.where() + ".code", q.codes, v.take("code"));
    same_floats(v.where() + ".dequant", dequant, v.take("dequant"));
    v.require_all_handled();
  }
  f.require_all_handled();
}

/// X[i][j] = (((i*a + j*b) % 257) - 128) / 32 * factor(i, j), as the file's generators say.
template <class Factor>
std::vector<float> generated(int rows, int cols, int a, int b, Factor factor) {
  std::vector<float> x(static_cast<std::size_t>(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int jj = 0; jj < cols; ++jj)
      x[static_cast<std::size_t>(i) * cols + jj] =
          (static_cast<float>(((i * a + jj * b) % 257) - 128) / 32.0F) * factor(i, jj);
  return x;
}

void check_blockwise_2d(json const& j) {
  object_fields f(j, "blockwise_2d_tensor");
  f.describe({"generator"});
  if (f.take("format").get<std::string>() != "E4M3") throw mismatch("blockwise_2d_tensor: format");
  auto const shape = f.take("shape").get<std::vector<int>>();
  int const rows = shape.at(0), cols = shape.at(1);
  auto x = generated(rows, cols, 37, 101, [](int i, int) { return static_cast<float>(1 + i % 5); });
  x[3 * static_cast<std::size_t>(cols) + 7] = 300.0F;
  auto const xt = transposed(x, rows, cols);
  for (bool pow2 : {false, true}) {
    object_fields s(f.take(pow2 ? "pow2_scales" : "fp32_scales"),
                    std::string("blockwise_2d_tensor.") + (pow2 ? "pow2_scales" : "fp32_scales"));
    auto blocks = [&](int block_rows, std::vector<float> const& v, int r, int c) {
      if (block_rows == 1)
        return pow2 ? quantized<blockwise_format(1, true)>(v, r, c)
                    : quantized<blockwise_format(1, false)>(v, r, c);
      return pow2 ? quantized<blockwise_format(128, true)>(v, r, c)
                  : quantized<blockwise_format(128, false)>(v, r, c);
    };
    auto const row = blocks(1, x, rows, cols);
    auto const col = blocks(1, xt, cols, rows);
    auto const tile = blocks(128, x, rows, cols);
    auto check = [&](char const* name, mp::quantized_matrix const& q) {
      object_fields c(s.take(name), s.where() + "." + name);
      c.describe({"layout", "note"});
      auto const& si = c.take("scale_inv");
      if (si.is_array()) {
        same_floats(c.where() + ".scale_inv", q.scale_inv, si);
      } else {
        same_float(c.where() + ".scale_inv", q.scale_inv.at(0), fp32_of(si, "scale_inv"));
      }
      if (c.has("scale_inv_bits"))
        same_bits_list(c.where() + ".scale_inv_bits", q.scale_inv, c.take("scale_inv_bits"));
      if (c.has("codes_hex"))
        same_text(c.where() + ".codes_hex", hex_bytes(q.codes), c.take("codes_hex"));
      same_text(c.where() + ".sha256", sha256_hex(q.codes), c.take("sha256"));
      c.require_all_handled();
    };
    check("rowwise_1x128", row);
    check("columnwise_1x128_of_transpose", col);
    check("block_128x128", tile);
    // Rowwise and columnwise copies dequantize differently (re-quantized along the other axis).
    // The file counts exact products (code value x scale_inv in double), not fp32-rounded ones.
    long differ = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        auto const i = static_cast<std::size_t>(r) * cols + c;
        auto const it = static_cast<std::size_t>(c) * rows + r;
        double const a = static_cast<double>(mp::decode<mp::e4m3>(row.codes[i])) *
                         row.scale_inv[static_cast<std::size_t>(r)];
        double const b = static_cast<double>(mp::decode<mp::e4m3>(col.codes[it])) *
                         col.scale_inv[static_cast<std::size_t>(c)];
        differ += a != b ? 1 : 0;
      }
    same_int(s.where() + ".elements_where_rowwise_and_columnwise_dequant_differ", differ,
             s.take("elements_where_rowwise_and_columnwise_dequant_differ"));
    s.require_all_handled();
  }
  f.require_all_handled();
}

template <class F>
void check_mx_variant(object_fields& v, std::vector<float> const& xs, bool te, int element_emax) {
  float const amax = mp::amax_of(xs);
  std::uint8_t const e = te ? mp::mxfp8_scale<F>(amax) : mp::e8m0_ocp(amax, element_emax);
  same_int(v.where() + ".e8m0", e, v.take("e8m0"));
  if (v.has("scale"))
    same_float(v.where() + ".scale", mp::e8m0_value(e), fp32_of(v.take("scale"), "scale"));
  std::vector<std::uint8_t> codes;
  std::vector<float> deq;
  for (float x : xs) {
    // TE multiplies by 2^(127-e); the OCP reference divides by 2^(e-127): both exact.
    std::uint8_t const c =
        te ? mp::encode<F>(x * mp::e8m0_reciprocal(e)) : mp::encode<F>(x / mp::e8m0_value(e));
    codes.push_back(c);
    deq.push_back(mp::decode<F>(c) * mp::e8m0_value(e));
  }
  same_ints(v.where() + ".code", codes, v.take("code"));
  same_floats(v.where() + ".dequant", deq, v.take("dequant"));
  if (te) {
    auto const q = quantized<mxfp8_format<F>>(xs, 1, static_cast<int>(xs.size()));
    same_ints(v.where() + ".code (quantize<mxfp8>)", q.codes, v.take("code"));
  }
  v.require_all_handled();
}

template <class F>
void check_mx_block(object_fields& b, int element_emax) {
  auto const xs = inputs(b);
  if (b.has("amax"))
    same_float(b.where() + ".amax", mp::amax_of(xs), fp32_of(b.take("amax"), "amax"));
  {
    object_fields te(b.take("te"), b.where() + ".te");
    check_mx_variant<F>(te, xs, true, element_emax);
  }
  object_fields ocp(b.take("ocp_spec"), b.where() + ".ocp_spec");
  check_mx_variant<F>(ocp, xs, false, element_emax);
}

void check_mxfp8(json const& j, json const& whole) {
  object_fields f(j, "mxfp8");
  auto const& blocks = f.take("blocks");
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    object_fields b(blocks[i], "mxfp8.blocks[" + std::to_string(i) + "]");
    b.describe({"name"});
    std::string const format = b.take("format").get<std::string>();
    if (format == "E4M3") {
      check_mx_block<mp::e4m3>(b, 8);
    } else if (format == "E5M2") {
      check_mx_block<mp::e5m2>(b, 15);
    } else {
      throw mismatch(b.where() + ": unknown format " + format);
    }
    b.require_all_handled();
  }
  {
    object_fields b(f.take("e5m2_block"), "mxfp8.e5m2_block");
    b.describe({"name"});
    if (b.take("format").get<std::string>() != "E5M2") throw mismatch("e5m2_block: format");
    // The E5M2 case re-uses block A's input.
    auto const& a = whole.at("mxfp8").at("blocks").at(0);
    auto const xs = floats_of(b.has("input") ? b.take("input") : a.at("input"), "input");
    same_float(b.where() + ".amax", mp::amax_of(xs), fp32_of(b.take("amax"), "amax"));
    {
      object_fields te(b.take("te"), b.where() + ".te");
      check_mx_variant<mp::e5m2>(te, xs, true, 15);
    }
    object_fields ocp(b.take("ocp_spec"), b.where() + ".ocp_spec");
    check_mx_variant<mp::e5m2>(ocp, xs, false, 15);
    b.require_all_handled();
  }
  auto const& edges = f.take("e8m0_edge_cases");
  for (std::size_t i = 0; i < edges.size(); ++i) {
    object_fields e(edges[i], "mxfp8.e8m0_edge_cases[" + std::to_string(i) + "]");
    float const amax = fp32_of(e.take("amax"), "amax");
    float const v = amax * static_cast<float>(1.0 / 448.0);
    same_float(e.where() + ".amax_times_rcp448", v, fp32_of(e.take("amax_times_rcp448"), "v"));
    same_bits(e.where() + ".bits", v, e.take("bits"));
    same_int(e.where() + ".e8m0_te", mp::mxfp8_scale<mp::e4m3>(amax), e.take("e8m0_te"));
    same_int(e.where() + ".e8m0_ocp_e4m3", mp::e8m0_ocp(amax, 8), e.take("e8m0_ocp_e4m3"));
    e.require_all_handled();
  }
  {
    object_fields r(f.take("rowwise_vs_columnwise"), "mxfp8.rowwise_vs_columnwise");
    r.describe({"generator", "rowwise_layout", "columnwise_layout"});
    auto const shape = r.take("shape").get<std::vector<int>>();
    int const rows = shape.at(0), cols = shape.at(1);
    auto x =
        generated(rows, cols, 29, 83, [](int i, int) { return static_cast<float>(1 + i % 5); });
    x[5 * static_cast<std::size_t>(cols) + 40] = -90.0F;
    auto const row = quantized<mxfp8_format<mp::e4m3>>(x, rows, cols);
    auto const col = quantized<mxfp8_format<mp::e4m3>>(transposed(x, rows, cols), cols, rows);
    same_ints(r.where() + ".rowwise_e8m0", row.scale_codes, r.take("rowwise_e8m0"));
    same_text(r.where() + ".rowwise_codes_hex", hex_bytes(row.codes), r.take("rowwise_codes_hex"));
    same_text(r.where() + ".rowwise_sha256", sha256_hex(row.codes), r.take("rowwise_sha256"));
    same_ints(r.where() + ".columnwise_e8m0", col.scale_codes, r.take("columnwise_e8m0"));
    same_text(r.where() + ".columnwise_codes_hex", hex_bytes(col.codes),
              r.take("columnwise_codes_hex"));
    same_text(r.where() + ".columnwise_sha256", sha256_hex(col.codes), r.take("columnwise_sha256"));
    r.require_all_handled();
  }
  f.require_all_handled();
}

void check_nvfp4_block(object_fields& b, std::vector<float> const& xs, float global_amax) {
  auto const g = mp::nvfp4_global(global_amax);
  float const block_amax = mp::amax_of(xs);
  same_float(b.where() + ".block_amax", block_amax, fp32_of(b.take("block_amax"), "block_amax"));
  auto const s = mp::nvfp4_block(block_amax, g);
  same_float(b.where() + ".s_dec_b_fp32", s.s_dec_b, fp32_of(b.take("s_dec_b_fp32"), "s_dec_b"));
  same_bits(b.where() + ".s_dec_b_fp32_bits", s.s_dec_b, b.take("s_dec_b_fp32_bits"));
  same_int(b.where() + ".scale_e4m3_code", s.e4m3_code, b.take("scale_e4m3_code"));
  same_float(b.where() + ".scale_e4m3_value", mp::decode<mp::e4m3>(s.e4m3_code),
             fp32_of(b.take("scale_e4m3_value"), "v"));
  same_float(b.where() + ".s_enc_b", s.s_enc_b, fp32_of(b.take("s_enc_b"), "s_enc_b"));
  same_bits(b.where() + ".s_enc_b_bits", s.s_enc_b, b.take("s_enc_b_bits"));
  std::vector<float> scaled;
  std::vector<std::uint8_t> codes;
  for (float x : xs) {
    scaled.push_back(mp::nvfp4_scaled(x, s.s_enc_b));
    codes.push_back(mp::encode<mp::e2m1>(scaled.back()));
  }
  same_floats(b.where() + ".scaled_clamped", scaled, b.take("scaled_clamped"));
  same_ints(b.where() + ".codes", codes, b.take("codes"));
  float const factor = mp::nvfp4_dequant_factor(s.e4m3_code, global_amax);
  same_float(b.where() + ".dequant_factor", factor, fp32_of(b.take("dequant_factor"), "factor"));
  std::vector<float> deq;
  for (auto c : codes) deq.push_back(mp::decode<mp::e2m1>(c) * factor);
  same_floats(b.where() + ".dequant", deq, b.take("dequant"));
  // The whole-tensor quantizer gives the same codes and scale for this block.
  constexpr auto format = nvfp4_format(1);
  auto const q = quantized<format>(xs, 1, static_cast<int>(xs.size()), 1.0F, global_amax);
  for (std::size_t i = 0; i < codes.size(); ++i)
    if (fp4_code(q, i) != codes[i])
      throw mismatch(b.where() + ": quantize<nvfp4> code " + std::to_string(i));
  if (q.scale_codes.at(0) != s.e4m3_code) throw mismatch(b.where() + ": quantize<nvfp4> scale");
  same_floats(b.where() + ".dequant (quantize<nvfp4>)", dequantized_values<format>(q),
              b.take("dequant"));
}

void check_global(object_fields& f, float global_amax) {
  auto const g = mp::nvfp4_global(global_amax);
  same_float(f.where() + ".s_enc", g.s_enc, fp32_of(f.take("s_enc"), "s_enc"));
  if (f.has("s_enc_bits")) same_bits(f.where() + ".s_enc_bits", g.s_enc, f.take("s_enc_bits"));
  same_float(f.where() + ".s_dec", g.s_dec, fp32_of(f.take("s_dec"), "s_dec"));
  if (f.has("s_dec_bits")) same_bits(f.where() + ".s_dec_bits", g.s_dec, f.take("s_dec_bits"));
}

void check_nvfp4_1d(json const& j) {
  object_fields f(j, "nvfp4_1d");
  float const global_amax = fp32_of(f.take("global_amax"), "global_amax");
  check_global(f, global_amax);
  auto const& blocks = f.take("blocks");
  std::vector<float> first;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    object_fields b(blocks[i], "nvfp4_1d.blocks[" + std::to_string(i) + "]");
    auto const xs = inputs(b);
    if (i == 0) first = xs;
    check_nvfp4_block(b, xs, global_amax);
    b.require_all_handled();
  }
  {
    object_fields s(f.take("same_block_global_amax_20"), "nvfp4_1d.same_block_global_amax_20");
    float const ga = fp32_of(s.take("global_amax"), "global_amax");
    check_global(s, ga);
    check_nvfp4_block(s, first, ga);
    s.require_all_handled();
  }
  {
    // Stochastic rounding: checked statistically (a CPU generator cannot match the GPU's bits).
    object_fields s(f.take("stochastic_rounding_demo"), "nvfp4_1d.stochastic_rounding_demo");
    float const value = fp32_of(s.take("value"), "value");
    auto const neighbours = floats_of(s.take("neighbours"), "neighbours");
    double const p_up = s.take("p_up").get<double>();
    long const samples = s.take("samples").get<long>();
    double const file_mean = s.take("empirical_mean").get<double>();  // the generator's own draws
    long up = 0;
    double sum = 0.0;
    for (long i = 0; i < samples; ++i) {
      std::uint8_t const c =
          mp::encode_e2m1_stochastic(value, mp::uniform_of(12345, static_cast<std::uint64_t>(i)));
      float const v = mp::decode<mp::e2m1>(c);
      if (v != neighbours.at(0) && v != neighbours.at(1))
        throw mismatch("stochastic rounding left the neighbours");
      up += v == neighbours.at(1) ? 1 : 0;
      sum += v;
    }
    double const expected_p = (value - neighbours[0]) / (neighbours[1] - neighbours[0]);
    if (std::abs(expected_p - p_up) > 1e-6)
      throw mismatch("stochastic_rounding_demo.p_up differs from the spec's rule");
    double const sigma_p = std::sqrt(p_up * (1 - p_up) / samples);
    double const p = static_cast<double>(up) / samples;
    double const mean = sum / samples;
    double const sigma_mean = (neighbours[1] - neighbours[0]) * sigma_p;
    if (std::abs(file_mean - value) > 4 * sigma_mean)
      throw mismatch("stochastic_rounding_demo.empirical_mean is not within 4 sigma of the value");
    if (std::abs(p - p_up) > 4 * sigma_p || std::abs(mean - value) > 4 * sigma_mean)
      throw mismatch("stochastic rounding: P(up) " + std::to_string(p) + ", mean " +
                     std::to_string(mean) + " over " + std::to_string(samples) +
                     " draws (4 sigma)");
    s.require_all_handled();
  }
  f.require_all_handled();
}

void check_nvfp4_2d(json const& j) {
  object_fields f(j, "nvfp4_2d");
  f.describe({"generator", "note"});
  auto const shape = f.take("shape").get<std::vector<int>>();
  int const rows = shape.at(0), cols = shape.at(1);
  float const m[2][2] = {{1.0F, 0.25F}, {2.0F, 0.0625F}};
  auto const x = generated(rows, cols, 41, 7, [&](int i, int jj) { return m[i / 16][jj / 16]; });
  float const global_amax = mp::amax_of(x);
  same_float("nvfp4_2d.global_amax", global_amax, fp32_of(f.take("global_amax"), "global_amax"));
  check_global(f, global_amax);
  auto const tiles = quantized<nvfp4_format(16)>(x, rows, cols);
  auto const rowwise = quantized<nvfp4_format(1)>(x, rows, cols);
  int const col_blocks = (cols + 15) / 16;
  auto const& list = f.take("tiles_16x16");
  for (std::size_t t = 0; t < list.size(); ++t) {
    object_fields e(list[t], "nvfp4_2d.tiles_16x16[" + std::to_string(t) + "]");
    auto const at = e.take("tile").get<std::vector<int>>();
    int const ti = at.at(0), tj = at.at(1);
    same_float(e.where() + ".multiplier", m[ti][tj], fp32_of(e.take("multiplier"), "multiplier"));
    float tile_amax = 0.0F;
    std::vector<std::uint8_t> codes;
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) {
        std::size_t const i = static_cast<std::size_t>(ti * 16 + r) * cols + (tj * 16 + c);
        tile_amax = std::max(tile_amax, std::fabs(x[i]));
        codes.push_back(fp4_code(tiles, i));
      }
    same_float(e.where() + ".tile_amax", tile_amax, fp32_of(e.take("tile_amax"), "tile_amax"));
    std::uint8_t const scale = tiles.scale_codes.at(static_cast<std::size_t>(ti * col_blocks + tj));
    same_int(e.where() + ".scale_e4m3_code", scale, e.take("scale_e4m3_code"));
    same_float(e.where() + ".scale_e4m3_value", mp::decode<mp::e4m3>(scale),
               fp32_of(e.take("scale_e4m3_value"), "v"));
    same_float(e.where() + ".dequant_factor", mp::nvfp4_dequant_factor(scale, global_amax),
               fp32_of(e.take("dequant_factor"), "factor"));
    same_text(e.where() + ".codes_hex_rowmajor", hex_bytes(codes, true),
              e.take("codes_hex_rowmajor"));
    std::vector<std::uint8_t> row_scales;
    for (int r = 0; r < 16; ++r)
      row_scales.push_back(
          rowwise.scale_codes.at(static_cast<std::size_t>((ti * 16 + r) * col_blocks + tj)));
    same_ints(e.where() + ".for_comparison_1x16_scale_codes_per_row", row_scales,
              e.take("for_comparison_1x16_scale_codes_per_row"));
    e.require_all_handled();
  }
  f.require_all_handled();
}

void check_rht16(json const& j) {
  object_fields f(j, "rht16");
  f.describe({"matrix"});
  same_ints("rht16.signs", std::vector<int>(mp::rht_signs.begin(), mp::rht_signs.end()),
            f.take("signs"));
  auto const& cases = f.take("cases");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    object_fields c(cases[i], "rht16.cases[" + std::to_string(i) + "]");
    c.describe({"input_note"});
    auto const xs = floats_of(c.take("input"), "input");
    if (xs.size() != 16) throw mismatch(c.where() + ": input is not 16 values");
    auto const y = mp::rht16(std::span<float const, 16>(xs.data(), 16));
    same_floats(c.where() + ".output_fp32", std::vector<float>(y.begin(), y.end()),
                c.take("output_fp32"));
    std::vector<float> bf16 = xs;
    mp::rht16_bf16(bf16);
    same_floats(c.where() + ".output_bf16", bf16, c.take("output_bf16"));
    c.require_all_handled();
  }
  f.require_all_handled();
}

void check_moe_padding(json const& j) {
  object_fields f(j, "moe_padding");
  auto const counts = f.take("tokens_per_expert").get<std::vector<long>>();
  for (int align : {16, 32, 128}) {
    std::vector<long> padded;
    for (long c : counts) padded.push_back(static_cast<long>(mp::pad_rows(c, align)));
    same_ints("moe_padding.align_" + std::to_string(align), padded,
              f.take("align_" + std::to_string(align)));
  }
  f.require_all_handled();
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    std::string const arg = argv[i];
    if (arg == "--file" && i + 1 < argc) {
      path = argv[++i];
    } else {
      std::cerr << "usage: megamoe_precision_vectors [--file F]\n";
      return 2;
    }
  }
  if (path.empty()) {
    char const* env = std::getenv("MEGAMOE_PRECISION_VECTORS");
    path = env && *env ? env : MEGAMOE_DEFAULT_PRECISION_VECTORS;
  }
  json whole;
  try {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path + " (MEGAMOE_PRECISION_VECTORS)");
    whole = json::parse(in);
  } catch (std::exception const& e) {
    std::cout << "precision_vectors: " << e.what() << "\n";
    return 1;
  }
  std::map<std::string, std::function<void(json const&)>> const sections{
      {"meta", check_meta},
      {"formats", check_formats},
      {"fp8_cast", check_fp8_cast},
      {"bf16_cast", check_bf16_cast},
      {"e2m1_cast", check_e2m1_cast},
      {"per_tensor_current_scaling", check_per_tensor},
      {"delayed_scaling", check_delayed},
      {"blockwise_1x128_row", check_blockwise_row},
      {"blockwise_2d_tensor", check_blockwise_2d},
      {"mxfp8", [&](json const& j) { check_mxfp8(j, whole); }},
      {"nvfp4_1d", check_nvfp4_1d},
      {"nvfp4_2d", check_nvfp4_2d},
      {"rht16", check_rht16},
      {"moe_padding", check_moe_padding},
  };
  int failed = 0, ran = 0;
  for (auto const& [name, section] : whole.items()) {
    ++ran;
    auto const it = sections.find(name);
    if (it == sections.end()) {
      std::cout << "precision_vectors " << name << ": FAILED, a section this test does not check\n";
      ++failed;
      continue;
    }
    try {
      it->second(section);
      std::cout << "precision_vectors " << name << ": ok\n";
    } catch (std::exception const& e) {
      std::cout << "precision_vectors " << name << ": FAILED, " << e.what() << "\n";
      ++failed;
    }
  }
  std::cout << "precision_vectors: " << ran - failed << " of " << ran << " sections ok (" << path
            << ", "
#ifdef __OPTIMIZE__
            << "optimized"
#else
            << "-O0"
#endif
            << " build)\n";
  return failed == 0 ? 0 : 1;
}
