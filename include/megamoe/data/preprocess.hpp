// SPDX-License-Identifier: Apache-2.0
// megamoe/data/preprocess.hpp — text to Megatron's indexed datasets, as Megatron's
// tools/preprocess_data.py makes them: each document tokenized, an end-of-document id after its
// last token with --append-eod, one sequence per document, one `.bin/.idx` pair per JSON key named
// `{output_prefix}_{key}_document`, in the smallest dtype that holds the vocabulary. The same
// tokens give the same bytes as the Python tool.
//
// The input is JSON lines (a document per line, its text under each key; a list of strings is a
// document already cut into sentences, one sequence each), or plain text files whose documents
// are separated by lines holding only a separator (fortune files' "%"). Documents are tokenized by
// `workers` threads and written in their input order.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/error.hpp>
#include <megamoe/data/tokenizer.hpp>

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

namespace megamoe::data {

enum class text_format { jsonl, text };

struct preprocess_options {
  /// Files, or folders whose regular files are read in name order (fortune's *.dat and *.u8
  /// index files skipped).
  std::vector<std::filesystem::path> inputs;
  text_format format = text_format::jsonl;
  std::vector<std::string> json_keys{"text"};  // --json-keys (jsonl)
  std::string document_separator = "%";        // a line holding only this ends a document (text)
  std::filesystem::path output_prefix;         // --output-prefix
  bool append_eod = false;                     // --append-eod
  int workers = 1;                             // --workers
  std::int64_t log_interval = 0;               // documents between progress lines (0: none)
};

struct preprocess_report {
  std::vector<std::filesystem::path> prefixes;  // one per key
  std::int64_t documents = 0;                   // per key
  std::int64_t tokens = 0;                      // every key's together
  std::int64_t text_bytes = 0;                  // of the documents' text
  double seconds = 0;
};

/// The input's files in reading order; throws input_error for a path that does not exist or a
/// folder without files.
MEGAMOE_DECL std::vector<std::filesystem::path> input_files(
    std::vector<std::filesystem::path> const& inputs);

/// Tokenizes the inputs and writes the datasets. Throws input_error naming the file and line of
/// a line that is not a JSON object, a missing key, a value that is not text, and a token id
/// outside the vocabulary; a failed run leaves no `.bin` behind.
MEGAMOE_DECL preprocess_report preprocess(tokenizer const& t, preprocess_options const& options,
                                          std::ostream* log = nullptr);

}  // namespace megamoe::data

#if MEGAMOE_HEADER_ONLY
#include <megamoe/data/preprocess.ipp>
#endif
