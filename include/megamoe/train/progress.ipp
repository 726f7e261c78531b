// SPDX-License-Identifier: Apache-2.0
// megamoe/train/progress.ipp — the definitions behind progress.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/progress.hpp>

namespace megamoe::train {

MEGAMOE_DECL std::vector<double> load_shares(std::vector<double> const& counts) {
  double total = 0.0;
  for (double c : counts) total += c;
  std::vector<double> share(counts.size());
  for (std::size_t e = 0; e < counts.size(); ++e) share[e] = total > 0 ? counts[e] / total : 0;
  return share;
}

MEGAMOE_DECL std::string duration(double seconds) {
  int const s = static_cast<int>(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%dm%02ds", s / 60, s % 60);
  return buf;
}

MEGAMOE_DECL nlohmann::ordered_json step_line(int step, step_metrics const& m,
                                              double flops_per_token, bool pipelined, bool has_mtp,
                                              double bytes_per_token, training_history& history) {
  double const bpb = m.loss / std::log(2.0) / bytes_per_token;
  history.train_bpb.push_back(bpb);
  nlohmann::ordered_json line;
  line["step"] = step;
  line["loss"] = m.loss;
  line["train_bpb"] = bpb;
  line["aux_loss"] = m.aux_loss;
  line["z_loss"] = m.z_loss;
  if (has_mtp) line["mtp_loss"] = m.mtp_loss;
  line["lr"] = m.lr;
  line["grad_norm"] = m.grad_norm;
  line["tokens_per_s"] = m.tokens_per_s;
  line["model_gflops_per_s"] = m.tokens_per_s * flops_per_token / 1e9;
  if (pipelined) line["pipeline_bubble"] = m.pipeline_bubble;
  if (!m.failed_check.empty()) {
    line["failed_check"] = m.failed_check;
    if (m.rerun != rerun_outcome::none) {
      line["rerun"] = name_of(m.rerun);
      line["first_loss"] = m.first_loss;  // null when not finite
      line["first_grad_norm"] = m.first_grad_norm;
    }
    if (!m.fault_at.empty()) {
      line["fault_at"] = m.fault_at;
      line["fault_rank"] = m.fault_rank;
    }
    line["skipped"] = m.skipped;
  }
  nlohmann::ordered_json loads = nlohmann::ordered_json::array();
  for (std::size_t l = 0; l < m.expert_load.size(); ++l) {
    auto const& counts = m.expert_load[l];
    double total = 0.0, top = 0.0;
    for (double c : counts) total += c, top = std::max(top, c);
    if (history.keeps_load(step)) history.load[l].push_back(load_shares(counts));
    loads.push_back({{"tokens_per_expert", counts},
                     {"imbalance", total > 0 ? top * counts.size() / total : 0.0}});
  }
  line["expert_load"] = loads;
  if (history.keeps_load(step)) history.thin_load();
  return line;
}

MEGAMOE_DECL void print_profile(std::string const& program, nlohmann::ordered_json const& profile) {
  std::string line = program + ": step profile (rank 0, share of the step):";
  for (auto const& [name, value] : profile.items())
    if (name != "seconds_per_step") {
      char part[80];
      std::snprintf(part, sizeof part, " %s %.1f %%", name.c_str(),
                    100.0 * value.template get<double>());
      line += part;
    }
  std::fprintf(stderr, "%s; %.4f s per step\n", line.c_str(),
               profile["seconds_per_step"].get<double>());
}

MEGAMOE_DECL void print_traffic(std::string const& program, nlohmann::ordered_json const& traffic) {
  std::string line = program + ": bytes per step sent by rank 0 (implied by the layout):";
  for (auto const& [name, value] : traffic.items()) {
    char part[120];
    std::snprintf(part, sizeof part, " %s %.4g", name.c_str(),
                  value["bytes_per_step"].template get<double>());
    line += part;
    if (value.contains("implied")) {
      std::snprintf(part, sizeof part, " (%.4g)", value["implied"].template get<double>());
      line += part;
    }
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace megamoe::train

namespace megamoe::train {

MEGAMOE_DECL metrics_log::metrics_log(bool writes, std::filesystem::path const& path,
                                      int first_step, training_history& history) {
  if (!writes) return;
  std::vector<std::string> kept;
  if (first_step > 1) {
    std::ifstream in(path);
    for (std::string text; std::getline(in, text);) {
      auto const line = nlohmann::json::parse(text, nullptr, false);
      if (line.is_discarded() || line.value("step", 0) < 1 || line.value("step", 0) >= first_step)
        continue;
      kept.push_back(text);
      history.train_bpb.push_back(line.value("train_bpb", 0.0));
      if (line.contains("heldout_bpb"))
        history.heldout_bpb.emplace_back(line["step"].get<int>(),
                                         line["heldout_bpb"].get<double>());
      auto const& loads = line.value("expert_load", nlohmann::json::array());
      if (!history.keeps_load(line.value("step", 0))) continue;
      for (std::size_t l = 0; l < loads.size() && l < history.load.size(); ++l)
        history.load[l].push_back(
            load_shares(loads[l].at("tokens_per_expert").get<std::vector<double>>()));
      history.thin_load();
    }
  }
  out_.open(path, std::ios::trunc);
  for (auto const& text : kept) out_ << text << '\n';
  out_.flush();
}

MEGAMOE_DECL auto metrics_log::write(nlohmann::ordered_json const& line) -> void {
  if (out_.is_open()) out_ << line.dump() << '\n' << std::flush;
}

MEGAMOE_DECL auto progress_bar::show(int step, double bpb, double tokens_per_s, double elapsed,
                                     std::optional<double> heldout, double unigram,
                                     std::optional<double> heldout_mtp) const -> void {
  if (!terminal_ && !heldout) return;
  int const bar = 30, done = bar * step / steps_;
  std::fprintf(stderr, "%sstep %d/%d [%s%s] loss %.3f bits/byte | %.0f tok/s | ETA %s   %s",
               terminal_ ? "\r" : "", step, steps_,
               std::string(static_cast<std::size_t>(done), '#').c_str(),
               std::string(static_cast<std::size_t>(bar - done), '-').c_str(), bpb, tokens_per_s,
               duration(elapsed / step * (steps_ - step)).c_str(), terminal_ ? "" : "\n");
  if (heldout && heldout_mtp)
    std::fprintf(stderr, "%s  held-out %.3f bits/byte (unigram %.3f; MTP %.3f)\n",
                 terminal_ ? "\n" : "", *heldout, unigram, *heldout_mtp);
  else if (heldout)
    std::fprintf(stderr, "%s  held-out %.3f bits/byte (unigram %.3f)\n", terminal_ ? "\n" : "",
                 *heldout, unigram);
}

MEGAMOE_DECL auto step_profile::add(context const& ctx) -> void {
  for (std::size_t i = 0; i < moe_seconds.size(); ++i) moe_seconds[i] += ctx.stages.seconds[i];
  for (std::size_t i = 0; i < step_seconds.size(); ++i)
    step_seconds[i] += ctx.step_stages.seconds[i];
}

MEGAMOE_DECL auto step_profile::shares(double elapsed, int steps) const -> nlohmann::ordered_json {
  nlohmann::ordered_json profile;
  double accounted = 0.0;
  auto share = [&](char const* name, double seconds) {
    profile[name] = seconds / elapsed;
    accounted += seconds;
  };
  for (std::size_t i = 0; i < step_seconds.size(); ++i) share(step_stage_names[i], step_seconds[i]);
  for (std::size_t i = 0; i < moe_seconds.size(); ++i) share(layer_stage_names[i], moe_seconds[i]);
  profile["rest"] = (elapsed - accounted) / elapsed;
  profile["seconds_per_step"] = elapsed / steps;
  return profile;
}

}  // namespace megamoe::train
