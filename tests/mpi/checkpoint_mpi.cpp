// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. Checkpoints of the whole training state (train/training_state.hpp):
//
//   --mode resume       a run of 5 steps against 2 steps, a save, a fresh model and trainer, a load
//                       and 3 more steps: every loss and the final state the same bits (fp32 with
//                       the aux-loss-free router's expert bias; FP8 delayed scaling with the expert
//                       weights held as codes: their codes, the delayed-scaling state)
//   --mode save         train --steps, save to --dir, train --more and write the losses to
//                       --losses (rank 0, hexadecimal doubles)
//   --mode resave       load --dir (saved on any layout), save the loaded state at once to --to,
//                       train --more and write the losses
//   --mode compare      one rank: every tensor of --dir and --to the same bits, and the losses of
//                       --losses and --against within --rtol
//   --mode damage       save after 2 steps, rank 0 damages it (--damage byte | truncate | missing
//                       | index | tracker), load: an error on every rank (the caller checks it)
//   --mode other_model  save, load into a model with a wider hidden size: an error on every rank
//   --mode fault        save at step 2, train to 4, save with MEGAMOE_CHECKPOINT_FAULT=--fault
//                       (write_error: an error on every rank, caught; kill_in_save: the job dies),
//                       then as --mode recover
//   --mode recover      load --dir: iteration 2, and 2 more steps give the uninterrupted run's
//                       losses of steps 3 and 4
//   --mode killed       FP8 delayed scaling with the weights as codes: train 6 steps saving every 2
//                       and SIGKILL every rank after step --steps (the job dies)
//   --mode after_kill   load --dir and train to step 6: every loss after the saved step and the
//                       final state the same bits as an uninterrupted run's
//   --mode upcycle      a dense model (one expert of width 12, top-1) written as safetensors under
//                       the dense names, upcycled into 4 experts top-2 on the job's layout: the
//                       first forward's loss equals the dense model's within the round-off of
//                       the router's fp32 probabilities (1e-6 in fp64, 1e-5 in fp32); granular (a
//                       dense FFN of 24 into experts of 12, g = 2, weights of std 0.3): SwiGLU
//                       does not commute with the scaling, so within 1e-2 only (8e-3 seen)
//   --mode convert      each rank writes its rows of an F32 and a BF16 tensor; every rank reads
//                       both whole in the other dtype: F32 into bfloat16 rounds to nearest even
//                       (to_bf16_bits, halfway cases and NaN among the values), BF16 into float
//                       is exact; another dtype is refused (Adam's moments under either
//                       --exp-avg-dtype load into the other)
//
// Layout: --tp, --cp, --pp, --ep, --etp (the world's other ranks are DP); --precision fp64 | fp32.
// With --mtp 1 (modes resume, save, resave) the model has a multi-token prediction depth (an MoE
// layer), whose table under PP is the last stage's copy of stage 0's: saved once, as stage 0's.
#include "support/sample_data.hpp"
#include "support/tally.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/io/checkpoint_files.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/precision/operands.hpp>
#include <megamoe/train/trainer.hpp>
#include <megamoe/train/training_state.hpp>
#include <megamoe/train/upcycle.hpp>

#include <boost/mpi/collectives/broadcast.hpp>

#include <bit>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace mt = megamoe::train;
namespace rt = megamoe::router;
namespace md = megamoe::model;
namespace fs = std::filesystem;

