// SPDX-License-Identifier: Apache-2.0
// megamoe/model/model_values.hpp — a whole model's configuration resolved at start-up: on one
// rank (the degrees the type leaves dynamic are 1) or on a job (the degrees from its groups'
// layout, agreed on every rank), with every model size known (R027) and the layers split over the
// pipeline's virtual stages (R036).
#pragma once

#include <megamoe/config/resolve.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/parallel/environment.hpp>
#include <megamoe/parallel/layout.hpp>
#include <megamoe/parallel/pipeline_schedule.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/policy/error.hpp>

#include <string>

namespace megamoe {

/// `given` on one rank: the degrees it leaves empty are 1.
MEGAMOE_DECL startup_values startup_on_one_rank(startup_values given);
/// `given` on a job: the degrees are its groups' layout's.
MEGAMOE_DECL startup_values startup_on_job(parallel::process_groups const& groups,
                                           startup_values const& given);

/// R046 and R049 for a sequence length: throws the rule's config_error where the model's CP and TP
/// cannot cut it (every rank is given the same length, so every rank throws alike).
MEGAMOE_DECL void check_sequence_cut(config_values const& v, int seq);

/// The pipeline's virtual stages of a resolved model.
MEGAMOE_DECL parallel::pipeline_layout model_pipeline(config_values const& v,
                                                      startup_values const& given);

/// Config resolved with `given` as a whole model needs it; a broken rule throws its
/// config_error.
template <class Config>
config_values resolve_model(startup_values const& given) {
  config_values v = resolve<Config>(given);
  if (!rules::model_resolved(v.model)) {
    std::string missing;
    auto add = [&](int value, char const* name) {
      if (value == dynamic) missing += (missing.empty() ? "" : ", ") + std::string(name);
    };
    add(v.model.layers, "num_layers");
    add(v.model.heads, "num_attention_heads");
    add(v.model.query_groups, "num_query_groups");
    add(v.model.vocabulary, "vocab_size");
    add(v.model.dense_ffn, "ffn_hidden_size");
    if (!v.model.moe_layers.is_list()) add(v.model.moe_layers.every, "moe_layer_freq");
    throw config_error(rules::id::values_resolved,
                       "the transformer's model sizes left to start-up: " + missing);
  }
  (void)model_pipeline(v, given);  // R036
  return v;
}
/// The same on every rank of a job's TP x DP x CP group: a broken rule is the same agreed error
/// on all.
template <class Config>
config_values resolve_model_on_job(parallel::process_groups const& groups,
                                   startup_values const& given) {
  config_values v;
  parallel::check_on_every_rank(groups.tp_dp_cp(), [&] { v = resolve_model<Config>(given); });
  return v;
}

}  // namespace megamoe

#if MEGAMOE_HEADER_ONLY
#include <megamoe/model/model_values.ipp>
#endif
