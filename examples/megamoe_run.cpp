// SPDX-License-Identifier: Apache-2.0
// megamoe-run — runs a training job under mpiexec (or srun) and, when it fails (a rank killed, the
// collective watchdog firing, a node gone), relaunches it from its last checkpoint.
//
//   megamoe-run -n R [--max-restarts N] [--min-ranks M] [--layout N:FLAGS]... [--hostfile F |
//               --launcher srun] [--launcher-args "..."] [--watchdog S] -- PROGRAM FLAGS...
//
// PROGRAM is megamoe-train or any program built on train::run. Every launch after the first adds
// --load of the job's --save folder once it holds a checkpoint, so the job continues where it
// last saved (bit for bit on the same layout). With a hostfile, read again before every launch,
// a job whose hosts offer fewer than R slots runs on fewer ranks, down to --min-ranks: on a
// layout listed for that count (--layout 2:--ep=2), else on the largest count the job's degrees
// divide; it reshards its checkpoint as any load does. SIGTERM (or SIGUSR1) is passed to the job
// as SIGUSR1, which the launchers forward untouched: every rank saves after its current step
// (--exit-signal-handler, which every launch adds), the job ends, and megamoe-run exits 0. Each
// launch, failure and restart is a line of JSON in OUT/supervisor.jsonl (OUT: the job's --out)
// and on stderr.
#include <megamoe/train/supervisor.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

namespace sv = megamoe::train::supervisor;

volatile std::sig_atomic_t stop_signal = 0;       // SIGTERM or SIGUSR1: save and stop the job
volatile std::sig_atomic_t interrupt_signal = 0;  // SIGINT: stop the job now

void note_stop(int signal) {
  stop_signal = signal;
}
void note_interrupt(int signal) {
  interrupt_signal = signal;
}

