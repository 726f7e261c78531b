// SPDX-License-Identifier: Apache-2.0
// megamoe-layout — prints the process groups of a parallel layout, as the reference builds them.
//
//   megamoe-layout --world 256 --tp 4 --cp 2 --pp 4 --etp 1 --ep 64 --json
//
// Needs no MPI: the groups come from megamoe::parallel::rank_generator, the same code that
// parallel::process_groups uses to create the communicators.
#include <megamoe/parallel/layout.hpp>
#include <megamoe/version.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using megamoe::parallel::rank_groups;

std::string group_text(std::vector<int> const& group) {
  std::string text = "[";
  for (std::size_t i = 0; i < group.size(); ++i) {
    if (i > 0) text += ' ';
    text += std::to_string(group[i]);
  }
  text += ']';
  return text;
}

/// One line per group type (type, label): all groups, or only the one holding `rank`.
void print_groups(std::string_view title, megamoe::parallel::rank_generator const& grid,
                  std::vector<std::pair<std::string_view, std::string>> const& types,
                  std::optional<int> rank) {
  std::cout << title << "\n";
  for (auto const& [type, label] : types) {
    rank_groups const groups = grid.groups(type);
    std::string line(2, ' ');
    line += label;
    line.resize(std::max<std::size_t>(line.size() + 1, 24), ' ');
    line += std::to_string(groups.size());
    line += " x ";
    line += std::to_string(groups.front().size());
    line += ':';
    for (auto const& group : groups) {
      if (rank && std::find(group.begin(), group.end(), *rank) == group.end()) continue;
      line += ' ';
      line += group_text(group);
    }
    std::cout << line << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Prints the process groups of a megamoe parallel layout (attention grid TPxCPxDPxPP, "
      "expert grid ETPxEPxEDPxPP, order tp-cp-ep-dp-pp), as the reference creates them."};
  int world = 0;
  megamoe::parallel::degrees degrees;
  std::optional<int> etp;
  std::optional<int> rank;
  bool json = false;
  app.set_version_flag("--version", megamoe::version_line("megamoe-layout"));
  app.add_option("--world", world, "world size (number of ranks)")->required();
  app.add_option("--tp", degrees.tp, "tensor parallel size")->capture_default_str();
  app.add_option("--cp", degrees.cp, "context parallel size")->capture_default_str();
  app.add_option("--pp", degrees.pp, "pipeline parallel size")->capture_default_str();
  app.add_option("--etp", etp, "expert tensor parallel size (default: --tp)");
  app.add_option("--ep", degrees.ep, "expert parallel size")->capture_default_str();
  app.add_option("--rank", rank, "show only the groups that hold this rank (text output)");
  app.add_flag("--json", json, "print one JSON object with config, decoder_groups, expert_groups");
  CLI11_PARSE(app, argc, argv);
  degrees.etp = etp.value_or(degrees.tp);

  megamoe::parallel::layout layout;
  try {
    layout = megamoe::parallel::layout::resolve(world, degrees);
    if (rank && (*rank < 0 || *rank >= world))
      throw megamoe::input_error("--rank " + std::to_string(*rank) + " is outside the world [0, " +
                                 std::to_string(world) + ")");
  } catch (std::exception const& e) {
    std::cerr << "megamoe-layout: " << e.what() << "\n";
    return 2;
  }
  auto const decoder = layout.decoder_grid();
  auto const expert = layout.expert_grid();

  if (json) {
    nlohmann::ordered_json out;
    out["config"] = {{"world_size", layout.world_size},
                     {"order", std::string(megamoe::parallel::default_order)},
                     {"tp", layout.tp},
                     {"cp", layout.cp},
                     {"dp", layout.dp},
                     {"pp", layout.pp},
                     {"etp", layout.etp},
                     {"ep", layout.ep},
                     {"edp", layout.edp}};
    for (auto type : megamoe::parallel::decoder_group_types)
      out["decoder_groups"][std::string(type)] = decoder.groups(type);
    for (auto type : megamoe::parallel::expert_group_types)
      out["expert_groups"][std::string(type)] = expert.groups(type);
    std::cout << out.dump() << "\n";
    return 0;
  }

  std::cout << "megamoe layout: world " << layout.world_size << ", order "
            << megamoe::parallel::default_order << "\n"
            << "  attention grid: TP " << layout.tp << " x CP " << layout.cp << " x DP "
            << layout.dp << " x PP " << layout.pp << "\n"
            << "  expert grid:    ETP " << layout.etp << " x EP " << layout.ep << " x EDP "
            << layout.edp << " x PP " << layout.pp << "\n"
            << "groups are listed as count x size, in creation order"
            << (rank ? "; only those holding rank " + std::to_string(*rank) : std::string())
            << "\n";
  std::vector<std::pair<std::string_view, std::string>> decoder_types, expert_types;
  for (auto type : megamoe::parallel::decoder_group_types)
    decoder_types.emplace_back(type, std::string(type));
  for (auto const& role : megamoe::parallel::expert_group_roles)
    expert_types.emplace_back(role.type,
                              std::string(role.type) + " (" + std::string(role.degree) + ")");
  print_groups("decoder groups (attention grid)", decoder, decoder_types, rank);
  print_groups("expert groups (expert grid)", expert, expert_types, rank);
  return 0;
}
