// SPDX-License-Identifier: Apache-2.0
// megamoe/train/training_state.ipp — the definitions behind training_state.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/training_state.hpp>

#include <megamoe/io/hugging_face.hpp>

namespace megamoe::train {

MEGAMOE_DECL bool runtime_field(std::string const& key) {
  static std::set<std::string> const fields = {"order",
                                               "tensor_model_parallel_size",
                                               "context_parallel_size",
                                               "pipeline_model_parallel_size",
                                               "expert_tensor_parallel_size",
                                               "expert_model_parallel_size",
                                               "world_size",
                                               "data_parallel_size",
                                               "expert_data_parallel_size",
                                               "moe_token_dispatcher_type",
                                               "expert_backend",
                                               "recompute_granularity",
                                               "recompute_modules",
                                               "quantized_activations",
                                               "quantized_weights",
                                               "defaults",
                                               "policies"};
  return fields.contains(key);
}

MEGAMOE_DECL nlohmann::json checkpoint_configuration(config_values const& values) {
  auto const flat = describe(values).flat;
  nlohmann::json model = nlohmann::json::object(), layout = nlohmann::json::object();
  for (auto const& [key, value] : flat.items())
    if (key != "defaults") (runtime_field(key) ? layout : model)[key] = value;
  return {{"model", model}, {"runtime", layout}};
}
}  // namespace megamoe::train

namespace megamoe::train::detail {

MEGAMOE_DECL bool writes(parallel::process_groups const* groups, state_owner owner) {
  if (groups == nullptr) return true;
  if (owner == state_owner::attention_grid_first) return groups->tp_dp_cp().rank() == 0;
  return groups->expert_dp().rank() == 0 && groups->expert_tp().rank() == 0;
}

MEGAMOE_DECL void add_persistent_states(io::checkpoint_writer& writer,
                                        parallel::process_groups const* groups,
                                        persistent_state_list const& states) {
  for (auto const& s : states) {
    if (!writes(groups, s.owner)) continue;
    std::string const name(s.name);
    std::int64_t const local_rows = std::ssize(s.values) / s.cols;
    writer.add(name, io::reference_shape(name, s.rows, s.cols), s.rows, s.cols,
               global_rectangle{0, s.first_row, 0, local_rows, s.cols}, s.values.data());
  }
}

MEGAMOE_DECL void read_persistent_states(io::checkpoint_reader& reader,
                                         persistent_state_list const& states) {
  for (auto const& s : states) {
    std::int64_t const local_rows = std::ssize(s.values) / s.cols;
    reader.read(std::string(s.name), s.rows, s.cols,
                global_rectangle{0, s.first_row, 0, local_rows, s.cols}, s.values.data());
  }
}
}  // namespace megamoe::train::detail

namespace megamoe::train {

template <class Scalar>
std::map<std::string, element_numbering> numbering_by_name_of(
    parameter_list<Scalar> const& parameters) {
  std::map<std::string, element_numbering> out;
  for (auto const& p : parameters) out.emplace(p.name, p.numbering);
  return out;
}
MEGAMOE_DECL std::map<std::string, element_numbering> numbering_by_name(
    parameter_list<float> const& parameters) {
  return numbering_by_name_of(parameters);
}
MEGAMOE_DECL std::map<std::string, element_numbering> numbering_by_name(
    parameter_list<double> const& parameters) {
  return numbering_by_name_of(parameters);
}

MEGAMOE_DECL std::string model_difference(nlohmann::json const& saved, config_values const& values,
                                          bool saved_fields_only) {
  auto const mine = checkpoint_configuration(values).at("model");
  if (!saved.is_object()) return "it records no model configuration";
  // The layer kinds compare as lists: an imported model lists them, a type may give a frequency.
  auto const same = [&](std::string const& key, nlohmann::json const& there,
                        nlohmann::json const& here) {
    if (key != "moe_layer_freq" || there == here) return there == here;
    try {
      int const layers = mine.value("num_layers", 0);
      return io::hugging_face::moe_layer_pattern(there, layers) ==
             io::hugging_face::moe_layer_pattern(here, layers);
    } catch (input_error const&) {
      return false;
    }
  };
  for (auto const& [key, value] : mine.items()) {
    if (!saved.contains(key)) {
      if (saved_fields_only) continue;
      return key + " is missing there";
    }
    if (!same(key, saved.at(key), value))
      return key + " is " + saved.at(key).dump() + " there, " + value.dump() + " here";
  }
  for (auto const& [key, value] : saved.items())
    if (!mine.contains(key)) return key + " is set there, unknown here";
  return {};
}

}  // namespace megamoe::train