namespace {

using decoder = md::decoder<md::layers<4>, md::heads<2>, md::vocabulary<256>, md::dense_ffn<20>,
                            md::moe_layer_freq<2>>;
using mapped = mm::parallel::mapping<mm::parallel::tp<mm::dynamic>, mm::parallel::cp<mm::dynamic>,
                                     mm::parallel::pp<mm::dynamic>, mm::parallel::etp<mm::dynamic>,
                                     mm::parallel::ep<mm::dynamic>>;
using mtp_decoder =
    md::decoder<md::layers<4>, md::heads<2>, md::vocabulary<256>, md::dense_ffn<20>,
                md::moe_layer_pattern<0, 1, 0, 1>, md::multi_token_prediction<1, 0.3>>;
template <class Router, class Precision, class Memory = mm::memory::keep_all, int Hidden = 16,
          int Ffn = 12, int Experts = 4, class Decoder = decoder>
using config =
    mm::make_config<mm::shape<mm::hidden<Hidden>, mm::ffn<Ffn>, mm::experts<Experts>>, Router,
                    mm::dispatch::all_to_all, mm::expert::mlp<mm::expert::swiglu>, Precision,
                    mapped, Memory, Decoder>;
using aux_router = rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>;
using bias_router = rt::aux_loss_free<2, rt::seq_aux_loss<1e-4>>;
using fp64_config = config<aux_router, mm::precision::fp64>;
using fp32_config = config<bias_router, mm::precision::fp32>;
template <class Precision>
using mtp_config = config<aux_router, Precision, mm::memory::keep_all, 16, 12, 4, mtp_decoder>;
template <class Precision, int Ffn>
using dense_config =
    config<rt::top_k<1, rt::softmax_before_topk>, Precision, mm::memory::keep_all, 16, Ffn, 1>;
template <class Precision>
using upcycled_config = config<aux_router, Precision>;
using delayed_codes_config =
    config<aux_router, mm::precision::fp8_tensorwise<mm::precision::delayed>,
           mm::memory::plan<mm::memory::quantized_weights>>;

struct arguments {
  std::string mode = "resume", dir, to, losses, against, damage, fault, precision = "fp64";
  int steps = 2, more = 2;
  double rtol = 0.0;
  bool mtp = false;
  mm::parallel::degrees degrees;
};

mt::train_settings settings(int steps) {
  mt::train_settings s;
  s.seq_length = 8;
  s.steps = steps;
  s.schedule = {1e-2, 1e-3, 1, steps};
  s.seed = 21;
  return s;
}

/// The global batch of 4 sequences over the job's DP ranks, in micro-batches of one sequence
/// (the router's losses are per micro-batch: every layout keeps its size).
mt::train_settings job_settings(mm::parallel::process_groups const& groups, int steps) {
  auto s = settings(steps);
  s.micro_batch = 1;
  s.micro_batches = 4 / groups.dp().size();
  return s;
}

std::string hex(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", x);
  return buf;
}

std::vector<double> read_losses(std::string const& path) {
  std::ifstream in(path);
  if (!in) throw mm::input_error("cannot read " + path);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) out.push_back(std::strtod(line.c_str(), nullptr));
  return out;
}

/// A model and its trainer on the job, initialised alike on every layout.
template <class Config>
struct job {
  mm::transformer<Config> model;
  mt::trainer<Config> trainer;
  job(mm::parallel::process_groups const& groups, mm::testing::sample_corpus const& corpus,
      int steps)
      : model(groups),
        trainer((model.initialize(9, 0.3), groups), model,
                corpus(job_settings(groups, steps).seq_length), job_settings(groups, steps)) {}
  std::vector<double> run(mm::context& ctx, int steps) {
    std::vector<double> losses;
    for (int k = 0; k < steps; ++k) losses.push_back(trainer.step(ctx).loss);
    return losses;
  }
};

/// The values of every parameter this rank holds, and the persistent state, as doubles.
template <class Config>
std::map<std::string, std::vector<double>> state_of(mm::transformer<Config>& model) {
  std::map<std::string, std::vector<double>> out;
  model.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    out[std::string(name)].assign(value.data(), value.data() + value.size());
  });
  model.for_each_persistent_state([&](mm::persistent_state const& s) {
    out[std::string(s.name)].assign(s.values.begin(), s.values.end());
  });
  return out;
}

