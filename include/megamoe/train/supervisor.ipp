// SPDX-License-Identifier: Apache-2.0
// megamoe/train/supervisor.ipp — the definitions behind supervisor.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/io/checkpoint_index.hpp>
#include <megamoe/train/supervisor.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <fstream>
#include <sstream>

namespace megamoe::train::supervisor {

namespace detail {

/// megamoe-train's degree flags, each with its reference name.
inline constexpr std::array<std::array<std::string_view, 2>, 5> degree_flags = {{
    {"--tp", "--tensor-model-parallel-size"},
    {"--cp", "--context-parallel-size"},
    {"--pp", "--pipeline-model-parallel-size"},
    {"--ep", "--expert-model-parallel-size"},
    {"--etp", "--expert-tensor-parallel-size"},
}};

/// The name of an option token (`--name` of `--name=value`); "" for a value.
inline std::string_view option_name(std::string_view token) {
  if (!token.starts_with("--")) return {};
  return token.substr(0, token.find('='));
}

/// Whether `token` is a value rather than an option (negative numbers are values).
inline bool is_value(std::string_view token) {
  if (token.starts_with("--")) return false;
  return !(token.size() > 1 && token[0] == '-' && !(token[1] >= '0' && token[1] <= '9'));
}

/// `names` and, for a degree flag, its other spelling.
inline std::vector<std::string_view> aliases_of(std::string_view name) {
  for (auto const& pair : degree_flags)
    if (name == pair[0] || name == pair[1]) return {pair[0], pair[1]};
  return {name};
}

inline int positive_int(std::string_view text, std::string_view what) {
  int value = 0;
  auto const [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 1)
    throw input_error("megamoe-run: " + std::string(what) + " '" + std::string(text) +
                      "' is not a positive integer");
  return value;
}

inline std::vector<std::string> split_spaces(std::string_view text) {
  std::vector<std::string> out;
  std::istringstream in{std::string(text)};
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

}  // namespace detail

MEGAMOE_DECL std::vector<host_slots> read_hostfile(std::filesystem::path const& path) {
  std::ifstream in(path);
  if (!in) throw input_error("megamoe-run: cannot read the hostfile " + path.string());
  std::vector<host_slots> hosts;
  std::vector<bool> counted;  // hosts without slots=: one slot per line
  for (std::string line; std::getline(in, line);) {
    line = line.substr(0, line.find('#'));
    auto const words = detail::split_spaces(line);
    if (words.empty()) continue;
    std::optional<int> slots;
    for (std::size_t i = 1; i < words.size(); ++i) {
      std::string_view const w = words[i];
      if (w.starts_with("slots="))
        slots = detail::positive_int(w.substr(6),
                                     "the slots of " + words[0] + " in " + path.string() + ":");
      else if (!w.starts_with("max_slots=") && !w.starts_with("max-slots="))
        throw input_error("megamoe-run: " + path.string() + ": '" + std::string(w) +
                          "' after host " + words[0] + " (slots=N or max_slots=N)");
    }
    auto const it = std::find_if(hosts.begin(), hosts.end(),
                                 [&](host_slots const& h) { return h.host == words[0]; });
    if (it == hosts.end()) {
      hosts.push_back({words[0], slots.value_or(1)});
      counted.push_back(!slots);
    } else if (slots || !counted[static_cast<std::size_t>(it - hosts.begin())]) {
      throw input_error("megamoe-run: " + path.string() + " names " + words[0] +
                        " twice with slots= (one line with slots=N, or one line per slot)");
    } else {
      ++it->slots;
    }
  }
  if (hosts.empty())
    throw input_error("megamoe-run: the hostfile " + path.string() + " names no host");
  return hosts;
}

MEGAMOE_DECL int total_slots(std::span<host_slots const> hosts) {
  int n = 0;
  for (auto const& h : hosts) n += h.slots;
  return n;
}

MEGAMOE_DECL layout_choice parse_layout(std::string_view text) {
  auto const colon = text.find(':');
  if (colon == std::string_view::npos)
    throw input_error("megamoe-run: --layout '" + std::string(text) +
                      "' is not N:FLAGS (e.g. 2:--ep=2)");
  layout_choice out{detail::positive_int(text.substr(0, colon), "the ranks of --layout"),
                    detail::split_spaces(text.substr(colon + 1))};
  // Each word is an option, or the value of the option before it (`--name value`).
  for (std::size_t i = 0; i < out.flags.size(); ++i) {
    if (!detail::is_value(out.flags[i])) continue;
    bool const follows_option = i > 0 && !detail::is_value(out.flags[i - 1]) &&
                                out.flags[i - 1].find('=') == std::string::npos;
    if (!follows_option)
      throw input_error("megamoe-run: --layout '" + std::string(text) + "': '" + out.flags[i] +
                        "' is neither an option nor an option's value");
  }
  return out;
}

MEGAMOE_DECL std::optional<std::string> option_value(std::span<std::string const> flags,
                                                     std::span<std::string_view const> names) {
  std::optional<std::string> value;
  for (std::size_t i = 0; i < flags.size(); ++i) {
    auto const name = detail::option_name(flags[i]);
    if (name.empty() || std::find(names.begin(), names.end(), name) == names.end()) continue;
    if (flags[i].size() > name.size())
      value = flags[i].substr(name.size() + 1);
    else if (i + 1 < flags.size() && detail::is_value(flags[i + 1]))
      value = flags[++i];
  }
  return value;
}

MEGAMOE_DECL std::vector<std::string> without_option(std::span<std::string const> flags,
                                                     std::span<std::string_view const> names,
                                                     bool takes_value) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < flags.size(); ++i) {
    auto const name = detail::option_name(flags[i]);
    if (name.empty() || std::find(names.begin(), names.end(), name) == names.end()) {
      out.push_back(flags[i]);
      continue;
    }
    if (takes_value && flags[i].size() == name.size() && i + 1 < flags.size() &&
        detail::is_value(flags[i + 1]))
      ++i;
  }
  return out;
}

