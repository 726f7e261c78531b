// SPDX-License-Identifier: Apache-2.0
// megamoe/io/checkpoint_writer.ipp — the definitions behind checkpoint_writer.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/io/checkpoint_writer.hpp>

namespace megamoe::io::detail {

MEGAMOE_DECL bool exchange_paths(std::filesystem::path const& a, std::filesystem::path const& b) {
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
}

}  // namespace megamoe::io::detail

namespace megamoe::io {

MEGAMOE_DECL auto checkpoint_writer::staged_bytes() const noexcept -> std::size_t {
  std::size_t n = 0;
  for (auto const& s : staged_) n += s.bytes.size();
  return n;
}

MEGAMOE_DECL auto checkpoint_writer::commit(nlohmann::json const& state) -> std::uint64_t {
  prepare();
  write_file();
  return finish(state);
}

MEGAMOE_DECL auto checkpoint_writer::partial_folder() const -> std::filesystem::path {
  return root_ / ("." + iteration_folder(iteration_) + ".partial");
}

MEGAMOE_DECL auto checkpoint_writer::prepare() -> void {
  auto const partial = partial_folder();
  parallel::check_on_every_rank(world_, [&] {
    if (world_.rank() != 0) return;
    std::error_code error;
    std::filesystem::create_directories(root_, error);
    if (error || !std::filesystem::is_directory(root_))
      throw input_error("checkpoint: cannot create " + root_.string() + ": " + error.message());
    // What a killed save left: never chosen (the tracker names none), removed here.
    std::vector<std::filesystem::path> stale;
    for (auto const& entry : std::filesystem::directory_iterator(root_, error)) {
      auto const name = entry.path().filename().string();
      if (name.starts_with(".iter_") && name.ends_with(".partial")) stale.push_back(entry.path());
    }
    for (auto const& path : stale) std::filesystem::remove_all(path, error);
    std::filesystem::remove_all(partial, error);
    if (!std::filesystem::create_directory(partial, error))
      throw input_error("checkpoint: cannot create " + partial.string() + ": " + error.message());
  });
}

MEGAMOE_DECL auto checkpoint_writer::write_file() noexcept -> void {
  int const rank = world_.rank();
  auto const partial = partial_folder();
  try {
    durable_file file(partial / rank_file(rank), checkpoint_fault(rank));
    std::vector<tensor_bytes> tensors;
    nlohmann::json pieces = nlohmann::json::array();
    for (auto const& s : staged_) {
      std::string const key = detail::piece_key(s.name, s.rect);
      std::vector<std::int64_t> shape{s.rect.rows, s.rect.cols};
      if (s.shape.size() == 1) shape = {s.rect.cols};
      tensors.push_back({key, s.type, shape, std::span<std::byte const>(s.bytes)});
      checkpoint_tensor t{s.type,
                          s.shape,
                          s.rows,
                          s.cols,
                          {{rank, key, s.rect.row, s.rect.col, s.rect.rows, s.rect.cols,
                            crc32(std::span<std::byte const>(s.bytes))}}};
      pieces.push_back({{"name", s.name}, {"tensor", detail::tensor_json(t)}});
    }
    write_safetensors(file, tensors,
                      {{"format", checkpoint_format},
                       {"iteration", std::to_string(iteration_)},
                       {"rank", std::to_string(rank)}});
    file.finish();
    written_ = {{"pieces", pieces}, {"bytes", file.size()}, {"crc32", crc_text(file.crc())}};
  } catch (std::exception const& e) {
    write_error_ = e.what();
  }
  staged_ = {};
}

MEGAMOE_DECL auto checkpoint_writer::finish(nlohmann::json const& state) -> std::uint64_t {
  int const rank = world_.rank();
  auto const folder = iteration_folder(iteration_);
  auto const partial = partial_folder();
  parallel::check_on_every_rank(world_, [&] {
    if (!write_error_.empty()) throw input_error(write_error_);
  });
  nlohmann::json const& mine = written_;
  std::vector<std::string> all;
  boost::mpi::gather(world_, mine.dump(), all, 0);
  std::uint64_t total = 0;
  parallel::check_on_every_rank(world_, [&] {
    if (rank != 0) return;
    std::map<std::string, checkpoint_tensor> tensors;
    nlohmann::json files = nlohmann::json::array();
    for (std::size_t r = 0; r < all.size(); ++r) {
      auto const j = nlohmann::json::parse(all[r]);
      files.push_back({{"name", rank_file(static_cast<int>(r))},
                       {"bytes", j.at("bytes")},
                       {"crc32", j.at("crc32")}});
      total += j.at("bytes").get<std::uint64_t>();
      for (auto const& p : j.at("pieces")) {
        auto const name = p.at("name").get<std::string>();
        auto const t = detail::tensor_of_json(p.at("tensor"));
        auto [it, fresh] = tensors.try_emplace(name, t);
        if (fresh) continue;
        if (it->second.type != t.type || it->second.shape != t.shape || it->second.rows != t.rows)
          throw input_error("checkpoint: ranks disagree on the dtype or shape of " + name);
        it->second.pieces.push_back(t.pieces.front());
      }
    }
    nlohmann::json index_tensors = nlohmann::json::object();
    for (auto const& [name, t] : tensors) {
      if (auto const why = detail::coverage_problem(name, t); !why.empty())
        throw input_error("checkpoint: not saved, the ranks' pieces are wrong: " + why);
      index_tensors[name] = detail::tensor_json(t);
    }
    nlohmann::json index = {{"format", checkpoint_format},
                            {"version", checkpoint_version},
                            {"iteration", iteration_},
                            {"world_size", world_.size()},
                            {"files", files},
                            {"state", state},
                            {"tensors", index_tensors}};
    std::string const text = index.dump(1);
    durable_file file(partial / "index.json");
    file.write(text);
    file.finish();
    total += file.size();
    sync_directory(partial);
    auto const final_folder = root_ / folder;
    std::error_code error;
    if (std::filesystem::exists(final_folder, error)) {
      // An older save of this iteration: exchanged in one step, then removed.
      if (!detail::exchange_paths(partial, final_folder))
        throw input_error("checkpoint: cannot replace " + final_folder.string() + ": " +
                          std::strerror(errno));
      sync_directory(root_);
      std::filesystem::remove_all(partial, error);
    } else {
      std::filesystem::rename(partial, final_folder, error);
      if (error)
        throw input_error("checkpoint: cannot rename " + partial.string() + " to " +
                          final_folder.string() + ": " + error.message());
      sync_directory(root_);
    }
    replace_file(root_ / checkpoint_tracker, std::to_string(iteration_) + "\n");
  });
  boost::mpi::broadcast(world_, total, 0);
  return total;
}

}  // namespace megamoe::io
