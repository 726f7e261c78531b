// SPDX-License-Identifier: Apache-2.0
// megamoe/data/utf8.hpp — UTF-8 as the tokenizers need it: a code point written, one read (or the
// maximal ill-formed part skipped, Unicode's rule that Python's and Rust's lossy decoders follow),
// and bytes made valid text with U+FFFD where they are not.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace megamoe::data::utf8 {

inline void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

inline constexpr char32_t invalid = 0xFFFFFFFF;

/// The code point at s[i], advancing i past it; `invalid` for a maximal ill-formed part,
/// advancing past that part.
inline char32_t next(std::string_view s, std::size_t& i) {
  auto const byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned const b0 = byte(i);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int n = 0;
  char32_t c = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 1;
    c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 2;
    c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 3;
    c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    ++i;
    return invalid;
  }
  ++i;
  for (int k = 0; k < n; ++k) {
    if (i >= s.size()) return invalid;
    unsigned const b = byte(i);
    if (b < lo || b > hi) return invalid;
    lo = 0x80;
    hi = 0xBF;
    c = (c << 6) | (b & 0x3F);
    ++i;
  }
  return c;
}

/// `bytes` as text: each maximal ill-formed part becomes U+FFFD.
inline std::string lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    auto const c = next(bytes, i);
    append(out, c == invalid ? char32_t{0xFFFD} : c);
  }
  return out;
}

}  // namespace megamoe::data::utf8
