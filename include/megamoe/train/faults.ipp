// SPDX-License-Identifier: Apache-2.0
// megamoe/train/faults.ipp — the definitions behind faults.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/faults.hpp>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace megamoe::train {

MEGAMOE_DECL planted_faults parse_planted_faults(std::string_view text, int rank) {
  planted_faults out;
  while (!text.empty()) {
    auto const comma = text.find(',');
    std::string_view const entry = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    std::vector<std::string_view> parts;
    for (std::string_view rest = entry;;) {
      auto const colon = rest.find(':');
      parts.push_back(rest.substr(0, colon));
      if (colon == std::string_view::npos) break;
      rest = rest.substr(colon + 1);
    }
    auto bad = [&] {
      return input_error("MEGAMOE_FAULT: '" + std::string(entry) +
                         "' is not slow:RANK:MILLISECONDS");
    };
    if (parts.size() != 3 || parts[0] != "slow") throw bad();
    int target = -1;
    double milliseconds = -1.0;
    auto const r = std::from_chars(parts[1].data(), parts[1].data() + parts[1].size(), target);
    auto const m =
        std::from_chars(parts[2].data(), parts[2].data() + parts[2].size(), milliseconds);
    if (r.ec != std::errc() || r.ptr != parts[1].data() + parts[1].size() || target < 0 ||
        m.ec != std::errc() || m.ptr != parts[2].data() + parts[2].size() || !(milliseconds >= 0))
      throw bad();
    if (target == rank) out.slow_milliseconds += milliseconds;
  }
  return out;
}

MEGAMOE_DECL planted_faults planted_faults_from_environment(int rank) {
  char const* text = std::getenv("MEGAMOE_FAULT");
  return text == nullptr ? planted_faults{} : parse_planted_faults(text, rank);
}

MEGAMOE_DECL void slow_down(planted_faults const& faults) {
  if (faults.slow_milliseconds > 0)
    std::this_thread::sleep_for(
        std::chrono::duration<double, std::milli>(faults.slow_milliseconds));
}

}  // namespace megamoe::train
