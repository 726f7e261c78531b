// SPDX-License-Identifier: Apache-2.0
// A downstream program that includes Eigen's Tensor module before megamoe: the target's
// EIGEN_USE_THREADS definition keeps every translation unit in agreement whatever comes first.
#include <unsupported/Eigen/CXX11/Tensor>

#include <megamoe/megamoe.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>

namespace mm = megamoe;

struct my_layer : mm::defaults {
  using shape = mm::shape<mm::hidden<32>, mm::ffn<64>, mm::experts<4>>;
  using router = mm::router::top_k<2, mm::router::aux_loss<1e-2>>;
};
static_assert(mm::rules::check<my_layer>());

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [](mm::parallel::environment& env) {
    mm::parallel::process_groups const groups(env.world(), mm::values_of<my_layer>().parallel);
    mm::thread_pool pool(2);

    // A contraction on megamoe's pool against a plain loop.
    Eigen::Tensor<float, 2, Eigen::RowMajor> a(3, 5), b(5, 4), c(3, 4);
    a.setRandom();
    b.setRandom();
    Eigen::array<Eigen::IndexPair<int>, 1> const dims{Eigen::IndexPair<int>(1, 0)};
    c.device(pool.device()) = a.contract(b, dims);
    float worst = 0;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) {
        float sum = 0;
        for (int k = 0; k < 5; ++k) sum += a(i, k) * b(k, j);
        worst = std::max(worst, std::abs(sum - c(i, j)));
      }
    if (worst > 1e-5f || groups.ep().size() != 1) return 1;
    std::cout << mm::describe<my_layer>().json["router"]["moe_router_topk"] << "\n";
    std::cout << "consumer ok\n";
    return 0;
  });
}
