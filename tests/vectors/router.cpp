// SPDX-License-Identifier: Apache-2.0
// Files of kind "router": a Megatron-Core TopKRouter run on fixed inputs. megamoe builds a run-time
// router from the file's `config` (Megatron field names), routes every micro-batch from the stored
// logits, and compares probs, maps, counts, losses, gradients, the dense view, the aux-loss scores,
// the expert-bias state and the permutation block. Every field of the file must be checked.
#include "vectors/tensor_json.hpp"
#include "vectors/vector_file.hpp"

#include <megamoe/dispatch/permute.hpp>
#include <megamoe/router/capacity.hpp>
#include <megamoe/router/gating.hpp>
#include <megamoe/router/megatron_config.hpp>
#include <megamoe/router/router.hpp>

#include <string>
#include <vector>

namespace megamoe::vectors {
namespace {

constexpr double rtol = 1e-5, atol = 1e-7;  // fp32 values, losses and gradients
constexpr double sum_rtol = 1e-6;           // unpermute sums

template <class L>
row_matrix<L> sparse_of(row_matrix<L> const& dense_probs, row_matrix<int> const& indices,
                        int experts) {
  row_matrix<L> out = row_matrix<L>::Zero(dense_probs.rows(), experts);
  for (Eigen::Index t = 0; t < dense_probs.rows(); ++t)
    for (Eigen::Index i = 0; i < dense_probs.cols(); ++i) out(t, indices(t, i)) = dense_probs(t, i);
  return out;
}

template <class L>
double objective(row_matrix<L> const& probs, row_matrix<L> const& weights) {
  return (probs.template cast<double>().array() * weights.template cast<double>().array()).sum();
}

/// The permutation block: megamoe's permute/unpermute on the file's own map and probs.
template <class L>
void check_permutation(object_fields& f, mask_matrix const& map, row_matrix<L> const& probs,
                       comparer& cmp) {
  auto const hidden = matrix_of<float>(f.take("hidden"), "permutation.hidden");
  auto const weights = matrix_of<float>(f.take("unpermute_objective_weights"), "weights");
  bool const drop_and_pad = f.take("drop_and_pad").get<bool>();
  int const experts = static_cast<int>(map.cols());
  int capacity = 0;
  if (drop_and_pad) {
    // Every column of a drop-and-pad map holds the capacity.
    capacity = static_cast<int>(map.col(0).template cast<int>().sum());
  }
  dispatch::permutation p;
  dispatch::make_permutation(map, p, capacity);
  if (f.take("num_out_tokens").get<int>() != p.rows())
    throw mismatch("permutation.num_out_tokens: megamoe " + std::to_string(p.rows()));

  Eigen::Map<Eigen::VectorXi const> source(p.source_token.data(), p.rows());
  Eigen::Map<Eigen::VectorXi const> row_expert(p.row_expert.data(), p.rows());
  cmp.exact("permutation.sorted_indices", source,
            matrix_of<long>(f.take("sorted_indices"), "sorted_indices"));
  cmp.exact("permutation.row_expert", row_expert,
            matrix_of<long>(f.take("row_expert"), "row_expert"));

  row_matrix<float> rows;
  dispatch::permute(hidden, p, rows);
  cmp.exact("permutation.permuted_hidden", rows, matrix_of<float>(f.take("permuted_hidden"), "ph"));
  std::vector<L> row_probs;
  dispatch::permute_probs(probs, p, row_probs);
  Eigen::Map<Eigen::Matrix<L, Eigen::Dynamic, 1> const> row_probs_view(row_probs.data(), p.rows());
  cmp.exact("permutation.permuted_probs", row_probs_view,
            matrix_of<L>(f.take("permuted_probs"), "permuted_probs"));

  // Fake expert: y_j = rows_j * (1 + e).
  row_matrix<float> y = rows;
  for (int j = 0; j < p.rows(); ++j)
    y.row(j) *= static_cast<float>(1 + p.row_expert[static_cast<std::size_t>(j)]);
  row_matrix<float> with_probs;
  dispatch::unpermute(y, p, with_probs, std::span<L const>(row_probs));
  cmp.close("permutation.unpermuted_with_probs", with_probs,
            matrix_of<float>(f.take("unpermuted_with_probs"), "uwp"), sum_rtol, atol);
  // The training way: probs applied inside the expert (in the rows' type), unpermute without.
  row_matrix<float> y_weighted = y;
  for (int j = 0; j < p.rows(); ++j)
    y_weighted.row(j) = (y.row(j).template cast<L>() * row_probs[static_cast<std::size_t>(j)])
                            .template cast<float>();
  row_matrix<float> in_expert;
  dispatch::unpermute(y_weighted, p, in_expert);
  cmp.close("permutation.unpermuted_probs_in_expert", in_expert,
            matrix_of<float>(f.take("unpermuted_probs_in_expert"), "upie"), sum_rtol, atol);
  cmp.scalar_close("permutation.unpermute_objective",
                   (with_probs.cast<double>().array() * weights.cast<double>().array()).sum(),
                   f.take("unpermute_objective").get<double>(), rtol, 1e-6);

  // Gradients of sum(unpermute(y, probs) .* R2): the backward of unpermute is a gather (permute),
  // the backward of permute a scatter-add (unpermute).
  row_matrix<float> grad_rows;
  dispatch::permute(weights, p, grad_rows);  // d out / d weighted row j = R2[source j]
  row_matrix<float> grad_y = grad_rows;
  row_matrix<L> grad_probs = row_matrix<L>::Zero(map.rows(), experts);
  for (int j = 0; j < p.rows(); ++j) {
    auto const t = p.source_token[static_cast<std::size_t>(j)];
    auto const e = p.row_expert[static_cast<std::size_t>(j)];
    grad_probs(t, e) += static_cast<L>((y.row(j).template cast<double>().array() *
                                        grad_rows.row(j).template cast<double>().array())
                                           .sum());
    grad_y.row(j) = (grad_rows.row(j).template cast<L>() * row_probs[static_cast<std::size_t>(j)] *
                     static_cast<L>(1 + e))
                        .template cast<float>();
  }
  row_matrix<float> grad_hidden;
  dispatch::unpermute(grad_y, p, grad_hidden);
  cmp.close("permutation.grad_hidden", grad_hidden, matrix_of<float>(f.take("grad_hidden"), "gh"),
            sum_rtol, atol);
  cmp.close("permutation.grad_probs", grad_probs, matrix_of<L>(f.take("grad_probs"), "gp"), rtol,
            1e-6);

  if (f.has("pad_multiple")) {
    int const multiple = f.take("pad_multiple").get<int>();
    mask_matrix padded = map;
    router::pad_routing_map(padded, multiple);
    cmp.exact("permutation.padded_routing_map", padded,
              matrix_of<int>(f.take("padded_routing_map"), "prm"));
    cmp.exact("permutation.padded_tokens_per_expert", padded.template cast<long>().colwise().sum(),
              matrix_of<long>(f.take("padded_tokens_per_expert"), "ptpe").transpose());
  }
  f.require_all_handled();
}

/// One file, with L the router dtype of its config.
/// Puts into `mine` the element of largest rounding allowance relative to rtol / atol, at
/// `factor` times its whole allowance from the reference (1 + 1e-6: just outside; 1 - 1e-6: just
/// inside).
template <class L>
void plant_logit_error(Eigen::MatrixXd& mine, row_matrix<L> const& reference,
                       Eigen::MatrixXd const& bound, double factor) {
  Eigen::Index best_r = 0, best_c = 0;
  double best = -1.0;
  for (Eigen::Index r = 0; r < mine.rows(); ++r)
    for (Eigen::Index c = 0; c < mine.cols(); ++c) {
      double const plain = atol + rtol * std::abs(static_cast<double>(reference(r, c)));
      if (bound(r, c) / plain > best) {
        best = bound(r, c) / plain;
        best_r = r;
        best_c = c;
      }
    }
  double const ref = static_cast<double>(reference(best_r, best_c));
  mine(best_r, best_c) = ref + factor * (atol + rtol * std::abs(ref) + bound(best_r, best_c));
}

/// A wrong router: capacity applied with the opposite tie rule (the highest token index wins),
/// by running the same capacity step on the tokens in reverse order.
template <class L>
void flip_capacity_ties(router::routing_output<L>& out, router::settings const& settings) {
  Eigen::Index const T = out.topk_indices.rows(), E = out.probs.cols();
  row_matrix<L> probs = sparse_of(out.topk_probs, out.topk_indices, static_cast<int>(E));
  mask_matrix map = mask_matrix::Zero(T, E);
  for (Eigen::Index t = 0; t < T; ++t)
    for (Eigen::Index i = 0; i < out.topk_indices.cols(); ++i) map(t, out.topk_indices(t, i)) = 1;
  row_matrix<L> reversed_probs = probs.colwise().reverse();
  mask_matrix reversed_map = map.colwise().reverse();
  std::vector<int> order;
  router::apply_capacity(reversed_probs, reversed_map, settings.top_k, *settings.capacity_factor,
                         settings.token_drop_policy, settings.pad_to_capacity, order);
  out.probs = reversed_probs.colwise().reverse();
  out.routing_map = reversed_map.colwise().reverse();
  for (Eigen::Index e = 0; e < E; ++e)
    out.tokens_per_expert[static_cast<std::size_t>(e)] =
        out.routing_map.col(e).template cast<std::int64_t>().sum();
}

template <class L>
check_result run(vector_file& file, router::megatron_router_config const& rc,
                 run_options const& options) {
  comparer cmp;
  int const E = rc.num_experts;
  int const S = rc.seq_length.value_or(0), B = rc.micro_batch_size.value_or(1);
  router::topk_router<L> router(rc.router, E);

  object_fields initial(file.take("state_initial"), "state_initial");
  auto const weight = matrix_of<float>(initial.take("router_weight"), "router_weight");
  if (initial.has("expert_bias")) {
    auto const bias = matrix_of<float>(initial.take("expert_bias"), "expert_bias");
    if (router.state().expert_bias.size() != static_cast<std::size_t>(bias.size()))
      throw mismatch("state_initial.expert_bias is given but the config has no expert bias");
    std::copy(bias.data(), bias.data() + bias.size(), router.state().expert_bias.begin());
  } else {
    initial.take_null("expert_bias");
  }
  initial.require_all_handled();

  auto const& microbatches = file.take("microbatches");
  if (!microbatches.is_array() || microbatches.empty()) throw mismatch("microbatches: empty");
  if (rc.num_microbatches && *rc.num_microbatches != static_cast<int>(microbatches.size()))
    throw mismatch("config.num_microbatches differs from the micro-batches in the file");

  for (std::size_t m = 0; m < microbatches.size(); ++m) {
    std::string const at = "microbatches[" + std::to_string(m) + "]";
    object_fields mb(microbatches[m], at);
    object_fields in(mb.take("inputs"), at + ".inputs");
    auto const hidden = matrix_of<float>(in.take("hidden"), "hidden");
    auto const logits = matrix_of<L>(in.take("logits"), "logits");
    auto const weights = matrix_of<L>(in.take("objective_weights"), "objective_weights");
    if (in.has("expert_bias_used")) {
      auto const used = matrix_of<float>(in.take("expert_bias_used"), "expert_bias_used");
      Eigen::Map<Eigen::VectorXf const> mine(router.state().expert_bias.data(), E);
      cmp.exact(at + ".inputs.expert_bias_used", mine, used);
    } else {
      in.take_null("expert_bias_used");
    }
    in.require_all_handled();

    // The gating GEMM: z = x W^T in the router dtype, each logit within the rounding bound of
    // its dot product over H (2 gamma_H sum |x||w|) on top of rtol / atol.
    row_matrix<L> my_logits;
    router::gating_forward<L>(hidden, weight, my_logits);
    Eigen::MatrixXd const logit_bound =
        product_bound(hidden, weight.transpose(), unit_roundoff<L>());
    Eigen::MatrixXd mine = my_logits.template cast<double>();
    if (options.fault == planted_fault::logit_above_bound ||
        options.fault == planted_fault::logit_within_bound)
      plant_logit_error(
          mine, logits, logit_bound,
          options.fault == planted_fault::logit_above_bound ? 1.0 + 1e-6 : 1.0 - 1e-6);
    cmp.close_within(at + ".inputs.logits (gating)", mine, logits, rtol, atol, logit_bound);

    // A copy: a planted fault may change what megamoe's router gave.
    router::routing_output<L> out = router.route(logits, {.seq_length = S, .micro_batch_size = B});
    if (options.fault == planted_fault::flipped_ties && rc.router.capacity_factor)
      flip_capacity_ties(out, rc.router);
    object_fields o(mb.take("outputs"), at + ".outputs");

    bool const tie_variant = o.has("canonical_tiebreak");
    bool maps_agree = true, probs_agree = true;
    mask_matrix megatron_map;
    row_matrix<L> megatron_probs, canonical_probs;
    if (tie_variant) {
      object_fields c(o.take("canonical_tiebreak"), at + ".outputs.canonical_tiebreak");
      maps_agree = c.take("routing_map_equals_megatron").get<bool>();
      probs_agree = c.take("probs_equal_megatron").get<bool>();
      cmp.exact(at + ".canonical_tiebreak.routing_map", out.routing_map,
                matrix_of<int>(c.take("routing_map"), "map"));
      canonical_probs = matrix_of<L>(c.take("probs"), "p");
      cmp.close(at + ".canonical_tiebreak.probs", out.probs, canonical_probs, rtol, atol);
      Eigen::Map<Eigen::Matrix<std::int64_t, Eigen::Dynamic, 1> const> counts(
          out.tokens_per_expert.data(), E);
      cmp.exact(at + ".canonical_tiebreak.tokens_per_expert", counts,
                matrix_of<long>(c.take("tokens_per_expert"), "tpe"));
      auto const& grad = router.backward(weights);
      cmp.close(at + ".canonical_tiebreak.grad_logits_total", grad,
                matrix_of<L>(c.take("grad_logits_total"), "glt"), rtol, atol);
      c.require_all_handled();
    }

    // Megatron's own map, probs and counts. Where its tie order differs from megamoe's rule they
    // must still be a valid capacity result: a subset (or fillers) of the pre-drop routing with the
    // same per-expert counts and the pre-drop probs on the kept entries.
    megatron_map =
        matrix_of<int>(o.take("routing_map"), "routing_map").template cast<std::uint8_t>();
    megatron_probs = matrix_of<L>(o.take("probs"), "probs");
    auto const megatron_counts = matrix_of<long>(o.take("tokens_per_expert"), "tokens_per_expert");
    cmp.exact(at + ".outputs.tokens_per_expert (Megatron's map)",
              megatron_map.template cast<long>().colwise().sum().transpose(), megatron_counts);
    if (maps_agree) {
      cmp.exact(at + ".outputs.routing_map", out.routing_map, megatron_map);
      cmp.close(at + ".outputs.probs", out.probs, megatron_probs, rtol, atol);
      Eigen::Map<Eigen::Matrix<std::int64_t, Eigen::Dynamic, 1> const> counts(
          out.tokens_per_expert.data(), E);
      cmp.exact(at + ".outputs.tokens_per_expert", counts, megatron_counts);
    } else {
      Eigen::Map<Eigen::Matrix<std::int64_t, Eigen::Dynamic, 1> const> counts(
          out.tokens_per_expert.data(), E);
      cmp.exact(at + ".outputs.tokens_per_expert (per-expert counts)", counts, megatron_counts);
      row_matrix<L> kept = sparse_of(out.topk_probs, out.topk_indices, E);
      for (Eigen::Index t = 0; t < megatron_map.rows(); ++t)
        for (int e = 0; e < E; ++e) {
          if (megatron_map(t, e) && kept(t, e) == L(0) && !rc.router.pad_to_capacity)
            throw mismatch(at + ".outputs.routing_map keeps a token that was not routed");
          if (!megatron_map(t, e)) kept(t, e) = L(0);
        }
      cmp.close(at + ".outputs.probs (pre-drop probs on Megatron's map)", kept, megatron_probs,
                rtol, atol);
    }

    // The objective sums the probs the reference kept: where its tie order kept other tokens,
    // the file's value belongs to its own choice, and megamoe's is compared with the canonical
    // variant's (whose probs were compared above).
    double const file_objective = o.take("objective").get<double>();
    if (probs_agree) {
      cmp.scalar_close(at + ".outputs.objective", objective(out.probs, weights), file_objective,
                       rtol, 1e-6);
    } else {
      cmp.scalar_close(at + ".outputs.objective (of Megatron's probs, in the file)",
                       objective(megatron_probs, weights), file_objective, rtol, 1e-6);
      cmp.scalar_close(at + ".canonical_tiebreak objective", objective(out.probs, weights),
                       objective(canonical_probs, weights), rtol, 1e-6);
    }

    // Losses, coefficient-scaled and unscaled.
    nlohmann::json const no_losses = nlohmann::json::object();
    object_fields losses(o.has("losses") ? o.take("losses") : no_losses, at + ".outputs.losses");
    auto check_loss = [&](char const* name, std::optional<router::attached_loss> const& mine) {
      std::string const key = name;
      if (!losses.has(key)) {
        if (mine) throw mismatch(at + ": megamoe attaches " + key + ", the reference does not");
        return;
      }
      if (!mine) throw mismatch(at + ": the reference has " + key + ", megamoe does not");
      cmp.scalar_close(at + ".losses." + key, mine->value, losses.take(key).get<double>(), rtol,
                       1e-9);
      cmp.scalar_close(at + ".losses." + key + "_unscaled", mine->unscaled,
                       losses.take(key + "_unscaled").get<double>(), rtol, 1e-9);
    };
    check_loss("aux_loss", out.losses.aux_loss);
    check_loss("seq_aux_loss", out.losses.seq_aux_loss);
    check_loss("global_aux_loss", out.losses.global_aux_loss);
    check_loss("z_loss", out.losses.z_loss);
    losses.require_all_handled();

    if (o.has("topk_indices_dense")) {
      // The reference took this view with an unsorted top-k, whose order is torch's own; megamoe's
      // is by descending selection score. Each token's (expert, prob) pairs are compared as a set.
      auto const indices = matrix_of<long>(o.take("topk_indices_dense"), "topk_indices_dense");
      auto const probs = matrix_of<L>(o.take("topk_probs_dense"), "topk_probs_dense");
      cmp.close(at + ".outputs.topk_probs_dense (as sparse)",
                sparse_of(out.topk_probs, out.topk_indices, E),
                sparse_of(probs, indices.template cast<int>().eval(), E), rtol, atol);
      mask_matrix mine = mask_matrix::Zero(out.topk_indices.rows(), E);
      mask_matrix theirs = mine;
      for (Eigen::Index t = 0; t < indices.rows(); ++t)
        for (Eigen::Index i = 0; i < indices.cols(); ++i) {
          mine(t, out.topk_indices(t, i)) = 1;
          theirs(t, indices(t, i)) = 1;
        }
      cmp.exact(at + ".outputs.topk_indices_dense (as sets)", mine, theirs);
    }
    if (o.has("probs_before_drop")) {
      cmp.close(at + ".outputs.probs_before_drop", sparse_of(out.topk_probs, out.topk_indices, E),
                matrix_of<L>(o.take("probs_before_drop"), "pbd"), rtol, atol);
      mask_matrix before_map = mask_matrix::Zero(out.topk_indices.rows(), E);
      for (Eigen::Index t = 0; t < out.topk_indices.rows(); ++t)
        for (Eigen::Index i = 0; i < out.topk_indices.cols(); ++i)
          before_map(t, out.topk_indices(t, i)) = 1;
      cmp.exact(at + ".outputs.routing_map_before_drop", before_map,
                matrix_of<int>(o.take("routing_map_before_drop"), "rmbd"));
    }
    if (o.has("routing_map_for_aux_loss")) {
      cmp.exact(at + ".outputs.routing_map_for_aux_loss", router.aux_routing_map(),
                matrix_of<int>(o.take("routing_map_for_aux_loss"), "rmal"));
      cmp.close(at + ".outputs.scores_for_aux_loss", router.aux_scores(),
                matrix_of<float>(o.take("scores_for_aux_loss"), "sfal"), rtol, atol);
    }
    if (o.has("global_tokens_per_expert_avg")) {
      Eigen::VectorXd average(E);
      for (int e = 0; e < E; ++e)
        average(e) = router.state().global_tokens_per_expert[static_cast<std::size_t>(e)] /
                     router.state().global_aux_steps;
      cmp.close(at + ".outputs.global_tokens_per_expert_avg", average,
                matrix_of<double>(o.take("global_tokens_per_expert_avg"), "gtpea"), rtol, atol);
    }

    // Gradients. Where Megatron's map differs by tie order, the file's gradient belongs to its map:
    // megamoe's gating backward is then checked on the file's logit gradient.
    auto const megatron_grad = matrix_of<L>(o.take("grad_logits_total"), "grad_logits_total");
    row_matrix<L> grad = router.backward(weights);
    if (maps_agree) cmp.close(at + ".outputs.grad_logits_total", grad, megatron_grad, rtol, atol);
    if (o.has("grad_logits_components")) {
      object_fields parts(o.take("grad_logits_components"), at + ".grad_logits_components");
      auto part = [&](char const* name, router::gradient_terms terms) {
        if (!parts.has(name)) return;
        auto const expected = matrix_of<L>(parts.take(name), name);
        if (!maps_agree && std::string(name) == "objective") return;
        cmp.close(at + ".grad_logits_components." + name, router.backward(weights, 1.0, terms),
                  expected, rtol, atol);
      };
      router::gradient_terms none{false, false, false, false, false};
      auto only = [&](auto member) {
        auto t = none;
        t.*member = true;
        return t;
      };
      part("objective", only(&router::gradient_terms::objective));
      part("aux_loss", only(&router::gradient_terms::aux_loss));
      part("seq_aux_loss", only(&router::gradient_terms::seq_aux_loss));
      part("global_aux_loss", only(&router::gradient_terms::global_aux_loss));
      part("z_loss", only(&router::gradient_terms::z_loss));
      parts.require_all_handled();
    }
    // dW = dz^T x (sums over T) and dx = dz W (sums over E): each element within its dot
    // product's rounding bound, plus what megamoe's dz may differ from the reference's (the
    // allowance of grad_logits_total) carried through the product.
    row_matrix<L> const& upstream = maps_agree ? grad : megatron_grad;
    row_matrix<float> grad_hidden, grad_weight;
    router::gating_backward<L>(upstream, hidden, weight, grad_hidden, grad_weight);
    Eigen::MatrixXd const upstream_error =
        maps_agree ? Eigen::MatrixXd(
                         (rtol * megatron_grad.template cast<double>().cwiseAbs()).array() + atol)
                   : Eigen::MatrixXd::Zero(upstream.rows(), upstream.cols());
    Eigen::MatrixXd const upstream_error_t = upstream_error.transpose();
    cmp.close_within(
        at + ".outputs.grad_router_weight", grad_weight,
        matrix_of<float>(o.take("grad_router_weight"), "grw"), rtol, atol,
        product_bound(upstream.transpose(), hidden, unit_roundoff<L>(), &upstream_error_t));
    cmp.close_within(at + ".outputs.grad_hidden", grad_hidden,
                     matrix_of<float>(o.take("grad_hidden"), "gh"), rtol, atol,
                     product_bound(upstream, weight, unit_roundoff<L>(), &upstream_error));
    o.require_all_handled();

    if (mb.has("permutation")) {
      object_fields perm(mb.take("permutation"), at + ".permutation");
      check_permutation<L>(perm, megatron_map, megatron_probs, cmp);
    }
    mb.require_all_handled();
  }

  if (file.has("state_final")) {
    object_fields fin(file.take("state_final"), "state_final");
    Eigen::Map<Eigen::VectorXd const> counts(router.state().local_tokens_per_expert.data(), E);
    cmp.exact("state_final.local_tokens_per_expert", counts,
              matrix_of<double>(fin.take("local_tokens_per_expert"), "ltpe"));
    router.state().finish_global_batch(router::reduction_groups<>{});
    Eigen::Map<Eigen::VectorXf const> bias(router.state().expert_bias.data(), E);
    cmp.close("state_final.expert_bias_after_update", bias,
              matrix_of<float>(fin.take("expert_bias_after_update"), "biasu"), 0.0, 1e-9);
    fin.require_all_handled();
  }
  return {cmp.worst(), cmp.fields()};
}

check_result check_router(vector_file& file, run_options const& options) {
  auto const rc = router::from_megatron(file.take("config"));
  if (rc.router.dtype == router::logits_dtype::fp64) return run<double>(file, rc, options);
  return run<float>(file, rc, options);
}

[[maybe_unused]] bool const registered = [] {
  checkers()["router"] = check_router;
  return true;
}();

}  // namespace
}  // namespace megamoe::vectors
