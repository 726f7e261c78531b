// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/pipeline_schedule.ipp — the definitions behind pipeline_schedule.hpp that depend
// on no configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/pipeline_schedule.hpp>

namespace megamoe::parallel {

MEGAMOE_DECL pipeline_layout pipeline_layout::split(int layers, int pp, int vpp,
                                                    std::optional<int> first,
                                                    std::optional<int> last) {
  int const stages = pp * vpp;
  auto broken = [&](std::string const& why) {
    return config_error(rules::id::pipeline_stages_divide_layers,
                        std::to_string(layers) + " layers, PP " + std::to_string(pp) + " x V " +
                            std::to_string(vpp) + ": " + why);
  };
  if (pp < 1 || vpp < 1) throw broken("PP and V must be at least 1");
  if (vpp > 1 && pp == 1) throw broken("virtual stages need PP above 1");
  if ((first && *first < 0) || (last && *last < 0)) throw broken("negative stage layer count");
  if ((first || last) && stages == 1) throw broken("first / last stage counts need PP above 1");
  pipeline_layout out;
  out.pp_ = pp;
  out.vpp_ = vpp;
  out.layers_.assign(static_cast<std::size_t>(stages), 0);
  int rest = layers, others = stages;
  if (first) {
    out.layers_.front() = *first;
    rest -= *first;
    --others;
  }
  if (last) {
    out.layers_.back() = *last;
    rest -= *last;
    --others;
  }
  if (rest < 0) throw broken("the first and last stages take more layers than there are");
  if (others == 0 ? rest != 0 : rest % others != 0)
    throw broken(std::to_string(rest) + " layers do not split evenly over " +
                 std::to_string(others) + " stages");
  for (int j = first ? 1 : 0; j < stages - (last ? 1 : 0); ++j)
    out.layers_[static_cast<std::size_t>(j)] = rest / others;
  return out;
}

MEGAMOE_DECL pipeline_layout pipeline_layout::parse(std::string_view text, int layers, int pp) {
  auto broken = [&](std::string const& why) {
    return config_error(rules::id::pipeline_stages_divide_layers,
                        "--pipeline-model-parallel-layout \"" + std::string(text) + "\" (" +
                            std::to_string(layers) + " layers, PP " + std::to_string(pp) +
                            "): " + why);
  };
  std::size_t at = 0;
  // A sequence of items up to `close` (')' or the end), each repeated by a following "*n".
  auto sequence = [&](auto&& self, char close) -> std::string {
    std::string out;
    while (at < text.size() && text[at] != close) {
      char const c = text[at++];
      std::string item;
      if (c == ',' || c == ' ') continue;
      if (c == '(') {
        item = self(self, ')');
        if (at >= text.size()) throw broken("an unclosed '('");
        ++at;
      } else if (c == 'E' || c == 't' || c == 'L' || c == '|') {
        item = std::string(1, c);
      } else if (c == 'm') {
        throw broken("'m' (multi-token prediction) is not part of this model");
      } else {
        throw broken(std::string("unexpected '") + c + "'");
      }
      int times = 1;
      if (at < text.size() && text[at] == '*') {
        std::size_t digits = ++at;
        while (at < text.size() && text[at] >= '0' && text[at] <= '9') ++at;
        if (at == digits || at - digits > 6) throw broken("'*' needs a count");
        times = std::stoi(std::string(text.substr(digits, at - digits)));
      }
      for (int i = 0; i < times; ++i) out += item;
    }
    return out;
  };
  std::string const flat = sequence(sequence, '\0');
  if (at < text.size()) throw broken("an unmatched ')'");
  std::vector<std::string> stages(1);
  for (char c : flat) {
    if (c == '|')
      stages.emplace_back();
    else
      stages.back() += c;
  }
  int const count = static_cast<int>(stages.size());
  if (pp < 1 || count % pp != 0)
    throw broken(std::to_string(count) + " stages are not a multiple of PP");
  pipeline_layout out;
  out.pp_ = pp;
  out.vpp_ = count / pp;
  out.layers_.clear();
  int total = 0;
  for (int j = 0; j < count; ++j) {
    auto const& stage = stages[static_cast<std::size_t>(j)];
    auto const e = stage.find('E'), l = stage.find('L');
    if ((j == 0) != (e == 0) ||
        stage.find('E', e == std::string::npos ? 0 : e + 1) != std::string::npos)
      throw broken("'E' must open the first stage, once");
    if ((j == count - 1) != (l != std::string::npos && l + 1 == stage.size()) ||
        stage.find('L') != stage.rfind('L'))
      throw broken("'L' must close the last stage, once");
    int const t = static_cast<int>(std::count(stage.begin(), stage.end(), 't'));
    out.layers_.push_back(t);
    total += t;
  }
  if (total != layers)
    throw broken("the stages hold " + std::to_string(total) + " layers, the model has " +
                 std::to_string(layers));
  return out;
}

MEGAMOE_DECL pipeline_layout pipeline_layout::of(int layers, int pp, std::string_view text,
                                                 std::optional<int> vpp, std::optional<int> first,
                                                 std::optional<int> last) {
  if (text.empty()) return split(layers, pp, vpp.value_or(1), first, last);
  if (first || last)
    throw config_error(rules::id::pipeline_stages_divide_layers,
                       "--pipeline-model-parallel-layout goes without the first and last "
                       "stages' layer counts");
  auto out = parse(text, layers, pp);
  if (vpp && *vpp != out.vpp())
    throw config_error(rules::id::pipeline_stages_divide_layers,
                       "V " + std::to_string(*vpp) + " but the layout has " +
                           std::to_string(out.vpp()) + " stages per pipeline rank");
  return out;
}

MEGAMOE_DECL int pipeline_layout::first_layer(int stage) const {
  int first = 0;
  for (int j = 0; j < stage; ++j) first += layers_[static_cast<std::size_t>(j)];
  return first;
}

MEGAMOE_DECL void check_micro_batches(pipeline_shape const& s) {
  if (s.pp == 1) return;
  if (s.micro_batches < s.pp || (s.vpp > 1 && s.micro_batches % s.pp != 0))
    throw config_error(rules::id::pipeline_micro_batches,
                       std::to_string(s.micro_batches) + " micro-batches per step, PP " +
                           std::to_string(s.pp) + ", V " + std::to_string(s.vpp));
}

MEGAMOE_DECL std::vector<pipeline_op> one_f_one_b::ops(pipeline_shape const& s) {
  int const M = s.micro_batches, warmup = std::min(s.pp - s.rank - 1, M);
  std::vector<pipeline_op> out;
  out.reserve(2 * static_cast<std::size_t>(M));
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back({pipeline_op::forward, f, 0});
  while (f < M) {
    out.push_back({pipeline_op::forward, f++, 0});
    out.push_back({pipeline_op::backward, b++, 0});
  }
  while (b < M) out.push_back({pipeline_op::backward, b++, 0});
  return out;
}

namespace detail {

MEGAMOE_DECL std::vector<pipeline_op> interleaved_ops(pipeline_shape const& s, int extra,
                                                      bool merge) {
  int const P = s.pp, V = s.vpp, total = s.micro_batches * V;
  auto micro_batch = [&](int k) { return (k / (P * V)) * P + k % P; };
  auto chunk = [&](int k) { return (k / P) % V; };
  int const warmup =
      s.micro_batches == P ? total : std::min(2 * (P - s.rank - 1) + (V - 1) * P + extra, total);
  std::vector<pipeline_op> out;
  out.reserve(2 * static_cast<std::size_t>(total));
  int f = 0, b = 0;
  auto forward = [&](bool merged) {
    out.push_back({pipeline_op::forward, micro_batch(f), chunk(f), merged});
    ++f;
  };
  auto backward = [&] {
    out.push_back({pipeline_op::backward, micro_batch(b), V - 1 - chunk(b)});
    ++b;
  };
  while (f < warmup) forward(false);
  while (f < total) {
    forward(merge);
    backward();
  }
  while (b < total) backward();
  return out;
}

}  // namespace detail

MEGAMOE_DECL std::vector<pipeline_op> interleaved_one_f_one_b::ops(pipeline_shape const& s) {
  return detail::interleaved_ops(s, 0, false);
}

MEGAMOE_DECL std::vector<pipeline_op> merged_one_f_one_b::ops(pipeline_shape const& s) {
  if (s.pp > 1 && s.vpp == 1)
    throw config_error(rules::id::merged_schedule_needs_interleaving,
                       "PP " + std::to_string(s.pp) + ", V 1");
  return detail::interleaved_ops(s, 1, true);
}

MEGAMOE_DECL void repeated_forwards(std::span<pipeline_op const> ops, int vpp,
                                    std::vector<char>& out) {
  std::vector<int> last(static_cast<std::size_t>(vpp), -1);
  out.assign(ops.size(), 0);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    int& held = last[static_cast<std::size_t>(ops[i].chunk)];
    if (ops[i].kind == pipeline_op::backward && held != ops[i].micro_batch) out[i] = 1;
    held = ops[i].micro_batch;
  }
}

}  // namespace megamoe::parallel
