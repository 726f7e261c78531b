// SPDX-License-Identifier: Apache-2.0
// megamoe/train/export.hpp — a trained model as one safetensors file of whole fp32 tensors under
// the reference's names: every rank's pieces of each tensor (experts on their EP ranks, TP and
// ETP shards on theirs, weights held as codes in the optimizer's fp32 shards) gathered to rank 0
// and placed there by their numbering into io::whole_tensors, which megamoe-checkpoint export
// writes a checkpoint's tensors with too.
#pragma once

#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/parameter.hpp>
#include <megamoe/core/parameter_list.hpp>
#include <megamoe/io/whole_tensors.hpp>
#include <megamoe/train/training_state.hpp>
#include <megamoe/train/upcycle.hpp>

#include <boost/mpi/communicator.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
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

namespace detail {
/// Adds this rank's pieces of `parameters` (under the dense names where `dense_names`), of the
/// routers' expert biases among `states`, and writes what every rank of `world` holds to `path`
/// on rank 0.
MEGAMOE_DECL void add_parameter_pieces(tensor_pieces& mine, parameter_list<float> const& parameters,
                                       bool dense_names);
MEGAMOE_DECL void add_parameter_pieces(tensor_pieces& mine,
                                       parameter_list<double> const& parameters, bool dense_names);
MEGAMOE_DECL void add_expert_bias_pieces(tensor_pieces& mine, persistent_state_list const& states,
                                         bool dense_names);
MEGAMOE_DECL void write_gathered_model(boost::mpi::communicator const& world,
                                       tensor_pieces const& mine, std::filesystem::path const& path,
                                       std::map<std::string, std::string> const& metadata);
}  // namespace detail

/// Writes the model `trainer` trains to `path` (rank 0; every rank of `world` calls it), with
/// `metadata`. Models of one expert per layer are dense FFNs there, under the dense names.
template <class Trainer>
void export_whole_model(boost::mpi::communicator const& world, Trainer& trainer,
                        std::filesystem::path const& path,
                        std::map<std::string, std::string> const& metadata) {
  auto& model = trainer.model();
  tensor_pieces mine;
  bool const dense_names = model.values().shape.experts == 1;
  auto const parameters = model.numbered_parameters();
  detail::add_parameter_pieces(mine, parameters, dense_names);
  // Weights held as codes: their fp32 masters, each element in the optimizer shard of one rank.
  if constexpr (Trainer::model_type::quantized_weights) {
    auto const numbering = numbering_by_name(parameters);
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
  detail::add_expert_bias_pieces(mine, model.persistent_states(), dense_names);
  detail::write_gathered_model(world, mine, path, metadata);
}

}  // namespace megamoe::train

#if MEGAMOE_HEADER_ONLY
#include <megamoe/train/export.ipp>
#endif
