// SPDX-License-Identifier: Apache-2.0
// The layer's view of a dispatcher (dispatch/exchange.hpp): what satisfies `token_dispatcher` and
// `expert_computation`, and the sequential exchange every non-overlapping dispatcher inherits, on a
// fake dispatcher that records its calls: forward is dispatch (tokens and probs), one compute over
// every local expert, combine; backward is dispatch of dy, compute, combine_grad; the buffers are
// handed through unchanged, and each step is timed under its own stage.
#include <megamoe/core/stage_times.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/dispatch/exchange.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mm = megamoe;
namespace md = megamoe::dispatch;

namespace {

/// Records each call with the buffers it got; every step sleeps 2 ms so its stage's time shows.
class recording_dispatcher : public md::sequential_exchange<recording_dispatcher, double, float> {
 public:
  std::vector<std::string> calls;
  std::vector<void const*> buffers;

  void plan(mm::thread_pool&, mm::mask_matrix const&, int, std::exception_ptr = nullptr) {
    calls.push_back("plan");
  }
  [[nodiscard]] int expert_rows() const noexcept { return 7; }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_local_expert() const noexcept {
    return counts_;
  }
  void dispatch(mm::thread_pool&, double const* tokens, double* rows,
                mm::row_matrix<float> const& probs, double* row_probs) {
    step("dispatch tokens", {tokens, rows, &probs, row_probs});
  }
  void dispatch(mm::thread_pool&, double const* tokens, double* rows) {
    step("dispatch dy", {tokens, rows});
  }
  void combine(mm::thread_pool&, double const* rows, double* out) { step("combine", {rows, out}); }
  void combine_grad(mm::thread_pool&, double const* grad_rows, double const* grad_row_probs,
                    double* dx, mm::row_matrix<float>& grad_probs) {
    step("combine_grad", {grad_rows, grad_row_probs, dx, &grad_probs});
  }
  [[nodiscard]] std::size_t saved_bytes() const noexcept { return 0; }

 private:
  void step(char const* name, std::vector<void const*> const& args) {
    calls.emplace_back(name);
    buffers.insert(buffers.end(), args.begin(), args.end());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<std::int64_t> counts_{4, 0, 3};
};

/// The same without saved_bytes: not a dispatcher the layer can use.
struct no_saved_bytes {
  void plan(mm::thread_pool&, mm::mask_matrix const&, int, std::exception_ptr) {}
  void dispatch(mm::thread_pool&, double const*, double*, mm::row_matrix<float> const&, double*) {}
  [[nodiscard]] int expert_rows() const { return 0; }
  [[nodiscard]] std::span<std::int64_t const> tokens_per_local_expert() const { return {}; }
  template <class C>
  void forward(mm::thread_pool&, mm::stage_times&, double const*, double*,
               mm::row_matrix<float> const&, double*, double const*, double*, C&&) {}
  template <class C>
  void backward(mm::thread_pool&, mm::stage_times&, double const*, double*, double*, double*,
                mm::row_matrix<float>&, C&&) {}
};

static_assert(md::token_dispatcher<recording_dispatcher, double, float>);
static_assert(!md::token_dispatcher<recording_dispatcher, float, float>);  // rows are double
static_assert(!md::token_dispatcher<no_saved_bytes, double, float>);
static_assert(md::expert_computation<decltype([](int, int) {})>);
static_assert(!md::expert_computation<decltype([](int) {})>);
static_assert(!md::expert_computation<int>);

double const two_ms = 0.002;

TEST(SequentialExchange, ForwardDispatchesComputesEveryExpertOnceAndCombines) {
  mm::thread_pool pool(1);
  mm::stage_times times;
  recording_dispatcher d;
  std::vector<double> tokens(4), rows(7), row_probs(7), expert_out(7), out(4);
  mm::row_matrix<float> const probs(2, 3);
  std::vector<std::pair<int, int>> computed;
  d.forward(pool, times, tokens.data(), rows.data(), probs, row_probs.data(), expert_out.data(),
            out.data(), [&](int first, int last) {
              d.calls.emplace_back("compute");
              computed.emplace_back(first, last);
              std::this_thread::sleep_for(std::chrono::milliseconds(2));
            });
  EXPECT_EQ(d.calls, (std::vector<std::string>{"dispatch tokens", "compute", "combine"}));
  // Every local expert in one call, including the one without rows.
  EXPECT_EQ(computed, (std::vector<std::pair<int, int>>{{0, 3}}));
  EXPECT_EQ(d.buffers, (std::vector<void const*>{tokens.data(), rows.data(), &probs,
                                                 row_probs.data(), expert_out.data(), out.data()}));
  EXPECT_GE(times[mm::layer_stage::permute], two_ms);
  EXPECT_GE(times[mm::layer_stage::experts], two_ms);
  EXPECT_GE(times[mm::layer_stage::unpermute], two_ms);
  EXPECT_EQ(times[mm::layer_stage::router], 0.0);
  EXPECT_EQ(times[mm::layer_stage::shared_expert], 0.0);
}

TEST(SequentialExchange, BackwardDispatchesDyComputesAndCombinesGradients) {
  mm::thread_pool pool(1);
  mm::stage_times times;
  recording_dispatcher d;
  std::vector<double> dy(4), grad_rows(7), grad_row_probs(7), dx(4);
  mm::row_matrix<float> grad_probs(2, 3);
  int computed = 0;
  d.backward(pool, times, dy.data(), grad_rows.data(), grad_row_probs.data(), dx.data(), grad_probs,
             [&](int first, int last) {
               ++computed;
               EXPECT_EQ(first, 0);
               EXPECT_EQ(last, 3);
               d.calls.emplace_back("compute");
             });
  EXPECT_EQ(computed, 1);
  EXPECT_EQ(d.calls, (std::vector<std::string>{"dispatch dy", "compute", "combine_grad"}));
  EXPECT_EQ(d.buffers, (std::vector<void const*>{dy.data(), grad_rows.data(), grad_rows.data(),
                                                 grad_row_probs.data(), dx.data(), &grad_probs}));
  // Combine's backward is timed as unpermute, dispatch's as permute.
  EXPECT_GE(times[mm::layer_stage::unpermute], two_ms);
  EXPECT_GE(times[mm::layer_stage::permute], two_ms);
}

TEST(SequentialExchange, FreeFunctionsServeADispatcherThatOverridesForward) {
  // sequential_forward / sequential_backward work on any dispatcher with the four steps.
  mm::thread_pool pool(1);
  mm::stage_times times;
  recording_dispatcher d;
  std::vector<double> a(7), b(7), c(7), e(7);
  mm::row_matrix<float> probs(1, 3);
  int computed = 0;
  md::sequential_forward(d, pool, times, a.data(), b.data(), probs, c.data(), e.data(), a.data(),
                         [&](int, int) { ++computed; });
  md::sequential_backward(d, pool, times, a.data(), b.data(), c.data(), e.data(), probs,
                          [&](int, int) { ++computed; });
  EXPECT_EQ(computed, 2);
  EXPECT_EQ(d.calls, (std::vector<std::string>{"dispatch tokens", "combine", "dispatch dy",
                                               "combine_grad"}));
}

}  // namespace
