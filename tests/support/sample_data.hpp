// SPDX-License-Identifier: Apache-2.0
// The shipped text sample (tests/data/corpus_sample.txt, fortunes ending at "%" lines) as a
// training job reads it: preprocessed with the byte tokenizer into a fresh folder, then split and
// sampled by Megatron's builder (train/token_data.hpp).
#pragma once

#include <megamoe/data/preprocess.hpp>
#include <megamoe/data/tokenizer.hpp>
#include <megamoe/train/token_data.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

namespace megamoe::testing {

inline std::filesystem::path corpus_sample() {
  return std::filesystem::path(MEGAMOE_TEST_DATA) / "corpus_sample.txt";
}

struct sample_data_options {
  std::int64_t train_samples = 4096, valid_samples = 256;
  std::uint32_t seed = 1234;
  std::string split = "95, 5, 0";
  bool append_eod = false;  // the tests' models hold the 256 byte values only
  bool eod_mask_loss = false;
};

/// The sample's samples of `seq` + 1 tokens. The folder is removed once the datasets are open
/// (they stay mapped).
inline train::token_data sample_data(int seq, sample_data_options const& o = {}) {
  std::string folder = (std::filesystem::temp_directory_path() / "megamoe_sample_XXXXXX").string();
  if (::mkdtemp(folder.data()) == nullptr) throw input_error("cannot make " + folder);
  data::preprocess_options p;
  p.inputs = {corpus_sample()};
  p.format = data::text_format::text;
  p.output_prefix = std::filesystem::path(folder) / "sample";
  p.append_eod = o.append_eod;
  auto const tokenizer = data::make_tokenizer({});
  auto const report = data::preprocess(tokenizer, p);
  train::data_options d;
  d.data_path = {report.prefixes.front().string()};
  d.split = o.split;
  d.eod_mask_loss = o.eod_mask_loss;
  train::token_data out(d, tokenizer, seq, o.seed, {o.train_samples, o.valid_samples, 0});
  std::filesystem::remove_all(folder);
  return out;
}

/// The sample's data for each sequence length a test asks for, built once.
class sample_corpus {
 public:
  explicit sample_corpus(sample_data_options o = {}) : options_(std::move(o)) {}
  train::token_data const& operator()(int seq) const {
    auto it = built_.find(seq);
    if (it == built_.end()) it = built_.emplace(seq, sample_data(seq, options_)).first;
    return it->second;
  }

 private:
  sample_data_options options_;
  mutable std::map<int, train::token_data> built_;
};

}  // namespace megamoe::testing
