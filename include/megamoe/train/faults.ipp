// SPDX-License-Identifier: Apache-2.0
// megamoe/train/faults.ipp — the definitions behind faults.hpp (compiled once under
// MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/faults.hpp>

#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
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

namespace detail {

template <class Scalar>
std::string first_nonfinite_gradient(parameter_list<Scalar> const& parameters) {
  for (auto const& p : parameters)
    if (!p.grad.allFinite()) return p.name;
  return {};
}

template <class Scalar>
std::pair<std::string, double> largest_gradient(parameter_list<Scalar> const& parameters) {
  std::pair<std::string, double> out{std::string(), -1.0};
  for (auto const& p : parameters) {
    if (p.grad.size() == 0) continue;
    double const m = static_cast<double>(p.grad.cwiseAbs().maxCoeff());
    if (m > out.second) out = {p.name, m};
  }
  return out;
}

template <class Scalar>
void corrupt_first_gradient(parameter_list<Scalar>& parameters, bool not_a_number) {
  using bits = std::conditional_t<sizeof(Scalar) == 4, std::uint32_t, std::uint64_t>;
  for (auto& p : parameters) {
    if (p.grad.size() == 0) continue;
    Scalar* const g = p.grad.data();
    Eigen::Index at = 0;
    for (Eigen::Index i = 0; i < p.grad.size(); ++i)
      if (std::abs(g[i]) < Scalar(2) && std::abs(g[i]) > std::abs(g[at])) at = i;
    g[at] = not_a_number ? std::numeric_limits<Scalar>::quiet_NaN()
                         : std::bit_cast<Scalar>(std::bit_cast<bits>(g[at]) ^
                                                 (bits{1} << (8 * sizeof(Scalar) - 2)));
    return;
  }
}

}  // namespace detail

MEGAMOE_DECL std::string first_nonfinite_gradient(parameter_list<float> const& parameters) {
  return detail::first_nonfinite_gradient(parameters);
}
MEGAMOE_DECL std::string first_nonfinite_gradient(parameter_list<double> const& parameters) {
  return detail::first_nonfinite_gradient(parameters);
}
MEGAMOE_DECL std::pair<std::string, double> largest_gradient(
    parameter_list<float> const& parameters) {
  return detail::largest_gradient(parameters);
}
MEGAMOE_DECL std::pair<std::string, double> largest_gradient(
    parameter_list<double> const& parameters) {
  return detail::largest_gradient(parameters);
}
MEGAMOE_DECL void corrupt_first_gradient(parameter_list<float>& parameters,
                                         bool not_a_number) {
  detail::corrupt_first_gradient(parameters, not_a_number);
}
MEGAMOE_DECL void corrupt_first_gradient(parameter_list<double>& parameters,
                                         bool not_a_number) {
  detail::corrupt_first_gradient(parameters, not_a_number);
}

}  // namespace megamoe::train
