// SPDX-License-Identifier: Apache-2.0
// Megatron-Core's dataset builder: one dataset's three splits against the reference's vectors
// (tests/data/megatron_data), blends with and without weights against the pieces built directly
// (each dataset asked for its share and the surplus, the blending indices, one epoch each), paths
// per split, the index cache, the requested sizes, bad blends and splits, and the pretraining
// sampler's order over data-parallel ranks.
#include <megamoe/data/dataset_builder.hpp>
#include <megamoe/data/pretraining_sampler.hpp>

#include "support/megatron_data.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace {

namespace mdata = megamoe::data;
namespace fs = std::filesystem;
using megamoe::test::expect_summary;
using megamoe::test::megatron_data;
using megamoe::test::read_json;

fs::path shipped_prefix() { return megatron_data() / "data" / "bytes_doc_u16"; }

// A scratch folder of the test's own, emptied first.
fs::path scratch(std::string const& name) {
  auto const dir = fs::temp_directory_path() / ("megamoe_dataset_builder_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A second dataset unlike the shipped one: its documents reversed, every other one dropped.
fs::path other_dataset(fs::path const& dir) {
  mdata::indexed_dataset const shipped(shipped_prefix());
  auto const prefix = dir / "other";
  mdata::indexed_dataset_builder out(mdata::data_path(prefix), mdata::token_dtype::uint16);
  for (std::int64_t i = shipped.sequence_count() - 1; i >= 0; i -= 2) {
    auto const tokens = shipped.get(i);
    out.add_item(tokens);
    out.end_document();
  }
  out.finalize(mdata::index_path(prefix));
  return prefix;
}

TEST(DatasetBuilder, OneDatasetsSplitsAreMegatrons) {
  auto const v = read_json(megatron_data() / "gpt_bytes_doc_u16_s32_seed1234_split969.json");
  auto const& config = v["config"];
  mdata::dataset_builder_options o;
  std::vector<std::string> const words{(megatron_data() /
                                        config["blend_prefixes"][0].get<std::string>()).string()};
  o.data = mdata::parse_blend(words);
  o.split = config["split"].get<std::string>();
  o.seq_length = config["sequence_length"].get<std::int64_t>();
  o.seed = config["random_seed"].get<std::uint32_t>();
  mdata::split_sizes sizes;
  for (std::size_t i = 0; i < 3; ++i) sizes[i] = config["sizes"][i].get<std::int64_t>();
  auto const splits = mdata::build_datasets(o, sizes);
  for (auto const kind : mdata::split_kinds) {
    auto const i = static_cast<std::size_t>(kind);
    auto const& expected = v["splits"][std::string(mdata::name_of(kind))];
    SCOPED_TRACE(std::string(mdata::name_of(kind)));
    ASSERT_TRUE(splits[i].has_value());
    auto const& split = *splits[i];
    EXPECT_FALSE(split.blended());
    EXPECT_EQ(split.size(), expected["len"].get<std::int64_t>());
    auto const& indices = split.datasets()[0].indices();
    expect_summary(indices.document_index.values(), expected["document_index"], "document_index");
    expect_summary(indices.sample_index.values(), expected["sample_index"], "sample_index", 2);
    expect_summary(indices.shuffle_index.values(), expected["shuffle_index"], "shuffle_index");
    for (auto const& s : expected["samples"]) {
      auto const index = s["index"].get<std::int64_t>();
      EXPECT_EQ(split.sample(index).text, s["text"].get<std::vector<std::int64_t>>())
          << "sample " << index;
    }
  }
}

TEST(DatasetBuilder, BlendsAreMegatrons) {
  // Cases made by Megatron-Core's own builder (tests/data/megatron_blends/make_vectors.py):
  // weighted and unweighted blends of two and three datasets (uint16 and int32 tokens), with and
  // without sizes, and one weighted prefix.
  auto const folder = fs::path(MEGAMOE_TEST_DATA) / "megatron_blends";
  auto const v = read_json(folder / "blends.json");
  for (auto const& c : v["cases"]) {
    std::vector<std::string> words;
    for (auto const& w : c["data_path"]) {
      auto const word = w.get<std::string>();
      words.push_back(v["datasets"].contains(word)
                          ? (folder / v["datasets"][word].get<std::string>()).string()
                          : word);
    }
    SCOPED_TRACE(c["data_path"].dump() + " split " + c["split"].get<std::string>());
    mdata::dataset_builder_options o;
    o.data = mdata::parse_blend(words);
    o.split = c["split"].get<std::string>();
    o.seq_length = c["seq_length"].get<std::int64_t>();
    o.seed = c["seed"].get<std::uint32_t>();
    mdata::split_sizes sizes;
    for (std::size_t i = 0; i < 3; ++i)
      if (!c["sizes"][i].is_null()) sizes[i] = c["sizes"][i].get<std::int64_t>();
    auto const splits = mdata::build_datasets(o, sizes);
    for (auto const kind : mdata::split_kinds) {
      auto const i = static_cast<std::size_t>(kind);
      auto const& expected = c["splits"][std::string(mdata::name_of(kind))];
      SCOPED_TRACE(std::string(mdata::name_of(kind)));
      ASSERT_EQ(splits[i].has_value(), !expected.is_null());
      if (expected.is_null()) continue;
      EXPECT_EQ(splits[i]->blended(), expected["blended"].get<bool>());
      ASSERT_EQ(splits[i]->size(), expected["len"].get<std::int64_t>());
      for (auto const& s : expected["samples"]) {
        auto const index = s["index"].get<std::int64_t>();
        EXPECT_EQ(splits[i]->sample(index).text, s["text"].get<std::vector<std::int64_t>>())
            << "sample " << index;
      }
    }
  }
  // Where the reference loops for ever (a dataset's test range holds no tokens but is asked for
  // samples), an error names the dataset and the split.
  std::vector<std::string> const hangs{"1", shipped_prefix().string(), "0.5",
                                       (folder / "first_100_i32").string()};
  mdata::dataset_builder_options o;
  o.data = mdata::parse_blend(hangs);
  o.seq_length = 32;
  try {
    (void)mdata::build_datasets(o, {2000, 100, 20});
    ADD_FAILURE() << "no error";
  } catch (megamoe::input_error const& e) {
    EXPECT_NE(std::string(e.what()).find("first_100_i32: the test split"), std::string::npos)
        << e.what();
  }
}

TEST(DatasetBuilder, RequestedSamplesFollowTheSchedule) {
  // 1000 steps of 16 samples, 10 evaluation batches every 100 steps: 11 evaluations.
  auto const sizes = mdata::requested_samples(1000, 16, 100, 10);
  EXPECT_EQ(sizes[0], 1000 * 16);
  EXPECT_EQ(sizes[1], (1000 / 100 + 1) * 10 * 16);
  EXPECT_EQ(sizes[2], 10 * 16);
  auto const odd = mdata::requested_samples(250, 8, 100, 3);
  EXPECT_EQ(odd[1], 3 * 3 * 8);  // evaluations at 0, 100, 200
  EXPECT_THROW((void)mdata::requested_samples(10, 0, 1, 1), megamoe::input_error);
}

TEST(DatasetBuilder, WeightedBlendBuildsEachDatasetsShareWithTheSurplus) {
  auto const dir = scratch("weighted");
  auto const other = other_dataset(dir);
  std::vector<std::string> const words{"0.3", shipped_prefix().string(), "0.7", other.string()};
  mdata::dataset_builder_options o;
  o.data = mdata::parse_blend(words);
  ASSERT_TRUE(o.data->weights.has_value());
  o.split = "90,8,2";
  o.seq_length = 24;
  o.seed = 77;
  mdata::split_sizes const sizes{500, 60, 9};
  auto const splits = mdata::build_datasets(o, sizes);

  std::vector<mdata::indexed_dataset> files;
  files.emplace_back(shipped_prefix());
  files.emplace_back(other);
  auto const bookends = mdata::parse_split(o.split);
  auto const weights = mdata::normalize(std::vector<double>{0.3, 0.7});
  for (auto const kind : mdata::split_kinds) {
    auto const i = static_cast<std::size_t>(kind);
    SCOPED_TRACE(std::string(mdata::name_of(kind)));
    ASSERT_TRUE(splits[i].has_value());
    auto const& split = *splits[i];
    ASSERT_TRUE(split.blended());
    ASSERT_EQ(split.datasets().size(), 2U);
    std::int64_t size = 0;
    for (std::size_t k = 0; k < 2; ++k) {
      // Built with ceil(ceil(size x w) x 1.005) samples, the same seed, its own split range.
      auto const share = std::ceil(static_cast<double>(*sizes[i]) * weights[k]);
      auto const buffer = static_cast<std::int64_t>(std::ceil(share * 1.005));
      size += static_cast<std::int64_t>(share);
      auto const [begin, end] = mdata::split_range(*bookends[i], files[k].sequence_count());
      mdata::gpt_dataset_options d{.seq_length = 24, .num_samples = buffer,
                                   .drop_last = true, .seed = 77};
      auto const direct = mdata::build_gpt_indices(files[k].sequence_lengths(), begin, end, d);
      auto const& built = split.datasets()[k];
      EXPECT_EQ(built.options().num_samples, buffer);
      EXPECT_EQ(built.indices().document_index.values(), direct.document_index.values());
      EXPECT_EQ(built.indices().shuffle_index.values(), direct.shuffle_index.values());
    }
    ASSERT_EQ(split.size(), size);
    auto const blending = mdata::build_blending_indices(mdata::normalize(weights), size);
    EXPECT_EQ(split.blending()->dataset_index, blending.dataset_index);
    EXPECT_EQ(split.blending()->dataset_sample_index, blending.dataset_sample_index);
    for (std::int64_t s = 0; s < size; s += 7) {
      auto const k = static_cast<std::size_t>(blending.dataset_index[static_cast<std::size_t>(s)]);
      EXPECT_EQ(split.dataset_of(s), static_cast<std::int16_t>(k));
      EXPECT_EQ(split.sample(s).text,
                split.datasets()[k].sample(
                    blending.dataset_sample_index[static_cast<std::size_t>(s)]).text);
    }
  }
  // A weighted blend needs every split's size.
  EXPECT_THROW((void)mdata::build_datasets(o, {500, 60, std::nullopt}), megamoe::input_error);
  fs::remove_all(dir);
}

TEST(DatasetBuilder, UnweightedBlendTakesOneEpochOfEach) {
  auto const dir = scratch("unweighted");
  auto const other = other_dataset(dir);
  std::vector<std::string> const words{shipped_prefix().string(), other.string()};
  mdata::dataset_builder_options o;
  o.data = mdata::parse_blend(words);
  EXPECT_FALSE(o.data->weights.has_value());
  o.split = "1";
  o.seq_length = 40;
  o.seed = 5;
  // No size: every sample of both, each once, in proportion.
  auto const all = mdata::build_datasets(o, {std::nullopt, std::nullopt, std::nullopt});
  ASSERT_TRUE(all[0].has_value());
  EXPECT_FALSE(all[1].has_value());
  EXPECT_FALSE(all[2].has_value());
  auto const& split = *all[0];
  std::vector<std::int64_t> lengths;
  for (auto const& d : split.datasets()) {
    EXPECT_EQ(d.indices().epochs, 1);
    lengths.push_back(d.size());
  }
  ASSERT_EQ(split.size(), lengths[0] + lengths[1]);
  std::set<std::pair<int, std::int64_t>> seen;
  for (std::int64_t s = 0; s < split.size(); ++s)
    seen.emplace(split.blending()->dataset_index[static_cast<std::size_t>(s)],
                 split.blending()->dataset_sample_index[static_cast<std::size_t>(s)]);
  EXPECT_EQ(static_cast<std::int64_t>(seen.size()), split.size());
  auto const exhaustive = mdata::build_exhaustive_blending_indices(lengths);
  EXPECT_EQ(split.blending()->dataset_index, exhaustive.dataset_index);

  // A size: min(size, all samples), weighted by the datasets' lengths.
  auto const some = mdata::build_datasets(o, {100, std::nullopt, std::nullopt});
  ASSERT_EQ(some[0]->size(), 100);
  auto const by_length = mdata::build_blending_indices(
      mdata::normalize(std::vector<double>(lengths.begin(), lengths.end())), 100);
  EXPECT_EQ(some[0]->blending()->dataset_index, by_length.dataset_index);
  auto const capped = mdata::build_datasets(o, {1'000'000, std::nullopt, std::nullopt});
  EXPECT_EQ(capped[0]->size(), lengths[0] + lengths[1]);
  fs::remove_all(dir);
}

TEST(DatasetBuilder, OneWeightedPrefixIsABlendOfOne) {
  // "--data-path 1 A" builds A with the surplus and blends it; "--data-path A" builds A with
  // the size itself. Their first samples agree only where both epochs' shuffles happen to.
  mdata::dataset_builder_options o;
  std::vector<std::string> const weighted{"1", shipped_prefix().string()};
  o.data = mdata::parse_blend(weighted);
  o.split = "1";
  o.seq_length = 32;
  auto const blend_of_one = mdata::build_datasets(o, {7000, 0, 0});
  ASSERT_TRUE(blend_of_one[0]->blended());
  EXPECT_EQ(blend_of_one[0]->datasets()[0].options().num_samples,
            static_cast<std::int64_t>(std::ceil(7000 * 1.005)));
  EXPECT_EQ(blend_of_one[0]->size(), 7000);
  EXPECT_FALSE(blend_of_one[1].has_value());  // asked for no samples

  // Per-split paths build a single prefix directly whatever its weight.
  mdata::dataset_builder_options p;
  p.per_split[0] = mdata::parse_blend(weighted);
  std::vector<std::string> const plain{shipped_prefix().string()};
  p.per_split[1] = mdata::parse_blend(plain);
  p.seq_length = 32;
  auto const per_split = mdata::build_datasets(p, {7000, 30, 10});
  ASSERT_TRUE(per_split[0].has_value());
  EXPECT_FALSE(per_split[0]->blended());
  EXPECT_EQ(per_split[0]->datasets()[0].options().num_samples, 7000);
  ASSERT_TRUE(per_split[1].has_value());
  EXPECT_TRUE(per_split[1]->datasets()[0].options().drop_last);
  EXPECT_FALSE(per_split[2].has_value());  // no --test-data-path
  // Each split uses the whole file.
  mdata::indexed_dataset const ds(shipped_prefix());
  std::int64_t tokens = 0;
  for (auto const l : ds.sequence_lengths()) tokens += l;
  EXPECT_EQ(per_split[1]->datasets()[0].indices().tokens_per_epoch, tokens);
}

TEST(DatasetBuilder, CacheKeepsIndicesAndRebuildsWhatDoesNotMatch) {
  auto const dir = scratch("cache");
  mdata::indexed_dataset const ds(shipped_prefix());
  mdata::gpt_dataset_options const o{.seq_length = 32, .num_samples = 900, .seed = 3};
  auto const built = mdata::cached_gpt_indices(dir, ds, shipped_prefix(), 10, 500, o);
  std::vector<fs::path> files;
  for (auto const& e : fs::directory_iterator(dir)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1U);  // no temporary left behind
  auto const direct = mdata::build_gpt_indices(ds.sequence_lengths(), 10, 500, o);
  EXPECT_EQ(built.shuffle_index.values(), direct.shuffle_index.values());
  // As the reference holds them: int32 rows, a uint32 shuffle.
  EXPECT_EQ(direct.sample_index.type(), mdata::index_array::element::int32);
  EXPECT_EQ(direct.shuffle_index.type(), mdata::index_array::element::uint32);

  // The file is what a second build reads: swap two shuffle entries in it and see them swapped.
  std::string bytes = [&] {
    std::ifstream in(files[0], std::ios::binary);
    return std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }();
  auto const n = direct.shuffle_index.size();
  auto const last = bytes.size() - 4 * n;  // the shuffle index (uint32) ends the file
  std::swap_ranges(bytes.begin() + static_cast<std::ptrdiff_t>(last),
                   bytes.begin() + static_cast<std::ptrdiff_t>(last + 4),
                   bytes.begin() + static_cast<std::ptrdiff_t>(last + 4));
  {
    // Replaced through a rename, as the builder replaces it: a map of the old file stays whole.
    std::ofstream(dir / "swapped", std::ios::binary) << bytes;
    fs::rename(dir / "swapped", files[0]);
    auto const read = mdata::cached_gpt_indices(dir, ds, shipped_prefix(), 10, 500, o);
    ASSERT_EQ(read.shuffle_index.size(), n);
    EXPECT_EQ(read.shuffle_index[0], direct.shuffle_index[1]);
    EXPECT_EQ(read.shuffle_index[1], direct.shuffle_index[0]);
    EXPECT_EQ(read.sample_index.values(), direct.sample_index.values());
  }

  {
    // A value out of range in the file: a sample that uses it is an error, not a read past
    // the map.
    auto damaged = bytes;
    std::uint32_t const huge = 0x7fffffff;
    std::memcpy(damaged.data() + last, &huge, 4);
    std::ofstream(dir / "damaged", std::ios::binary) << damaged;
    fs::rename(dir / "damaged", files[0]);
    auto const read = mdata::cached_gpt_indices(dir, ds, shipped_prefix(), 10, 500, o);
    EXPECT_THROW((void)mdata::query_sample(ds, read, o, 0), megamoe::input_error);
    EXPECT_NO_THROW((void)mdata::query_sample(ds, read, o, 1));
  }

  // Another seed is another file; a truncated file is built again.
  auto const other = mdata::cached_gpt_indices(dir, ds, shipped_prefix(), 10, 500,
                                               {.seq_length = 32, .num_samples = 900, .seed = 4});
  EXPECT_NE(other.shuffle_index.values(), direct.shuffle_index.values());
  fs::resize_file(files[0], bytes.size() / 2);
  EXPECT_EQ(mdata::cached_gpt_indices(dir, ds, shipped_prefix(), 10, 500, o).shuffle_index.values(),
            direct.shuffle_index.values());
  fs::remove_all(dir);
}

TEST(DatasetBuilder, BadBlendsAndSplitsAreNamed) {
  auto const message = [](auto&& f) {
    try {
      f();
    } catch (megamoe::input_error const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto const blend_of = [](std::vector<std::string> const& w) { return mdata::parse_blend(w); };
  EXPECT_NE(message([&] { blend_of({"-0.3", "A", "0.7", "B"}); }).find("not a positive"),
            std::string::npos);
  EXPECT_NE(message([&] { blend_of({"0", "A", "1", "B"}); }).find("not a positive"),
            std::string::npos);
  EXPECT_NE(message([&] { blend_of({"0.3", "A", "0.7"}); }).find("pair"), std::string::npos);
  EXPECT_NE(message([&] { blend_of({}); }).find("no dataset"), std::string::npos);
  EXPECT_EQ(blend_of({"A", "B", "C"}).prefixes.size(), 3U);

  mdata::dataset_builder_options o;
  std::vector<std::string> const words{shipped_prefix().string()};
  o.data = mdata::parse_blend(words);
  o.seq_length = 32;
  // 600 sequences: "998,1,1" leaves the valid split [599, 599) empty.
  o.split = "998,1,1";
  EXPECT_NE(message([&] { (void)mdata::build_datasets(o, {100, 10, 10}); }).find("no tokens"),
            std::string::npos);
  o.split = "0,0,0";
  EXPECT_NE(message([&] { (void)mdata::build_datasets(o, {100, 10, 10}); }).find("zero"),
            std::string::npos);
  o.split = "1";
  o.seq_length = 1'000'000;
  EXPECT_NE(message([&] { (void)mdata::build_datasets(o, {std::nullopt, 0, 0}); })
                .find("cannot fill one sample"),
            std::string::npos);
  o.seq_length = 32;
  // Weights need every split's size, a single weighted prefix in a per-split list too; the two
  // ways of naming data exclude each other; the surplus is a fraction.
  {
    mdata::dataset_builder_options p;
    std::vector<std::string> const weighted{"1", shipped_prefix().string()};
    p.per_split[0] = mdata::parse_blend(weighted);
    p.seq_length = 32;
    EXPECT_NE(message([&] { (void)mdata::build_datasets(p, {std::nullopt, 0, 0}); })
                  .find("--train-data-path: a weighted blend needs"),
              std::string::npos);
    p.data = mdata::parse_blend(words);
    EXPECT_NE(message([&] { (void)mdata::build_datasets(p, {100, 0, 0}); }).find("exclude"),
              std::string::npos);
    o.mid_level_surplus = -0.1;
    EXPECT_NE(message([&] { (void)mdata::build_datasets(o, {100, 0, 0}); }).find("surplus"),
              std::string::npos);
    o.mid_level_surplus = 0.005;
  }
  // An unweighted blend whose dataset's valid split cannot fill one sample.
  {
    auto const dir = scratch("short");
    mdata::indexed_dataset const shipped(shipped_prefix());
    auto const tiny = dir / "tiny";
    mdata::indexed_dataset_builder out(mdata::data_path(tiny), mdata::token_dtype::uint16);
    for (std::int64_t i = 0; i < 10; ++i) {
      auto tokens = shipped.get(i);
      tokens.resize(std::min<std::size_t>(tokens.size(), 3));
      out.add_item(tokens);
      out.end_document();
    }
    out.finalize(mdata::index_path(tiny));
    mdata::dataset_builder_options p;
    std::vector<std::string> const two{shipped_prefix().string(), tiny.string()};
    p.data = mdata::parse_blend(two);
    p.split = "8,2";
    p.seq_length = 32;
    EXPECT_NE(message([&] { (void)mdata::build_datasets(p, {0, 10, std::nullopt}); })
                  .find("valid split cannot fill one sample"),
              std::string::npos);
    fs::remove_all(dir);
  }
  std::vector<std::string> const missing{"/nonexistent/megamoe/dataset"};
  o.data = mdata::parse_blend(missing);
  EXPECT_NE(message([&] { (void)mdata::build_datasets(o, {100, 0, 0}); }), "no error");
}

TEST(PretrainingSampler, DataParallelRanksSplitEachGlobalBatch) {
  // A global batch of 12: micro-batch 2, 3 micro-batches per rank, 2 DP ranks.
  std::int64_t const micro = 2, per_rank = 3, dp = 2, global = micro * per_rank * dp;
  for (std::int64_t step = 0; step < 3; ++step) {
    std::int64_t const consumed = step * global;
    std::vector<std::int64_t> one_rank, union_of_two;
    mdata::pretraining_sampler const alone{.micro_batch = micro * dp};
    for (std::int64_t m = 0; m < per_rank; ++m)
      for (std::int64_t b = 0; b < micro * dp; ++b) one_rank.push_back(alone.sample(consumed, m, b));
    for (std::int64_t r = 0; r < dp; ++r) {
      mdata::pretraining_sampler const s{.micro_batch = micro, .data_parallel_size = dp,
                                         .data_parallel_rank = r};
      s.check();
      for (std::int64_t m = 0; m < per_rank; ++m)
        for (std::int64_t b = 0; b < micro; ++b) {
          auto const i = s.sample(consumed, m, b);
          // Megatron: block m holds samples [consumed + m*4, +4); rank r takes slice r.
          EXPECT_EQ(i, consumed + m * micro * dp + r * micro + b);
          union_of_two.push_back(i);
        }
    }
    std::sort(union_of_two.begin(), union_of_two.end());
    EXPECT_EQ(union_of_two, one_rank);
  }
  mdata::pretraining_sampler const s{.micro_batch = 4, .data_parallel_size = 2};
  EXPECT_EQ(s.blocks_left(20, 0), 2);  // the last 4 samples do not fill a block
  EXPECT_EQ(s.blocks_left(20, 16), 0);
  EXPECT_THROW((mdata::pretraining_sampler{.micro_batch = 1, .data_parallel_size = 2,
                                           .data_parallel_rank = 2}
                    .check()),
               megamoe::input_error);
}

}  // namespace
