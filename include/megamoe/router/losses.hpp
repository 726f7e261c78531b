// SPDX-License-Identifier: Apache-2.0
// megamoe/router/losses.hpp — the losses a router attaches: the load-balancing losses (aux over
// the micro-batch, seq-aux per sequence, global-aux over the global batch so far) on their own
// scores and top-k, and the z-loss on the logits; forward and backward.
//
// The aux losses score every expert without group limits, expert bias or capacity (softmax, or the
// sigmoid-family score normalised over E), take their own top-k, sum the counts over TPxCP
// (global-aux: TPxDPxCP) and weigh the column sums of the scores by them (the switch loss,
// coeff * E / (k * T_tot^2) * sum_e P_e c_e). Padding tokens count in none of them.
#pragma once

#include <megamoe/core/tensor.hpp>
#include <megamoe/router/expert_bias.hpp>
#include <megamoe/router/groups.hpp>
#include <megamoe/router/output.hpp>
#include <megamoe/router/plan.hpp>
#include <megamoe/router/scores.hpp>
#include <megamoe/router/tags.hpp>
#include <megamoe/router/top_k.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace megamoe::router {

/// True when any load-balancing loss is on.
constexpr bool any_aux_loss(settings const& s) {
  auto on = [](std::optional<double> c) { return c && *c > 0.0; };
  return on(s.aux_loss_coeff) || on(s.seq_aux_loss_coeff) || on(s.global_aux_loss_coeff);
}

/// The attached losses of one router: what their forwards keep for their backwards, reused across
/// calls. L: the router dtype; S: the score type.
template <class L, class S>
class attached_losses {
 public:
  /// The aux losses' own scores [T,E] and top-k map of the last forward (padding rows 0).
  [[nodiscard]] row_matrix<S> const& aux_scores() const noexcept { return aux_scores_; }
  [[nodiscard]] mask_matrix const& aux_routing_map() const noexcept { return aux_map_; }

  /// z-loss: coeff / TPxCP times the mean over valid tokens of logsumexp(z)^2.
  void forward_z(row_matrix<L> const& logits, std::span<std::uint8_t const> valid, int valid_tokens,
                 double coeff, int tp_cp_size, loss_values& out) {
    auto const T = logits.rows(), E = logits.cols();
    lse_.resize(T);
    double sum = 0.0;
    for (Eigen::Index t = 0; t < T; ++t) {
      L const* z = &logits(t, 0);
      L m = z[0];
      for (Eigen::Index e = 1; e < E; ++e) m = std::max(m, z[e]);
      L s = 0;
      for (Eigen::Index e = 0; e < E; ++e) s += std::exp(z[e] - m);
      lse_(t) = m + std::log(s);
      if (valid[static_cast<std::size_t>(t)]) sum += static_cast<double>(lse_(t) * lse_(t));
    }
    double const mean = sum / std::max(valid_tokens, 1);
    double const scaled = coeff / tp_cp_size;
    z_factor_ = scaled / std::max(valid_tokens, 1);
    out.z_loss = attached_loss{mean * scaled, mean};
  }

  /// Adds scale times the z-loss's gradient to `grad` [T,E].
  void backward_z(row_matrix<L> const& logits, std::span<std::uint8_t const> valid, double scale,
                  row_matrix<L>& grad) const {
    auto const T = logits.rows(), E = logits.cols();
    for (Eigen::Index t = 0; t < T; ++t) {
      if (!valid[static_cast<std::size_t>(t)]) continue;
      L const factor = static_cast<L>(scale * z_factor_ * 2.0) * lse_(t);
      for (Eigen::Index e = 0; e < E; ++e) grad(t, e) += factor * std::exp(logits(t, e) - lse_(t));
    }
  }

