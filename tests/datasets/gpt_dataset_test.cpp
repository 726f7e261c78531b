// SPDX-License-Identifier: Apache-2.0
// Megatron-Core's GPT sample order against what its own code produced (tests/data/megatron_data):
// numpy's RandomState draws and shuffles, split strings to sequence ranges, a GPTDataset's three
// indices, samples and items for each split, numpy's summation, and the blending indices.
#include <megamoe/data/blended_dataset.hpp>
#include <megamoe/data/gpt_dataset.hpp>
#include <megamoe/data/indexed_dataset.hpp>
#include <megamoe/data/numpy_random.hpp>

#include "support/megatron_data.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace {

namespace mdata = megamoe::data;
using megamoe::test::expect_summary;
using megamoe::test::megatron_data;
using megamoe::test::read_json;

std::vector<std::int64_t> arange(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::vector<std::int64_t> as_ints(nlohmann::json const& j) {
  return j.get<std::vector<std::int64_t>>();
}

double from_hex(nlohmann::json const& j) { return std::strtod(j.get<std::string>().c_str(), nullptr); }

TEST(NumpyRandomState, DrawsAndShufflesAsNumpy) {
  auto const v = read_json(megatron_data() / "numpy_random_state.json");
  for (auto const& c : v["seeds"]) {
    auto const seed = c["seed"].get<std::uint32_t>();
    SCOPED_TRACE("seed " + std::to_string(seed));
    {
      mdata::numpy_random_state r(seed);
      for (auto const& x : c["first_uint32"]) EXPECT_EQ(r.next32(), x.get<std::uint32_t>());
    }
    {
      mdata::numpy_random_state r(seed);
      for (auto const& x : c["first_uint64"])
        EXPECT_EQ(r.next64(), std::stoull(x.get<std::string>()));
    }
    {
      mdata::numpy_random_state r(seed);
      for (int i = 0; i < 624; ++i) (void)r.next32();
      for (auto const& x : c["uint32_at_624_to_628"]) EXPECT_EQ(r.next32(), x.get<std::uint32_t>());
    }
    for (auto const& [n, expected] : c["shuffle_arange_int32"].items()) {
      mdata::numpy_random_state r(seed);
      auto a = arange(std::stoll(n));
      r.shuffle(std::span(a));
      EXPECT_EQ(a, as_ints(expected)) << "arange(" << n << ")";
    }
    {
      mdata::numpy_random_state r(seed);
      auto a = arange(5000);
      r.shuffle(std::span(a));
      expect_summary(a, c["shuffle_arange_uint32_5000"], "arange(5000)");
    }
    {
      mdata::numpy_random_state r(seed);
      auto a = arange(7), b = arange(9);
      r.shuffle(std::span(a));
      r.shuffle(std::span(b));
      EXPECT_EQ(a, as_ints(c["two_shuffles_same_state"]["arange7_int32"]));
      EXPECT_EQ(b, as_ints(c["two_shuffles_same_state"]["then_arange9_uint32"]));
    }
  }
  // Bounds above 2^32 - 1 draw 64 bits at a time.
  mdata::numpy_random_state wide(5), narrow(5);
  std::uint64_t const max = (std::uint64_t{1} << 40) + 3;
  auto const drawn = wide.random_interval(max);
  EXPECT_LE(drawn, max);
  std::uint64_t expected = 0;
  do {
    expected = narrow.next64() & ((std::uint64_t{1} << 41) - 1);
  } while (expected > max);
  EXPECT_EQ(drawn, expected);
}

TEST(GptSplit, SplitStringsGiveMegatronsRanges) {
  auto const v = read_json(megatron_data() / "split_ranges.json");
  for (auto const& c : v["cases"]) {
    auto const split = c["split"].get<std::string>();
    SCOPED_TRACE("split " + split);
    auto const bookends = mdata::parse_split(split);
    for (std::size_t k = 0; k < 3; ++k) {
      auto const& m = c["split_matrix_hex"][k];
      ASSERT_EQ(bookends[k].has_value(), !m.is_null()) << "part " << k;
      if (m.is_null()) continue;
      EXPECT_EQ(bookends[k]->first, from_hex(m[0])) << "part " << k;
      EXPECT_EQ(bookends[k]->second, from_hex(m[1])) << "part " << k;
    }
    for (auto const& [n, ranges] : c["ranges"].items()) {
      for (std::size_t k = 0; k < 3; ++k) {
        auto const& r = ranges[k];
        if (r.is_null()) continue;
        auto const [begin, end] = mdata::split_range(*bookends[k], std::stoll(n));
        if (r.is_string()) {
          EXPECT_EQ(begin, end) << "N " << n << " part " << k;
        } else {
          EXPECT_EQ(begin, r[0].get<std::int64_t>()) << "N " << n << " part " << k;
          EXPECT_EQ(end, r[1].get<std::int64_t>()) << "N " << n << " part " << k;
        }
      }
    }
  }
  for (std::string const bad : {"1,2,3,4", "0,0,0", "", "1.2.3,4"})
    EXPECT_THROW((void)mdata::parse_split(bad), megamoe::input_error) << bad;
}

TEST(GptDataset, EverySplitsIndicesSamplesAndItemsAreMegatrons) {
  auto const v = read_json(megatron_data() / "gpt_bytes_doc_u16_s32_seed1234_split969.json");
  auto const& config = v["config"];
  mdata::indexed_dataset const ds(megatron_data() / config["blend_prefixes"][0].get<std::string>());
  auto const lengths = ds.sequence_lengths();
  auto const bookends = mdata::parse_split(config["split"].get<std::string>());
  std::vector<std::string> const names{"train", "valid", "test"};
  for (std::size_t k = 0; k < 3; ++k) {
    auto const& expected = v["splits"][names[k]];
    SCOPED_TRACE(names[k]);
    ASSERT_EQ(bookends[k].has_value(), !expected.is_null());
    if (expected.is_null()) continue;
    auto const [begin, end] = mdata::split_range(*bookends[k], ds.sequence_count());
    EXPECT_EQ(begin, expected["indexed_indices"]["begin"].get<std::int64_t>());
    EXPECT_EQ(end, expected["indexed_indices"]["end"].get<std::int64_t>());
    mdata::gpt_dataset_options o;
    o.seq_length = config["sequence_length"].get<std::int64_t>();
    o.add_extra_token = config["add_extra_token_to_sequence"].get<bool>();
    o.num_samples = expected["num_samples_requested"].get<std::int64_t>();
    o.drop_last = expected["drop_last_partial_sequence"].get<bool>();
    o.seed = config["random_seed"].get<std::uint32_t>();
    auto const idx = mdata::build_gpt_indices(lengths, begin, end, o);
    EXPECT_EQ(idx.tokens_per_epoch, expected["num_tokens_per_epoch"].get<std::int64_t>());
    EXPECT_EQ(idx.epochs, expected["num_epochs"].get<std::int64_t>());
    EXPECT_EQ(idx.separate_final_epoch, expected["separate_final_epoch"].get<bool>());
    EXPECT_EQ(idx.size(), expected["len"].get<std::int64_t>());
    expect_summary(idx.document_index.values(), expected["document_index"], "document_index");
    expect_summary(idx.sample_index.values(), expected["sample_index"], "sample_index", 2);
    expect_summary(idx.shuffle_index.values(), expected["shuffle_index"], "shuffle_index");

    auto const& tokenizer = config["tokenizer"];
    mdata::gpt_item_options item;
    item.eod = tokenizer["eod"].get<std::int64_t>();
    item.pad = tokenizer["pad"].get<std::int64_t>();
    item.reset_position_ids = config["reset_position_ids"].get<bool>();
    item.reset_attention_mask = config["reset_attention_mask"].get<bool>();
    item.eod_mask_loss = config["eod_mask_loss"].get<bool>();
    auto const check_sample = [&](nlohmann::json const& s) {
      auto const i = s["index"].get<std::int64_t>();
      auto const got = mdata::query_sample(ds, idx, o, i, item.pad);
      EXPECT_EQ(got.text, as_ints(s["text"])) << "sample " << i;
      EXPECT_EQ(got.document_ids, as_ints(s["document_ids"])) << "sample " << i;
    };
    auto const check_item = [&](nlohmann::json const& g) {
      auto const i = g["index"].get<std::int64_t>();
      auto const text = mdata::query_sample(ds, idx, o, i, item.pad).text;
      auto const got = mdata::make_item(text, item);
      EXPECT_EQ(got.tokens, as_ints(g["tokens"])) << "item " << i;
      EXPECT_EQ(got.labels, as_ints(g["labels"])) << "item " << i;
      EXPECT_EQ(got.position_ids, as_ints(g["position_ids"])) << "item " << i;
      EXPECT_EQ(got.attention_row_start, as_ints(g["attention_mask_row_start"])) << "item " << i;
      std::vector<float> mask;
      for (auto const& m : g["loss_mask"]) mask.push_back(m.get<float>());
      EXPECT_EQ(got.loss_mask, mask) << "item " << i;
    };
    for (auto const& s : expected["samples"]) check_sample(s);
    for (auto const& g : expected["getitem"]) check_item(g);
    check_sample(expected["last_sample"]);
    check_item(expected["last_sample"]["getitem"]);
  }
}

TEST(GptDataset, MasksFollowTheResetFlagsAndPadsEndTheLastPartialSample) {
  // Tokens 5 6 EOD 7 EOD 8 (EOD 9), labels shifted by one; pad -1 marks nothing here.
  std::vector<std::int64_t> const text{5, 6, 9, 7, 9, 8, -1};
  mdata::gpt_item_options o;
  o.eod = 9;
  auto plain = mdata::make_item(text, o);
  EXPECT_EQ(plain.position_ids, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(plain.attention_row_start, (std::vector<std::int64_t>(6, 0)));
  EXPECT_EQ(plain.loss_mask, (std::vector<float>{1, 1, 1, 1, 1, 0}));  // the label is pad
  EXPECT_EQ(plain.labels.back(), 0);                                      // pads become 0
  o.reset_position_ids = o.reset_attention_mask = o.eod_mask_loss = true;
  auto reset = mdata::make_item(text, o);
  EXPECT_EQ(reset.position_ids, (std::vector<std::int64_t>{0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(reset.attention_row_start, (std::vector<std::int64_t>{0, 0, 0, 3, 3, 5}));
  EXPECT_EQ(reset.loss_mask, (std::vector<float>{1, 1, 0, 1, 0, 0}));
  // Without the extra token the labels roll left and end in pad.
  o.add_extra_token = false;
  auto rolled = mdata::make_item(std::span(text).first(3), o);
  EXPECT_EQ(rolled.tokens, (std::vector<std::int64_t>{5, 6, 9}));
  EXPECT_EQ(rolled.labels, (std::vector<std::int64_t>{6, 9, 0}));
  EXPECT_EQ(rolled.loss_mask, (std::vector<float>{1, 1, 0}));

  // Without drop_last the sample count rounds up (in float) and the last sample is padded.
  std::vector<std::int32_t> const lengths{5, 4};
  mdata::gpt_dataset_options d;
  d.seq_length = 4;
  d.drop_last = false;
  auto const idx = mdata::build_gpt_indices(lengths, 0, 2, d);
  EXPECT_EQ(idx.epochs, 1);
  EXPECT_EQ(idx.size(), 2);  // ceil(8 / 4); with drop_last: 8 / 4 = 2 as well
  d.seq_length = 3;
  auto const odd = mdata::build_gpt_indices(lengths, 0, 2, d);
  EXPECT_EQ(odd.size(), 3);  // ceil(8 / 3)
  d.drop_last = true;
  EXPECT_EQ(mdata::build_gpt_indices(lengths, 0, 2, d).size(), 2);
  std::vector<std::int32_t> const empty{0, 0};
  EXPECT_THROW((void)mdata::build_gpt_indices(empty, 0, 2, d), megamoe::input_error);
}

TEST(Blending, NumpySumNormalizeAndBothIndexBuildersAreMegatrons) {
  auto const v = read_json(megatron_data() / "blending_indices.json");
  for (auto const& c : v["normalize"]) {
    auto const in = c["weights_in"].get<std::vector<double>>();
    auto const w = mdata::normalize(in);
    ASSERT_EQ(w.size(), c["normalized_hex"].size());
    for (std::size_t k = 0; k < w.size(); ++k)
      EXPECT_EQ(w[k], from_hex(c["normalized_hex"][k])) << "n " << in.size() << " weight " << k;
  }
  for (auto const& c : v["weighted"]) {
    std::vector<double> w;
    for (auto const& h : c["weights_hex"]) w.push_back(from_hex(h));
    auto const got = mdata::build_blending_indices(w, c["size"].get<std::int64_t>());
    EXPECT_EQ(std::vector<std::int64_t>(got.dataset_index.begin(), got.dataset_index.end()),
              as_ints(c["dataset_index"]));
    EXPECT_EQ(got.dataset_sample_index, as_ints(c["dataset_sample_index"]));
  }
  for (auto const& c : v["exhaustive"]) {
    auto const sizes = as_ints(c["sizes"]);
    auto const got = mdata::build_exhaustive_blending_indices(sizes);
    EXPECT_EQ(std::vector<std::int64_t>(got.dataset_index.begin(), got.dataset_index.end()),
              as_ints(c["dataset_index"]));
    EXPECT_EQ(got.dataset_sample_index, as_ints(c["dataset_sample_index"]));
  }
  // The counts asked of each dataset: ceil(size x weight), and 0.5 % more to build.
  std::vector<double> const w{0.3, 0.7};
  auto const counts = mdata::blend_counts(w, 1000);
  EXPECT_EQ(counts.target, (std::vector<std::int64_t>{300, 700}));
  EXPECT_EQ(counts.buffer, (std::vector<std::int64_t>{302, 704}));
}

}  // namespace