template <class Config>
void check_resume(mm::testing::tally& result, mm::parallel::process_groups const& groups,
                  mm::testing::sample_corpus const& corpus, mm::context& ctx, fs::path const& dir,
                  std::string const& what) {
  boost::mpi::communicator const world;
  job<Config> whole(groups, corpus, 5);
  auto const expected = whole.run(ctx, 5);
  {
    job<Config> first(groups, corpus, 5);
    first.run(ctx, 2);
    mt::save_checkpoint(first.trainer, world, dir);
  }
  job<Config> resumed(groups, corpus, 5);
  auto const report = mt::load_checkpoint(resumed.trainer, world, dir);
  result.close(what + ": loaded iteration", report.iteration, 2, 1, 0);
  auto const losses = resumed.run(ctx, 3);
  for (std::size_t k = 0; k < losses.size(); ++k)
    result.close(what + ": loss of step " + std::to_string(k + 3), losses[k], expected[k + 2], 1,
                 0);
  auto const a = state_of(resumed.model), b = state_of(whole.model);
  for (auto const& [name, values] : b) {
    auto const& mine = a.at(name);
    for (std::size_t i = 0; i < values.size(); ++i)
      result.close(what + ": final " + name, mine[i], values[i], 1, 0);
  }
  result.close(what + ": optimizer steps", resumed.trainer.optimizer().steps(),
               whole.trainer.optimizer().steps(), 1, 0);
  if constexpr (mm::transformer<Config>::moe_type::quantized_weights) {
    using role = mm::precision::operand_role;
    auto const resumed_layers = resumed.model.recipe_moe_layers();
    auto const whole_layers = whole.model.recipe_moe_layers();
    result.close(what + ": MoE layers", static_cast<double>(resumed_layers.size()),
                 static_cast<double>(whole_layers.size()), 1, 0);
    for (std::size_t l = 0; l < whole_layers.size() && l < resumed_layers.size(); ++l) {
      auto const& m = *resumed_layers[l];
      auto const& w = *whole_layers[l];
      for (auto lin : {mm::expert::linear::fc1, mm::expert::linear::fc2})
        for (int e = 0; e < m.local_experts(); ++e) {
          auto const& x = m.routed_operands().codes_of(lin, role::weight,
                                                       mm::precision::operand_usage::rowwise, e);
          auto const& y = w.routed_operands().codes_of(lin, role::weight,
                                                       mm::precision::operand_usage::rowwise, e);
          result.close(what + ": weight codes of expert " + std::to_string(e),
                       x.codes == y.codes && x.scale_inv == y.scale_inv ? 1 : 0, 1, 1, 0);
        }
    }
  }
}

/// A dense model's weights under the dense names, written by rank 0 (every rank holds them all).
template <class Config>
void write_dense(boost::mpi::communicator const& world, mm::transformer<Config>& model,
                 fs::path const& file) {
  std::vector<std::vector<float>> values;
  std::vector<mm::io::tensor_view> tensors;
  model.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind) {
    auto const dense = mt::dense_parameter_name(std::string(name));
    if (!dense) return;
    values.emplace_back(value.data(), value.data() + value.size());
    tensors.push_back({*dense, mm::io::reference_shape(*dense, value.rows(), value.cols()),
                       std::span<float const>(values.back())});
  });
  // values grew while the views were taken: point them again.
  for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].values = values[i];
  if (world.rank() == 0) mm::io::write_safetensors(file, tensors);
  world.barrier();
}

/// The first forward's loss of a dense model and of its upcycled MoE on the job's layout.
template <class Precision, int DenseFfn>
std::pair<double, double> upcycled_first_loss(boost::mpi::communicator const& world,
                                              mm::parallel::process_groups const& groups,
                                              mm::testing::sample_corpus const& corpus,
                                              mm::context& ctx, fs::path const& file,
                                              int& granularity) {
  mm::parallel::process_groups const dense_groups(world, mm::parallel::degrees{});
  mm::transformer<dense_config<Precision, DenseFfn>> dense(dense_groups);
  dense.initialize(5, 0.3);
  write_dense(world, dense, file);
  mm::transformer<upcycled_config<Precision>> moe(groups);
  moe.initialize(6, 0.3);
  granularity = mt::upcycle(moe, world, file);
  std::vector<std::int32_t> tokens(8 * 2), targets(tokens.size());
  corpus(8).training_batch(groups.dp().rank() * 2, 8, 2, tokens, targets);
  double const a = dense.forward(ctx, tokens, targets, 8, 2).cross_entropy;
  double const b = moe.forward(ctx, tokens, targets, 8, 2).cross_entropy;
  return {a, b};
}

