// SPDX-License-Identifier: Apache-2.0
// Reading a nested object of a reference file so that no field goes unchecked: every key must be
// taken (compared), marked descriptive, or be a *_equals_megatron flag.
#pragma once

#include "vectors/vector_file.hpp"

#include <nlohmann/json.hpp>

#include <initializer_list>
#include <set>
#include <string>

namespace megamoe::vectors {

/// Walks the keys of a nested object: each must be handled, or the file has a field nobody checks.
class object_fields {
 public:
  object_fields(nlohmann::json const& object, std::string where)
      : object_(object), where_(std::move(where)) {
    if (!object.is_object()) throw mismatch(where_ + ": expected an object");
  }
  [[nodiscard]] bool has(std::string const& key) const {
    return object_.contains(key) && !object_.at(key).is_null();
  }
  nlohmann::json const& take(std::string const& key) {
    if (!object_.contains(key)) throw mismatch(where_ + "." + key + " is missing");
    handled_.insert(key);
    return object_.at(key);
  }
  /// Marks a key as handled when it is present and null (not applicable).
  void take_null(std::string const& key) {
    if (object_.contains(key) && object_.at(key).is_null()) handled_.insert(key);
  }
  /// Marks descriptive keys (generator formulas, notes, layouts, names) as handled when present.
  void describe(std::initializer_list<char const*> keys) {
    for (auto const* key : keys)
      if (object_.contains(key)) handled_.insert(key);
  }
  [[nodiscard]] std::string const& where() const noexcept { return where_; }
  /// Fails on any key not taken (besides the *_equals_megatron flags, which are descriptive).
  void require_all_handled() const {
    for (auto const& [key, value] : object_.items()) {
      bool const flag = key.ends_with("_equals_megatron") || key.ends_with("_equal_megatron");
      if (!handled_.count(key) && !flag)
        throw mismatch(where_ + "." + key + " is a field this test does not check");
    }
  }

 private:
  nlohmann::json const& object_;
  std::string where_;
  std::set<std::string> handled_;
};

}  // namespace megamoe::vectors
