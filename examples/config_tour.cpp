// SPDX-License-Identifier: Apache-2.0
// megamoe-config-tour — training configurations as types: written, checked at compile time,
// completed at start-up, described, and laid out over a world of ranks.
//
//   megamoe-config-tour [--world N]
//
// Until the training job exists this is the most complete program megamoe offers: everything it
// shows is what a training run does before its first step, and then one routed micro-batch.
#include <megamoe/config/config.hpp>
#include <megamoe/config/describe.hpp>
#include <megamoe/config/resolve.hpp>
#include <megamoe/config/rules.hpp>
#include <megamoe/parallel/layout.hpp>
#include <megamoe/router/router.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <random>
#include <string>

namespace mm = megamoe;

// 1. A configuration as a struct with named slots; slots not named take megamoe::defaults.
struct mixtral_like : mm::defaults {
  using shape = mm::shape<mm::hidden<4096>, mm::ffn<14336>, mm::experts<8>>;
  using router = mm::router::top_k<2, mm::router::aux_loss<1e-2>, mm::router::z_loss<1e-3>>;
  using dispatch = mm::dispatch::all_to_all;
  using parallel = mm::parallel::mapping<mm::parallel::tp<2>, mm::parallel::ep<8>>;
};

// 2. The same from policies in any order (DeepSeek-V3-like routing: sigmoid scores, expert bias,
//    group-limited selection, a small sequence aux loss), with EP left to start-up.
using deepseek_like = mm::make_config<
    mm::parallel::mapping<mm::parallel::ep<mm::dynamic>>,
    mm::router::aux_loss_free<8, mm::router::group_limit<8, 4>,
                              mm::router::topk_scaling_factor<2.5>, mm::router::seq_aux_loss<1e-4>>,
    mm::shape<mm::hidden<2048>, mm::ffn<1408>, mm::experts<64>, mm::shared_ffn<2816>>,
    mm::precision::fp8_blockwise, mm::dispatch::all_to_all>;

// 3. A router read at start-up (from a file or a command line), checked then with the same rules.
using runtime_router = mm::make_config<mm::shape<mm::hidden<1024>, mm::ffn<704>, mm::experts<32>>,
                                       mm::router::runtime>;

// Every rule the types can break is checked here, at compile time, with its megamoe[Rnnn] id.
static_assert(mm::rules::check<mixtral_like>());
static_assert(mm::rules::check<deepseek_like>());
static_assert(mm::rules::check<runtime_router>());

int main(int argc, char** argv) {
  CLI::App app{"A tour of megamoe configurations as types"};
  int world = 16;
  app.add_option("--world", world, "world size to lay the configurations out on")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    std::cout << "== mixtral_like (struct with named slots)\n"
              << mm::describe<mixtral_like>().text << "\n";

    // Start-up: EP decided from the world size, then every rule runs once more on the values.
    int const ep = world % 64 == 0 ? 64 : world;
    auto const deepseek = mm::resolve<deepseek_like>({.ep = ep, .world_size = world});
    std::cout << "== deepseek_like (make_config, ep resolved to " << ep << " at start-up)\n"
              << mm::describe(deepseek).text << "\n";

    auto const layout = mm::parallel::layout::resolve(world, deepseek.parallel);
    std::cout << "== deepseek_like on " << world << " ranks: attention TP " << layout.tp << " x CP "
              << layout.cp << " x DP " << layout.dp << " x PP " << layout.pp << ", experts ETP "
              << layout.etp << " x EP " << layout.ep << " x EDP " << layout.edp << "\n";
    auto const ep_groups = layout.expert_grid().groups("ep");
    std::cout << "   " << ep_groups.size() << " EP group(s) of " << ep_groups.front().size()
              << " ranks; rank 0 holds experts 0.." << (64 / layout.ep - 1) << "\n\n";

    // A run-time router: settings as a reader of a reference-vector file or a CLI would produce.
    mm::router::settings router;
    router.top_k = 4;
    router.score = mm::router::score_function::softmax_before_topk;
    router.aux_loss_coeff = 1e-2;
    auto const runtime = mm::resolve<runtime_router>({.router = router, .world_size = 1});
    std::cout << "== runtime_router (router read at start-up)\n"
              << mm::describe(runtime).json["router"].dump() << "\n\n";

    // The same rules guard start-up values: an expert bias with softmax scores breaks R007.
    router.expert_bias = true;
    std::cout << "== a start-up mistake, caught before any step:\n";
    try {
      (void)mm::resolve<runtime_router>({.router = router, .world_size = 1});
    } catch (mm::config_error const& e) {
      std::cout << "   " << e.what() << "\n";
    }

    // The router of deepseek_like, built from its type: one micro-batch of 4 sequences x 64
    // positions, forward and backward, then the end of the global batch moves the expert bias.
    auto deepseek_router = mm::router::make_router<deepseek_like>();
    int const seq = 64, batch = 4, hidden = 2048, experts = 64;
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0F, 1.0F);
    mm::row_matrix<float> x(seq * batch, hidden), w(experts, hidden);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = normal(rng);
    for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = 0.02F * normal(rng);
    auto const& routed = deepseek_router.route(x, w, {seq, batch});
    auto const [fewest, most] =
        std::minmax_element(routed.tokens_per_expert.begin(), routed.tokens_per_expert.end());
    std::cout << "\n== deepseek_like's router on " << seq * batch << " tokens: " << *fewest
              << " to " << *most << " tokens per expert, seq_aux_loss "
              << routed.losses.seq_aux_loss->unscaled << " (unscaled)\n";
    mm::row_matrix<float> grad_x, grad_w;
    deepseek_router.backward(mm::row_matrix<float>::Zero(seq * batch, experts), 1.0, x, w, grad_x,
                             grad_w);
    deepseek_router.state().finish_global_batch(mm::router::reduction_groups<>{});
    auto const [low, high] = std::minmax_element(deepseek_router.state().expert_bias.begin(),
                                                 deepseek_router.state().expert_bias.end());
    std::cout << "   expert bias after the global batch: " << *low << " .. " << *high
              << " (busy experts down, idle ones up)\n";
  } catch (std::exception const& e) {
    std::cerr << "megamoe-config-tour: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
