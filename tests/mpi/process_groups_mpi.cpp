// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. Every rank builds megamoe's communicators for a layout and checks each one
// against the group that the closed-form rank formula gives (tests/reference/group_formula.hpp, not
// megamoe's generator): its size, this rank's position, and an all-gather of the world ranks over
// it. With --layout-from FILE the layout comes from a reference file, whose group lists are checked
// too.
//
//   mpiexec -n 8 megamoe_mpi_tests --tp 2 --etp 1 --ep 4
//   mpiexec -n 8 megamoe_mpi_tests --layout-from tests/data/megatron/p01_w8_tp2_dp4_etp1_ep4.json
#include <megamoe/parallel/process_groups.hpp>

#include "reference/group_formula.hpp"

#include <boost/mpi/collectives/all_gather.hpp>
#include <boost/mpi/collectives/all_reduce.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace ref = megamoe::reference;

namespace {

struct arguments {
  mm::parallel::degrees degrees;
  std::optional<nlohmann::json> reference;
  std::optional<int> fail_on_rank;  // a local error on one rank while the others communicate
};

arguments parse(int argc, char** argv) {
  arguments a;
  std::optional<int> etp;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const key = argv[i];
    std::string const value = argv[i + 1];
    if (key == "--layout-from") {
      std::ifstream in(value);
      if (!in) throw mm::input_error("cannot open " + value);
      a.reference = nlohmann::json::parse(in);
      auto const& c = a.reference->at("config");
      a.degrees = {c.at("tp"), c.at("cp"), c.at("pp"), c.at("etp"), c.at("ep")};
      etp = a.degrees.etp;
    } else if (key == "--tp") {
      a.degrees.tp = std::stoi(value);
    } else if (key == "--cp") {
      a.degrees.cp = std::stoi(value);
    } else if (key == "--pp") {
      a.degrees.pp = std::stoi(value);
    } else if (key == "--etp") {
      etp = std::stoi(value);
    } else if (key == "--ep") {
      a.degrees.ep = std::stoi(value);
    } else if (key == "--fail-on-rank") {
      a.fail_on_rank = std::stoi(value);
    } else {
      throw mm::input_error("unknown argument " + key);
    }
  }
  a.degrees.etp = etp.value_or(a.degrees.tp);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    auto const& world = env.world();
    arguments const args = parse(argc, argv);
    mm::parallel::process_groups const groups(world, args.degrees);
    auto const& l = groups.layout();
    if (args.reference && args.reference->at("config").at("world_size") != world.size())
      throw mm::input_error("the reference layout needs " +
                            args.reference->at("config").at("world_size").dump() + " ranks");

    int const me = world.rank();
    if (args.fail_on_rank == me)
      throw mm::input_error("injected failure on one rank while the others communicate");
    int failures = 0;
    int checked = 0;
    auto check = [&](boost::mpi::communicator const& comm, ref::axis_sizes const& sizes,
                     std::string_view type, std::string const& grid, char const* file_key) {
      std::vector<int> const expected = ref::group_of(sizes, type, me);
      std::vector<int> members;
      boost::mpi::all_gather(comm, me, members);
      bool ok = comm.size() == static_cast<int>(expected.size()) && members == expected &&
                expected.at(static_cast<std::size_t>(comm.rank())) == me;
      if (args.reference) {
        bool found = false;
        for (auto const& g : args.reference->at(file_key).at(std::string(type)))
          found = found || g.get<std::vector<int>>() == expected;
        ok = ok && found;
      }
      if (!ok) {
        ++failures;
        std::cerr << "rank " << me << ": " << grid << " " << type << " holds "
                  << nlohmann::json(members).dump() << ", expected "
                  << nlohmann::json(expected).dump() << "\n";
      }
      ++checked;
    };

    auto const decoder = ref::decoder_sizes(l.tp, l.cp, l.dp, l.pp);
    auto const expert = ref::expert_sizes(l.etp, l.ep, l.edp, l.pp);
    for (std::size_t i = 0; i < mm::parallel::decoder_group_types.size(); ++i)
      check(groups.get(static_cast<mm::parallel::decoder_group>(i)), decoder,
            mm::parallel::decoder_group_types[i], "decoder", "decoder_groups");
    for (std::size_t i = 0; i < mm::parallel::expert_group_types.size(); ++i)
      check(groups.get(static_cast<mm::parallel::expert_group>(i)), expert,
            mm::parallel::expert_group_types[i], "expert", "expert_groups");

    // The named accessors are the same communicators.
    bool const named = groups.tp_ep().size() == l.etp * l.ep && groups.ep().size() == l.ep &&
                       groups.expert_dp().size() == l.edp && groups.dp_cp().size() == l.dp * l.cp &&
                       groups.tp_dp_cp().size() == l.tp * l.dp * l.cp;
    failures += named ? 0 : 1;

    int const total = boost::mpi::all_reduce(world, failures, std::plus<int>());
    if (me == 0)
      std::cout << "process groups on " << world.size() << " ranks (tp " << l.tp << " cp " << l.cp
                << " dp " << l.dp << " pp " << l.pp << " | etp " << l.etp << " ep " << l.ep
                << " edp " << l.edp << "): " << checked << " communicators per rank, "
                << (total == 0 ? "all match" : std::to_string(total) + " mismatches") << "\n";
    return total == 0 ? 0 : 1;
  });
}
