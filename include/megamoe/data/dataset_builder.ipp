// SPDX-License-Identifier: Apache-2.0
// megamoe/data/dataset_builder.ipp — the definitions behind dataset_builder.hpp (compiled once
// under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/data/dataset_builder.hpp>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

namespace megamoe::data {

MEGAMOE_DECL std::string_view name_of(split_kind split) {
  switch (split) {
    case split_kind::train: return "train";
    case split_kind::valid: return "valid";
    case split_kind::test: return "test";
  }
  return "?";
}

MEGAMOE_DECL blend parse_blend(std::span<std::string const> words) {
  auto const bad = [](std::string const& why) {
    return input_error("--data-path: " + why);
  };
  if (words.empty()) throw bad("names no dataset");
  // Python's float() on a word: the whole word (spaces around it aside) is a number.
  auto const number = [](std::string const& word) -> std::optional<double> {
    auto const first = word.find_first_not_of(" \t");
    auto const last = word.find_last_not_of(" \t");
    if (first == std::string::npos) return std::nullopt;
    std::string const trimmed = word.substr(first, last - first + 1);
    double value = 0;
    char const* begin = trimmed.data();
    if (*begin == '+') ++begin;
    auto const [end, error] = std::from_chars(begin, trimmed.data() + trimmed.size(), value);
    if (error != std::errc() || end != trimmed.data() + trimmed.size()) return std::nullopt;
    return value;
  };
  auto const trimmed = [](std::string const& word) {
    auto const first = word.find_first_not_of(" \t\n");
    auto const last = word.find_last_not_of(" \t\n");
    return first == std::string::npos ? std::string() : word.substr(first, last - first + 1);
  };
  blend out;
  bool weighted = words.size() % 2 == 0;
  if (weighted)
    for (std::size_t i = 0; i < words.size(); i += 2)
      if (!number(words[i])) weighted = false;
  if (!weighted) {
    if (words.size() % 2 == 1 && words.size() > 1 && number(words[0]))
      throw bad("weights and prefixes come in pairs, and " + std::to_string(words.size()) +
                " words starting with the weight '" + words[0] + "' do not pair up");
    for (auto const& word : words) out.prefixes.emplace_back(trimmed(word));
  } else {
    out.weights.emplace();
    for (std::size_t i = 0; i < words.size(); i += 2) {
      double const w = *number(words[i]);
      if (!std::isfinite(w) || w <= 0)
        throw bad("the weight '" + words[i] + "' of " + words[i + 1] +
                  " is not a positive number");
      out.weights->push_back(w);
      out.prefixes.emplace_back(trimmed(words[i + 1]));
    }
  }
  for (auto const& prefix : out.prefixes)
    if (prefix.empty()) throw bad("an empty dataset prefix");
  return out;
}

MEGAMOE_DECL split_sizes requested_samples(std::int64_t train_iters, std::int64_t global_batch,
                                           std::int64_t eval_interval, std::int64_t eval_iters) {
  if (train_iters < 0 || global_batch < 1 || eval_interval < 1 || eval_iters < 0)
    throw input_error("requested samples: steps and evaluation iterations must not be negative, "
                      "the global batch and the evaluation interval must be positive");
  return {train_iters * global_batch,
          (train_iters / eval_interval + 1) * eval_iters * global_batch,
          eval_iters * global_batch};
}

// ---------------------------------------------------------------------------------------------

MEGAMOE_DECL split_dataset::split_dataset(gpt_split_dataset dataset) {
  size_ = dataset.size();
  weights_ = {1.0};
  datasets_.push_back(std::move(dataset));
}

MEGAMOE_DECL split_dataset::split_dataset(std::vector<gpt_split_dataset> datasets,
                                          std::vector<double> weights, blending_indices blending)
    : datasets_(std::move(datasets)), weights_(std::move(weights)), blending_(std::move(blending)) {
  size_ = static_cast<std::int64_t>(blending_->dataset_index.size());
  std::vector<std::int64_t> drawn(datasets_.size(), 0);
  for (std::size_t s = 0; s < blending_->dataset_index.size(); ++s) {
    auto const k = static_cast<std::size_t>(blending_->dataset_index[s]);
    if (k >= datasets_.size())
      throw std::logic_error("megamoe: a blended sample from no dataset of the blend");
    drawn[k] = std::max(drawn[k], blending_->dataset_sample_index[s] + 1);
  }
  for (std::size_t k = 0; k < datasets_.size(); ++k)
    if (drawn[k] > datasets_[k].size())
      throw input_error("blend: dataset " + index_path(datasets_[k].dataset().prefix()).string() +
                        " is asked for " + std::to_string(drawn[k]) + " samples and holds " +
                        std::to_string(datasets_[k].size()));
}

MEGAMOE_DECL void split_dataset::check_index(std::int64_t i) const {
  if (i < 0 || i >= size_)
    throw std::out_of_range("split dataset: sample " + std::to_string(i) + " of " +
                            std::to_string(size_));
}

MEGAMOE_DECL std::int16_t split_dataset::dataset_of(std::int64_t i) const {
  check_index(i);
  return blending_ ? blending_->dataset_index[static_cast<std::size_t>(i)] : std::int16_t{0};
}

MEGAMOE_DECL gpt_sample split_dataset::sample(std::int64_t i, std::int64_t pad) const {
  gpt_sample out;
  sample(i, pad, out);
  return out;
}

MEGAMOE_DECL void split_dataset::sample(std::int64_t i, std::int64_t pad, gpt_sample& out) const {
  check_index(i);
  if (!blending_) return datasets_.front().sample(i, pad, out);
  auto const s = static_cast<std::size_t>(i);
  datasets_[static_cast<std::size_t>(blending_->dataset_index[s])].sample(
      blending_->dataset_sample_index[s], pad, out);
}

// ---------------------------------------------------------------------------------------------

namespace detail {

inline std::uint64_t fnv1a64(std::span<std::byte const> bytes, std::uint64_t h) {
  for (std::byte const b : bytes) {
    h ^= static_cast<std::uint64_t>(b);
    h *= 0x100000001b3ULL;
  }
  return h;
}

inline constexpr std::string_view cache_magic = "megamoe gpt_indices 2\n";

// Everything a split's indices depend on, one "key=value" per line.
inline std::string describe_indices(indexed_dataset const& dataset,
                                    std::filesystem::path const& prefix, std::int64_t begin,
                                    std::int64_t end, gpt_dataset_options const& o) {
  auto const lengths = dataset.sequence_lengths();
  auto const lengths_hash =
      fnv1a64(std::as_bytes(std::span(lengths)), 0xcbf29ce484222325ULL);
  std::error_code ignored;
  auto const where = std::filesystem::weakly_canonical(prefix, ignored);
  std::string d;
  d += "prefix=" + (where.empty() ? prefix : where).string() + "\n";
  d += "sequences=" + std::to_string(dataset.sequence_count()) + "\n";
  d += "tokens=" + std::to_string(dataset.token_count()) + "\n";
  d += "lengths_fnv1a64=" + std::to_string(lengths_hash) + "\n";
  d += "range=" + std::to_string(begin) + "," + std::to_string(end) + "\n";
  d += "seq_length=" + std::to_string(o.seq_length) + "\n";
  d += "add_extra_token=" + std::to_string(o.add_extra_token ? 1 : 0) + "\n";
  d += "num_samples=" + (o.num_samples ? std::to_string(*o.num_samples) : std::string("none")) +
       "\n";
  d += "drop_last=" + std::to_string(o.drop_last ? 1 : 0) + "\n";
  d += "seed=" + std::to_string(o.seed) + "\n";
  return d;
}

// The file: the magic, a header (the description's size, tokens per epoch, epochs, a separate
// last epoch), the description, then each array: its element type and count as int64, then its
// bytes. Written straight from the arrays (no copy of the file in memory).
inline void write_indices(std::ostream& out, std::string const& description,
                          gpt_indices const& indices) {
  out.write(cache_magic.data(), static_cast<std::streamsize>(cache_magic.size()));
  std::int64_t const header[] = {static_cast<std::int64_t>(description.size()),
                                 indices.tokens_per_epoch, indices.epochs,
                                 indices.separate_final_epoch ? 1 : 0};
  out.write(reinterpret_cast<char const*>(header), sizeof header);
  out.write(description.data(), static_cast<std::streamsize>(description.size()));
  for (auto const* a : {&indices.document_index, &indices.sample_index, &indices.shuffle_index}) {
    std::int64_t const head[] = {static_cast<std::int64_t>(a->type()),
                                 static_cast<std::int64_t>(a->size())};
    out.write(reinterpret_cast<char const*>(head), sizeof head);
    auto const bytes = a->bytes();
    out.write(reinterpret_cast<char const*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

// The indices in the mapped `file` when it was made from `description`, as views into the map
// (which they keep); none otherwise (another file's name clash, a file from another version, a
// truncated one: then it is rebuilt). Values are not checked here (that would read every page);
// query_sample checks each one it uses.
inline std::optional<gpt_indices> decode_indices(std::shared_ptr<mapped_file const> const& file,
                                                 std::string const& description) {
  auto const bytes = file->bytes();
  auto const text = std::string_view(reinterpret_cast<char const*>(bytes.data()), bytes.size());
  std::size_t at = 0;
  auto const take = [&](void* out, std::size_t n) {
    if (bytes.size() - at < n) return false;
    std::memcpy(out, bytes.data() + at, n);
    at += n;
    return true;
  };
  if (!text.starts_with(cache_magic)) return std::nullopt;
  at = cache_magic.size();
  std::int64_t header[4];
  if (!take(header, sizeof header) || header[0] != static_cast<std::int64_t>(description.size()) ||
      text.substr(at, description.size()) != description)
    return std::nullopt;
  at += description.size();
  gpt_indices out;
  out.tokens_per_epoch = header[1];
  out.epochs = header[2];
  out.separate_final_epoch = header[3] != 0;
  auto const array = [&](index_array& a) {
    std::int64_t head[2];
    if (!take(head, sizeof head) || head[0] < 1 || head[0] > 3 || head[1] < 0) return false;
    auto const e = static_cast<index_array::element>(head[0]);
    auto const n = static_cast<std::uint64_t>(head[1]);
    if (n > (bytes.size() - at) / index_array::width(e)) return false;
    a = index_array(file, bytes.data() + at, static_cast<std::size_t>(n), e);
    at += a.bytes().size();
    return true;
  };
  if (!array(out.document_index) || !array(out.sample_index) || !array(out.shuffle_index) ||
      at != bytes.size() || out.sample_index.size() != 2 * (out.shuffle_index.size() + 1))
    return std::nullopt;
  return out;
}

}  // namespace detail

MEGAMOE_DECL gpt_indices cached_gpt_indices(std::optional<std::filesystem::path> const& cache,
                                            indexed_dataset const& dataset,
                                            std::filesystem::path const& prefix,
                                            std::int64_t begin, std::int64_t end,
                                            gpt_dataset_options const& options) {
  auto const lengths = dataset.sequence_lengths();
  if (!cache) return build_gpt_indices(lengths, begin, end, options);
  std::string const description = detail::describe_indices(dataset, prefix, begin, end, options);
  char name[17];
  auto const hash = detail::fnv1a64(std::as_bytes(std::span(description)), 0xcbf29ce484222325ULL);
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(hash));
  auto const path = *cache / (std::string(name) + "-gpt_indices.bin");
  // Mapped, not read: the ranks of a node that read the same file share its pages.
  if (std::filesystem::is_regular_file(path)) {
    auto const file = std::make_shared<mapped_file const>(path);
    if (auto indices = detail::decode_indices(file, description)) return std::move(*indices);
  }
  gpt_indices indices = build_gpt_indices(lengths, begin, end, options);
  std::error_code error;
  std::filesystem::create_directories(*cache, error);
  if (error)
    throw input_error("--data-cache-path: cannot make " + cache->string() + ": " +
                      error.message());
  // A temporary of this writer's own (mkstemp's unique name), renamed into place: ranks or jobs
  // writing the same indices at once each rename a whole file.
  std::string pattern = (*cache / ("." + path.filename().string() + ".XXXXXX")).string();
  int const fd = ::mkstemp(pattern.data());
  if (fd < 0)
    throw input_error("--data-cache-path: cannot create a file in " + cache->string() + ": " +
                      std::strerror(errno));
  ::close(fd);
  std::filesystem::path const temporary = pattern;
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    detail::write_indices(out, description, indices);
    out.close();
    if (!out) {
      std::filesystem::remove(temporary, error);
      throw input_error("--data-cache-path: cannot write " + temporary.string());
    }
  }
  // A matching file another writer put there meanwhile stays: others may have mapped it.
  if (std::filesystem::is_regular_file(path) &&
      detail::decode_indices(std::make_shared<mapped_file const>(path), description)) {
    std::filesystem::remove(temporary, error);
    return indices;
  }
  std::filesystem::rename(temporary, path, error);
  if (error)
    throw input_error("--data-cache-path: cannot rename " + temporary.string() + " to " +
                      path.string() + ": " + error.message());
  return indices;
}

namespace detail {

using split_datasets = std::array<std::optional<gpt_split_dataset>, 3>;

// One prefix's splits (Megatron's _build_megatron_dataset_splits): split i is built where its
// bookends are given and it is asked for samples (or for one epoch: size none).
inline split_datasets build_dataset_splits(std::filesystem::path const& prefix,
                                           split_bookends const& bookends,
                                           split_sizes const& sizes,
                                           dataset_builder_options const& o) {
  split_datasets out;
  bool wanted = false;
  for (std::size_t i = 0; i < 3; ++i) wanted |= bookends[i] && (!sizes[i] || *sizes[i] > 0);
  if (!wanted) return out;
  auto const dataset = std::make_shared<indexed_dataset const>(prefix, o.multimodal);
  auto const lengths = dataset->sequence_lengths();
  for (std::size_t i = 0; i < 3; ++i) {
    if (!bookends[i] || (sizes[i] && *sizes[i] == 0)) continue;
    auto const [begin, end] = split_range(*bookends[i], dataset->sequence_count());
    std::int64_t tokens = 0;
    for (std::int64_t s = begin; s < end; ++s) tokens += lengths[static_cast<std::size_t>(s)];
    auto const split = name_of(split_kinds[i]);
    if (tokens == 0) {
      if (!sizes[i]) continue;  // one epoch of nothing: no dataset, as Megatron's is empty
      throw input_error("dataset " + prefix.string() + ": the " + std::string(split) +
                        " split (sequences [" + std::to_string(begin) + ", " +
                        std::to_string(end) + ") of " +
                        std::to_string(dataset->sequence_count()) +
                        ") holds no tokens, and it is asked for " + std::to_string(*sizes[i]) +
                        " samples; change --split or the data");
    }
    gpt_dataset_options const options{
        .seq_length = o.seq_length,
        .add_extra_token = o.add_extra_token,
        .num_samples = sizes[i],
        .drop_last = split_kinds[i] != split_kind::valid || o.drop_last_partial_validation,
        .seed = o.seed};
    gpt_indices indices = cached_gpt_indices(o.cache, *dataset, prefix, begin, end, options);
    if (split_kinds[i] == split_kind::train && indices.size() == 0)
      throw input_error("dataset " + prefix.string() + ": the train split's " +
                        std::to_string(tokens) + " tokens cannot fill one sample of " +
                        std::to_string(o.seq_length + (o.add_extra_token ? 1 : 0)) + " tokens");
    out[i].emplace(dataset, std::move(indices), options);
  }
  return out;
}

// A blend's splits over `bookends` (Megatron's _build_blended_dataset_splits for one blend).
// One prefix builds its splits directly: without weights (--data-path), or with any when
// `single_any_weights` (a per-split path list). Weights need every split's size (the
// reference's size_is_none => weights_are_none); `flag` names the paths in errors.
inline std::array<std::optional<split_dataset>, 3> build_blend_splits(
    blend const& b, split_bookends const& bookends, split_sizes const& sizes,
    dataset_builder_options const& o, bool single_any_weights, std::string const& flag) {
  std::array<std::optional<split_dataset>, 3> out;
  std::optional<std::vector<double>> weights;
  if (b.weights) {
    if (b.weights->size() != b.prefixes.size())
      throw input_error(flag + ": " + std::to_string(b.weights->size()) + " weights for " +
                        std::to_string(b.prefixes.size()) + " datasets");
    weights = normalize(*b.weights);
    for (std::size_t i = 0; i < 3; ++i)
      if (!sizes[i])
        throw input_error(flag + ": a weighted blend needs the number of samples of every "
                          "split (the " + std::string(name_of(split_kinds[i])) +
                          " split has none)");
  }
  if (b.prefixes.size() == 1 && (!weights || single_any_weights)) {
    auto splits = build_dataset_splits(b.prefixes.front(), bookends, sizes, o);
    for (std::size_t i = 0; i < 3; ++i)
      if (splits[i]) out[i].emplace(std::move(*splits[i]));
    return out;
  }
  std::size_t const n = b.prefixes.size();
  // per_dataset[k][i]: the samples dataset k is built with for split i.
  // Without weights each dataset is built for one epoch, except for splits asked for nothing.
  split_sizes one_epoch;
  for (std::size_t i = 0; i < 3; ++i)
    if (sizes[i] && *sizes[i] == 0) one_epoch[i] = 0;
  std::vector<split_sizes> built(n, one_epoch);
  std::vector<std::array<std::int64_t, 3>> target(n);
  if (weights) {
    for (std::size_t i = 0; i < 3; ++i) {
      auto const counts = blend_counts(*weights, *sizes[i], o.mid_level_surplus);
      for (std::size_t k = 0; k < n; ++k) {
        built[k][i] = counts.buffer[k];
        target[k][i] = counts.target[k];
      }
    }
  }
  std::vector<split_datasets> components;
  components.reserve(n);
  for (std::size_t k = 0; k < n; ++k)
    components.push_back(build_dataset_splits(b.prefixes[k], bookends, built[k], o));
  for (std::size_t i = 0; i < 3; ++i) {
    if (!bookends[i] || (sizes[i] && *sizes[i] == 0)) continue;
    std::vector<gpt_split_dataset> parts;
    std::vector<std::int64_t> lengths;
    for (std::size_t k = 0; k < n; ++k) {
      if (!components[k][i]) {  // one epoch of an empty split
        throw input_error("dataset " + b.prefixes[k].string() + ": its " +
                          std::string(name_of(split_kinds[i])) +
                          " split holds no tokens; change --split or the data");
      }
      lengths.push_back(components[k][i]->size());
      parts.push_back(std::move(*components[k][i]));
    }
    if (weights) {
      std::int64_t size = 0;
      for (std::size_t k = 0; k < n; ++k) size += target[k][i];
      auto const held = normalize(*weights);  // BlendedDataset normalises again
      auto blending = build_blending_indices(held, size);
      out[i].emplace(std::move(parts), held, std::move(blending));
    } else {
      for (std::size_t k = 0; k < n; ++k)
        if (lengths[k] == 0)
          throw input_error("dataset " + b.prefixes[k].string() + ": its " +
                            std::string(name_of(split_kinds[i])) +
                            " split cannot fill one sample, so it has no share of the blend");
      std::vector<double> const as_weights(lengths.begin(), lengths.end());
      auto held = normalize(as_weights);
      std::int64_t const all = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
      auto blending = sizes[i] ? build_blending_indices(held, std::min(*sizes[i], all))
                               : build_exhaustive_blending_indices(lengths);
      out[i].emplace(std::move(parts), std::move(held), std::move(blending));
    }
  }
  return out;
}

}  // namespace detail

MEGAMOE_DECL std::array<std::optional<split_dataset>, 3> build_datasets(
    dataset_builder_options const& o, split_sizes const& sizes) {
  if (o.seq_length < 1)
    throw input_error("datasets: the sequence length must be positive, not " +
                      std::to_string(o.seq_length));
  for (std::size_t i = 0; i < 3; ++i)
    if (sizes[i] && *sizes[i] < 0)
      throw input_error("datasets: the " + std::string(name_of(split_kinds[i])) +
                        " split is asked for a negative number of samples");
  if (!(o.mid_level_surplus >= 0 && o.mid_level_surplus <= 1))
    throw input_error("--mid-level-dataset-surplus must be between 0 and 1, not " +
                      std::to_string(o.mid_level_surplus));
  if (o.data) {
    for (auto const& p : o.per_split)
      if (p)
        throw input_error("--data-path and --train-data-path, --valid-data-path, "
                          "--test-data-path exclude each other");
    return detail::build_blend_splits(*o.data, parse_split(o.split), sizes, o, false,
                                      "--data-path");
  }
  std::array<std::optional<split_dataset>, 3> out;
  bool any = false;
  for (std::size_t i = 0; i < 3; ++i) {
    if (!o.per_split[i]) continue;
    any = true;
    split_bookends only{};
    only[i] = std::pair{0.0, 1.0};
    split_sizes only_sizes{0, 0, 0};
    only_sizes[i] = sizes[i];
    out[i] = std::move(detail::build_blend_splits(*o.per_split[i], only, only_sizes, o, true,
                                                  "--" + std::string(name_of(split_kinds[i])) +
                                                      "-data-path")[i]);
  }
  if (!any)
    throw input_error("datasets: no data; give --data-path, or --train-data-path and the others");
  return out;
}

}  // namespace megamoe::data
