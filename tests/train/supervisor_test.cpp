// SPDX-License-Identifier: Apache-2.0
// megamoe-run's decisions (train/supervisor.hpp): hostfiles, layouts on fewer ranks, the flags and
// the command of a relaunch.
#include <megamoe/train/supervisor.hpp>

#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace sv = megamoe::train::supervisor;
using words = std::vector<std::string>;

std::filesystem::path scratch(std::string const& name) {
  auto const dir = std::filesystem::temp_directory_path() / "megamoe_supervisor_test";
  std::filesystem::create_directories(dir);
  return dir / name;
}

std::filesystem::path written(std::string const& name, std::string const& text) {
  auto const path = scratch(name);
  std::ofstream(path) << text;
  return path;
}

TEST(Supervisor, HostfileSlots) {
  auto const hosts = sv::read_hostfile(written("hosts",
                                               "# two nodes\nnode-a slots=4 max_slots=8\n"
                                               "node-b   slots=2 # the small one\n\n"
                                               "node-c\nnode-c\nnode-c\n"));
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "node-a");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[1].slots, 2);
  EXPECT_EQ(hosts[2].slots, 3);  // one slot per line
  EXPECT_EQ(sv::total_slots(hosts), 9);
  EXPECT_THROW(sv::read_hostfile(written("bad1", "a slots=2\na slots=2\n")), megamoe::input_error);
  EXPECT_THROW(sv::read_hostfile(written("bad2", "a slots=two\n")), megamoe::input_error);
  EXPECT_THROW(sv::read_hostfile(written("bad3", "a cores=2\n")), megamoe::input_error);
  EXPECT_THROW(sv::read_hostfile(written("bad4", "# none\n")), megamoe::input_error);
  EXPECT_THROW(sv::read_hostfile(scratch("absent")), megamoe::input_error);
}

TEST(Supervisor, OptionsAreFoundAndReplaced) {
  words const flags{"--preset", "tiny",   "--ep=4", "--lr",
                    "-1e-3",    "--save", "ck",     "--fp8-param-gather"};
  constexpr std::array<std::string_view, 2> ep{"--ep", "--expert-model-parallel-size"};
  constexpr std::array<std::string_view, 1> lr{"--lr"}, save{"--save"},
      gather{"--fp8-param-gather"};
  EXPECT_EQ(sv::option_value(flags, ep), "4");
  EXPECT_EQ(sv::option_value(flags, lr), "-1e-3");  // a negative number is a value
  EXPECT_EQ(sv::option_value(flags, save), "ck");
  EXPECT_FALSE(sv::option_value(flags, gather));  // a flag has no value
  EXPECT_EQ(sv::without_option(flags, save, true),
            (words{"--preset", "tiny", "--ep=4", "--lr", "-1e-3", "--fp8-param-gather"}));
  // A replacement removes both spellings of a degree flag.
  words const reference{"--expert-model-parallel-size", "4", "--tp", "2"};
  words const two{"--ep", "2", "--tp=1"};
  EXPECT_EQ(sv::with_options(reference, two), (words{"--ep", "2", "--tp=1"}));
  EXPECT_EQ(sv::degree_products(words{"--tp", "2", "--pp=2", "--ep", "4", "--etp", "1"}),
            (std::pair{4, 8}));
  EXPECT_EQ(sv::degree_products(words{}), (std::pair{1, 1}));
  EXPECT_THROW(sv::degree_products(words{"--ep", "0"}), megamoe::input_error);
}

TEST(Supervisor, LayoutOnFewerRanks) {
  words const flags{"--ep", "4"};
  std::vector<sv::layout_choice> const listed{sv::parse_layout("2:--ep=2"),
                                              sv::parse_layout("3:--ep 1 --global-batch 12")};
  EXPECT_EQ(listed[1].flags, (words{"--ep", "1", "--global-batch", "12"}));
  // All there: the job's own flags.
  auto full = sv::choose_layout(4, 8, 2, listed, flags);
  ASSERT_TRUE(full);
  EXPECT_EQ(full->ranks, 4);
  EXPECT_TRUE(full->flags.empty());
  // Three left: the largest listed count that fits.
  auto three = sv::choose_layout(4, 3, 2, listed, flags);
  ASSERT_TRUE(three);
  EXPECT_EQ(three->ranks, 3);
  // Nothing listed: the largest count the degrees divide (EP 4 needs 4).
  EXPECT_FALSE(sv::choose_layout(4, 3, 2, {}, flags));
  auto const by_degrees = sv::choose_layout(8, 7, 2, {}, words{"--tp", "2"});
  ASSERT_TRUE(by_degrees);
  EXPECT_EQ(by_degrees->ranks, 6);
  // Not below --min-ranks, and without it not below -n.
  EXPECT_FALSE(sv::choose_layout(4, 1, 2, listed, flags));
  EXPECT_FALSE(sv::choose_layout(4, 3, 0, listed, flags));
  EXPECT_THROW(sv::parse_layout("2"), megamoe::input_error);
  EXPECT_THROW(sv::parse_layout("x:--ep=2"), megamoe::input_error);
  EXPECT_THROW(sv::parse_layout("2:ep 2"), megamoe::input_error);
  EXPECT_THROW(sv::parse_layout("2:--ep=2 2"), megamoe::input_error);
}

TEST(Supervisor, RelaunchLoadsTheSaveFolder) {
  auto const save = scratch("save");
  std::filesystem::remove_all(save);
  words const flags{"--preset",   "tiny",   "--load",     "pretrained",
                    "--finetune", "--save", save.string()};
  sv::layout_choice const same{4, {}};
  // The first launch as written, with the signal handler.
  auto first = sv::launch_flags(flags, same, false);
  EXPECT_EQ(first.back(), "--exit-signal-handler");
  // A relaunch before any save is the first launch again.
  EXPECT_EQ(sv::launch_flags(flags, same, true), first);
  std::filesystem::create_directories(save);
  std::ofstream(save / "latest_checkpointed_iteration.txt") << "40\n";
  EXPECT_EQ(sv::saved_iteration(save), 40);
  auto const again = sv::launch_flags(flags, sv::layout_choice{2, {"--ep=2"}}, true);
  EXPECT_EQ(again, (words{"--preset", "tiny", "--save", save.string(), "--ep=2",
                          "--exit-signal-handler", "--load", save.string()}));
  EXPECT_FALSE(sv::saved_iteration(scratch("nothing")));
}

TEST(Supervisor, LaunchCommands) {
  words const flags{"--preset", "tiny"};
  EXPECT_EQ(
      sv::launch_command({"mpiexec", {"--bind-to", "core"}, "hosts"}, 4, "megamoe-train", flags),
      (words{"mpiexec", "-n", "4", "--hostfile", "hosts", "--bind-to", "core", "megamoe-train",
             "--preset", "tiny"}));
  EXPECT_EQ(sv::launch_command({"/usr/bin/srun", {"--mpi=pmix"}, ""}, 8, "./my-model", flags),
            (words{"/usr/bin/srun", "--ntasks", "8", "--kill-on-bad-exit=1", "--mpi=pmix",
                   "./my-model", "--preset", "tiny"}));
}

}  // namespace
