// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/backends.hpp — GEMM backends: how a batch of per-expert products is run on the
// thread pool. One interface, chosen by type (expert::per_expert, expert::grouped,
// expert::tensor_contraction):
//
//   Backend::template run<gemm_op::nt>(executor, problems);   // every problem, then return
//
// per_expert_gemm    one task per expert, each a single-threaded Eigen product: simple, but a
//                    skewed routing leaves threads idle while one expert finishes.
// grouped_gemm       all experts' products as one piece of work, cut into one contiguous share
//                    of rows per thread by FLOPs, so small and uneven experts keep every core busy.
// tensor_gemm        Eigen Tensor contractions on the pool's ThreadPoolDevice, expert after expert
//                    (Eigen splits each contraction over the pool; expert/tensor_gemm.hpp, by
//                    need, as it is the one user of Eigen's Tensor module).
// tile_backend<U>    BF16 products on tile unit U (expert/tile_gemm.hpp; expert::amx: the AMX
//                    unit, expert::avx512_bf16: the same tile products on VDPBF16PS)
//                    with fp32 accumulation: each operand over its per-tensor factor (a_unit,
//                    b_unit) is a BF16 value under every bf16 / FP8 / FP4 recipe and is packed
//                    exactly; the product is scaled by a_unit * b_unit (R037: no fp32 / fp64).
#pragma once

#include <megamoe/core/by_need.hpp>
#include <megamoe/core/compiled_once.hpp>
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/thread_pool.hpp>
#include <megamoe/expert/gemm.hpp>
#include <megamoe/expert/tags.hpp>
#include <megamoe/expert/tile_gemm.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe::expert {

/// Where a grouped product's share of work begins: problem index and first row.
struct split_point {
  int problem = 0;
  int row = 0;
};

/// The pool and one GEMM workspace per pool thread; what every backend runs on.
template <class T>
class executor {
 public:
  explicit executor(thread_pool& pool)
      : pool_(&pool),
        workspaces_(static_cast<std::size_t>(pool.size())),
        splits_(static_cast<std::size_t>(pool.size()) + 1) {}

  [[nodiscard]] thread_pool& pool() const noexcept { return *pool_; }
  [[nodiscard]] int threads() const noexcept { return pool_->size(); }
  /// The workspace of the pool thread running the caller.
  [[nodiscard]] gemm_workspace<T>& workspace() {
    int const id = pool_->current_thread();
    return workspaces_[static_cast<std::size_t>(id < 0 ? 0 : id)];
  }
  [[nodiscard]] std::span<split_point> splits() noexcept { return splits_; }
  /// Grows every thread's workspace for `problems`, on the calling thread.
  void reserve_for(std::span<gemm_problem<T> const> problems) {
    for (auto& w : workspaces_) expert::reserve_for(problems, w);
  }
  /// Bytes held by the packing buffers.
  [[nodiscard]] std::size_t workspace_bytes() const noexcept {
    std::size_t total = 0;
    for (auto const& w : workspaces_) total += w.bytes();
    return total;
  }

  /// Runs `body(begin, end)` over [0, count) cut into one contiguous range per thread.
  template <class Body>
  void parallel_rows(int count, Body const& body) {
    megamoe::parallel_rows(*pool_, count, body);
  }

 private:
  thread_pool* pool_;
  std::vector<gemm_workspace<T>> workspaces_;
  std::vector<split_point> splits_;
};

/// One task per problem; each problem is one single-threaded product.
struct per_expert_gemm {
  static constexpr gemm_backend id = gemm_backend::per_expert;
  template <gemm_op Op, class T>
  static void run(executor<T>& exec, std::span<gemm_problem<T> const> problems) {
    exec.reserve_for(problems);
    exec.pool().run(static_cast<int>(problems.size()), [&](int i) {
      gemm<Op>(problems[static_cast<std::size_t>(i)], exec.workspace());
    });
  }
};

/// All problems as one piece of work: each thread gets a contiguous run of (problem, row) with an
/// equal share of the FLOPs, cut at multiples of `row_granularity` rows.
struct grouped_gemm {
  static constexpr gemm_backend id = gemm_backend::grouped;
  static constexpr int row_granularity = 16;

