// SPDX-License-Identifier: Apache-2.0
// megamoe/core/parameter_list.hpp — a model's parameters and persistent state gathered into plain
// lists, once per call, so that what reads or writes them (checkpoints, export, upcycling) is
// code keyed by the element type alone, compiled once, instead of a walk over each configuration's
// module types.
#pragma once

#include <megamoe/core/parameter.hpp>
#include <megamoe/core/tensor.hpp>

#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe {

/// One parameter this rank holds: its reference name, value and gradient (row-major maps of the
/// model's storage), kind, and where its elements lie in the whole parameter.
template <class Scalar>
struct numbered_parameter {
  std::string name;
  row_matrix_map<Scalar> value, grad;
  parameter_kind kind;
  element_numbering numbering;
};
template <class Scalar>
using parameter_list = std::vector<numbered_parameter<Scalar>>;

/// Copies of persistent_state entries, names and values held by the list (the walks that produce
/// them name each one in a temporary string, and some hand out a temporary copy of the values);
/// a model's set_persistent_states() puts changed values back.
class persistent_state_list {
 public:
  void add(persistent_state s) {
    // A deque's elements stay where they are as it grows.
    s.name = names_.emplace_back(s.name);
    s.values = values_.emplace_back(s.values.begin(), s.values.end());
    states_.push_back(s);
  }
  [[nodiscard]] auto begin() const noexcept { return states_.begin(); }
  [[nodiscard]] auto end() const noexcept { return states_.end(); }
  [[nodiscard]] std::size_t size() const noexcept { return states_.size(); }

 private:
  std::deque<std::string> names_;
  std::deque<std::vector<float>> values_;
  std::vector<persistent_state> states_;
};

}  // namespace megamoe
