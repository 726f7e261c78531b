// SPDX-License-Identifier: Apache-2.0
// megamoe/data/preprocess.ipp — the definitions behind preprocess.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/data/indexed_dataset.hpp>
#include <megamoe/data/preprocess.hpp>
#include <megamoe/data/utf8.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <memory>
#include <ostream>
#include <thread>

namespace megamoe::data {

MEGAMOE_DECL std::vector<std::filesystem::path> input_files(
    std::vector<std::filesystem::path> const& inputs) {
  std::vector<std::filesystem::path> out;
  if (inputs.empty()) throw input_error("preprocess: no --input");
  for (auto const& input : inputs) {
    if (std::filesystem::is_directory(input)) {
      std::vector<std::filesystem::path> files;
      for (auto const& e : std::filesystem::directory_iterator(input)) {
        auto const ext = e.path().extension();
        if (e.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(e.path());
      }
      if (files.empty()) throw input_error("--input: the folder " + input.string() + " has no files");
      std::sort(files.begin(), files.end());
      out.insert(out.end(), files.begin(), files.end());
    } else if (std::filesystem::is_regular_file(input)) {
      out.push_back(input);
    } else {
      throw input_error("--input: no such file or folder " + input.string());
    }
  }
  return out;
}

namespace detail::preprocess {

// One document as read: each key's sentences, and where it came from (for errors); or what
// was wrong with it (a line that is not JSON, a missing key, a file that does not open).
struct document {
  std::vector<std::vector<std::string>> sentences;  // [key][sentence]
  std::string where;
  std::exception_ptr error;
};

// Each key's tokens and sequence lengths for one document.
struct encoded {
  std::vector<std::vector<std::int64_t>> tokens, lengths;
};

// Reads documents from the files in order, `batch` at a time.
class reader {
 public:
  reader(std::vector<std::filesystem::path> files, preprocess_options const& o)
      : files_(std::move(files)), o_(o) {}

  // Up to `count` more documents (none: the input is done). A fault ends the input with a
  // document that holds it, so that it is reported in input order with the tokenizer's.
  std::vector<document> next(std::size_t count) {
    std::vector<document> out;
    while (out.size() < count && !failed_) {
      try {
        if (!in_.is_open()) {
          if (file_ == files_.size()) break;
          in_.open(files_[file_], std::ios::binary);
          if (!in_) throw input_error("--input: cannot open " + files_[file_].string());
          line_ = 0;
        }
        std::optional<document> d =
            o_.format == text_format::jsonl ? next_json() : next_text();
        if (d) {
          out.push_back(std::move(*d));
        } else {
          in_.close();
          ++file_;
        }
      } catch (input_error const&) {
        out.push_back(document{{}, {}, std::current_exception()});
        failed_ = true;
      }
    }
    return out;
  }

 private:
  std::string where() const { return files_[file_].string() + ":" + std::to_string(line_); }

  std::optional<document> next_json() {
    std::string line;
    if (!std::getline(in_, line)) return std::nullopt;
    ++line_;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (nlohmann::json::exception const& e) {
      throw input_error("--input " + where() + ": not a JSON object (" + e.what() + ")");
    }
    if (!j.is_object()) throw input_error("--input " + where() + ": not a JSON object");
    document d{{}, where(), nullptr};
    for (auto const& key : o_.json_keys) {
      auto const it = j.find(key);
      if (it == j.end()) throw input_error("--input " + where() + ": no key '" + key + "'");
      std::vector<std::string> sentences;
      if (it->is_string()) {
        sentences.push_back(it->get<std::string>());
      } else if (it->is_array() &&
                 std::all_of(it->begin(), it->end(), [](auto const& s) { return s.is_string(); })) {
        for (auto const& s : *it) sentences.push_back(s.get<std::string>());
      } else {
        throw input_error("--input " + where() + ": the value of '" + key +
                          "' is not text or a list of texts");
      }
      d.sentences.push_back(std::move(sentences));
    }
    return d;
  }

  std::optional<document> next_text() {
    std::string text, line;
    bool any = false;
    while (std::getline(in_, line)) {
      ++line_;
      if (line == o_.document_separator) {
        if (any) break;
        continue;  // an empty document
      }
      for (std::size_t i = 0; i < line.size();)
        if (utf8::next(line, i) == utf8::invalid)
          throw input_error("--input " + where() + ": not UTF-8 text (byte " +
                            std::to_string(i) + " of the line)");
      text += line;
      if (!in_.eof()) text += '\n';
      any = true;
    }
    if (!any) return std::nullopt;
    return document{{{std::move(text)}}, where(), nullptr};
  }

  std::vector<std::filesystem::path> files_;
  preprocess_options const& o_;
  std::size_t file_ = 0;
  std::int64_t line_ = 0;
  std::ifstream in_;
  bool failed_ = false;
};

inline encoded encode_document(tokenizer const& t, document const& d, bool append_eod,
                               std::int64_t vocabulary) {
  if (d.error) std::rethrow_exception(d.error);
  encoded out;
  for (auto const& sentences : d.sentences) {
    std::vector<std::int64_t> tokens, lengths;
    for (auto const& s : sentences) {
      std::vector<std::int64_t> ids;
      try {
        ids = encode(t, s);
      } catch (input_error const& e) {
        throw input_error("--input " + d.where + ": " + e.what());
      }
      if (ids.empty()) continue;  // Megatron keeps no empty sentence
      for (auto const id : ids)
        if (id < 0 || id >= vocabulary)
          throw input_error("--input " + d.where + ": token id " + std::to_string(id) +
                            " is outside the tokenizer's vocabulary of " +
                            std::to_string(vocabulary));
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      lengths.push_back(static_cast<std::int64_t>(ids.size()));
    }
    if (append_eod && !tokens.empty()) {
      tokens.push_back(eod(t));
      ++lengths.back();
    }
    out.tokens.push_back(std::move(tokens));
    out.lengths.push_back(std::move(lengths));
  }
  return out;
}

}  // namespace detail::preprocess

MEGAMOE_DECL preprocess_report preprocess(tokenizer const& t, preprocess_options const& o,
                                          std::ostream* log) {
  auto const start = std::chrono::steady_clock::now();
  if (o.output_prefix.empty()) throw input_error("preprocess: no --output-prefix");
  if (o.json_keys.empty()) throw input_error("preprocess: no --json-keys");
  if (o.workers < 1) throw input_error("preprocess: --workers must be positive");
  if (o.format == text_format::text && o.json_keys.size() != 1)
    throw input_error("preprocess: text input has one text per document (one key)");
  auto const files = input_files(o.inputs);
  std::int64_t const vocabulary = vocab_size(t);
  if (o.append_eod) (void)eod(t);  // a tokenizer without one fails here, before any output
  auto const dtype = optimal_dtype(vocabulary);

  preprocess_report report;
  std::vector<std::unique_ptr<indexed_dataset_builder>> builders;
  for (auto const& key : o.json_keys) {
    auto const prefix =
        std::filesystem::path(o.output_prefix.string() + "_" + key + "_document");
    if (!prefix.parent_path().empty()) std::filesystem::create_directories(prefix.parent_path());
    report.prefixes.push_back(prefix);
    builders.push_back(std::make_unique<indexed_dataset_builder>(data_path(prefix), dtype));
  }
  detail::preprocess::reader in(files, o);
  auto const workers = static_cast<std::size_t>(o.workers);
  std::size_t const batch = 256 * workers;
  std::int64_t next_log = o.log_interval;
  while (true) {
    auto const documents = in.next(batch);
    if (documents.empty()) break;
    std::vector<detail::preprocess::encoded> encoded(documents.size());
    std::vector<std::exception_ptr> errors(documents.size());
    {
      std::vector<std::jthread> threads;
      for (std::size_t w = 0; w < workers; ++w)
        threads.emplace_back([&, w] {
          // A worker stops at its first failing document; every document before the first
          // failure in input order is still encoded by its own worker.
          for (std::size_t d = w; d < documents.size(); d += workers) {
            try {
              encoded[d] = detail::preprocess::encode_document(t, documents[d], o.append_eod,
                                                               vocabulary);
            } catch (...) {
              errors[d] = std::current_exception();
              break;
            }
          }
        });
    }
    // The first error in input order is the one reported.
    for (auto const& error : errors)
      if (error) std::rethrow_exception(error);
    for (std::size_t d = 0; d < documents.size(); ++d) {
      for (std::size_t k = 0; k < builders.size(); ++k) {
        builders[k]->add_document(encoded[d].tokens[k], encoded[d].lengths[k]);
        report.tokens += static_cast<std::int64_t>(encoded[d].tokens[k].size());
        for (auto const& s : documents[d].sentences[k])
          report.text_bytes += static_cast<std::int64_t>(s.size());
      }
      ++report.documents;
    }
    if (log && o.log_interval > 0 && report.documents >= next_log) {
      double const s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      *log << "preprocess: " << report.documents << " documents, " << report.tokens
           << " tokens, " << static_cast<std::int64_t>(report.tokens / std::max(s, 1e-9))
           << " tokens/s\n";
      while (next_log <= report.documents) next_log += o.log_interval;
    }
  }
  for (std::size_t k = 0; k < builders.size(); ++k)
    builders[k]->finalize(index_path(report.prefixes[k]));
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace megamoe::data
