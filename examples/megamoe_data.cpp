// SPDX-License-Identifier: Apache-2.0
// megamoe-data — Megatron's indexed datasets from the command line (one process).
//
//   megamoe-data preprocess --input F [--input F ...] --output-prefix P --tokenizer-type T ...
//       JSON lines (or --input-format text: documents separated by "%" lines) to
//       P_<key>_document.bin/.idx, as Megatron's tools/preprocess_data.py writes them
//   megamoe-data samples --data-path [W] PREFIX ... --seq-length S [--split 969,30,1] [--seed K]
//       [--num-samples T,V,Q] [--split-name train|valid|test] --count N
//       the first N samples of a split as megamoe-train draws them: seq_length + 1 ids, one JSON
//       array per line, nothing else on stdout
//   megamoe-data inspect --data-path PREFIX [--tokenizer-type T ...] [--documents N]
//       counts, dtype and the first documents' tokens (decoded when a tokenizer is named)
#include <megamoe/data/dataset_builder.hpp>
#include <megamoe/data/indexed_dataset.hpp>
#include <megamoe/data/preprocess.hpp>
#include <megamoe/data/tokenizer.hpp>
#include <megamoe/version.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace mdata = megamoe::data;

namespace {

CLI::Option* add_tokenizer_flags(CLI::App& app, mdata::tokenizer_options& t) {
  auto* type = app.add_option("--tokenizer-type", t.type,
                 "ByteTokenizer, NullTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer, "
                 "SentencePieceTokenizer (GPTSentencePieceTokenizer, Llama2Tokenizer)")
      ->capture_default_str();
  app.add_option("--vocab-file", t.vocab_file, "GPT-2's vocab.json / encoder.json");
  app.add_option("--merge-file", t.merge_file, "GPT-2's merges.txt / vocab.bpe");
  app.add_option("--tokenizer-model", t.model,
                 "a Hugging Face tokenizer.json (or its folder), or a SentencePiece model");
  app.add_option("--vocab-size", t.vocab_size, "NullTokenizer's vocabulary");
  app.add_option("--null-tokenizer-eod-id", t.null_eod,
                 "NullTokenizer's end of document (default: its last id)");
  return type;
}

// 0 when everything printed reached stdout (a full disk behind a redirection is an error).
int written() {
  std::cout.flush();
  if (std::cout) return 0;
  std::cerr << "megamoe-data: writing to standard output failed\n";
  return 2;
}

std::vector<std::string> comma_separated(std::string const& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (true) {
    auto const comma = text.find(',', at);
    out.push_back(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

std::int64_t count_of(std::string const& word, std::string const& flag) {
  std::size_t used = 0;
  std::int64_t value = 0;
  try {
    value = std::stoll(word, &used);
  } catch (std::exception const&) {
    used = 0;
  }
  if (used != word.size() || word.empty() || value < 0)
    throw megamoe::input_error(flag + ": '" + word + "' is not a count");
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Megatron's indexed datasets: preprocess text, list a split's samples, inspect."};
  app.set_version_flag("--version", megamoe::version_line("megamoe-data"));
  app.require_subcommand(1);

  // preprocess
  auto* pre = app.add_subcommand("preprocess", "text to .bin/.idx, as tools/preprocess_data.py");
  mdata::preprocess_options p;
  mdata::tokenizer_options pre_tokenizer;
  std::string format = "jsonl";
  pre->add_option("--input", p.inputs, "JSON lines files, or text files / folders")->required();
  pre->add_option("--input-format", format, "jsonl, or text (documents separated by lines)")
      ->check(CLI::IsMember({"jsonl", "text"}))
      ->capture_default_str();
  pre->add_option("--document-separator", p.document_separator,
                  "text input: the line that ends a document")
      ->capture_default_str();
  pre->add_option("--json-keys", p.json_keys, "the keys to tokenize, a dataset each")
      ->capture_default_str();
  pre->add_option("--output-prefix", p.output_prefix, "writes PREFIX_<key>_document.bin/.idx")
      ->required();
  pre->add_flag("--append-eod", p.append_eod, "an end-of-document id after each document");
  pre->add_option("--workers", p.workers, "tokenizing threads")->capture_default_str();
  pre->add_option("--log-interval", p.log_interval, "documents between progress lines")
      ->capture_default_str();
  add_tokenizer_flags(*pre, pre_tokenizer);

  // samples
  auto* samples = app.add_subcommand("samples", "a split's first samples as megamoe-train draws them");
  mdata::dataset_builder_options b;
  std::vector<std::string> data_path, per_split[3];
  std::string num_samples, split_name = "train";
  std::int64_t count = 0;
  std::optional<std::filesystem::path> cache;
  samples->add_option("--data-path", data_path, "prefixes, or weight prefix pairs");
  samples->add_option("--train-data-path", per_split[0], "the train split's own prefixes");
  samples->add_option("--valid-data-path", per_split[1], "the valid split's own prefixes");
  samples->add_option("--test-data-path", per_split[2], "the test split's own prefixes");
  samples->add_option("--split", b.split, "train,valid,test shares")->capture_default_str();
  samples->add_option("--seq-length", b.seq_length, "tokens per sample (plus one)")->required();
  samples->add_option("--seed", b.seed, "the shuffles' seed")->capture_default_str();
  samples->add_option("--num-samples", num_samples,
                      "T,V,Q: the samples asked of each split (default: one epoch each)");
  samples->add_option("--split-name", split_name, "train, valid or test")
      ->check(CLI::IsMember({"train", "valid", "test"}))
      ->capture_default_str();
  samples->add_option("--count", count, "samples to print")->required();
  samples->add_option("--data-cache-path", cache, "keep the indices here");
  samples->add_option("--mid-level-dataset-surplus", b.mid_level_surplus,
                      "a blend's extra share per dataset")
      ->capture_default_str();

  // inspect
  auto* inspect = app.add_subcommand("inspect", "counts, dtype and the first documents");
  std::string inspect_prefix;
  std::int64_t show_documents = 3;
  mdata::tokenizer_options inspect_tokenizer;
  inspect->add_option("--data-path", inspect_prefix, "the dataset's prefix")->required();
  inspect->add_option("--documents", show_documents, "documents to show")->capture_default_str();
  auto const* inspect_type = add_tokenizer_flags(*inspect, inspect_tokenizer);

  CLI11_PARSE(app, argc, argv);

  try {
    if (*pre) {
      p.format = format == "text" ? mdata::text_format::text : mdata::text_format::jsonl;
      auto const t = mdata::make_tokenizer(pre_tokenizer);
      auto const r = mdata::preprocess(t, p, &std::cerr);
      for (auto const& prefix : r.prefixes)
        std::cout << "wrote " << mdata::data_path(prefix).string() << " and "
                  << mdata::index_path(prefix).string() << "\n";
      nlohmann::ordered_json j{{"documents", r.documents},
                               {"tokens", r.tokens},
                               {"text_bytes", r.text_bytes},
                               {"seconds", r.seconds},
                               {"tokens_per_s", r.tokens / std::max(r.seconds, 1e-9)},
                               {"vocab_size", mdata::vocab_size(t)},
                               {"workers", p.workers}};
      std::cout << nlohmann::ordered_json{{"preprocess", j}}.dump() << "\n";
      return written();
    }
    if (*samples) {
      if (!data_path.empty()) b.data = mdata::parse_blend(data_path);
      for (std::size_t i = 0; i < 3; ++i)
        if (!per_split[i].empty()) b.per_split[i] = mdata::parse_blend(per_split[i]);
      if (b.data && std::any_of(std::begin(per_split), std::end(per_split),
                                [](auto const& v) { return !v.empty(); }))
        throw megamoe::input_error("--data-path and the per-split data paths exclude each other");
      b.cache = cache;
      mdata::split_sizes sizes;
      if (!num_samples.empty()) {
        auto const words = comma_separated(num_samples);
        if (words.size() != 3)
          throw megamoe::input_error("--num-samples: three counts T,V,Q, not '" + num_samples + "'");
        for (std::size_t i = 0; i < 3; ++i) sizes[i] = count_of(words[i], "--num-samples");
      }
      auto const splits = mdata::build_datasets(b, sizes);
      std::size_t const which = split_name == "train" ? 0 : split_name == "valid" ? 1 : 2;
      if (!splits[which])
        throw megamoe::input_error("the " + split_name + " split is not built (its share of --split "
                                   "is empty, it has no paths, or it is asked for no samples)");
      auto const& split = *splits[which];
      if (count < 0 || count > split.size())
        throw megamoe::input_error("--count " + std::to_string(count) + ": the " + split_name +
                                   " split holds " + std::to_string(split.size()) + " samples");
      for (std::int64_t i = 0; i < count; ++i)
        std::cout << nlohmann::json(split.sample(i).text).dump() << "\n";
      return written();
    }
    if (*inspect) {
      mdata::indexed_dataset const ds(inspect_prefix);
      std::cout << "dataset " << inspect_prefix << ": " << ds.sequence_count() << " sequences in "
                << ds.document_count() << " documents, " << ds.token_count() << " "
                << mdata::name_of(ds.dtype()) << " tokens\n";
      // Decoded only with a tokenizer named: the dataset does not say which made it.
      std::optional<mdata::tokenizer> t;
      if (inspect_type->count() > 0) t = mdata::make_tokenizer(inspect_tokenizer);
      auto const documents = ds.document_indices();
      for (std::int64_t d = 0; d < std::min(show_documents, ds.document_count()); ++d) {
        std::vector<std::int64_t> tokens;
        for (auto s = documents[static_cast<std::size_t>(d)];
             s < documents[static_cast<std::size_t>(d) + 1]; ++s) {
          auto const part = ds.get(s);
          tokens.insert(tokens.end(), part.begin(), part.end());
        }
        std::vector<std::int64_t> const head(
            tokens.begin(), tokens.begin() + std::min<std::ptrdiff_t>(
                                                 static_cast<std::ptrdiff_t>(tokens.size()), 64));
        std::cout << "document " << d << " (" << tokens.size()
                  << " tokens): " << nlohmann::json(head).dump() << "\n";
        if (t)
          std::cout << "  "
                    << nlohmann::json(mdata::decode(*t, head))
                           .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                    << "\n";
      }
      return written();
    }
  } catch (std::exception const& e) {
    std::cerr << "megamoe-data: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
