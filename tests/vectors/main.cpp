// SPDX-License-Identifier: Apache-2.0
// megamoe_reference_vectors — runs every reference-vector file of the requested kinds.
//
//   megamoe_reference_vectors --kind parallel_groups [--dir D] [--layout-tool PATH]
//   megamoe_reference_vectors --kind router --fault flipped_ties   (must fail: a planted fault)
//
// The folder is MEGAMOE_REFERENCE_VECTORS, or else the in-repo copy tests/data/megatron (a path
// fixed at build time from the source tree, so the working directory does not matter). Files are
// selected by their `kind` field; each prints `reference_vectors <stem>: ok, fields=<n>,
// worst_rel_err=<x>` or the reason it failed. A file with a field its checker does not read fails.
#include "vectors/vector_file.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace mv = megamoe::vectors;

std::map<std::string, mv::checker>& mv::checkers() {
  static std::map<std::string, checker> all;
  return all;
}

int main(int argc, char** argv) {
  std::vector<std::string> kinds;
  std::string dir;
  mv::run_options options;
  for (int i = 1; i < argc; ++i) {
    std::string const arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << arg << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--kind") {
      kinds.push_back(value());
    } else if (arg == "--dir") {
      dir = value();
    } else if (arg == "--layout-tool") {
      options.layout_tool = value();
    } else if (arg == "--fault") {
      std::string const fault = value();
      if (fault == "flipped_ties") {
        options.fault = mv::planted_fault::flipped_ties;
      } else if (fault == "logit_above_bound") {
        options.fault = mv::planted_fault::logit_above_bound;
      } else if (fault == "logit_within_bound") {
        options.fault = mv::planted_fault::logit_within_bound;
      } else {
        std::cerr << "--fault: flipped_ties, logit_above_bound or logit_within_bound\n";
        return 2;
      }
    } else {
      std::cerr << "usage: megamoe_reference_vectors --kind K [--kind K ...] [--dir D] "
                   "[--layout-tool PATH] [--fault NAME]\n";
      return 2;
    }
  }
  if (dir.empty()) {
    char const* env = std::getenv("MEGAMOE_REFERENCE_VECTORS");
    dir = env && *env ? env : MEGAMOE_DEFAULT_REFERENCE_VECTORS;
  }
  if (kinds.empty()) {
    for (auto const& [kind, check] : mv::checkers()) kinds.push_back(kind);
  }
  for (auto const& kind : kinds) {
    if (!mv::checkers().count(kind)) {
      std::cerr << "no checker for kind '" << kind << "'\n";
      return 2;
    }
  }
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) {
    std::cerr << "reference vectors: folder '" << dir
              << "' does not exist (MEGAMOE_REFERENCE_VECTORS)\n";
    return 1;
  }

  std::vector<std::filesystem::path> files;
  for (auto const& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());

  int ran = 0, failed = 0;
  for (auto const& path : files) {
    nlohmann::json content;
    try {
      std::ifstream in(path);
      content = nlohmann::json::parse(in);
    } catch (std::exception const& e) {
      std::cout << "reference_vectors " << path.stem().string()
                << ": FAILED, not valid JSON: " << e.what() << "\n";
      ++failed;
      continue;
    }
    mv::vector_file file(path, std::move(content));
    if (std::find(kinds.begin(), kinds.end(), file.kind()) == kinds.end()) continue;
    ++ran;
    try {
      auto const result = mv::checkers().at(file.kind())(file, options);
      auto const unchecked = file.unchecked();
      if (!unchecked.empty()) {
        std::string list;
        for (auto const& f : unchecked) list += (list.empty() ? "" : ", ") + f;
        throw mv::mismatch("fields not checked: " + list);
      }
      char line[256];
      std::snprintf(line, sizeof line, "reference_vectors %s: ok, fields=%d, worst_rel_err=%.3g",
                    file.stem().c_str(), result.fields >= 0 ? result.fields : file.checked_count(),
                    result.worst_rel_err);
      std::cout << line << "\n";
    } catch (std::exception const& e) {
      std::cout << "reference_vectors " << file.stem() << ": FAILED, " << e.what() << "\n";
      ++failed;
    }
  }
  if (ran == 0) {
    std::cout << "reference_vectors: no file of the requested kind in " << dir << "\n";
    return 1;
  }
  std::cout << "reference_vectors: " << ran - failed << " of " << ran << " files ok (" << dir
            << ")\n";
  return failed == 0 ? 0 : 1;
}