void write_losses(boost::mpi::communicator const& world, std::string const& path,
                  std::vector<double> const& losses) {
  if (world.rank() != 0 || path.empty()) return;
  std::ofstream out(path);
  for (double l : losses) out << hex(l) << "\n";
}

/// Every tensor of two checkpoints the same bits, and the same steps.
void compare_checkpoints(mm::testing::tally& result, boost::mpi::communicator const& world,
                         fs::path const& a, fs::path const& b) {
  mm::io::checkpoint_reader x(world, a, mm::io::checkpoint_reader::latest_iteration(world, a));
  mm::io::checkpoint_reader y(world, b, mm::io::checkpoint_reader::latest_iteration(world, b));
  result.close("iterations", x.iteration(), y.iteration(), 1, 0);
  for (char const* key : {"step", "optimizer_step", "operand_step"})
    result.close(key, x.state().at(key).get<double>(), y.state().at(key).get<double>(), 1, 0);
  result.close("tensor count", static_cast<double>(x.tensors().size()),
               static_cast<double>(y.tensors().size()), 1, 0);
  for (auto const& [name, t] : x.tensors()) {
    if (!y.contains(name)) {
      result.close(name + " is in both", 0, 1, 1, 0);
      continue;
    }
    auto compare = [&]<class T>(T) {
      auto const u = x.read_whole<T>(name), v = y.read_whole<T>(name);
      for (std::size_t i = 0; i < u.size(); ++i)
        result.close(name, std::memcmp(&u[i], &v[i], sizeof(T)) == 0 ? 1 : 0, 1, 1, 0);
    };
    if (t.type == mm::io::dtype::f64)
      compare(0.0);
    else
      compare(0.0F);
  }
}

