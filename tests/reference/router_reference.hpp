// SPDX-License-Identifier: Apache-2.0
// A plain re-statement of the reference router's forward (docs/spec/megatron_moe.md §2a, §2b) in
// double precision, written from the spec and sharing no code with include/megamoe/router: nested
// vectors, full sorts, one formula per line. Tests compare megamoe's router with it in the modes
// the reference vectors do not cover.
#pragma once

#include <megamoe/router/tags.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

namespace megamoe::reference {

using table = std::vector<std::vector<double>>;

struct router_result {
  table probs;                          // [T][E]
  std::vector<std::vector<int>> map;    // [T][E]
  std::vector<long> tokens_per_expert;  // [E]
  std::optional<double> aux_loss, seq_aux_loss, global_aux_loss, z_loss;
};

/// State carried over micro-batches: the global-aux sums.
struct router_memory {
  std::vector<double> global_counts;
  int steps = 0;
};

/// The k largest entries of v, largest first, ties to the lower index (full sort).
inline std::vector<int> largest(std::vector<double> const& v, int k) {
  std::vector<int> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return v[static_cast<std::size_t>(a)] != v[static_cast<std::size_t>(b)]
               ? v[static_cast<std::size_t>(a)] > v[static_cast<std::size_t>(b)]
               : a < b;
  });
  order.resize(static_cast<std::size_t>(k));
  return order;
}

inline std::vector<double> softmax_of(std::vector<double> const& z) {
  double const m = *std::max_element(z.begin(), z.end());
  std::vector<double> out(z.size());
  double sum = 0;
  for (std::size_t i = 0; i < z.size(); ++i) sum += out[i] = std::exp(z[i] - m);
  for (double& x : out) x /= sum;
  return out;
}

inline double raw_score(router::score_function f, double z) {
  if (f == router::score_function::sigmoid) return 1.0 / (1.0 + std::exp(-z));
  double const softplus = z > 20.0 ? z : std::log(1.0 + std::exp(z));
  return std::sqrt(softplus);
}

/// Top-k of `sel`, restricted to the best group_top_k groups when groups are on.
inline std::vector<int> choose(std::vector<double> const& sel, router::settings const& s) {
  int const E = static_cast<int>(sel.size());
  if (s.group_top_k <= 0) return largest(sel, s.top_k);
  int const size = E / s.num_groups;
  std::vector<double> group_score(static_cast<std::size_t>(s.num_groups));
  for (int g = 0; g < s.num_groups; ++g) {
    std::vector<double> members(sel.begin() + g * size, sel.begin() + (g + 1) * size);
    for (int i : largest(members, s.top_k / s.group_top_k))
      group_score[static_cast<std::size_t>(g)] += members[static_cast<std::size_t>(i)];
  }
  std::vector<double> masked(sel.size(), -std::numeric_limits<double>::infinity());
  for (int g : largest(group_score, s.group_top_k))
    for (int e = g * size; e < (g + 1) * size; ++e)
      masked[static_cast<std::size_t>(e)] = sel[static_cast<std::size_t>(e)];
  return largest(masked, s.top_k);
}