/// Handlers without SA_RESTART, so that waiting for the job returns when a signal arrives.
void install_handlers() {
  struct sigaction action {};
  sigemptyset(&action.sa_mask);
  action.sa_handler = note_stop;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
  action.sa_handler = note_interrupt;
  sigaction(SIGINT, &action, nullptr);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string joined(std::vector<std::string> const& words) {
  std::string out;
  for (auto const& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

/// Events as metrics.jsonl's lines are written: one JSON object per line, flushed.
class event_log {
 public:
  explicit event_log(std::filesystem::path path) : path_(std::move(path)) {
    std::error_code ignored;
    if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path(), ignored);
  }
  void write(nlohmann::ordered_json event, std::string const& says) {
    nlohmann::ordered_json line{{"time", now_seconds()}};
    line.update(event);
    std::ofstream(path_, std::ios::app) << line.dump() << '\n' << std::flush;
    std::fprintf(stderr, "megamoe-run: %s\n", says.c_str());
  }

 private:
  std::filesystem::path path_;
};

/// Starts `command`; returns its process id.
pid_t start(std::vector<std::string> const& command) {
  std::vector<char*> argv;
  for (auto const& word : command) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  pid_t const pid = fork();
  if (pid < 0)
    throw megamoe::input_error(std::string("megamoe-run: fork: ") + std::strerror(errno));
  if (pid == 0) {
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "megamoe-run: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

/// Waits for the job, passing a stop request on as SIGUSR1 (once) and an interrupt as SIGINT.
int wait_for(pid_t pid) {
  bool stop_passed = false, interrupt_passed = false;
  for (;;) {
    if (stop_signal != 0 && !stop_passed) {
      kill(pid, SIGUSR1);
      stop_passed = true;
    }
    if (interrupt_signal != 0 && !interrupt_passed) {
      kill(pid, SIGINT);
      interrupt_passed = true;
    }
    int status = 0;
    if (waitpid(pid, &status, 0) == pid) return status;
    if (errno != EINTR)
      throw megamoe::input_error(std::string("megamoe-run: waitpid: ") + std::strerror(errno));
  }
}

/// The exit code a shell would show for `status`.
int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

/// Sleeps `seconds`, or less when a signal asks the supervisor to stop.
void pause_before_restart(double seconds) {
  auto const until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until && stop_signal == 0 && interrupt_signal == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace

int main(int argc, char** argv) {
  // megamoe-run's own flags come before "--", the job's after it.
  int separator = 1;
  while (separator < argc && std::string_view(argv[separator]) != "--") ++separator;
  CLI::App app{
      "megamoe-run: runs a training job under mpiexec or srun and relaunches it from its last "
      "checkpoint when it fails.\nUsage: megamoe-run [OPTIONS] -- PROGRAM FLAGS..."};
  int ranks = 1, max_restarts = 3, min_ranks = 0;
  double restart_delay = 1.0, watchdog = 0.0;
  std::string hostfile, launcher = "mpiexec", launcher_args, log;
  std::vector<std::string> layout_texts;
  bool dry_run = false;
  app.add_option("-n,--np", ranks, "ranks of the job")->check(CLI::PositiveNumber);
  app.add_option("--max-restarts", max_restarts, "relaunches after failures before giving up")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--min-ranks", min_ranks,
                 "relaunch on fewer ranks, down to this many, when the hostfile offers fewer "
                 "slots (0: never fewer than -n)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--layout", layout_texts,
                 "N:FLAGS, the job's flags on N ranks (e.g. 2:--ep=2), replacing its own; "
                 "repeat for several counts");
  app.add_option("--hostfile", hostfile,
                 "Open MPI hostfile, read again before every launch (its slots bound the ranks)");
  app.add_option("--launcher", launcher, "mpiexec (default) or srun, or a path to either");
  app.add_option("--launcher-args", launcher_args,
                 "the launcher's own flags, in one word (e.g. \"--bind-to core --map-by "
                 "ppr:2:node\", or \"--mpi=pmix\" for srun)");
  app.add_option("--watchdog", watchdog,
                 "MEGAMOE_WATCHDOG_SECONDS for the job: a collective still waiting after this "
                 "many seconds ends it, and it is relaunched (0: the environment's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--restart-delay", restart_delay, "seconds between a failure and the relaunch")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log", log, "the events' file (default: the job's --out/supervisor.jsonl)");
  app.add_flag("--dry-run", dry_run, "print the first launch's command and exit");
  try {
    app.parse(separator, argv);
  } catch (CLI::ParseError const& e) {
    return app.exit(e);
  }
  if (separator + 1 >= argc) {
    std::fprintf(stderr, "megamoe-run: no program: megamoe-run [OPTIONS] -- PROGRAM FLAGS...\n");
    return 2;
  }
  std::string const program = argv[separator + 1];
  std::vector<std::string> const flags(argv + separator + 2, argv + argc);
  try {
    std::vector<sv::layout_choice> listed;
    for (auto const& text : layout_texts) listed.push_back(sv::parse_layout(text));
    if (min_ranks > ranks)
      throw megamoe::input_error("megamoe-run: --min-ranks " + std::to_string(min_ranks) +
                                 " is more than -n " + std::to_string(ranks));
    if (!hostfile.empty() && std::filesystem::path(launcher).filename() == "srun")
      throw megamoe::input_error(
          "megamoe-run: --hostfile is mpiexec's: under srun, Slurm's allocation gives the nodes");
    sv::launcher how{launcher, {}, hostfile};
    std::istringstream words(launcher_args);
    for (std::string w; words >> w;) how.args.push_back(w);
    if (watchdog > 0) {
      setenv("MEGAMOE_WATCHDOG_SECONDS", std::to_string(watchdog).c_str(), 1);
      if (std::filesystem::path(launcher).filename() != "srun")
        how.args.insert(how.args.begin(), {"-x", "MEGAMOE_WATCHDOG_SECONDS"});
    }
    constexpr std::array<std::string_view, 1> out_flag{"--out"}, save_flag{"--save"};
    auto const out = sv::option_value(flags, out_flag)
                         .value_or(std::filesystem::path(program).filename().string() + "-out");
    auto const save = sv::option_value(flags, save_flag);
    event_log events(log.empty() ? std::filesystem::path(out) / "supervisor.jsonl"
                                 : std::filesystem::path(log));
    if (!save)
      std::fprintf(stderr,
                   "megamoe-run: warning: the job has no --save: a relaunch starts it again from "
                   "its first step\n");
    install_handlers();
    for (int attempt = 0;; ++attempt) {
      int const available = hostfile.empty() ? ranks : sv::total_slots(sv::read_hostfile(hostfile));
      auto const layout = sv::choose_layout(ranks, available, min_ranks, listed, flags);
      if (!layout) {
        events.write({{"event", "gave_up"}, {"attempt", attempt}, {"available_ranks", available}},
                     "only " + std::to_string(available) + " of " + std::to_string(ranks) +
                         " ranks available, and no layout fits them" +
                         (min_ranks > 0 ? " down to --min-ranks " + std::to_string(min_ranks)
                                        : std::string(" (--min-ranks allows fewer)")));
        return 1;
      }
      // -1: no checkpoint (an optional here trips GCC 12's maybe-uninitialized warning).
      int const iteration = save ? sv::saved_iteration(*save).value_or(-1) : -1;
      bool const resumes = attempt > 0 && iteration >= 0;
      auto const command = sv::launch_command(how, layout->ranks, program,
                                              sv::launch_flags(flags, *layout, attempt > 0));
      if (dry_run) {
        std::cout << joined(command) << std::endl;
        return 0;
      }
      events.write({{"event", "launch"},
                    {"attempt", attempt},
                    {"ranks", layout->ranks},
                    {"resume_iteration", resumes ? nlohmann::json(iteration) : nlohmann::json()},
                    {"command", joined(command)}},
                   "launch " + std::to_string(attempt) + " on " + std::to_string(layout->ranks) +
                       " ranks" + (resumes ? ", from iteration " + std::to_string(iteration) : "") +
                       ": " + joined(command));
      auto const started = std::chrono::steady_clock::now();
      int const status = wait_for(start(command));
      double const seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      int const code = exit_code(status);
      int const saved = save ? sv::saved_iteration(*save).value_or(-1) : -1;
      nlohmann::ordered_json ended{
          {"attempt", attempt},
          {"ranks", layout->ranks},
          {"exit_status", code},
          {"seconds", seconds},
          {"saved_iteration", saved >= 0 ? nlohmann::json(saved) : nlohmann::json()}};
      if (code == 0) {
        ended["event"] = stop_signal != 0 ? "stopped" : "finished";
        events.write(
            ended, stop_signal != 0 ? "the job saved and stopped on request" : "the job finished");
        return 0;
      }
      ended["event"] = "failure";
      if (WIFSIGNALED(status)) ended["signal"] = WTERMSIG(status);
      events.write(ended, "launch " + std::to_string(attempt) + " failed with exit status " +
                              std::to_string(code) + " after " + std::to_string(seconds) +
                              " s; last checkpoint: " +
                              (saved >= 0 ? "iteration " + std::to_string(saved) : "none"));
      if (stop_signal != 0 || interrupt_signal != 0) return code;
      if (attempt == max_restarts) {
        events.write({{"event", "gave_up"}, {"attempt", attempt}, {"exit_status", code}},
                     "giving up after " + std::to_string(max_restarts) + " restarts");
        return code;
      }
      pause_before_restart(restart_delay);
      if (stop_signal != 0 || interrupt_signal != 0) {
        events.write({{"event", "stopped"}, {"attempt", attempt}},
                     "stopped between launches; the last checkpoint stands");
        return stop_signal != 0 ? 0 : 128 + SIGINT;
      }
      events.write({{"event", "restart"}, {"attempt", attempt + 1}},
                   "relaunching (restart " + std::to_string(attempt + 1) + " of " +
                       std::to_string(max_restarts) + ")");
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