template <class Config>
int run(arguments const& a, mm::parallel::process_groups const& groups,
        mm::testing::sample_corpus const& corpus) {
  boost::mpi::communicator const world;
  mm::context ctx(1);
  mm::testing::tally result;
  result.against = "expected";
  if (a.mode == "save") {
    job<Config> j(groups, corpus, a.steps + a.more);
    j.run(ctx, a.steps);
    auto const report = mt::save_checkpoint(j.trainer, world, a.dir);
    if (world.rank() == 0)
      std::cout << "saved iteration " << report.iteration << ": " << report.bytes << " bytes\n";
    write_losses(world, a.losses, j.run(ctx, a.more));
  } else if (a.mode == "resave") {
    job<Config> j(groups, corpus, a.steps + a.more);
    auto const report = mt::load_checkpoint(j.trainer, world, a.dir);
    result.close("loaded iteration", report.iteration, a.steps, 1, 0);
    mt::save_checkpoint(j.trainer, world, a.to);
    write_losses(world, a.losses, j.run(ctx, a.more));
  } else if (a.mode == "compare") {
    compare_checkpoints(result, world, a.dir, a.to);
    auto const mine = read_losses(a.losses), theirs = read_losses(a.against);
    result.close("loss count", static_cast<double>(mine.size()), static_cast<double>(theirs.size()),
                 1, 0);
    for (std::size_t k = 0; k < std::min(mine.size(), theirs.size()); ++k)
      result.close("continued loss " + std::to_string(k), mine[k], theirs[k], 1, a.rtol);
  } else if (a.mode == "damage") {
    {
      job<Config> j(groups, corpus, 4);
      j.run(ctx, 2);
      mt::save_checkpoint(j.trainer, world, a.dir);
    }
    if (world.rank() == 0) {
      auto const folder = fs::path(a.dir) / mm::io::iteration_folder(2);
      auto const shard = folder / mm::io::rank_file(world.size() - 1);
      if (a.damage == "byte") {
        std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(-3, std::ios::end);
        char c = 0;
        f.read(&c, 1);
        c = static_cast<char>(c ^ 0x10);
        f.seekp(-3, std::ios::end);
        f.write(&c, 1);
      } else if (a.damage == "truncate") {
        fs::resize_file(shard, fs::file_size(shard) - 100);
      } else if (a.damage == "missing") {
        fs::remove(shard);
      } else if (a.damage == "index") {
        std::ofstream(folder / "index.json") << "{\"format\": \"megamoe-checkpoint\", \"vers";
      } else if (a.damage == "tracker") {
        std::ofstream(fs::path(a.dir) / mm::io::checkpoint_tracker) << "iteration two\n";
      }
    }
    world.barrier();
    job<Config> j(groups, corpus, 4);
    mt::load_checkpoint(j.trainer, world, a.dir);
    result.close("a damaged checkpoint loads", 1, 0, 1, 0);
  } else if (a.mode == "other_model") {
    {
      job<Config> j(groups, corpus, 4);
      j.run(ctx, 1);
      mt::save_checkpoint(j.trainer, world, a.dir);
    }
    using wider = config<aux_router, mm::precision::fp64, mm::memory::keep_all, 32>;
    job<wider> j(groups, corpus, 4);
    mt::load_checkpoint(j.trainer, world, a.dir);
    result.close("another model's checkpoint loads", 1, 0, 1, 0);
  } else if (a.mode == "upcycle") {
    if (world.rank() == 0) fs::create_directories(a.dir);
    world.barrier();
    int g = 0;
    auto const [d64, m64] = upcycled_first_loss<mm::precision::fp64, 12>(
        world, groups, corpus, ctx, fs::path(a.dir) / "dense64.safetensors", g);
    result.close("fp64 granularity", g, 1, 1, 0);
    result.close("fp64 upcycled first loss", m64, d64, d64, 1e-6);
    auto const [d32, m32] = upcycled_first_loss<mm::precision::fp32, 12>(
        world, groups, corpus, ctx, fs::path(a.dir) / "dense32.safetensors", g);
    result.close("fp32 upcycled first loss", m32, d32, d32, 1e-5);
    auto const [dg, mg] = upcycled_first_loss<mm::precision::fp64, 24>(
        world, groups, corpus, ctx, fs::path(a.dir) / "dense_wide.safetensors", g);
    result.close("granular granularity", g, 2, 1, 0);
    result.close("granular upcycled first loss", mg, dg, dg, 1e-2);
    if (world.rank() == 0)
      std::cout << "first losses, relative differences: upcycled " << std::abs(m64 - d64) / d64
                << " (fp64), " << std::abs(m32 - d32) / d32 << " (fp32); granular "
                << std::abs(mg - dg) / dg << "\n";
  } else if (a.mode == "fault" || a.mode == "recover") {
    job<Config> whole(groups, corpus, 4);
    auto const expected = whole.run(ctx, 4);
    if (a.mode == "fault") {
      job<Config> j(groups, corpus, 4);
      j.run(ctx, 2);
      mt::save_checkpoint(j.trainer, world, a.dir);
      j.run(ctx, 2);
      ::setenv("MEGAMOE_CHECKPOINT_FAULT", a.fault.c_str(), 1);
      bool failed = false;
      try {
        mt::save_checkpoint(j.trainer, world, a.dir);
      } catch (mm::parallel::agreed_input_error const& e) {
        failed = true;
        if (world.rank() == 0) std::cout << "the save failed as asked: " << e.what() << "\n";
      }
      ::unsetenv("MEGAMOE_CHECKPOINT_FAULT");
      result.close("the save with a failed write failed", failed ? 1 : 0, 1, 1, 0);
    }
    job<Config> j(groups, corpus, 4);
    auto const report = mt::load_checkpoint(j.trainer, world, a.dir);
    result.close("the previous checkpoint loads", report.iteration, 2, 1, 0);
    auto const losses = j.run(ctx, 2);
    for (std::size_t k = 0; k < losses.size(); ++k)
      result.close("loss of step " + std::to_string(k + 3), losses[k], expected[k + 2], 1, 0);
  } else {
    throw mm::input_error("unknown --mode " + a.mode);
  }
  return result.finish(world,
                       "checkpoint --mode " + a.mode + " on " + std::to_string(world.size()) +
                           " ranks (EP " + std::to_string(groups.ep().size()) + ", ETP " +
                           std::to_string(groups.expert_tp().size()) + ", EDP " +
                           std::to_string(groups.expert_dp().size()) + ")",
                       "as expected");
}

}  // namespace

