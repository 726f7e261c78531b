// SPDX-License-Identifier: Apache-2.0
// megamoe/policy/error.hpp — the error for a broken configuration rule found at run time.
#pragma once

#include <megamoe/policy/rule_ids.hpp>

#include <stdexcept>
#include <string>

namespace megamoe {

/// A broken configuration rule found at run time (values left to start-up, the world size, the
/// environment). The message starts with the rule's `megamoe[Rnnn]:` text, then the details.
class config_error : public std::runtime_error {
 public:
  config_error(rules::id which, std::string const& details)
      : std::runtime_error(compose(which, details)), rule_id_(static_cast<int>(which)) {}

  /// The same error with its whole text already composed (e.g. received from another rank).
  static config_error verbatim(rules::id which, std::string const& text) {
    return config_error(which, text, verbatim_tag{});
  }

  /// The broken rule's number (the nnn of Rnnn).
  [[nodiscard]] int rule_id() const noexcept { return rule_id_; }
  /// The broken rule.
  [[nodiscard]] rules::id which() const noexcept { return static_cast<rules::id>(rule_id_); }

 private:
  struct verbatim_tag {};
  config_error(rules::id which, std::string const& text, verbatim_tag)
      : std::runtime_error(text), rule_id_(static_cast<int>(which)) {}

  static std::string compose(rules::id which, std::string const& details) {
    std::string text(rule(which).message);
    if (!details.empty()) text += " (" + details + ")";
    return text;
  }
  int rule_id_;
};

}  // namespace megamoe
