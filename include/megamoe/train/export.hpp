// SPDX-License-Identifier: Apache-2.0
// megamoe/train/export.hpp — a trained model as one safetensors file of whole fp32 tensors under
// the reference's names: every rank's pieces of each tensor (experts on their EP ranks, TP and
// ETP shards on theirs, weights held as codes in the optimizer's fp32 shards) gathered to rank 0
// and placed there by their numbering into io::whole_tensors, which megamoe-checkpoint export
// writes a checkpoint's tensors with too.
#pragma once

#include <megamoe/core/parameter.hpp>
#include <megamoe/io/whole_tensors.hpp>
#include <megamoe/train/training_state.hpp>
#include <megamoe/train/upcycle.hpp>

#include <boost/mpi/collectives/gather.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megamoe::train {

/// This rank's pieces of the model's tensors: per tensor its name, whole [rows, cols], the
/// rectangles it holds (row, col, rows, cols in order) and their values.
struct tensor_pieces {
  std::vector<std::string> names;
  std::vector<std::vector<std::int64_t>> shapes, rectangles;
  std::vector<std::vector<float>> values;

  void add(std::string name, std::vector<std::int64_t> shape) {
    names.push_back(std::move(name));
    shapes.push_back(std::move(shape));
    rectangles.emplace_back();
    values.emplace_back();
  }
};

/// Writes the model `trainer` trains to `path` (rank 0; every rank of `world` calls it), with
/// `metadata`. Models of one expert per layer are dense FFNs there, under the dense names.
template <class Trainer>
void export_whole_model(boost::mpi::communicator const& world, Trainer& trainer,
                        std::filesystem::path const& path,
                        std::map<std::string, std::string> const& metadata) {
  auto& model = trainer.model();
  tensor_pieces mine;
  bool const dense_names = model.values().shape.experts == 1;
  model.for_each_numbered_parameter([&](std::string_view name, auto value, auto, parameter_kind,
                                        element_numbering const& n) {
    auto const saved =
        dense_names ? dense_parameter_name(std::string(name)) : std::optional<std::string>(name);
    if (!saved || value.size() == 0) return;
    mine.add(*saved, {n.whole_rows(value.rows()), n.global_cols});
    auto& pieces = mine.rectangles.back();
    for_each_rectangle(n, value.cols(), 0, value.size(), [&](global_rectangle const& r) {
      pieces.insert(pieces.end(), {r.row, r.col, r.rows, r.cols});
    });
    mine.values.back().assign(value.data(), value.data() + value.size());
  });
  // Weights held as codes: their fp32 masters, each element in the optimizer shard of one rank.
  if constexpr (Trainer::model_type::quantized_weights) {
    auto const numbering = parameter_numbering(model);
    trainer.optimizer().for_each_shard_piece([&](auto const& piece) {
      if (!holds_codes(piece.kind) || piece.count == 0) return;
      auto const& n = numbering.at(std::string(piece.name));
      mine.add(std::string(piece.name), {n.whole_rows(piece.rows), n.global_cols});
      auto& pieces = mine.rectangles.back();
      for_each_rectangle(n, piece.cols, piece.first, piece.count, [&](global_rectangle const& r) {
        pieces.insert(pieces.end(), {r.row, r.col, r.rows, r.cols});
      });
      mine.values.back().assign(piece.values, piece.values + piece.count);
    });
  }
  model.for_each_persistent_state([&](persistent_state const& s) {
    if (s.name.find("expert_bias") == std::string_view::npos || dense_names) return;
    mine.add(std::string(s.name), {s.rows, s.cols});
    mine.rectangles.back() = {s.first_row, 0, std::ssize(s.values) / s.cols, s.cols};
    mine.values.back().assign(s.values.begin(), s.values.end());
  });
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

}  // namespace megamoe::train
