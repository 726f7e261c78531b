// SPDX-License-Identifier: Apache-2.0
// megamoe/data/gpt_dataset.ipp — the definitions behind gpt_dataset.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/data/gpt_dataset.hpp>
#include <megamoe/data/numpy_random.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <string>

namespace megamoe::data {

namespace detail {

/// numpy's pairwise_sum over doubles (blocks of eight below 128 values, halves above).
inline double pairwise_sum(double const* a, std::size_t n) {
  if (n < 8) {
    double res = -0.0;
    for (std::size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    std::array<double, 8> r{};
    for (std::size_t k = 0; k < 8; ++k) r[k] = a[k];
    std::size_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (std::size_t k = 0; k < 8; ++k) r[k] += a[i + k];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  std::size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

}  // namespace detail

MEGAMOE_DECL double numpy_sum(std::span<double const> x) {
  return 0.0 + detail::pairwise_sum(x.data(), x.size());
}

MEGAMOE_DECL std::vector<double> normalize(std::span<double const> weights) {
  double const sum = numpy_sum(weights);
  std::vector<double> out(weights.size());
  for (std::size_t k = 0; k < weights.size(); ++k) out[k] = weights[k] / sum;
  return out;
}

MEGAMOE_DECL split_bookends parse_split(std::string_view split) {
  auto const bad = [&](std::string const& why) {
    return input_error("--split '" + std::string(split) + "': " + why);
  };
  std::vector<double> shares;
  auto const numeric = [](char c) { return c == '.' || (c >= '0' && c <= '9'); };
  for (std::size_t i = 0; i < split.size();) {
    if (!numeric(split[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < split.size() && numeric(split[j])) ++j;
    double v = 0;
    auto const [end, ec] = std::from_chars(split.data() + i, split.data() + j, v);
    if (ec != std::errc{} || end != split.data() + j)
      throw bad("'" + std::string(split.substr(i, j - i)) + "' is not a number");
    shares.push_back(v);
    i = j;
  }
  if (shares.size() > 3)
    throw bad("gives " + std::to_string(shares.size()) +
              " shares; a split has three at most (train, valid, test)");
  shares.resize(3, 0.0);
  if (numpy_sum(shares) <= 0.0) throw bad("its shares sum to zero");
  auto const w = normalize(shares);
  split_bookends out;
  double begin = 0;
  for (std::size_t k = 0; k < 3; ++k) {
    double const end = begin + w[k];
    if (end - begin != 0.0) out[k] = std::pair{begin, end};
    begin = end;
  }
  return out;
}

MEGAMOE_DECL std::pair<std::int64_t, std::int64_t> split_range(std::pair<double, double> bookends,
                                                               std::int64_t sequences) {
  auto const at = [&](double f) {
    return static_cast<std::int64_t>(std::nearbyint(f * static_cast<double>(sequences)));
  };
  return {at(bookends.first), at(bookends.second)};
}

MEGAMOE_DECL gpt_indices build_gpt_indices(std::span<std::int32_t const> lengths,
                                           std::int64_t begin, std::int64_t end,
                                           gpt_dataset_options const& o) {
  if (o.seq_length <= 0)
    throw input_error("GPT dataset: the sequence length must be positive, not " +
                      std::to_string(o.seq_length));
  if (begin < 0 || end < begin || end > static_cast<std::int64_t>(lengths.size()))
    throw input_error("GPT dataset: sequences [" + std::to_string(begin) + ", " +
                      std::to_string(end) + ") of a dataset of " + std::to_string(lengths.size()));
  if (end > INT32_MAX)
    throw input_error("GPT dataset: " + std::to_string(end) +
                      " sequences; the document index holds int32 sequence ids");
  std::int64_t const extra = o.add_extra_token ? 1 : 0;
  if (o.num_samples && (*o.num_samples < 0 || *o.num_samples > (INT64_MAX - extra) / o.seq_length))
    throw input_error("GPT dataset: " + std::to_string(*o.num_samples) + " samples of " +
                      std::to_string(o.seq_length) + " tokens do not fit a 64-bit count");
  gpt_indices out;
  for (std::int64_t i = begin; i < end; ++i) out.tokens_per_epoch += lengths[i];
  if (out.tokens_per_epoch == 0)
    throw input_error("GPT dataset: the split's sequences [" + std::to_string(begin) + ", " +
                      std::to_string(end) + ") hold no tokens");

  // Epochs: the fewest whole ones that hold the samples asked for.
  out.epochs = 1;
  if (o.num_samples) {
    std::int64_t const wanted = *o.num_samples * o.seq_length + extra;
    for (std::int64_t tokens = out.tokens_per_epoch; tokens < wanted;
         tokens += out.tokens_per_epoch)
      ++out.epochs;
  }
  // A last epoch that adds less than 80 % of an epoch's samples is shuffled apart.
  std::int64_t samples_before_final_epoch = 0;
  if (out.epochs > 1) {
    samples_before_final_epoch = ((out.epochs - 1) * out.tokens_per_epoch - extra) / o.seq_length;
    std::int64_t const from_final = *o.num_samples - samples_before_final_epoch;
    std::int64_t const per_epoch = (out.tokens_per_epoch - extra) / o.seq_length;
    if (from_final < 0 || from_final > per_epoch + 1)
      throw std::logic_error("megamoe: GPT dataset epochs inconsistent with the samples asked");
    out.separate_final_epoch =
        from_final < static_cast<std::int64_t>(0.80 * static_cast<double>(per_epoch));
  }

  numpy_random_state rng(o.seed);
  // Document index: the split's sequence ids once per epoch, shuffled.
  auto const repeat_shuffled = [&](std::int64_t epochs) {
    std::vector<std::int32_t> ids;
    ids.reserve(static_cast<std::size_t>(epochs * (end - begin)));
    for (std::int64_t e = 0; e < epochs; ++e)
      for (std::int64_t i = begin; i < end; ++i) ids.push_back(static_cast<std::int32_t>(i));
    rng.shuffle(std::span(ids));
    return ids;
  };
  std::vector<std::int32_t> doc;
  if (!out.separate_final_epoch) {
    doc = repeat_shuffled(out.epochs);
  } else {
    doc = repeat_shuffled(out.epochs - 1);
    auto const last = repeat_shuffled(1);
    doc.insert(doc.end(), last.begin(), last.end());
  }

  // Sample index: where each sample of seq_length + extra tokens starts.
  std::int64_t const total = out.epochs * out.tokens_per_epoch - extra;
  std::int64_t const samples =
      o.drop_last ? total / o.seq_length
                  : static_cast<std::int64_t>(
                        std::ceil(static_cast<float>(total) / static_cast<float>(o.seq_length)));
  auto const last_position = static_cast<std::int64_t>(doc.size()) - 1;
  auto const rows = [&]<class T>(std::vector<T> index) {
    index.assign(static_cast<std::size_t>(2 * (samples + 1)), 0);
    std::int64_t d = 0, offset = 0;
    for (std::int64_t s = 1; s <= samples; ++s) {
      std::int64_t remaining = o.seq_length + extra;
      while (remaining != 0) {
        std::int64_t const length = lengths[static_cast<std::size_t>(doc[d])] - offset;
        remaining -= length;
        if (remaining <= 0) {
          offset += remaining + length - extra;  // the next sample starts on this one's extra token
          remaining = 0;
        } else if (d == last_position) {  // out of data: only without drop_last
          offset = lengths[static_cast<std::size_t>(doc[d])] - extra;
          break;
        } else {
          ++d;
          offset = 0;
        }
      }
      index[static_cast<std::size_t>(2 * s)] = static_cast<T>(d);
      index[static_cast<std::size_t>(2 * s + 1)] = static_cast<T>(offset);
    }
    return index_array(std::move(index));
  };
  // int32 unless a position or a sequence length does not fit (the reference's rule).
  std::int64_t const longest =
      lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  bool const wide = std::max(static_cast<std::int64_t>(doc.size()), longest) > INT32_MAX;
  out.sample_index = wide ? rows(std::vector<std::int64_t>()) : rows(std::vector<std::int32_t>());
  out.document_index = index_array(std::move(doc));

  // Shuffle index, the same generator continued: uint32 below 2^32 - 2 samples.
  std::int64_t const first = out.separate_final_epoch ? samples_before_final_epoch : samples;
  auto const shuffled = [&]<class T>(std::vector<T> ids) {
    ids.resize(static_cast<std::size_t>(samples));
    std::iota(ids.begin(), ids.end(), T{0});
    rng.shuffle(std::span(ids).first(static_cast<std::size_t>(first)));
    if (first != samples) rng.shuffle(std::span(ids).subspan(static_cast<std::size_t>(first)));
    return index_array(std::move(ids));
  };
  out.shuffle_index = samples < std::int64_t{UINT32_MAX} - 1
                          ? shuffled(std::vector<std::uint32_t>())
                          : shuffled(std::vector<std::int64_t>());
  return out;
}

MEGAMOE_DECL gpt_sample query_sample(indexed_dataset const& dataset, gpt_indices const& indices,
                                     gpt_dataset_options const& o, std::int64_t index,
                                     std::int64_t pad) {
  gpt_sample out;
  query_sample(dataset, indices, o, index, pad, out);
  return out;
}

MEGAMOE_DECL void query_sample(indexed_dataset const& dataset, gpt_indices const& indices,
                               gpt_dataset_options const& o, std::int64_t index, std::int64_t pad,
                               gpt_sample& out) {
  if (index < 0 || index >= indices.size())
    throw std::out_of_range("GPT dataset: sample " + std::to_string(index) + " of " +
                            std::to_string(indices.size()));
  std::int64_t const extra = o.add_extra_token ? 1 : 0;
  // Every index value is checked before it is used: a cache file is mapped, not verified.
  auto const damaged = [] {
    return input_error(
        "GPT dataset: an index value out of range (a damaged --data-cache-path "
        "file? remove it to rebuild)");
  };
  auto const j = static_cast<std::uint64_t>(indices.shuffle_index[static_cast<std::size_t>(index)]);
  if (j + 1 >= indices.sample_index.size() / 2) throw damaged();
  std::int64_t const d0 = indices.sample_index[2 * j], o0 = indices.sample_index[2 * j + 1];
  std::int64_t const d1 = indices.sample_index[2 * j + 2], o1 = indices.sample_index[2 * j + 3];
  auto const positions = static_cast<std::int64_t>(indices.document_index.size());
  if (d0 < 0 || d1 < d0 || d1 >= positions || o0 < 0 || o1 < 0) throw damaged();
  auto const sequence = [&](std::int64_t d) {
    auto const id = indices.document_index[static_cast<std::size_t>(d)];
    if (id < 0 || id >= dataset.sequence_count()) throw damaged();
    return id;
  };
  if (o0 > dataset.sequence_length(sequence(d0)) ||
      o1 + extra > dataset.sequence_length(sequence(d1)) || (d0 == d1 && o1 < o0))
    throw damaged();
  out.text.clear();
  out.document_ids.clear();
  auto const append = [&](std::int64_t d, std::int64_t from, std::optional<std::int64_t> count) {
    auto const id = sequence(d);
    auto const n = count.value_or(dataset.sequence_length(id) - from);
    auto const at = out.text.size();
    out.text.resize(at + static_cast<std::size_t>(n));
    dataset.read(id, from, std::span(out.text).subspan(at));
    out.document_ids.push_back(id);
  };
  if (d0 == d1) {
    append(d0, o0, o1 - o0 + extra);
  } else {
    append(d0, o0, std::nullopt);
    for (std::int64_t d = d0 + 1; d < d1; ++d) append(d, 0, std::nullopt);
    append(d1, 0, o1 + extra);
  }
  out.text.resize(static_cast<std::size_t>(std::max<std::int64_t>(
                      static_cast<std::int64_t>(out.text.size()), o.seq_length + extra)),
                  pad);
}

MEGAMOE_DECL gpt_item make_item(std::span<std::int64_t const> text, gpt_item_options const& o) {
  gpt_item out;
  if (o.add_extra_token) {
    if (text.empty()) throw std::logic_error("megamoe: an empty sample");
    out.tokens.assign(text.begin(), text.end() - 1);
    out.labels.assign(text.begin() + 1, text.end());
  } else {
    out.tokens.assign(text.begin(), text.end());
    out.labels.assign(text.begin(), text.end());
    if (!out.labels.empty()) {
      std::rotate(out.labels.begin(), out.labels.begin() + 1, out.labels.end());
      out.labels.back() = o.pad;
    }
  }
  auto const n = static_cast<std::int64_t>(out.tokens.size());
  out.loss_mask.assign(static_cast<std::size_t>(n), 1.0f);
  out.position_ids.resize(static_cast<std::size_t>(n));
  out.attention_row_start.assign(static_cast<std::size_t>(n), 0);
  std::int64_t last_eod = -1;  // the last end of document before the current position
  for (std::int64_t r = 0; r < n; ++r) {
    auto const i = static_cast<std::size_t>(r);
    out.position_ids[i] = o.reset_position_ids ? r - (last_eod + 1) : r;
    if (o.reset_attention_mask) out.attention_row_start[i] = last_eod + 1;
    if (out.tokens[i] == o.eod) {
      if (o.eod_mask_loss) out.loss_mask[i] = 0.0f;
      last_eod = r;
    }
    if (out.labels[i] == o.pad) out.loss_mask[i] = 0.0f;
  }
  for (auto& t : out.tokens)
    if (t == o.pad) t = 0;
  for (auto& t : out.labels)
    if (t == o.pad) t = 0;
  return out;
}

}  // namespace megamoe::data
