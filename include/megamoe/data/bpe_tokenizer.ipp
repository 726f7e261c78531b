// SPDX-License-Identifier: Apache-2.0
// megamoe/data/bpe_tokenizer.ipp — the definitions behind bpe_tokenizer.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp). Needs ICU's common and i18n libraries.
#pragma once

#include <megamoe/data/bpe_tokenizer.hpp>
#include <megamoe/data/utf8.hpp>

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include <algorithm>
#include <array>
#include <climits>
#include <fstream>
#include <iterator>
#include <unordered_map>
#include <utility>

namespace megamoe::data {

namespace detail::bpe {

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 for 256, 257, ...
inline std::array<char32_t, 256> byte_characters() {
  std::array<char32_t, 256> out{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    out[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return out;
}

inline constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// `\s` and `\S` as Unicode's White_Space, as the `regex` module and Oniguruma read them (ICU's
// `\s` leaves out U+000B, U+0085 and U+001C-U+001F).
inline std::string with_white_space(std::string_view pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      char const next = pattern[i + 1];
      if (next == 's' || next == 'S') {
        out += next == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
      } else {
        out += pattern.substr(i, 2);
      }
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

enum class split_behavior { isolated, removed };

// A pre-tokenizer step: split each piece by a pattern, or put a space before each piece that
// does not start with one (ByteLevel's add_prefix_space).
struct pre_step {
  std::unique_ptr<icu::RegexPattern> pattern;  // null: the prefix-space step
  split_behavior behavior = split_behavior::isolated;
};

inline std::unique_ptr<icu::RegexPattern> compile(std::string_view pattern, bool literal,
                                                  std::string const& where) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse{};
  std::string const text = literal ? std::string(pattern) : with_white_space(pattern);
  std::unique_ptr<icu::RegexPattern> out(icu::RegexPattern::compile(
      icu::UnicodeString::fromUTF8(text), literal ? UREGEX_LITERAL : 0, parse, status));
  if (U_FAILURE(status))
    throw input_error(where + ": the pattern '" + std::string(pattern) + "' does not compile (" +
                      u_errorName(status) + ", at offset " + std::to_string(parse.offset) + ")");
  return out;
}

// [begin, end) byte ranges of `pattern`'s matches in UTF-8 `text`.
inline void each_match(icu::RegexPattern const& pattern, std::string_view text, auto&& f) {
  UErrorCode status = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
  std::unique_ptr<icu::RegexMatcher> matcher(pattern.matcher(status));
  if (U_FAILURE(status)) {
    utext_close(ut);
    throw std::runtime_error(std::string("megamoe: ICU regex matcher: ") + u_errorName(status));
  }
  matcher->reset(ut);
  while (matcher->find(status) && U_SUCCESS(status)) {
    auto const begin = matcher->start64(status), end = matcher->end64(status);
    if (end > begin) f(static_cast<std::size_t>(begin), static_cast<std::size_t>(end));
  }
  matcher.reset();
  utext_close(ut);
  // A match that fails (ICU's stack or time limits) would otherwise end the pieces silently.
  if (U_FAILURE(status))
    throw input_error(std::string("tokenizer: the pre-tokenizer's pattern failed on a text (") +
                      u_errorName(status) + ")");
}

inline nlohmann::json read_json_file(std::filesystem::path const& path, std::string const& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error(what + ": cannot open " + path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (nlohmann::json::exception const& e) {
    throw input_error(what + ": " + path.string() + " is not JSON (" + e.what() + ")");
  }
}

}  // namespace detail::bpe

struct bpe_tokenizer::model {
  struct added_token {
    std::string content;
    std::int64_t id = 0;
    bool lstrip = false, rstrip = false;
  };

  std::unordered_map<std::string, std::int64_t> vocab;  // token (mapped characters) -> id
  std::vector<std::string> tokens;                      // id -> token ("" where no id)
  std::array<std::int64_t, 256> byte_ids{};             // each byte's one-character token
  std::array<char32_t, 256> byte_characters = detail::bpe::byte_characters();
  std::unordered_map<char32_t, unsigned char> character_bytes;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int64_t>> merges;
  std::vector<added_token> added;  // longest first
  std::vector<detail::bpe::pre_step> steps;
  icu::Normalizer2 const* normalizer = nullptr;  // owned by ICU
  bool ignore_merges = false;
  std::vector<std::int64_t> prefix_ids, suffix_ids;  // the post-processor's
  std::optional<std::int64_t> eod;
  std::int64_t pad = -1;
  std::int64_t size = 0;

  void set_vocabulary(nlohmann::json const& v, std::string const& where) {
    if (!v.is_object()) throw input_error(where + ": the vocabulary is not a JSON object");
    for (auto const& [token, id] : v.items()) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
          id.get<std::int64_t>() > INT32_MAX)
        throw input_error(where + ": the id of token '" + token + "' is not a non-negative "
                          "32-bit integer");
      auto const i = id.get<std::int64_t>();
      vocab[token] = i;
      if (static_cast<std::size_t>(i) >= tokens.size()) tokens.resize(static_cast<std::size_t>(i) + 1);
      tokens[static_cast<std::size_t>(i)] = token;
    }
    for (int b = 0; b < 256; ++b) {
      std::string c;
      utf8::append(c, byte_characters[static_cast<std::size_t>(b)]);
      auto const it = vocab.find(c);
      byte_ids[static_cast<std::size_t>(b)] = it == vocab.end() ? -1 : it->second;
      character_bytes[byte_characters[static_cast<std::size_t>(b)]] = static_cast<unsigned char>(b);
    }
  }

  void add_merge(std::string_view left, std::string_view right, std::string const& where,
                 std::size_t line) {
    auto const id = [&](std::string const& token) {
      auto const it = vocab.find(token);
      if (it == vocab.end())
        throw input_error(where + ": merge " + std::to_string(line) + " ('" + std::string(left) +
                          "' '" + std::string(right) + "') names '" + token +
                          "', which is not in the vocabulary");
      return it->second;
    };
    auto const a = id(std::string(left)), b = id(std::string(right));
    auto const merged = id(std::string(left) + std::string(right));
    auto const rank = static_cast<std::int32_t>(merges.size());
    merges.insert_or_assign((static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint64_t>(b),
                            std::pair{rank, merged});
  }

  void add_token(std::string content, std::int64_t id, bool lstrip, bool rstrip) {
    if (static_cast<std::size_t>(id) >= tokens.size()) tokens.resize(static_cast<std::size_t>(id) + 1);
    tokens[static_cast<std::size_t>(id)] = content;
    added.push_back({std::move(content), id, lstrip, rstrip});
  }

  // An added token's id, else the vocabulary's.
  [[nodiscard]] std::optional<std::int64_t> id_of(std::string_view token) const {
    for (auto const& a : added)
      if (a.content == token) return a.id;
    if (auto const it = vocab.find(std::string(token)); it != vocab.end()) return it->second;
    return std::nullopt;
  }

  void finish() {
    std::stable_sort(added.begin(), added.end(), [](auto const& a, auto const& b) {
      return a.content.size() > b.content.size();
    });
    // Megatron's len(tokenizer): the vocabulary and the added tokens not in it. An id past
    // that count (a gap in the ids) still needs a row, so the larger of the two.
    std::int64_t count = static_cast<std::int64_t>(vocab.size());
    for (auto const& a : added)
      if (!vocab.contains(a.content)) ++count;
    size = std::max(count, static_cast<std::int64_t>(tokens.size()));
  }

  // The byte-level BPE of one piece, appended to `out`.
  void encode_piece(std::string_view piece, std::vector<std::int64_t>& out) const {
    if (ignore_merges) {
      std::string mapped;
      for (char const c : piece)
        utf8::append(mapped, byte_characters[static_cast<unsigned char>(c)]);
      if (auto const it = vocab.find(mapped); it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<std::int64_t> symbols;
    symbols.reserve(piece.size());
    for (char const c : piece)
      if (auto const id = byte_ids[static_cast<unsigned char>(c)]; id >= 0) symbols.push_back(id);
    std::vector<std::int64_t> next;
    while (symbols.size() > 1) {
      std::int32_t best = INT32_MAX;
      std::int64_t merged = -1;
      std::uint64_t best_pair = 0;
      for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto const pair = (static_cast<std::uint64_t>(symbols[i]) << 32) |
                          static_cast<std::uint64_t>(symbols[i + 1]);
        if (auto const it = merges.find(pair); it != merges.end() && it->second.first < best) {
          best = it->second.first;
          merged = it->second.second;
          best_pair = pair;
        }
      }
      if (merged < 0) break;
      next.clear();
      for (std::size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() &&
            ((static_cast<std::uint64_t>(symbols[i]) << 32) |
             static_cast<std::uint64_t>(symbols[i + 1])) == best_pair) {
          next.push_back(merged);
          ++i;
        } else {
          next.push_back(symbols[i]);
        }
      }
      symbols.swap(next);
    }
    out.insert(out.end(), symbols.begin(), symbols.end());
  }

  // Normalise a part of the text between added tokens, cut it into pieces and encode them.
  void encode_part(std::string_view part, std::vector<std::int64_t>& out) const {
    if (part.empty()) return;
    std::string normalized;
    if (normalizer) {
      UErrorCode status = U_ZERO_ERROR;
      auto const n = normalizer->normalize(
          icu::UnicodeString::fromUTF8(icu::StringPiece(part.data(), static_cast<int32_t>(part.size()))),
          status);
      if (U_FAILURE(status))
        throw input_error(std::string("tokenizer: the normalizer failed on a text (") +
                          u_errorName(status) + ")");
      n.toUTF8String(normalized);
    } else {
      normalized = part;
    }
    std::vector<std::string> pieces{std::move(normalized)};
    std::vector<std::string> cut;
    for (auto const& step : steps) {
      cut.clear();
      for (auto& piece : pieces) {
        if (!step.pattern) {
          if (piece.empty() || piece.front() != ' ') piece.insert(piece.begin(), ' ');
          cut.push_back(std::move(piece));
          continue;
        }
        std::size_t at = 0;
        detail::bpe::each_match(*step.pattern, piece, [&](std::size_t begin, std::size_t end) {
          if (begin > at) cut.push_back(piece.substr(at, begin - at));
          if (step.behavior == detail::bpe::split_behavior::isolated)
            cut.push_back(piece.substr(begin, end - begin));
          at = end;
        });
        if (at < piece.size()) cut.push_back(piece.substr(at));
      }
      pieces.swap(cut);
    }
    for (auto const& piece : pieces) encode_piece(piece, out);
  }

  [[nodiscard]] static bool white_space_before(std::string_view text, std::size_t end,
                                               std::size_t& begin) {
    // One code point of white space ending at `end` (ASCII, or a multi-byte one).
    std::size_t start = end;
    do {
      --start;
    } while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80);
    std::size_t i = start;
    auto const c = utf8::next(text, i);
    if (c == utf8::invalid || i != end || !u_isUWhiteSpace(static_cast<UChar32>(c)))
      return false;
    begin = start;
    return true;
  }

  std::vector<std::int64_t> encode(std::string_view text) const {
    std::vector<std::int64_t> out(prefix_ids);
    std::size_t part = 0;  // start of the text not yet encoded
    std::size_t i = 0;
    while (i < text.size()) {
      model::added_token const* hit = nullptr;
      for (auto const& a : added)
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;  // longest first
          break;
        }
      if (!hit) {
        ++i;
        continue;
      }
      std::size_t begin = i, end = i + hit->content.size();
      if (hit->lstrip)
        while (begin > part && white_space_before(text, begin, begin)) {
        }
      if (hit->rstrip) {
        while (end < text.size()) {
          std::size_t k = end;
          auto const c = utf8::next(text, k);
          if (c == utf8::invalid || !u_isUWhiteSpace(static_cast<UChar32>(c))) break;
          end = k;
        }
      }
      encode_part(text.substr(part, begin - part), out);
      out.push_back(hit->id);
      part = i = end;
    }
    encode_part(text.substr(part), out);
    out.insert(out.end(), suffix_ids.begin(), suffix_ids.end());
    return out;
  }