  /// The load-balancing losses of the routing plan P's score family: scores, own top-k, counts
  /// reduced over the groups, then each loss that is on; the global-aux running mean lives in
  /// `state` (a training pass adds to it, a recompute only reads it).
  template <route_plan P, class TpCp, class TpDpCp>
  void forward_aux(row_matrix<L> const& logits, std::span<std::uint8_t const> valid, bool has_mask,
                   batch_shape batch, settings const& s, pass mode,
                   reduction_groups<TpCp, TpDpCp> const& groups, router_state& state,
                   loss_values& out) {
    int const T = static_cast<int>(logits.rows()), E = static_cast<int>(logits.cols());
    int const k = s.top_k, B = batch.micro_batch_size, Sq = batch.seq_length;
    experts_ = E;
    top_k_ = k;
    aux_scores_.setZero(T, E);
    aux_map_.setZero(T, E);
    idx_.resize(static_cast<std::size_t>(k));
    counts_.assign(static_cast<std::size_t>(E), 0.0);
    seq_counts_.assign(static_cast<std::size_t>(B * E), 0.0);
    for (int t = 0; t < T; ++t) {
      if (!valid[static_cast<std::size_t>(t)]) continue;
      S* row = &aux_scores_(t, 0);
      row_scores<P>(&logits(t, 0), row);
      kernels::top_k(std::span<S const>(row, static_cast<std::size_t>(E)), k, idx_.data());
      for (int e : idx_) {
        aux_map_(t, e) = 1;
        counts_[static_cast<std::size_t>(e)] += 1.0;
        seq_counts_[static_cast<std::size_t>((t % B) * E + e)] += 1.0;
      }
    }
    // Column sums of the aux scores: per expert, and per (sequence, expert).
    probs_sum_.assign(static_cast<std::size_t>(E), 0.0);
    seq_probs_sum_.assign(static_cast<std::size_t>(B * E), 0.0);
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        double const v = static_cast<double>(aux_scores_(t, e));
        probs_sum_[static_cast<std::size_t>(e)] += v;
        seq_probs_sum_[static_cast<std::size_t>((t % B) * E + e)] += v;
      }
    aux_weight_.assign(static_cast<std::size_t>(E), 0.0);
    global_weight_.assign(static_cast<std::size_t>(E), 0.0);
    seq_weight_.assign(static_cast<std::size_t>(B * E), 0.0);