/// --mode convert: an F32 and a BF16 tensor of rows x 16, written by every rank (its rows), read
/// whole in the other dtype.
int check_conversion(boost::mpi::communicator const& world, fs::path const& dir) {
  mm::testing::tally result;
  result.against = "to_bf16_bits";
  constexpr std::int64_t cols = 16;
  std::int64_t const rows = 4 * world.size();
  // Bits stepping by a quarter of a BF16 unit from just below 1, so that a quarter are exact, a
  // quarter halfway (ties to even both ways) and the rest round one way; odd rows negative; one
  // NaN with a payload the rounding must not carry into Inf.
  auto const value = [](std::int64_t i) {
    auto u = static_cast<std::uint32_t>(0x3F7F0000u + 0x4000u * static_cast<std::uint32_t>(i));
    if ((i / cols) % 2 == 1) u |= 0x80000000u;
    if (i == 5) u = 0x7F80FFFFu;
    return std::bit_cast<float>(u);
  };
  std::vector<float> f32(static_cast<std::size_t>(rows * cols));
  std::vector<mm::bfloat16> bf16(f32.size());
  for (std::size_t i = 0; i < f32.size(); ++i) {
    f32[i] = value(static_cast<std::int64_t>(i));
    bf16[i] = mm::bfloat16(f32[i]);
  }
  {
    mm::io::checkpoint_writer writer(world, dir, 1);
    std::int64_t const first = 4 * world.rank();
    auto const mine = mm::global_rectangle{0, first, 0, 4, cols};
    writer.add("f32", {rows, cols}, rows, cols, mine, f32.data() + first * cols);
    writer.add("bf16", {rows, cols}, rows, cols, mine, bf16.data() + first * cols);
    writer.commit(nlohmann::json::object());
  }
  mm::io::checkpoint_reader reader(world, dir, 1);
  auto const rounded = reader.read_whole<mm::bfloat16>("f32");
  auto const widened = reader.read_whole<float>("bf16");
  int wrong = 0;
  for (std::size_t i = 0; i < f32.size(); ++i) {
    wrong += rounded[i].bits != mm::to_bf16_bits(f32[i]) ? 1 : 0;
    wrong += std::bit_cast<std::uint32_t>(widened[i]) !=
                     std::bit_cast<std::uint32_t>(mm::from_bf16_bits(bf16[i].bits))
                 ? 1
                 : 0;
  }
  result.close("elements read wrong", wrong, 0, 1, 0);
  bool refused = false;
  try {
    reader.read_whole<double>("bf16");
  } catch (mm::input_error const&) {
    refused = true;
  }
  result.close("BF16 read as F64 refused", refused ? 1 : 0, 1, 1, 0);
  return result.finish(world,
                       "checkpoint --mode convert on " + std::to_string(world.size()) + " ranks",
                       "F32 and BF16 read into each other");
}

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    arguments a;
    mm::parallel::check_on_every_rank(env.world(), [&] {
      for (int i = 1; i + 1 < argc; i += 2) {
        std::string const key = argv[i], value = argv[i + 1];
        if (key == "--ep")
          a.degrees.ep = std::stoi(value);
        else if (key == "--tp")
          a.degrees.tp = std::stoi(value);
        else if (key == "--cp")
          a.degrees.cp = std::stoi(value);
        else if (key == "--etp")
          a.degrees.etp = std::stoi(value);
        else if (key == "--pp")
          a.degrees.pp = std::stoi(value);
        else if (key == "--mode")
          a.mode = value;
        else if (key == "--dir")
          a.dir = value;
        else if (key == "--to")
          a.to = value;
        else if (key == "--losses")
          a.losses = value;
        else if (key == "--against")
          a.against = value;
        else if (key == "--damage")
          a.damage = value;
        else if (key == "--fault")
          a.fault = value;
        else if (key == "--precision")
          a.precision = value;
        else if (key == "--mtp")
          a.mtp = std::stoi(value) != 0;
        else if (key == "--steps")
          a.steps = std::stoi(value);
        else if (key == "--more")
          a.more = std::stoi(value);
        else if (key == "--rtol")
          a.rtol = std::stod(value);
        else
          throw mm::input_error("unknown argument " + key);
      }
      if (a.dir.empty()) throw mm::input_error("--dir is required");
    });
    auto const& world = env.world();
    if (a.mode == "convert") return check_conversion(world, a.dir);
    mm::parallel::process_groups const groups(world, a.degrees);
    mm::testing::sample_corpus const corpus;
    if (a.mode == "killed" || a.mode == "after_kill") {
      mm::context ctx(1);
      mm::testing::tally result;
      result.against = "uninterrupted";
      if (a.mode == "killed") {
        job<delayed_codes_config> j(groups, corpus, 6);
        for (int k = 1; k <= 6; ++k) {
          j.trainer.step(ctx);
          if (k % 2 == 0) mt::save_checkpoint(j.trainer, world, a.dir);
          if (k == a.steps) {
            world.barrier();
            std::raise(SIGKILL);
          }
        }
        return 1;
      }
      job<delayed_codes_config> whole(groups, corpus, 6);
      auto const expected = whole.run(ctx, 6);
      job<delayed_codes_config> resumed(groups, corpus, 6);
      int const saved = mt::load_checkpoint(resumed.trainer, world, a.dir).iteration;
      auto const losses = resumed.run(ctx, 6 - saved);
      for (std::size_t k = 0; k < losses.size(); ++k)
        result.close("loss of step " + std::to_string(saved + 1 + static_cast<int>(k)), losses[k],
                     expected[static_cast<std::size_t>(saved) + k], 1, 0);
      auto const x = state_of(resumed.model), y = state_of(whole.model);
      for (auto const& [name, values] : y)
        for (std::size_t i = 0; i < values.size(); ++i)
          result.close("final " + name, x.at(name)[i], values[i], 1, 0);
      return result.finish(world,
                           "killed after step " + std::to_string(a.steps) +
                               ", resumed from iteration " + std::to_string(saved),
                           "bit for bit");
    }
    if (a.mode == "resume") {
      mm::context ctx(1);
      mm::testing::tally result;
      result.against = "uninterrupted";
      if (a.mtp) {
        check_resume<mtp_config<mm::precision::fp64>>(result, groups, corpus, ctx,
                                                      fs::path(a.dir) / "mtp", "MTP");
        return result.finish(
            world, "kill-free resume with MTP on " + std::to_string(world.size()) + " ranks",
            "bit for bit");
      }
      check_resume<fp32_config>(result, groups, corpus, ctx, fs::path(a.dir) / "fp32", "fp32");
      check_resume<fp64_config>(result, groups, corpus, ctx, fs::path(a.dir) / "fp64", "fp64");
      check_resume<delayed_codes_config>(result, groups, corpus, ctx,
                                         fs::path(a.dir) / "fp8_delayed_codes",
                                         "fp8 delayed, weights as codes");
      return result.finish(world, "kill-free resume on " + std::to_string(world.size()) + " ranks",
                           "bit for bit");
    }
    if (a.mtp)
      return a.precision == "fp32" ? run<mtp_config<mm::precision::fp32>>(a, groups, corpus)
                                   : run<mtp_config<mm::precision::fp64>>(a, groups, corpus);
    return a.precision == "fp32" ? run<fp32_config>(a, groups, corpus)
                                 : run<fp64_config>(a, groups, corpus);
  });
}
