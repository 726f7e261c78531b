// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec with MEGAMOE_WATCHDOG_SECONDS set. Without --mismatch: megamoe's collectives
// on named groups appear in the rank's ring in order, with their sizes, and complete. With
// --mismatch: rank 0 sums over `ep` while the others sum over `tp_dp_cp` (both hold every rank),
// so every rank waits forever; the watchdog must end the job with each rank's ring printed.
//
//   MEGAMOE_WATCHDOG_SECONDS=2 mpiexec -n 3 megamoe_watchdog_mpi_tests --ep 3 [--mismatch]
#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/parallel/watchdog.hpp>

#include <iostream>
#include <regex>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mp = megamoe::parallel;

int main(int argc, char** argv) {
  return mp::run_main(argc, argv, [&](mp::environment& env) {
    mp::degrees d;
    bool mismatch = false;
    mp::check_on_every_rank(env.world(), [&] {
      for (int i = 1; i < argc; ++i) {
        std::string const key = argv[i];
        if (key == "--ep" && i + 1 < argc)
          d.ep = std::stoi(argv[++i]);
        else if (key == "--mismatch")
          mismatch = true;
        else
          throw mm::input_error("unknown argument " + key);
      }
      if (!mp::watchdog::instance().on())
        throw mm::input_error("set MEGAMOE_WATCHDOG_SECONDS: this test needs the watchdog on");
    });
    mp::process_groups const groups(env.world(), d);
    std::vector<double> values(5, 1.0);
    mp::all_reduce_sum(groups.ep(), std::span<double>(values));
    std::vector<float> block(7, 1.0f);
    auto pending = mp::all_reduce_sum_start(groups.tp_dp_cp(), std::span<float>(block));
    pending.wait();
    if (mismatch) {
      std::vector<double> three(3, 1.0);
      mp::all_reduce_sum(env.world().rank() == 0 ? groups.ep() : groups.tp_dp_cp(),
                         std::span<double>(three));
      std::cout << "rank " << env.world().rank() << " passed the mismatched collective\n";
      return 0;
    }
    // The ring, oldest first: process groups, then the two sums, every one complete.
    std::string const ring = mp::watchdog::instance().ring_text();
    std::regex const expected(
        "#\\d+ agree_on_failure on MPI_COMM_WORLD \\(\\d+ ranks\\), 1 elements, done[^\n]*\n"
        "  #\\d+ create_process_groups on MPI_COMM_WORLD \\(\\d+ ranks\\), 15 elements, "
        "done[^\n]*\n"
        "  #\\d+ all_reduce_sum on ep \\(\\d+ ranks\\), 5 elements, done[^\n]*\n"
        "  #\\d+ all_reduce_sum on tp_dp_cp \\(\\d+ ranks\\), 7 elements, done");
    bool const ok = std::regex_search(ring, expected);
    int const failures = boost::mpi::all_reduce(env.world(), ok ? 0 : 1, std::plus<int>());
    if (!ok) std::cerr << "rank " << env.world().rank() << " ring:\n" << ring;
    if (env.world().rank() == 0)
      std::cout << "watchdog ring on every rank: " << (failures == 0 ? "as issued" : "WRONG")
                << "\n"
                << ring;
    return failures == 0 ? 0 : 1;
  });
}
