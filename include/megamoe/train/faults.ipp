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
                         "' is not slow:RANK:MILLISECONDS, bitflip:RANK:STEP or nan:RANK:STEP");
    };
    auto whole = [](std::string_view text, auto& value) {
      auto const r = std::from_chars(text.data(), text.data() + text.size(), value);
      return r.ec == std::errc() && r.ptr == text.data() + text.size();
    };
    if (parts.size() != 3) throw bad();
    int target = -1;
    if (!whole(parts[1], target) || target < 0) throw bad();
    if (parts[0] == "slow") {
      double milliseconds = -1.0;
      if (!whole(parts[2], milliseconds) || !(milliseconds >= 0)) throw bad();
      if (target == rank) out.slow_milliseconds += milliseconds;
    } else if (parts[0] == "bitflip" || parts[0] == "nan") {
      int step = 0;
      if (!whole(parts[2], step) || step < 1) throw bad();
      if (target == rank) (parts[0] == "nan" ? out.nan_step : out.bit_flip_step) = step;
    } else {
      throw bad();
    }
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
