// SPDX-License-Identifier: Apache-2.0
// Files of kind "parallel_groups": the reference's process groups of both grids for one layout.
// Every group list is compared exactly with megamoe's rank generator and with megamoe-layout's
// JSON.
#include "vectors/vector_file.hpp"

#include <megamoe/parallel/layout.hpp>
#include <megamoe/parallel/rank_generator.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <string>

namespace megamoe::vectors {
namespace {

/// The reference inserts a size-1 axis "gtp_remat" into its orders; size-1 axes change no group.
std::string without_size_one_extras(std::string const& order) {
  std::string out;
  std::size_t start = 0;
  while (start <= order.size()) {
    std::size_t end = order.find('-', start);
    if (end == std::string::npos) end = order.size();
    std::string const token = order.substr(start, end - start);
    if (token != "gtp_remat") out += (out.empty() ? "" : "-") + token;
    start = end + 1;
  }
  return out;
}

void compare_groups(nlohmann::json const& expected, parallel::rank_generator const& grid,
                    std::string const& grid_name) {
  if (!expected.is_object() || expected.empty())
    throw mismatch(grid_name + ": expected an object of group lists");
  for (auto const& [type, groups] : expected.items()) {
    if (groups != nlohmann::json(grid.groups(type)))
      throw mismatch(grid_name + "." + type + ": megamoe gives " +
                     nlohmann::json(grid.groups(type)).dump() + ", the reference " + groups.dump());
  }
}

nlohmann::json run_layout_tool(std::string const& tool, nlohmann::json const& config) {
  std::string command = tool;
  for (char const* key : {"tp", "cp", "pp", "etp", "ep"})
    command += std::string(" --") + key + " " + std::to_string(config.at(key).get<int>());
  command += " --world " + std::to_string(config.at("world_size").get<int>()) + " --json";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw mismatch("could not run " + command);
  std::string output;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe.get())) output.append(buffer, n);
  if (pclose(pipe.release()) != 0) throw mismatch(command + " failed: " + output);
  return nlohmann::json::parse(output);
}

/// megamoe-layout prints the standard group types (`standard`); each must equal the reference's
/// list. Other types a file may carry are compared with the generator only.
template <std::size_t N>
void compare_printed(nlohmann::json const& printed, nlohmann::json const& expected,
                     std::array<std::string_view, N> const& standard, std::string const& name) {
  for (auto const& [type, groups] : expected.items()) {
    bool const is_standard = std::find(standard.begin(), standard.end(), type) != standard.end();
    if (!printed.contains(type)) {
      if (is_standard) throw mismatch("megamoe-layout printed no " + name + "." + type);
      continue;
    }
    if (printed.at(type) != groups)
      throw mismatch("megamoe-layout " + name + "." + type + " differs");
  }
}

check_result check_parallel_groups(vector_file& file, run_options const& options) {
  auto const& config = file.take("config");
  auto const get = [&](char const* key) { return config.at(key).get<int>(); };
  std::string const order = config.at("order").get<std::string>();
  int const world = get("world_size");

  parallel::rank_generator const decoder(get("tp"), get("cp"), 1, get("dp"), get("pp"), order);
  parallel::rank_generator const expert(get("etp"), 1, get("ep"), get("edp"), get("pp"), order);
  if (decoder.world_size() != world || expert.world_size() != world)
    throw mismatch("config: the grids do not multiply to world_size");

  if (order == parallel::default_order) {
    // megamoe's own path: degrees -> layout (DP and EDP derived) -> grids.
    auto const layout =
        parallel::layout::resolve(world, {get("tp"), get("cp"), get("pp"), get("etp"), get("ep")});
    if (layout.dp != get("dp") || layout.edp != get("edp"))
      throw mismatch("config: megamoe derives dp " + std::to_string(layout.dp) + ", edp " +
                     std::to_string(layout.edp));
    if (layout.decoder_grid().order() != decoder.order())
      throw mismatch("config: order differs from megamoe's");
  }

  auto const decoder_order = without_size_one_extras(file.take("decoder_order_effective"));
  auto const expert_order = without_size_one_extras(file.take("expert_order_effective"));
  if (decoder_order != decoder.order() || expert_order != expert.order())
    throw mismatch("effective orders " + decoder_order + " / " + expert_order + " differ from " +
                   decoder.order());

  auto const& decoder_groups = file.take("decoder_groups");
  auto const& expert_groups = file.take("expert_groups");
  compare_groups(decoder_groups, decoder, "decoder_groups");
  compare_groups(expert_groups, expert, "expert_groups");

  // The aliases say which degree each expert-grid group is. The folder's README defines them for
  // tp (ETP), ep, tp-ep (ETPxEP) and dp (EDP); those must match megamoe's names, and any other
  // alias must at least name a group of the file.
  for (auto const& [type, alias] : file.take("expert_groups_alias").items()) {
    if (!expert_groups.contains(type))
      throw mismatch("expert_groups_alias." + type + ": no such group");
    if (type != "tp" && type != "ep" && type != "tp-ep" && type != "dp") continue;
    auto const role =
        std::find_if(parallel::expert_group_roles.begin(), parallel::expert_group_roles.end(),
                     [&](auto const& r) { return r.type == type; });
    std::string const text = alias.get<std::string>();
    if (text.substr(0, text.find(' ')) != role->degree)
      throw mismatch("expert_groups_alias." + type + ": '" + text + "' but megamoe calls it " +
                     std::string(role->degree));
  }

  if (!options.layout_tool.empty() && order == parallel::default_order) {
    auto const printed = run_layout_tool(options.layout_tool, config);
    for (auto const& [key, value] : config.items())
      if (printed.at("config").at(key) != value)
        throw mismatch("megamoe-layout config." + key + " = " +
                       printed.at("config").at(key).dump());
    compare_printed(printed.at("decoder_groups"), decoder_groups, parallel::decoder_group_types,
                    "decoder_groups");
    compare_printed(printed.at("expert_groups"), expert_groups, parallel::expert_group_types,
                    "expert_groups");
  }
  return {};
}

bool const registered = [] {
  checkers()["parallel_groups"] = check_parallel_groups;
  return true;
}();

}  // namespace

}  // namespace megamoe::vectors