  std::string decode(std::span<std::int64_t const> ids) const {
    std::string bytes;
    for (auto const id : ids) {
      if (id < 0 || static_cast<std::size_t>(id) >= tokens.size() ||
          tokens[static_cast<std::size_t>(id)].empty())
        throw input_error("tokenizer: id " + std::to_string(id) + " is not in the vocabulary of " +
                          std::to_string(size));
      auto const& token = tokens[static_cast<std::size_t>(id)];
      for (std::size_t k = 0; k < token.size();) {
        std::size_t const start = k;
        auto const c = utf8::next(token, k);
        auto const it = c == utf8::invalid ? character_bytes.end() : character_bytes.find(c);
        if (it != character_bytes.end())
          bytes += static_cast<char>(it->second);
        else
          bytes.append(token, start, k - start);
      }
    }
    return utf8::lossy(bytes);
  }
};

MEGAMOE_DECL bpe_tokenizer bpe_tokenizer::from_gpt2_files(std::filesystem::path const& vocab,
                                                          std::filesystem::path const& merges) {
  auto m = std::make_shared<model>();
  std::string const where = "GPT-2 tokenizer: " + vocab.string();
  m->set_vocabulary(detail::bpe::read_json_file(vocab, "GPT-2 tokenizer"), where);
  std::ifstream in(merges, std::ios::binary);
  if (!in) throw input_error("GPT-2 tokenizer: cannot open " + merges.string());
  std::string line;
  std::size_t number = 0;
  std::string const merges_where = "GPT-2 tokenizer: " + merges.string();
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.starts_with("#version")) continue;
    auto const space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw input_error(merges_where + ": line " + std::to_string(number) +
                        " is not a pair of tokens separated by one space");
    m->add_merge(std::string_view(line).substr(0, space), std::string_view(line).substr(space + 1),
                 merges_where, number);
  }
  if (m->merges.empty()) throw input_error(merges_where + ": no merges");
  auto const eod = m->vocab.find("<|endoftext|>");
  if (eod == m->vocab.end())
    throw input_error(where + ": has no <|endoftext|> token (GPT-2's end of document)");
  m->eod = eod->second;
  m->add_token("<|endoftext|>", eod->second, false, false);
  m->steps.push_back({detail::bpe::compile(detail::bpe::gpt2_pattern, false, where),
                      detail::bpe::split_behavior::isolated});
  m->finish();
  return bpe_tokenizer(std::move(m));
}