    if (s.aux_loss_coeff && *s.aux_loss_coeff > 0.0) {
      double const coeff = *s.aux_loss_coeff;
      reduced_.assign(counts_.begin(), counts_.end());
      groups.tp_cp.sum(reduced_);
      double const tokens_total =
          has_mask ? total(reduced_) / k : static_cast<double>(T) * groups.tp_cp.size();
      double const factor = switch_factor(coeff, tokens_total);
      double const loss = factor * dot(probs_sum_, reduced_);
      out.aux_loss = attached_loss{loss, loss / coeff};
      for (int e = 0; e < E; ++e)
        aux_weight_[static_cast<std::size_t>(e)] += factor * reduced_[static_cast<std::size_t>(e)];
    }
    if (s.global_aux_loss_coeff && *s.global_aux_loss_coeff > 0.0) {
      double const coeff = *s.global_aux_loss_coeff;
      reduced_.assign(counts_.begin(), counts_.end());
      groups.tp_dp_cp.sum(reduced_);
      double const tokens_total =
          has_mask ? total(reduced_) / k : static_cast<double>(T) * groups.tp_dp_cp.size();
      if (mode == pass::training || state.global_aux_steps == 0) {
        for (int e = 0; e < E; ++e)
          state.global_tokens_per_expert[static_cast<std::size_t>(e)] +=
              reduced_[static_cast<std::size_t>(e)];
        ++state.global_aux_steps;
      }
      average_.assign(state.global_tokens_per_expert.begin(), state.global_tokens_per_expert.end());
      for (double& a : average_) a /= state.global_aux_steps;
      double const factor = switch_factor(coeff, tokens_total);
      double const loss = factor * dot(probs_sum_, average_);
      out.global_aux_loss = attached_loss{loss, loss / coeff};
      for (int e = 0; e < E; ++e)
        global_weight_[static_cast<std::size_t>(e)] =
            factor * average_[static_cast<std::size_t>(e)];
    }
    if (s.seq_aux_loss_coeff && *s.seq_aux_loss_coeff > 0.0) {
      double const coeff = *s.seq_aux_loss_coeff;
      reduced_.assign(seq_counts_.begin(), seq_counts_.end());
      groups.tp_cp.sum(reduced_);
      double const tokens_total = has_mask ? total(reduced_) / (static_cast<double>(k) * B)
                                           : static_cast<double>(Sq) * groups.tp_cp.size();
      double const factor = switch_factor(coeff, tokens_total) / B;
      double const loss = factor * dot(seq_probs_sum_, reduced_);
      out.seq_aux_loss = attached_loss{loss, loss / coeff};
      for (std::size_t i = 0; i < reduced_.size(); ++i) seq_weight_[i] = factor * reduced_[i];
    }
  }

  /// Adds scale times the gradients of the aux losses `terms` selects to `grad` [T,E].
  template <route_plan P>
  void backward_aux(row_matrix<L> const& logits, std::span<std::uint8_t const> valid,
                    batch_shape batch, double scale, gradient_terms terms, row_matrix<L>& grad) {
    int const T = static_cast<int>(logits.rows()), E = static_cast<int>(logits.cols());
    int const B = batch.micro_batch_size;
    if (!terms.aux_loss && !terms.seq_aux_loss && !terms.global_aux_loss) return;
    double const aux_on = terms.aux_loss ? 1.0 : 0.0, global_on = terms.global_aux_loss ? 1.0 : 0.0;
    double const seq_on = terms.seq_aux_loss ? 1.0 : 0.0;
    ds_.resize(static_cast<std::size_t>(E));
    raw_.resize(static_cast<std::size_t>(E));
    for (int t = 0; t < T; ++t) {
      if (!valid[static_cast<std::size_t>(t)]) continue;
      for (int e = 0; e < E; ++e)
        ds_[static_cast<std::size_t>(e)] = static_cast<S>(
            scale * (aux_on * aux_weight_[static_cast<std::size_t>(e)] +
                     global_on * global_weight_[static_cast<std::size_t>(e)] +
                     seq_on * seq_weight_[static_cast<std::size_t>((t % B) * E + e)]));
      L const* z = &logits(t, 0);
      if constexpr (P.softmax_family()) {
        S const* sc = &aux_scores_(t, 0);
        S const d = kernels::dot(sc, ds_.data(), E);
        for (int e = 0; e < E; ++e)
          grad(t, e) += static_cast<L>(sc[e] * (ds_[static_cast<std::size_t>(e)] - d));
      } else {
        S sum = 0;
        for (int e = 0; e < E; ++e) {
          raw_[static_cast<std::size_t>(e)] = kernels::score<P.score>(static_cast<S>(z[e]));
          sum += raw_[static_cast<std::size_t>(e)];
        }
        sum += static_cast<S>(1e-20);
        S const weighted = kernels::dot(raw_.data(), ds_.data(), E);
        for (int e = 0; e < E; ++e) {
          S const dr = ds_[static_cast<std::size_t>(e)] / sum - weighted / (sum * sum);
          grad(t, e) +=
              static_cast<L>(dr * kernels::score_derivative<P.score>(
                                      static_cast<S>(z[e]), raw_[static_cast<std::size_t>(e)]));
        }
      }
    }
  }

 private:
  /// A row's aux scores: softmax, or the sigmoid-family score normalised over E.
  template <route_plan P>
  void row_scores(L const* z, S* out) const {
    int const E = experts_;
    if constexpr (P.softmax_family()) {
      kernels::softmax(z, E, out);
    } else {
      S sum = 0;
      for (int e = 0; e < E; ++e) {
        out[e] = kernels::score<P.score>(static_cast<S>(z[e]));
        sum += out[e];
      }
      sum += static_cast<S>(1e-20);
      for (int e = 0; e < E; ++e) out[e] /= sum;
    }
  }

  /// coeff * E / (k * T_tot^2): the switch loss's factor on sum_e P_e c_e.
  double switch_factor(double coeff, double tokens_total) const {
    if (tokens_total <= 0.0) return 0.0;
    return coeff * experts_ / (top_k_ * tokens_total * tokens_total);
  }
  static double dot(std::vector<double> const& a, std::vector<double> const& b) {
    double r = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) r += a[i] * b[i];
    return r;
  }
  static double total(std::vector<double> const& c) {
    double r = 0.0;
    for (double x : c) r += x;
    return r;
  }

  int experts_ = 0, top_k_ = 1;
  Eigen::Matrix<L, Eigen::Dynamic, 1> lse_;
  double z_factor_ = 0.0;
  row_matrix<S> aux_scores_;
  mask_matrix aux_map_;
  std::vector<int> idx_;
  std::vector<double> counts_, seq_counts_, probs_sum_, seq_probs_sum_, reduced_, average_;
  std::vector<double> aux_weight_, global_weight_, seq_weight_;
  std::vector<S> ds_, raw_;
};

}  // namespace megamoe::router
