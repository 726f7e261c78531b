// SPDX-License-Identifier: Apache-2.0
// megamoe/io/checkpoint_reader.ipp — the definitions behind checkpoint_reader.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/io/checkpoint_reader.hpp>

namespace megamoe::io {

MEGAMOE_DECL auto checkpoint_reader::latest_iteration(boost::mpi::communicator const& world,
                                                      std::filesystem::path const& root) -> int {
  int iteration = -1;
  parallel::check_on_every_rank(world, [&] {
    if (world.rank() != 0) return;
    auto const tracker = root / checkpoint_tracker;
    if (!std::filesystem::is_directory(root))
      throw input_error("checkpoint: " + root.string() + " is not a folder");
    std::ifstream in(tracker);
    if (!in)
      throw input_error("checkpoint: " + tracker.string() +
                        " does not exist: no checkpoint was completed in " + root.string());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (text.empty() || text.size() > 9 ||
        text.find_first_not_of("0123456789") != std::string::npos)
      throw input_error("checkpoint: " + tracker.string() + " does not name an iteration ('" +
                        text.substr(0, 40) + "')");
    iteration = std::stoi(text);
  });
  boost::mpi::broadcast(world, iteration, 0);
  return iteration;
}

MEGAMOE_DECL checkpoint_reader::checkpoint_reader(boost::mpi::communicator const& world,
                                                  std::filesystem::path root, int iteration)
    : folder_(root / iteration_folder(iteration)), iteration_(iteration) {
  auto const start = std::chrono::steady_clock::now();
  std::string text;
  parallel::check_on_every_rank(world, [&] {
    if (world.rank() != 0) return;
    auto const path = folder_ / "index.json";
    std::ifstream in(path);
    if (!in) throw input_error("checkpoint: " + path.string() + " does not exist");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  });
  boost::mpi::broadcast(world, text, 0);
  parallel::check_on_every_rank(world, [&] { parse(text); });
  // Every file's size and CRC-32, the files dealt over the ranks.
  parallel::check_on_every_rank(world, [&] {
    for (std::size_t f = static_cast<std::size_t>(world.rank()); f < files_.size();
         f += static_cast<std::size_t>(world.size()))
      verify(f);
  });
  open_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

MEGAMOE_DECL auto checkpoint_reader::tensors() const noexcept
    -> std::map<std::string, checkpoint_tensor> const& {
  return tensors_;
}

MEGAMOE_DECL auto checkpoint_reader::bytes() const noexcept -> std::uint64_t {
  std::uint64_t n = 0;
  for (auto const& f : files_) n += f.bytes;
  return n;
}

MEGAMOE_DECL auto checkpoint_reader::tensor(std::string const& name) const
    -> checkpoint_tensor const& {
  auto const it = tensors_.find(name);
  if (it == tensors_.end())
    throw input_error("checkpoint " + folder_.string() + " holds no tensor " + name +
                      " (saved by another model or configuration?)");
  return it->second;
}

MEGAMOE_DECL auto checkpoint_reader::release() -> void {
  pieces_.clear();
  opened_.clear();
}

MEGAMOE_DECL auto checkpoint_reader::parse(std::string const& text) -> void {
  auto const path = (folder_ / "index.json").string();
  try {
    auto const j = nlohmann::json::parse(text);
    if (!j.is_object() || j.value("format", "") != checkpoint_format)
      throw input_error("not a megamoe checkpoint index (format '" +
                        (j.is_object() ? j.value("format", "") : std::string()) + "')");
    if (j.at("version").get<int>() != checkpoint_version)
      throw input_error("version " + j.at("version").dump() + ", this megamoe reads version " +
                        std::to_string(checkpoint_version));
    if (j.at("iteration").get<int>() != iteration_)
      throw input_error("it says iteration " + j.at("iteration").dump() + ", its folder " +
                        std::to_string(iteration_));
    world_size_ = j.at("world_size").get<int>();
    for (auto const& f : j.at("files")) {
      auto const name = f.at("name").get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name.front() == '.')
        throw input_error("file name '" + name + "' is not a plain name in the folder");
      files_.push_back({name, f.at("bytes").get<std::uint64_t>(),
                        detail::parse_crc(f.at("crc32").get<std::string>())});
    }
    state_ = j.at("state");
    for (auto const& [name, t] : j.at("tensors").items()) {
      auto tensor = detail::tensor_of_json(t);
      for (auto const& p : tensor.pieces)
        if (p.file < 0 || p.file >= std::ssize(files_))
          throw input_error(name + " names file " + std::to_string(p.file) + " of " +
                            std::to_string(files_.size()));
      if (auto const why = detail::coverage_problem(name, tensor); !why.empty())
        throw input_error(why);
      tensors_.emplace(name, std::move(tensor));
    }
  } catch (nlohmann::json::exception const& e) {
    throw input_error("checkpoint: " + path + " is malformed (" + e.what() + ")");
  } catch (input_error const& e) {
    throw input_error("checkpoint: " + path + ": " + e.what());
  }
}

MEGAMOE_DECL auto checkpoint_reader::verify(std::size_t f) const -> void {
  auto const path = folder_ / files_[f].name;
  if (!std::filesystem::exists(path))
    throw input_error("checkpoint: " + path.string() + " is missing (a shard of " +
                      std::to_string(files_.size()) + " files)");
  readable_file const file(path);
  if (file.size() != files_[f].bytes)
    throw input_error("checkpoint: " + path.string() + " is " + std::to_string(file.size()) +
                      " bytes, the index says " + std::to_string(files_[f].bytes) +
                      (file.size() < files_[f].bytes ? " (truncated)" : ""));
  if (auto const crc = file.crc(); crc != files_[f].crc)
    throw input_error("checkpoint: " + path.string() + " is corrupted (CRC-32 " + crc_text(crc) +
                      ", the index says " + crc_text(files_[f].crc) + ")");
}

MEGAMOE_DECL auto checkpoint_reader::piece_bytes(checkpoint_piece const& p,
                                                 checkpoint_tensor const& t)
    -> std::vector<std::byte> const& {
  auto const cached = pieces_.find(std::pair(p.file, p.key));
  if (cached != pieces_.end()) return cached->second;
  auto it = opened_.find(p.file);
  if (it == opened_.end()) {
    readable_file file(folder_ / files_[static_cast<std::size_t>(p.file)].name);
    auto header = read_safetensors_header(file);
    it = opened_.emplace(p.file, opened_file{std::move(file), std::move(header)}).first;
  }
  auto const& [file, header] = it->second;
  auto const* entry = header.find(p.key);
  auto const bytes = static_cast<std::uint64_t>(p.rows * p.cols) * dtype_size(t.type);
  if (entry == nullptr || entry->type != t.type || entry->end - entry->begin != bytes)
    throw input_error("checkpoint: " + file.path().string() + " lacks " + p.key +
                      " as the index describes it");
  std::vector<std::byte> data(bytes);
  file.read(entry->begin, data);
  if (crc32(data) != p.crc)
    throw input_error("checkpoint: " + file.path().string() + ": " + p.key +
                      " is corrupted (CRC-32 mismatch)");
  return pieces_.emplace(std::pair(p.file, p.key), std::move(data)).first->second;
}

}  // namespace megamoe::io