namespace detail::bpe {

inline void add_pre_tokenizer(bpe_tokenizer::model& m, nlohmann::json const& p,
                              std::string const& where, bool& byte_level) {
  if (p.is_null()) return;
  auto const type = p.value("type", std::string());
  auto const unsupported = [&](std::string const& what) {
    return input_error(where + ": pre-tokenizer " + type + " " + what +
                       " is not implemented (ByteLevel, Split, Digits and Sequence are)");
  };
  if (byte_level && type != "Sequence")
    throw input_error(where + ": a pre-tokenizer after ByteLevel is not implemented");
  if (type == "Sequence") {
    for (auto const& q : p.at("pretokenizers")) add_pre_tokenizer(m, q, where, byte_level);
  } else if (type == "ByteLevel") {
    byte_level = true;
    if (p.value("add_prefix_space", false)) m.steps.push_back({nullptr, split_behavior::isolated});
    if (p.value("use_regex", true))
      m.steps.push_back({compile(gpt2_pattern, false, where), split_behavior::isolated});
  } else if (type == "Split") {
    if (p.value("invert", false)) throw unsupported("with invert");
    auto const behavior = p.value("behavior", std::string("Isolated"));
    split_behavior b = split_behavior::isolated;
    if (behavior == "Removed")
      b = split_behavior::removed;
    else if (behavior != "Isolated")
      throw unsupported("with behavior " + behavior);
    auto const& pattern = p.at("pattern");
    if (pattern.contains("Regex"))
      m.steps.push_back({compile(pattern["Regex"].get<std::string>(), false, where), b});
    else
      m.steps.push_back({compile(pattern.at("String").get<std::string>(), true, where), b});
  } else if (type == "Digits") {
    m.steps.push_back({compile(p.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)",
                               false, where),
                       split_behavior::isolated});
  } else {
    throw unsupported("");
  }
}