  template <gemm_op Op, class T>
  static void run(executor<T>& exec, std::span<gemm_problem<T> const> problems) {
    int const count = static_cast<int>(problems.size());
    exec.reserve_for(problems);
    // Cost of one row of C; a problem with k = 0 still has rows to clear.
    auto row_cost = [](gemm_problem<T> const& p) {
      return 2.0 * p.n * std::max(p.k, p.accumulate ? 0 : 1);
    };
    double total = 0.0;
    for (auto const& p : problems) total += row_cost(p) * p.m;
    int const threads = exec.threads();
    auto splits = exec.splits();
    splits[0] = {0, 0};
    // Walk the problems once, placing split t where the running cost passes t/threads of the total.
    int placed = 1;
    double running = 0.0;
    for (int i = 0; i < count && placed < threads; ++i) {
      auto const& p = problems[static_cast<std::size_t>(i)];
      double const cost = row_cost(p);
      if (p.m == 0 || cost == 0.0) continue;
      while (placed < threads) {
        double const target = total * placed / threads;
        if (running + cost * p.m < target) break;
        int row = static_cast<int>((target - running) / cost);
        row = std::clamp((row + row_granularity / 2) / row_granularity * row_granularity, 0, p.m);
        splits[static_cast<std::size_t>(placed++)] = {i, row};
      }
      running += cost * p.m;
    }
    for (; placed <= threads; ++placed) splits[static_cast<std::size_t>(placed)] = {count, 0};
    exec.pool().run(threads, [&](int t) {
      split_point const from = splits[static_cast<std::size_t>(t)];
      split_point const to = splits[static_cast<std::size_t>(t) + 1];
      auto& workspace = exec.workspace();
      for (int i = from.problem; i <= to.problem && i < count; ++i) {
        auto const& p = problems[static_cast<std::size_t>(i)];
        int const begin = i == from.problem ? from.row : 0;
        int const end = i == to.problem ? to.row : p.m;
        gemm_rows<Op>(p, begin, end, workspace);
      }
    });
  }
};

// Eigen Tensor contractions (expert::tensor_contraction), defined in expert/tensor_gemm.hpp,
// which a configuration choosing them includes (core/by_need.hpp).
struct tensor_gemm;

/// Products on a tile unit: each problem's B packed once (one task per problem), then blocks of
/// 128 rows of every problem as tasks, each packing its rows of A and running the tile GEMM into
/// its rows of C. The blocks are scheduled by work: sorted by cost (rows x n x k; with wgrad the
/// depth k is an expert's token count, so blocks of busy experts cost more), the largest first, and
/// every pool thread takes the next block when it finishes one, so the last blocks to start are
/// the cheapest.
template <class Tiles, gemm_backend Id = gemm_backend::amx>
struct tile_backend {
  static constexpr gemm_backend id = Id;
  static constexpr int row_block = 128;

  template <gemm_op Op, class T>
  static void run(executor<T>& exec, std::span<gemm_problem<T> const> problems) {
    static_assert(std::is_same_v<T, float>, "megamoe: the tile backend multiplies fp32 operands");
    auto const count = problems.size();
    auto& packed = packed_b_of_problems();
    if (packed.size() < count) packed.resize(count);
    exec.pool().run(static_cast<int>(count), [&](int i) {
      auto const& p = problems[static_cast<std::size_t>(i)];
      if (p.m == 0 || p.n == 0) return;
      // B[k, n]: stored [n, k] for nt, [k, n] otherwise.
      tiles::pack_b({p.b, p.ldb, Op == gemm_op::nt, p.b_unit}, p.k, p.n,
                    packed[static_cast<std::size_t>(i)]);
    });
    auto& blocks = row_blocks();
    blocks.clear();
    for (std::size_t i = 0; i < count; ++i) {
      auto const& p = problems[i];
      for (int row = 0; row < p.m && p.n > 0; row += row_block)
        blocks.push_back(
            {static_cast<int>(i), row,
             static_cast<double>(std::min(row_block, p.m - row)) * p.n * std::max(p.k, 1)});
    }
    std::sort(blocks.begin(), blocks.end(), [](row_block_task const& x, row_block_task const& y) {
      return x.cost != y.cost
                 ? x.cost > y.cost
                 : std::pair(x.problem, x.first_row) < std::pair(y.problem, y.first_row);
    });
    std::atomic<std::size_t> next{0};
    exec.pool().run(exec.threads(), [&](int) {
      for (std::size_t t = next.fetch_add(1); t < blocks.size(); t = next.fetch_add(1))
        run_block<Op>(problems, blocks[t]);
    });
  }