MEGAMOE_DECL std::vector<std::string> with_options(std::span<std::string const> flags,
                                                   std::span<std::string const> replacements) {
  std::vector<std::string> out(flags.begin(), flags.end());
  for (std::size_t i = 0; i < replacements.size(); ++i) {
    auto const name = detail::option_name(replacements[i]);
    if (name.empty()) continue;
    bool const separate_value = replacements[i].size() == name.size() &&
                                i + 1 < replacements.size() &&
                                detail::is_value(replacements[i + 1]);
    auto const aliases = detail::aliases_of(name);
    out = without_option(out, aliases, true);
    out.push_back(replacements[i]);
    if (separate_value) out.push_back(replacements[++i]);
  }
  return out;
}

MEGAMOE_DECL std::pair<int, int> degree_products(std::span<std::string const> flags) {
  std::array<int, 5> d{};
  for (std::size_t k = 0; k < d.size(); ++k) {
    auto const names = detail::degree_flags[k];
    auto const value = option_value(flags, names);
    d[k] = value ? detail::positive_int(*value, names[0]) : 1;
  }
  int const tp = d[0], cp = d[1], pp = d[2], ep = d[3], etp = d[4];
  return {tp * cp * pp, etp * ep * pp};
}

MEGAMOE_DECL std::optional<layout_choice> choose_layout(int wanted, int available, int min_ranks,
                                                        std::span<layout_choice const> listed,
                                                        std::span<std::string const> flags) {
  if (available >= wanted) {
    for (auto const& l : listed)
      if (l.ranks == wanted) return l;
    return layout_choice{wanted, {}};
  }
  int const floor = min_ranks > 0 ? min_ranks : wanted;
  std::optional<layout_choice> best;
  for (auto const& l : listed)
    if (l.ranks <= available && l.ranks >= floor && (!best || l.ranks > best->ranks)) best = l;
  if (best) return best;
  auto const [decoder, expert] = degree_products(flags);
  for (int n = available; n >= floor && n >= 1; --n)
    if (n % decoder == 0 && n % expert == 0) return layout_choice{n, {}};
  return std::nullopt;
}

MEGAMOE_DECL std::optional<int> saved_iteration(std::filesystem::path const& save) {
  std::ifstream in(save / io::checkpoint_tracker);
  int iteration = 0;
  if (in >> iteration && iteration >= 0) return iteration;
  return std::nullopt;
}

MEGAMOE_DECL std::vector<std::string> launch_flags(std::span<std::string const> flags,
                                                   layout_choice const& layout, bool resume) {
  auto out = with_options(flags, layout.flags);
  if (std::none_of(out.begin(), out.end(), [](std::string const& f) {
        return detail::option_name(f) == "--exit-signal-handler";
      }))
    out.push_back("--exit-signal-handler");
  constexpr std::array<std::string_view, 1> save{"--save"};
  auto const folder = option_value(out, save);
  if (!resume || !folder || !saved_iteration(*folder)) return out;
  constexpr std::array<std::string_view, 1> load{"--load"};
  constexpr std::array<std::string_view, 2> fresh{"--finetune", "--no-load-optim"};
  out = without_option(out, load, true);
  out = without_option(out, fresh, false);
  out.push_back("--load");
  out.push_back(*folder);
  return out;
}

MEGAMOE_DECL std::vector<std::string> launch_command(launcher const& l, int ranks,
                                                     std::string const& program,
                                                     std::span<std::string const> flags) {
  std::vector<std::string> out{l.program};
  bool const srun = std::filesystem::path(l.program).filename() == "srun";
  if (srun) {
    // One task per rank; a rank that fails ends the step (the supervisor then relaunches).
    out.insert(out.end(), {"--ntasks", std::to_string(ranks), "--kill-on-bad-exit=1"});
  } else {
    out.insert(out.end(), {"-n", std::to_string(ranks)});
    if (!l.hostfile.empty()) out.insert(out.end(), {"--hostfile", l.hostfile});
  }
  out.insert(out.end(), l.args.begin(), l.args.end());
  out.push_back(program);
  out.insert(out.end(), flags.begin(), flags.end());
  return out;
}

}  // namespace megamoe::train::supervisor
