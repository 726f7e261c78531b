// SPDX-License-Identifier: Apache-2.0
// A reference-vector file being checked: which of its fields a checker has read, so that a field
// nobody checks fails the run instead of passing silently.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace megamoe::vectors {

/// A mismatch between megamoe and a reference file.
class mismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class vector_file {
 public:
  vector_file(std::filesystem::path path, nlohmann::json content)
      : path_(std::move(path)), json_(std::move(content)) {}

  [[nodiscard]] std::string stem() const { return path_.stem().string(); }
  [[nodiscard]] std::string kind() const { return json_.value("kind", std::string()); }

  /// Whether a top-level field is present (and not null).
  [[nodiscard]] bool has(std::string const& field) const {
    return json_.contains(field) && !json_.at(field).is_null();
  }

  /// A top-level field, marked as checked; a missing field is a mismatch.
  nlohmann::json const& take(std::string const& field) {
    if (!json_.contains(field)) throw mismatch("field '" + field + "' is missing");
    taken_.insert(field);
    return json_.at(field);
  }

  /// The fields that are neither checked nor descriptive (name, description, generator,
  /// schema_version, kind, config and the *_equals_megatron flags).
  [[nodiscard]] std::vector<std::string> unchecked() const {
    static std::set<std::string> const descriptive{"name",           "description", "generator",
                                                   "schema_version", "kind",        "config"};
    std::vector<std::string> fields;
    for (auto const& [key, value] : json_.items()) {
      bool const flag = key.size() > 17 && key.ends_with("_equals_megatron");
      if (!descriptive.count(key) && !flag && !taken_.count(key)) fields.push_back(key);
    }
    return fields;
  }

  /// Checked fields other than the descriptive ones (the `fields=` count of the summary line).
  [[nodiscard]] int checked_count() const {
    return static_cast<int>(
        std::count_if(taken_.begin(), taken_.end(), [](auto const& f) { return f != "config"; }));
  }

 private:
  std::filesystem::path path_;
  nlohmann::json json_;
  std::set<std::string> taken_;
};

/// What a checker reports besides pass/fail: the worst relative error over compared values.
struct check_result {
  double worst_rel_err = 0.0;
  int fields = -1;  // fields compared, when the checker counts them (else the top-level count)
};

/// A fault a checker plants in megamoe's results before comparing them, to show that the harness
/// catches a wrong router (`--fault`): such a run must fail.
enum class planted_fault {
  none,
  flipped_ties,        // capacity keeps the highest-index candidates instead of the lowest
  logit_above_bound,   // one gating logit off by just more than its allowance
  logit_within_bound,  // the same, just less than its allowance (must still pass)
};

/// Options shared by checkers.
struct run_options {
  std::string layout_tool;  // path of megamoe-layout, or empty
  planted_fault fault = planted_fault::none;
};

using checker = std::function<check_result(vector_file&, run_options const&)>;

/// Checkers by file kind; each file of kind K is checked by checkers()[K].
std::map<std::string, checker>& checkers();

}  // namespace megamoe::vectors
