// SPDX-License-Identifier: Apache-2.0
// moe_layer_bench — forward + backward steps of one MoE layer on the standard shapes
// (BENCHMARKS.md).
//
//   moe_layer_bench --shape A|B|C --threads N [--backend per_expert|grouped|tensor]
//                   [--precision fp32|bf16|fp8_delayed|fp8_current|fp8_blockwise|mxfp8|nvfp4]
//                   (--backend amx | avx512_bf16: the recipes, where the CPU has the unit)
//                   [--quantized-weights] [--iters N] [--warmup W]
//
// Runs W untimed then N timed steps, each from the router GEMM through every weight gradient on
// fresh input, checks step 1 against the plain reference of the tests (relative error < 1e-4, else
// exit 1), and prints exactly one stdout line, a JSON object. An unknown or unavailable choice
// exits
// 2. The backend is chosen once here, at start-up; nothing is dispatched at run time in a step.
// --quantized-weights (with an FP8 or FP4 recipe) holds the experts' weights as codes
// (memory::quantized_weights): steps only dequantize them, and quantizing them once per optimizer
// step (moe_layer::refresh_weight_codes, what the optimizer's hand-back costs) is timed apart as
// weight_store_ms.
#include "reference/moe_reference.hpp"
#include "support/allocation_counter.hpp"
#include "support/layer_helpers.hpp"

#include "standard_shapes.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/core/random.hpp>
#include <megamoe/expert/tensor_gemm.hpp>
#include <megamoe/model/moe_layer.hpp>
#include <megamoe/precision/operands.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mm = megamoe;
namespace ref = megamoe::reference;

namespace {

using mm::bench::bench_shape;
using mm::bench::median;
using mm::bench::shapes;

struct options {
  std::string shape = "A";
  int threads = 1;
  std::string backend;  // empty: the default
  std::string precision = "fp32";
  bool quantized_weights = false;
  int iters = 5;
  int warmup = 1;
};

/// Sizes and k are read at start-up, so one layer type per backend serves every shape.
template <class Backend, class Precision = mm::precision::fp32, class Memory = mm::memory::keep_all>
using bench_config = mm::make_config<
    mm::shape<mm::hidden<mm::dynamic>, mm::ffn<mm::dynamic>, mm::experts<mm::dynamic>>,
    mm::router::runtime, mm::dispatch::local, mm::expert::mlp<mm::expert::swiglu, Backend>,
    Precision, Memory>;

/// How far step 1 may sit from the fp32 reference (max error over max value, per quantity): fp32
/// to rounding; a recipe to its quantization (the unit tests check recipes on their own codes).
constexpr double check_tolerance(mm::precision::recipe_id r) {
  switch (r) {
    case mm::precision::recipe_id::fp32: return 1e-4;
    case mm::precision::recipe_id::bf16: return 3e-2;
    case mm::precision::recipe_id::nvfp4: return 0.6;
    default: return 0.2;
  }
}

mm::row_matrix<float> random_tokens(int rows, int cols, std::uint64_t seed) {
  mm::row_matrix<float> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = static_cast<float>(mm::standard_normal(seed, static_cast<std::uint64_t>(i)));
  return m;
}

using mm::testing::to_mat;

/// Worst relative error of sampled values: per quantity max|a - b| / max|b|, then the max.
class error_tracker {
 public:
  void add(std::string const& quantity, double got, double want) {
    auto& q = quantities_[quantity];
    q.first = std::max(q.first, std::abs(got - want));
    q.second = std::max(q.second, std::abs(want));
  }
  [[nodiscard]] double worst() const {
    double w = 0.0;
    for (auto const& [name, q] : quantities_) w = std::max(w, q.first / std::max(q.second, 1e-30));
    return w;
  }