inline icu::Normalizer2 const* normalizer_of(nlohmann::json const& n, std::string const& where) {
  if (n.is_null()) return nullptr;
  auto const type = n.value("type", std::string());
  if (type == "Sequence") {
    icu::Normalizer2 const* out = nullptr;
    for (auto const& q : n.at("normalizers")) {
      if (out) throw input_error(where + ": more than one normalizer in a sequence is not implemented");
      out = normalizer_of(q, where);
    }
    return out;
  }
  UErrorCode status = U_ZERO_ERROR;
  icu::Normalizer2 const* out = nullptr;
  if (type == "NFC") out = icu::Normalizer2::getNFCInstance(status);
  else if (type == "NFD") out = icu::Normalizer2::getNFDInstance(status);
  else if (type == "NFKC") out = icu::Normalizer2::getNFKCInstance(status);
  else if (type == "NFKD") out = icu::Normalizer2::getNFKDInstance(status);
  else
    throw input_error(where + ": normalizer " + type +
                      " is not implemented (NFC, NFD, NFKC and NFKD are)");
  if (U_FAILURE(status)) throw std::runtime_error("megamoe: ICU normalizer unavailable");
  return out;
}

inline void add_post_processor(bpe_tokenizer::model& m, nlohmann::json const& p,
                               std::string const& where) {
  if (p.is_null()) return;
  auto const type = p.value("type", std::string());
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (auto const& q : p.at("processors")) add_post_processor(m, q, where);
    return;
  }
  if (type != "TemplateProcessing")
    throw input_error(where + ": post-processor " + type +
                      " is not implemented (TemplateProcessing, ByteLevel and Sequence are)");
  bool after = false;
  for (auto const& item : p.at("single")) {
    if (item.contains("Sequence")) {
      after = true;
      continue;
    }
    auto const name = item.at("SpecialToken").at("id").get<std::string>();
    auto const& special = p.at("special_tokens").at(name);
    for (auto const& id : special.at("ids"))
      (after ? m.suffix_ids : m.prefix_ids).push_back(id.get<std::int64_t>());
  }
}