/// One training forward on one rank. `padding[t]` true = padding token.
inline router_result route(table const& z, router::settings const& s, int B,
                           std::vector<float> const& bias, std::vector<bool> const& padding,
                           router_memory& memory) {
  int const T = static_cast<int>(z.size());
  int const E = static_cast<int>(z[0].size());
  int const k = s.top_k;
  int const S = T / B;
  double const scale = s.topk_scaling_factor.value_or(1.0);
  auto valid = [&](int t) { return padding.empty() || !padding[static_cast<std::size_t>(t)]; };
  router_result r;
  r.probs.assign(static_cast<std::size_t>(T),
                 std::vector<double>(static_cast<std::size_t>(E), 0.0));
  r.map.assign(static_cast<std::size_t>(T), std::vector<int>(static_cast<std::size_t>(E), 0));

  for (int t = 0; t < T; ++t) {
    auto const& zt = z[static_cast<std::size_t>(t)];
    std::vector<int> chosen;
    std::vector<double> p(static_cast<std::size_t>(k));
    if (s.score == router::score_function::softmax_after_topk) {
      chosen = choose(zt, s);
      std::vector<double> v;
      for (int e : chosen) v.push_back(zt[static_cast<std::size_t>(e)]);
      p = softmax_of(v);
    } else if (s.score == router::score_function::softmax_before_topk) {
      auto const probs = softmax_of(zt);
      chosen = choose(probs, s);
      for (int i = 0; i < k; ++i)
        p[static_cast<std::size_t>(i)] =
            probs[static_cast<std::size_t>(chosen[static_cast<std::size_t>(i)])];
    } else {
      std::vector<double> raw(static_cast<std::size_t>(E)), sel(static_cast<std::size_t>(E));
      for (int e = 0; e < E; ++e) {
        raw[static_cast<std::size_t>(e)] = raw_score(s.score, zt[static_cast<std::size_t>(e)]);
        sel[static_cast<std::size_t>(e)] = raw[static_cast<std::size_t>(e)] +
                                           (bias.empty() ? 0.0 : bias[static_cast<std::size_t>(e)]);
      }
      chosen = choose(sel, s);
      double sum = 1e-20;
      for (int e : chosen) sum += raw[static_cast<std::size_t>(e)];
      for (int i = 0; i < k; ++i) {
        double const q = raw[static_cast<std::size_t>(chosen[static_cast<std::size_t>(i)])];
        p[static_cast<std::size_t>(i)] = k > 1 ? q / sum : q;
      }
    }
    for (int i = 0; i < k; ++i) {
      auto const e = static_cast<std::size_t>(chosen[static_cast<std::size_t>(i)]);
      r.probs[static_cast<std::size_t>(t)][e] = p[static_cast<std::size_t>(i)] * scale;
      r.map[static_cast<std::size_t>(t)][e] = 1;
    }
  }

  if (s.capacity_factor) {
    int const C = static_cast<int>(std::ceil(static_cast<double>(T) * k / E * *s.capacity_factor));
    for (int e = 0; e < E; ++e) {
      std::vector<int> order(static_cast<std::size_t>(T));
      std::iota(order.begin(), order.end(), 0);
      auto key = [&](int t) {
        return s.token_drop_policy == router::drop_policy::probs
                   ? r.probs[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)]
                   : static_cast<double>(
                         r.map[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)]);
      };
      std::sort(order.begin(), order.end(),
                [&](int a, int b) { return key(a) != key(b) ? key(a) > key(b) : a < b; });
      std::vector<int> mask(static_cast<std::size_t>(T), C >= T ? 1 : 0);
      for (int i = 0; i < std::min(C, T); ++i)
        mask[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = 1;
      for (int t = 0; t < T; ++t) {
        auto& m = r.map[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)];
        m = s.pad_to_capacity ? mask[static_cast<std::size_t>(t)]
                              : (m && mask[static_cast<std::size_t>(t)]);
        if (!m) r.probs[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)] = 0.0;
      }
    }
  }
  r.tokens_per_expert.assign(static_cast<std::size_t>(E), 0);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e)
      r.tokens_per_expert[static_cast<std::size_t>(e)] +=
          r.map[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)];

  // Aux losses: own scores over all experts, own top-k, padding rows excluded.
  table a(static_cast<std::size_t>(T), std::vector<double>(static_cast<std::size_t>(E), 0.0));
  table m(static_cast<std::size_t>(T), std::vector<double>(static_cast<std::size_t>(E), 0.0));
  int valid_count = 0;
  for (int t = 0; t < T; ++t) {
    if (!valid(t)) continue;
    ++valid_count;
    auto const& zt = z[static_cast<std::size_t>(t)];
    std::vector<double> sc;
    if (s.score == router::score_function::softmax_after_topk ||
        s.score == router::score_function::softmax_before_topk) {
      sc = softmax_of(zt);
    } else {
      double sum = 1e-20;
      for (double x : zt) sum += raw_score(s.score, x);
      for (double x : zt) sc.push_back(raw_score(s.score, x) / sum);
    }
    a[static_cast<std::size_t>(t)] = sc;
    for (int e : largest(sc, k)) m[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)] = 1.0;
  }
  auto switch_loss = [&](double coeff, double tokens, double dot) {
    return coeff * E / (k * tokens * tokens) * dot;
  };
  bool const masked = !padding.empty();
  if (s.aux_loss_coeff && *s.aux_loss_coeff > 0) {
    double dot = 0, count = 0;
    for (int e = 0; e < E; ++e) {
      double P = 0, c = 0;
      for (int t = 0; t < T; ++t) {
        P += a[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)];
        c += m[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)];
      }
      dot += P * c;
      count += c;
    }
    r.aux_loss = switch_loss(*s.aux_loss_coeff, masked ? count / k : T, dot);
  }
  if (s.global_aux_loss_coeff && *s.global_aux_loss_coeff > 0) {
    memory.global_counts.resize(static_cast<std::size_t>(E), 0.0);
    double count = 0;
    for (int e = 0; e < E; ++e)
      for (int t = 0; t < T; ++t) {
        memory.global_counts[static_cast<std::size_t>(e)] +=
            m[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)];
        count += m[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)];
      }
    ++memory.steps;
    double dot = 0;
    for (int e = 0; e < E; ++e) {
      double P = 0;
      for (int t = 0; t < T; ++t) P += a[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)];
      dot += P * memory.global_counts[static_cast<std::size_t>(e)] / memory.steps;
    }
    r.global_aux_loss = switch_loss(*s.global_aux_loss_coeff, masked ? count / k : T, dot);
  }
  if (s.seq_aux_loss_coeff && *s.seq_aux_loss_coeff > 0) {
    // Mean over the B sequences of each sequence's own switch loss (token t = s*B + b).
    double total = 0;
    double count = 0;
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e)
        count += m[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)];
    double const tokens = masked ? count / (static_cast<double>(k) * B) : S;
    for (int b = 0; b < B; ++b) {
      double dot = 0;
      for (int e = 0; e < E; ++e) {
        double P = 0, c = 0;
        for (int q = 0; q < S; ++q) {
          P += a[static_cast<std::size_t>(q * B + b)][static_cast<std::size_t>(e)];
          c += m[static_cast<std::size_t>(q * B + b)][static_cast<std::size_t>(e)];
        }
        dot += P * c;
      }
      total += switch_loss(*s.seq_aux_loss_coeff, tokens, dot);
    }
    r.seq_aux_loss = total / B;
  }
  if (s.z_loss_coeff) {
    double sum = 0;
    for (int t = 0; t < T; ++t) {
      if (!valid(t)) continue;
      auto const& zt = z[static_cast<std::size_t>(t)];
      double const mx = *std::max_element(zt.begin(), zt.end());
      double se = 0;
      for (double x : zt) se += std::exp(x - mx);
      double const lse = mx + std::log(se);
      sum += lse * lse;
    }
    r.z_loss = *s.z_loss_coeff * sum / std::max(valid_count, 1);
  }
  return r;
}

}  // namespace megamoe::reference