 private:
  std::map<std::string, std::pair<double, double>> quantities_;
};

/// What step 1 produced, kept for the check after the timed steps.
struct first_step {
  mm::row_matrix<float> x, dy, y, dx;
  std::vector<mm::row_matrix<float>> grads;  // in for_each_parameter order
};

/// Step 1 against the plain reference, on samples: the output and dx of 16 tokens (their experts'
/// FFNs and the router's per-token gradient, by central differences of the plain router), and rows
/// of every expert's fc1 and fc2 gradients summed over all of that expert's tokens. (The router
/// weight's gradient sums every token's full expert outputs; the unit tests check it.)
template <class Layer>
double check_first_step(Layer& layer, first_step const& s) {
  int const T = static_cast<int>(s.x.rows()), E = layer.num_experts();
  std::size_t const H = static_cast<std::size_t>(layer.hidden_size());
  ref::moe_weights w;
  w.activation = Layer::activation;
  std::size_t p = 0;
  layer.for_each_parameter([&](std::string_view, auto value, auto, mm::parameter_kind) {
    auto m = to_mat(value);
    if (p == 0) w.router = std::move(m);
    if (p >= 1 && p <= static_cast<std::size_t>(E)) w.fc1.push_back(std::move(m));
    if (p > static_cast<std::size_t>(E)) w.fc2.push_back(std::move(m));
    ++p;
  });
  auto const settings = layer.router().config();
  // Route every token with the plain router (softmax top-k is per token).
  ref::mat z(static_cast<std::size_t>(T));
  for (int t = 0; t < T; ++t)
    z[static_cast<std::size_t>(t)] = ref::times(w.router, to_mat(s.x.row(t))[0]);
  ref::router_memory memory;
  auto const routing = ref::route(z, settings, 1, {}, {}, memory);
  error_tracker errors;
  auto x_of = [&](int t) { return to_mat(s.x.row(t))[0]; };
  auto dy_of = [&](int t) { return to_mat(s.dy.row(t))[0]; };
  // Sampled tokens: y and dx.
  for (int i = 0; i < 16; ++i) {
    int const t = (i * 977 + 13) % T;
    auto const x = x_of(t), dy = dy_of(t);
    ref::vec y(H, 0.0), dx(H, 0.0), grad_p(static_cast<std::size_t>(E), 0.0);
    for (int e = 0; e < E; ++e) {
      double const prob = routing.probs[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)];
      if (!routing.map[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)]) continue;
      auto const& fc1 = w.fc1[static_cast<std::size_t>(e)];
      auto const& fc2 = w.fc2[static_cast<std::size_t>(e)];
      auto const tr = ref::mlp_forward(w.activation, fc1, fc2, nullptr, nullptr, x, prob);
      auto const dap = ref::times_transposed(fc2, dy);
      double dp = 0.0;
      for (std::size_t f = 0; f < dap.size(); ++f) dp += dap[f] * tr.a[f];
      grad_p[static_cast<std::size_t>(e)] = dp;
      ref::vec da = dap;
      for (double& v : da) v *= prob;
      auto const dxe = ref::times_transposed(fc1, ref::act_backward(w.activation, tr.h, da));
      for (std::size_t j = 0; j < H; ++j) {
        y[j] += tr.y[j];
        dx[j] += dxe[j];
      }
    }
    // d/dz of sum_e grad_p[e] * probs(z)[e] for this token alone.
    ref::mat zt{z[static_cast<std::size_t>(t)]};
    for (int e = 0; e < E; ++e) {
      double const step = 1e-6;
      auto objective = [&](double delta) {
        ref::mat moved = zt;
        moved[0][static_cast<std::size_t>(e)] += delta;
        ref::router_memory fresh;
        auto const r = ref::route(moved, settings, 1, {}, {}, fresh);
        double total = 0.0;
        for (int f = 0; f < E; ++f)
          total += grad_p[static_cast<std::size_t>(f)] * r.probs[0][static_cast<std::size_t>(f)];
        return total;
      };
      double const dz = (objective(step) - objective(-step)) / (2 * step);
      for (std::size_t j = 0; j < H; ++j) dx[j] += dz * w.router[static_cast<std::size_t>(e)][j];
    }
    for (std::size_t j = 0; j < H; ++j) {
      errors.add("y", s.y(t, static_cast<Eigen::Index>(j)), y[j]);
      errors.add("dx", s.dx(t, static_cast<Eigen::Index>(j)), dx[j]);
    }
  }
  // Every expert's weight gradients, summed over all of its tokens: one fc1 row and a few fc2
  // entries each. The activation is elementwise per (gate, linear) pair, so the reference's act
  // runs on just the pairs these entries need.
  int const F = static_cast<int>(w.fc2[0][0].size());
  bool const glu = w.activation == mm::expert::activation_function::swiglu;
  auto dot = [](ref::vec const& a, ref::vec const& b) {
    double r = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) r += a[i] * b[i];
    return r;
  };
  /// fc1's output pair (gate, linear) of column c for input x.
  auto pair_of = [&](ref::mat const& fc1, int c, ref::vec const& x) {
    ref::vec h{dot(fc1[static_cast<std::size_t>(c)], x)};
    if (glu) h.push_back(dot(fc1[static_cast<std::size_t>(F + c)], x));
    return h;
  };
  for (int e = 0; e < E; ++e) {
    auto const& fc1 = w.fc1[static_cast<std::size_t>(e)];
    auto const& fc2 = w.fc2[static_cast<std::size_t>(e)];
    int const f = (e * 131 + 7) % F;
    int const out = (e * 37 + 3) % static_cast<int>(H);
    std::array<int, 4> const columns{(e * 17 + 1) % F, (e * 29 + 5) % F, (e * 43 + 11) % F, f};
    ref::vec g1(H, 0.0), g2(columns.size(), 0.0);
    for (int t = 0; t < T; ++t) {
      if (!routing.map[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)]) continue;
      double const prob = routing.probs[static_cast<std::size_t>(t)][static_cast<std::size_t>(e)];
      auto const x = x_of(t), dy = dy_of(t);
      double dap = 0.0;
      for (std::size_t i = 0; i < H; ++i) dap += fc2[i][static_cast<std::size_t>(f)] * dy[i];
      auto const dh = ref::act_backward(w.activation, pair_of(fc1, f, x), {dap * prob});
      for (std::size_t j = 0; j < H; ++j) g1[j] += dh[0] * x[j];
      for (std::size_t c = 0; c < columns.size(); ++c)
        g2[c] += dy[static_cast<std::size_t>(out)] *
                 ref::act(w.activation, pair_of(fc1, columns[c], x))[0] * prob;
    }
    auto const& grad_fc1 = s.grads[1 + static_cast<std::size_t>(e)];
    auto const& grad_fc2 = s.grads[1 + static_cast<std::size_t>(E + e)];
    for (std::size_t j = 0; j < H; ++j)
      errors.add("fc1 grad rows", grad_fc1(f, static_cast<Eigen::Index>(j)), g1[j]);
    for (std::size_t c = 0; c < columns.size(); ++c)
      errors.add("fc2 grad entries", grad_fc2(out, columns[c]), g2[c]);
  }
  return errors.worst();
}