 private:
  struct row_block_task {
    int problem, first_row;
    double cost;
  };
  template <gemm_op Op, class T>
  static void run_block(std::span<gemm_problem<T> const> problems, row_block_task const& block) {
    auto const& packed = packed_b_of_problems();
    int const i = block.problem, first = block.first_row;
    auto const& p = problems[static_cast<std::size_t>(i)];
    int const rows = std::min(row_block, p.m - first);
    thread_local tiles::packed_a a;
    // A[m, k]: stored [k, m] for tn, [m, k] otherwise; rows from `first`.
    bool const transposed = Op == gemm_op::tn;
    tiles::pack_a({p.a + (transposed ? first : static_cast<std::ptrdiff_t>(first) * p.lda), p.lda,
                   transposed, p.a_unit},
                  rows, p.k, a);
    Tiles unit;
    tiles::gemm(unit, a, packed[static_cast<std::size_t>(i)],
                p.c + static_cast<std::ptrdiff_t>(first) * p.ldc, p.ldc, p.a_unit * p.b_unit,
                p.accumulate);
  }
  // Grow-only, shared by every layer (layers run one after another).
  static std::vector<tiles::packed_b>& packed_b_of_problems() {
    static std::vector<tiles::packed_b> packed;
    return packed;
  }
  static std::vector<row_block_task>& row_blocks() {
    static std::vector<row_block_task> blocks;
    return blocks;
  }
};

/// Whether Backend rounds its operands to BF16 (the tile backends): right for a recipe's operands,
/// which are BF16 values over their per-tensor factors, wrong for fp32 ones such as the router's.
template <class Backend>
inline constexpr bool multiplies_bf16 = false;
template <class Tiles, gemm_backend Id>
inline constexpr bool multiplies_bf16<tile_backend<Tiles, Id>> = true;

namespace detail {
template <gemm_backend B>
struct backend_for;
/// `auto` resolves to the grouped backend (docs/design.md says why); expert::amx and
/// expert::avx512_bf16 are chosen by name (they need a bf16, FP8 or FP4 recipe, R037, and a CPU
/// with the unit, checked at start-up).
template <>
struct backend_for<gemm_backend::auto_> {
  using type = grouped_gemm;
};
template <>
struct backend_for<gemm_backend::per_expert> {
  using type = per_expert_gemm;
};
template <>
struct backend_for<gemm_backend::grouped> {
  using type = grouped_gemm;
};
template <>
struct backend_for<gemm_backend::tensor_contraction> {
  using type = tensor_gemm;
};
#if MEGAMOE_HAS_AMX_INTRINSICS
template <>
struct backend_for<gemm_backend::amx> {
  using type = tile_backend<tiles::hardware_tiles>;
};
template <>
struct backend_for<gemm_backend::avx512_bf16> {
  using type = tile_backend<tiles::vector_tiles, gemm_backend::avx512_bf16>;
};
#endif
}  // namespace detail

namespace detail {
template <gemm_backend B>
struct included_backend : backend_for<B> {
  static_assert(B != gemm_backend::tensor_contraction ||
                    by_need::included<by_need::module::tensor_gemm, backend_for<B>>,
                "megamoe: the configuration chooses expert::tensor_contraction: #include "
                "<megamoe/expert/tensor_gemm.hpp> before its model is instantiated");
};
}  // namespace detail

/// The backend class for a backend tag's value.
template <gemm_backend B>
using backend_t = typename detail::included_backend<B>::type;

/// Why backend `b` cannot run in this process (its BF16 unit missing or turned off), naming the
/// fp32 backends; empty where it can (every fp32 backend runs everywhere).
MEGAMOE_DECL std::string unavailable_reason(gemm_backend b);

}  // namespace megamoe::expert

#if MEGAMOE_HEADER_ONLY
#include <megamoe/expert/backends.ipp>
#endif