inline std::optional<std::string> token_text(nlohmann::json const& t) {
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content")) return t["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace detail::bpe

MEGAMOE_DECL bpe_tokenizer bpe_tokenizer::from_huggingface(std::filesystem::path const& path) {
  auto const file = std::filesystem::is_directory(path) ? path / "tokenizer.json" : path;
  std::string const where = "Hugging Face tokenizer: " + file.string();
  auto const j = detail::bpe::read_json_file(file, "Hugging Face tokenizer");
  auto m = std::make_shared<model>();
  try {
    auto const& mj = j.at("model");
    if (mj.value("type", std::string("BPE")) != "BPE")
      throw input_error(where + ": the model is " + mj.value("type", std::string()) +
                        ", not BPE");
    for (char const* option : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (mj.contains(option) && !mj[option].is_null() && mj[option] != "")
        throw input_error(where + ": BPE with " + option + " is not implemented");
    if (mj.value("byte_fallback", false))
      throw input_error(where + ": BPE with byte_fallback is not a byte-level BPE");
    m->ignore_merges = mj.value("ignore_merges", false);
    m->set_vocabulary(mj.at("vocab"), where);
    std::size_t number = 0;
    for (auto const& merge : mj.at("merges")) {
      ++number;
      if (merge.is_string()) {
        auto const text = merge.get<std::string>();
        auto const space = text.find(' ');
        if (space == std::string::npos)
          throw input_error(where + ": merge " + std::to_string(number) + " is not a pair");
        m->add_merge(std::string_view(text).substr(0, space),
                     std::string_view(text).substr(space + 1), where, number);
      } else {
        m->add_merge(merge.at(0).get<std::string>(), merge.at(1).get<std::string>(), where,
                     number);
      }
    }
    for (auto const& a : j.value("added_tokens", nlohmann::json::array())) {
      if (a.value("single_word", false))
        throw input_error(where + ": added tokens with single_word are not implemented");
      m->add_token(a.at("content").get<std::string>(), a.at("id").get<std::int64_t>(),
                   a.value("lstrip", false), a.value("rstrip", false));
    }
    m->normalizer = detail::bpe::normalizer_of(j.value("normalizer", nlohmann::json()), where);
    bool byte_level = false;
    detail::bpe::add_pre_tokenizer(*m, j.value("pre_tokenizer", nlohmann::json()), where,
                                   byte_level);
    if (!byte_level)
      throw input_error(where + ": has no ByteLevel pre-tokenizer, so its BPE is not byte-level");
    detail::bpe::add_post_processor(*m, j.value("post_processor", nlohmann::json()), where);
  } catch (nlohmann::json::exception const& e) {
    throw input_error(where + ": " + e.what());
  }
  m->finish();
  // The end of a document: the eos_token of tokenizer_config.json, else a usual name.
  auto const config = file.parent_path() / "tokenizer_config.json";
  auto const id_of = [&](std::string const& token) { return m->id_of(token); };
  if (std::filesystem::exists(config)) {
    auto const c = detail::bpe::read_json_file(config, "Hugging Face tokenizer");
    if (auto const eos = detail::bpe::token_text(c.value("eos_token", nlohmann::json())))
      m->eod = id_of(*eos);
    if (auto const pad = detail::bpe::token_text(c.value("pad_token", nlohmann::json())))
      m->pad = id_of(*pad).value_or(-1);
  }
  for (char const* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
    if (!m->eod) m->eod = id_of(name);
  return bpe_tokenizer(std::move(m));
}

MEGAMOE_DECL std::vector<std::int64_t> bpe_tokenizer::encode(std::string_view text) const {
  return model_->encode(text);
}
MEGAMOE_DECL std::string bpe_tokenizer::decode(std::span<std::int64_t const> ids) const {
  return model_->decode(ids);
}
MEGAMOE_DECL std::int64_t bpe_tokenizer::vocab_size() const noexcept { return model_->size; }
MEGAMOE_DECL std::int64_t bpe_tokenizer::eod() const {
  if (!model_->eod)
    throw input_error("tokenizer: names no end-of-document token (no eos_token, <|endoftext|>, "
                      "<|end_of_text|>, </s> or <eos>)");
  return *model_->eod;
}
MEGAMOE_DECL std::int64_t bpe_tokenizer::pad() const noexcept { return model_->pad; }
MEGAMOE_DECL std::optional<std::int64_t> bpe_tokenizer::id_of(std::string_view token) const {
  return model_->id_of(token);
}

}  // namespace megamoe::data