template <class Backend, class Precision = mm::precision::fp32, class Memory = mm::memory::keep_all>
int run(options const& o, bench_shape const& shape, std::string const& backend_name) {
  using layer_type = mm::moe_layer<bench_config<Backend, Precision, Memory>>;
  mm::router::settings router;
  router.top_k = shape.top_k;
  mm::testing::reset_peak();
  mm::context ctx(o.threads);
  layer_type layer(
      0, {.hidden = shape.hidden, .ffn = shape.ffn, .experts = shape.experts, .router = router});
  layer.initialize(2024);
  int const S = shape.tokens, B = 1, H = shape.hidden;
  std::vector<double> fwd, bwd, store;
  double err = 0.0;
  std::size_t peak = 0;
  for (int step = 0; step < o.warmup + o.iters; ++step) {
    auto const x = random_tokens(S * B, H, 7000 + static_cast<std::uint64_t>(step));
    auto const dy = random_tokens(S * B, H, 9000 + static_cast<std::uint64_t>(step));
    auto const t0 = std::chrono::steady_clock::now();
    auto const out = layer.forward(ctx, x, S, B);
    auto const t1 = std::chrono::steady_clock::now();
    auto const dx = layer.backward(ctx, dy);
    auto const t2 = std::chrono::steady_clock::now();
    if (step == 0) {
      // Checked now, while the gradients are step 1's alone; the check's own memory is not the
      // layer's, so the peak restarts after it.
      peak = mm::testing::allocations().peak_bytes;
      first_step first{x, dy, out.y, dx, {}};
      layer.for_each_parameter([&](std::string_view, auto, auto grad, mm::parameter_kind) {
        first.grads.emplace_back(grad);
      });
      err = check_first_step(layer, first);
    }
    if (step == 0) mm::testing::reset_peak();
    if (step + 1 == o.warmup) ctx.stages.clear();
    if (step >= o.warmup) {
      fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      bwd.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    if constexpr (layer_type::quantized_weights) {
      auto const s0 = std::chrono::steady_clock::now();
      layer.refresh_weight_codes();
      auto const s1 = std::chrono::steady_clock::now();
      if (step >= o.warmup)
        store.push_back(std::chrono::duration<double, std::milli>(s1 - s0).count());
    }
  }
  peak = std::max(peak, mm::testing::allocations().peak_bytes);
  std::vector<double> steps(fwd.size());
  for (std::size_t i = 0; i < steps.size(); ++i) steps[i] = fwd[i] + bwd[i];
  double const step_ms = median(steps);
  double const flops = 18.0 * shape.tokens * shape.top_k * double(shape.hidden) * shape.ffn;
  nlohmann::ordered_json j;
  j["shape"] = o.shape;
  j["threads"] = o.threads;
  j["backend"] = backend_name;
  // The expert GEMMs' kernel: the tile unit's name on the BF16 backends, else the fp32 kernel.
  if constexpr (mm::expert::multiplies_bf16<typename layer_type::backend>)
    j["kernel"] = mm::expert::name_of(layer_type::expert_settings.backend);
  else
    j["kernel"] = mm::expert::name_of(mm::expert::kernel_for<float>());
  j["precision"] = o.precision;
  j["quantized_weights"] = layer_type::quantized_weights;
  j["tokens_per_s"] = shape.tokens / (step_ms / 1e3);
  j["gflops"] = flops / (step_ms / 1e3) / 1e9;
  j["step_ms_median"] = step_ms;
  j["step_ms_min"] = *std::min_element(steps.begin(), steps.end());
  j["step_ms_max"] = *std::max_element(steps.begin(), steps.end());
  j["fwd_ms"] = median(fwd);
  j["bwd_ms"] = median(bwd);
  if constexpr (layer_type::quantized_weights) j["weight_store_ms"] = median(store);
  j["check_rel_err"] = err;
  j["peak_bytes"] = peak;
  // Kept from forward to backward, and the experts' weights: fp32 masters (with quantized weights
  // an optimizer's, 1/EDP of them per rank on a job) plus the recipe's quantized copies (both
  // orientations where they differ).
  j["saved_activation_bytes"] = layer.saved_activation_bytes();
  std::size_t const master_bytes =
      std::size_t{4} * shape.experts *
      (std::size_t{2} * shape.ffn * shape.hidden + std::size_t(shape.hidden) * shape.ffn);
  std::size_t code_bytes = 0;
  if constexpr (layer_type::rounds_operands)
    code_bytes = layer.routed_operands().weight_code_bytes();
  j["weight_bytes_master"] = master_bytes;
  j["weight_bytes_codes"] = code_bytes;
  std::cout << j.dump() << std::endl;
  // The share of each stage in the timed steps, on stderr (stdout holds only the JSON line).
  double total = 0.0;
  for (double v : ctx.stages.seconds) total += v;
  std::cerr << "stage shares (" << o.shape << ", " << backend_name << ", " << o.threads
            << " threads):";
  char const* names[] = {"router", "permute", "experts", "unpermute", "shared_expert"};
  for (std::size_t i = 0; i < ctx.stages.seconds.size(); ++i)
    std::cerr << " " << names[i] << " " << 100.0 * ctx.stages.seconds[i] / total << "%";
  std::cerr << "\n";
  double const tolerance = check_tolerance(Precision::value.recipe);
  if (!(err < tolerance)) {
    std::cerr << "moe_layer_bench: step 1 differs from the plain reference (relative error " << err
              << " >= " << tolerance << ")\n";
    return 1;
  }
  return 0;
}

/// Runs --precision's recipe on Backend with Memory; nothing where it names none (bf16 is not
/// offered with quantized weights, which need FP8 or FP4: R030).
template <class Backend, class Memory = mm::memory::keep_all>
std::optional<int> run_recipe(options const& o, bench_shape const& shape,
                              std::string const& backend) {
  namespace pr = mm::precision;
  auto const& p = o.precision;
  if constexpr (!Memory::value.quantized_weights)
    if (p == "bf16") return run<Backend, pr::bf16, Memory>(o, shape, backend);
  if (p == "fp8_delayed")
    return run<Backend, pr::fp8_tensorwise<pr::delayed>, Memory>(o, shape, backend);
  if (p == "fp8_current")
    return run<Backend, pr::fp8_tensorwise<pr::current>, Memory>(o, shape, backend);
  if (p == "fp8_blockwise") return run<Backend, pr::fp8_blockwise, Memory>(o, shape, backend);
  if (p == "mxfp8") return run<Backend, pr::mxfp8, Memory>(o, shape, backend);
  if (p == "nvfp4") return run<Backend, pr::nvfp4, Memory>(o, shape, backend);
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"moe_layer_bench: forward + backward steps of one MoE layer"};
  app.add_option("--shape", o.shape, "A, B or C (BENCHMARKS.md)")->required();
  app.add_option("--threads", o.threads, "threads of megamoe's pool")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_option("--backend", o.backend,
                 "per_expert, grouped or tensor (default: grouped); amx or avx512_bf16 with a "
                 "bf16, FP8 or FP4 --precision");
  app.add_option("--precision", o.precision,
                 "fp32 (default), bf16, fp8_delayed, fp8_current, fp8_blockwise, mxfp8 or nvfp4 "
                 "(the recipes run on grouped, amx and avx512_bf16)");
  app.add_flag("--quantized-weights", o.quantized_weights,
               "hold the experts' weights as codes (FP8 and FP4 recipes)");
  app.add_option("--iters", o.iters, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps before them (at least 1: step 1 is checked)")
      ->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    int const code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  auto const shape = shapes.find(o.shape);
  if (shape == shapes.end()) {
    std::cerr << "moe_layer_bench: unknown --shape '" << o.shape << "' (A, B or C)\n";
    return 2;
  }
  // The default backend, chosen once here: grouped (docs/design.md says why).
  std::string const backend = o.backend.empty() ? "grouped" : o.backend;
  using grouped = mm::expert::grouped;
  try {
    if (o.quantized_weights && o.precision == "fp32") {
      std::cerr << "moe_layer_bench: --quantized-weights needs an FP8 or FP4 --precision\n";
      return 2;
    }
    if (o.precision != "fp32") {
      // A recipe on the grouped backend or on a BF16 tile unit (R037), with fp32 or quantized
      // primary weights; nullopt: no such recipe.
      auto recipe = [&]<class Backend>(Backend) -> std::optional<int> {
        if (!o.quantized_weights) return run_recipe<Backend>(o, shape->second, backend);
        using codes = mm::memory::plan<mm::memory::quantized_weights>;
        if (auto const code = run_recipe<Backend, codes>(o, shape->second, backend)) return code;
        std::cerr << "moe_layer_bench: --quantized-weights needs an FP8 or FP4 --precision "
                     "(fp8_delayed, fp8_current, fp8_blockwise, mxfp8, nvfp4), not '"
                  << o.precision << "'\n";
        return 2;
      };
      std::optional<int> code;
      if (backend == "grouped") {
        code = recipe(grouped{});
      } else if (backend == "amx" || backend == "avx512_bf16") {
        bool const amx = backend == "amx";
        auto const why = mm::expert::unavailable_reason(
            amx ? mm::expert::gemm_backend::amx : mm::expert::gemm_backend::avx512_bf16);
        if (!why.empty()) {
          std::cerr << "moe_layer_bench: --backend " << backend << " cannot run here: " << why
                    << "\n";
          return 2;
        }
#if MEGAMOE_HAS_AMX_INTRINSICS
        code = amx ? recipe(mm::expert::amx{}) : recipe(mm::expert::avx512_bf16{});
#endif
      } else {
        std::cerr << "moe_layer_bench: --precision " << o.precision
                  << " runs on --backend grouped, amx or avx512_bf16 (fp32 runs on grouped, "
                     "per_expert and tensor)\n";
        return 2;
      }
      if (code) return *code;
      std::cerr << "moe_layer_bench: unknown --precision '" << o.precision
                << "' (fp32, bf16, fp8_delayed, fp8_current, fp8_blockwise, mxfp8, nvfp4)\n";
      return 2;
    }
    if (backend == "per_expert") return run<mm::expert::per_expert>(o, shape->second, backend);
    if (backend == "grouped") return run<mm::expert::grouped>(o, shape->second, backend);
    if (backend == "tensor") return run<mm::expert::tensor_contraction>(o, shape->second, backend);
  } catch (std::exception const& e) {
    std::cerr << "moe_layer_bench: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "moe_layer_bench: unknown or unavailable --backend '" << backend
            << "' (per_expert, grouped or tensor; amx and avx512_bf16 need a recipe)\n";
  return 2;
}
