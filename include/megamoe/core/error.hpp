// SPDX-License-Identifier: Apache-2.0
// megamoe/core/error.hpp — the exceptions megamoe throws at start-up and for bad input.
#pragma once

#include <megamoe/core/rule_ids.hpp>

#include <stdexcept>
#include <string>

namespace megamoe {

/// A broken configuration rule found at run time (values left to start-up, the world size, the
/// environment). The message starts with the rule's `megamoe[Rnnn]:` text, then the details.
class config_error : public std::runtime_error {
 public:
  config_error(int rule_id, std::string const& details)
      : std::runtime_error(compose(rule_id, details)), rule_id_(rule_id) {}

  /// The same error with its whole text already composed (e.g. received from another rank).
  static config_error verbatim(int rule_id, std::string const& text) {
    return config_error(rule_id, text, verbatim_tag{});
  }

  /// The broken rule's number (the nnn of Rnnn).
  [[nodiscard]] int rule_id() const noexcept { return rule_id_; }

 private:
  struct verbatim_tag {};
  config_error(int rule_id, std::string const& text, verbatim_tag)
      : std::runtime_error(text), rule_id_(rule_id) {}

  static std::string compose(int rule_id, std::string const& details) {
    std::string text(rule(rule_id).message);
    if (!details.empty()) text += " (" + details + ")";
    return text;
  }
  int rule_id_;
};

/// Bad run-time input that is not a configuration rule: a missing or malformed file, a tensor of
/// the wrong shape. The message names the input and what was expected.
class input_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace megamoe
