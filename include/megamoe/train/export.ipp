// SPDX-License-Identifier: Apache-2.0
// megamoe/train/export.ipp — the definitions behind export.hpp that depend on no configuration
// (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/export.hpp>

#include <boost/mpi/collectives/gather.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

#include <optional>

namespace megamoe::train::detail {

template <class Scalar>
void add_parameter_pieces_of(tensor_pieces& mine, parameter_list<Scalar> const& parameters,
                             bool dense_names) {
  for (auto const& p : parameters) {
    auto const saved =
        dense_names ? dense_parameter_name(p.name) : std::optional<std::string>(p.name);
    auto const& value = p.value;
    auto const& n = p.numbering;
    if (!saved || value.size() == 0) continue;
    mine.add(*saved, {n.whole_rows(value.rows()), n.global_cols});
    auto& pieces = mine.rectangles.back();
    for_each_rectangle(n, value.cols(), 0, value.size(), [&](global_rectangle const& r) {
      pieces.insert(pieces.end(), {r.row, r.col, r.rows, r.cols});
    });
    mine.values.back().assign(value.data(), value.data() + value.size());
  }
}

MEGAMOE_DECL void add_parameter_pieces(tensor_pieces& mine, parameter_list<float> const& parameters,
                                       bool dense_names) {
  add_parameter_pieces_of(mine, parameters, dense_names);
}
MEGAMOE_DECL void add_parameter_pieces(tensor_pieces& mine,
                                       parameter_list<double> const& parameters, bool dense_names) {
  add_parameter_pieces_of(mine, parameters, dense_names);
}

MEGAMOE_DECL void add_expert_bias_pieces(tensor_pieces& mine, persistent_state_list const& states,
                                         bool dense_names) {
  for (auto const& s : states) {
    if (s.name.find("expert_bias") == std::string_view::npos || dense_names) continue;
    mine.add(std::string(s.name), {s.rows, s.cols});
    mine.rectangles.back() = {s.first_row, 0, std::ssize(s.values) / s.cols, s.cols};
    mine.values.back().assign(s.values.begin(), s.values.end());
  }
}

MEGAMOE_DECL void write_gathered_model(boost::mpi::communicator const& world,
                                       tensor_pieces const& mine, std::filesystem::path const& path,
                                       std::map<std::string, std::string> const& metadata) {
  std::vector<std::vector<std::string>> all_names;
  std::vector<std::vector<std::vector<std::int64_t>>> all_shapes, all_rectangles;
  std::vector<std::vector<std::vector<float>>> all_values;
  boost::mpi::gather(world, mine.names, all_names, 0);
  boost::mpi::gather(world, mine.shapes, all_shapes, 0);
  boost::mpi::gather(world, mine.rectangles, all_rectangles, 0);
  boost::mpi::gather(world, mine.values, all_values, 0);
  if (world.rank() != 0) return;
  io::whole_tensors whole;
  for (std::size_t r = 0; r < all_names.size(); ++r)
    for (std::size_t i = 0; i < all_names[r].size(); ++i) {
      auto const& name = all_names[r][i];
      auto const& shape = all_shapes[r][i];
      whole.add<float>(name, shape[0], shape[1]);
      auto const& pieces = all_rectangles[r][i];
      float const* from = all_values[r][i].data();
      for (std::size_t k = 0; k + 3 < pieces.size(); k += 4) {
        global_rectangle const rect{0, pieces[k], pieces[k + 1], pieces[k + 2], pieces[k + 3]};
        whole.place(name, rect, from);
        from += rect.rows * rect.cols;
      }
    }
  whole.write(path, metadata);
}

}  // namespace megamoe::train::detail
