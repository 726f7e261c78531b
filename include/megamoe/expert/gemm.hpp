// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/gemm.hpp — one expert GEMM on row-major data, single-threaded, allocation-free.
//
// Two kernels, chosen once per process (core/cpu_features.hpp), never per step:
// - fp32 where the CPU has AVX-512: megamoe's own packing and 14x32 micro-kernel
//   (expert/sgemm_avx512.hpp);
// - otherwise (and for fp64): Eigen's GEBP kernel with Eigen's cache blocking. Eigen's matrix
//   product allocates its packing buffers on every call (and parallelises only through OpenMP,
//   which megamoe does not use), so megamoe calls the kernel itself with packing buffers that
//   belong to the calling pool thread.
// Either way a training step allocates nothing once the buffers have grown. The products
// (gemm_op::nt, nn, tn) are described in expert/gemm_problem.hpp.
#pragma once

#include <megamoe/core/buffer.hpp>
#include <megamoe/core/cpu_features.hpp>
#include <megamoe/core/tensor.hpp>
#include <megamoe/expert/gemm_problem.hpp>
#include <megamoe/expert/sgemm_avx512.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>

namespace megamoe::expert {

/// Packing buffers of one thread, grown to the largest blocks seen and then reused.
template <class T>
class gemm_workspace {
 public:
  /// Room for the packed A and B blocks of Eigen's blocking; grows only.
  void reserve(std::size_t a_elements, std::size_t b_elements) {
    a_.reserve(a_elements);
    b_.reserve(b_elements);
  }
  [[nodiscard]] T* a() const noexcept { return a_.data(); }
  [[nodiscard]] T* b() const noexcept { return b_.data(); }
  [[nodiscard]] std::size_t bytes() const noexcept {
    return a_.capacity_bytes() + b_.capacity_bytes();
  }

 private:
  buffer<T> a_, b_;
};

namespace detail {

/// Eigen's cache blocking for problem `p` as a whole: Eigen's row-major product runs the
/// column-major kernel on the transposed problem, whose rows are C's columns. A share of rows uses
/// the whole problem's blocking, so the packing room a problem needs does not depend on the split.
struct block_sizes {
  Eigen::Index kc = 0, mc = 0, nc = 0;
  [[nodiscard]] std::size_t a_elements() const { return static_cast<std::size_t>(kc * mc); }
  [[nodiscard]] std::size_t b_elements() const { return static_cast<std::size_t>(kc * nc); }
};
template <class T>
block_sizes blocking_of(gemm_problem<T> const& p) {
  block_sizes b{p.k, p.n, p.m};
  Eigen::internal::computeProductBlockingSizes<T, T, 1>(b.kc, b.mc, b.nc, Eigen::Index{1});
  return b;
}

/// Those blocking sizes, pointing at a workspace's buffers instead of Eigen's own.
template <class T>
class workspace_blocking : public Eigen::internal::level3_blocking<T, T> {
 public:
  workspace_blocking(block_sizes const& sizes, gemm_workspace<T>& workspace) {
    this->m_kc = sizes.kc;
    this->m_mc = sizes.mc;
    this->m_nc = sizes.nc;
    workspace.reserve(sizes.a_elements(), sizes.b_elements());
    this->m_blockA = workspace.a();
    this->m_blockB = workspace.b();
  }
};

template <gemm_op Op>
inline constexpr int lhs_order = Op == gemm_op::tn ? Eigen::ColMajor : Eigen::RowMajor;
template <gemm_op Op>
inline constexpr int rhs_order = Op == gemm_op::nt ? Eigen::ColMajor : Eigen::RowMajor;

/// Sets rows [row_begin, row_end) of C to zero (what C = op(A) op(B) is before any product).
template <class T>
void clear_rows(gemm_problem<T> const& p, int row_begin, int row_end) {
  for (int i = row_begin; i < row_end; ++i)
    std::fill_n(p.c + static_cast<std::ptrdiff_t>(i) * p.ldc, p.n, T(0));
}

}  // namespace detail

/// The kernels an expert GEMM can run on.
enum class gemm_kernel { eigen_gebp, avx512 };

/// The kernel that products of scalar `T` use in this process (fixed at the first call).
template <class T>
[[nodiscard]] gemm_kernel kernel_for() {
#if MEGAMOE_HAS_AVX512_KERNELS
  if constexpr (std::is_same_v<T, float>) {
    if (cpu().use_avx512()) return gemm_kernel::avx512;
  }
#endif
  return gemm_kernel::eigen_gebp;
}

[[nodiscard]] constexpr char const* name_of(gemm_kernel k) {
  return k == gemm_kernel::avx512 ? "avx512" : "eigen_gebp";
}

/// Rows [row_begin, row_end) of C for problem `p` on Eigen's GEBP kernel (any scalar, any CPU).
template <gemm_op Op, class T>
void gemm_rows_eigen(gemm_problem<T> const& p, int row_begin, int row_end,
                     gemm_workspace<T>& workspace) {
  int const rows = row_end - row_begin;
  if (rows <= 0 || p.n <= 0) return;
  T* const c = p.c + static_cast<std::ptrdiff_t>(row_begin) * p.ldc;
  if (!p.accumulate) detail::clear_rows(p, row_begin, row_end);
  if (p.k <= 0) return;
  // op(A)'s rows start at row_begin: a row offset of A, or a column offset of the stored A for tn.
  T const* const a =
      Op == gemm_op::tn ? p.a + row_begin : p.a + static_cast<std::ptrdiff_t>(row_begin) * p.lda;
  detail::workspace_blocking<T> blocking(detail::blocking_of(p), workspace);
  Eigen::internal::general_matrix_matrix_product<Eigen::Index, T, detail::lhs_order<Op>, false, T,
                                                 detail::rhs_order<Op>, false, Eigen::RowMajor,
                                                 1>::run(rows, p.n, p.k, a, p.lda, p.b, p.ldb, c, 1,
                                                         p.ldc, T(1), blocking, nullptr);
}

#if MEGAMOE_HAS_AVX512_KERNELS
/// Rows [row_begin, row_end) of C for fp32 problem `p` on megamoe's AVX-512 kernel; only where
/// cpu().avx512f holds.
template <gemm_op Op>
void gemm_rows_avx512(gemm_problem<float> const& p, int row_begin, int row_end,
                      gemm_workspace<float>& workspace) {
  int const rows = row_end - row_begin;
  if (rows <= 0 || p.n <= 0) return;
  if (p.k <= 0) {
    if (!p.accumulate) detail::clear_rows(p, row_begin, row_end);
    return;
  }
  using blk = avx512::sgemm_blocking;
  workspace.reserve(blk::a_elements, blk::b_elements);
  avx512::gemm_rows<Op>(p, row_begin, row_end, workspace.a(), workspace.b());
}
#endif

/// Rows [row_begin, row_end) of C for problem `p`, on the calling thread with its workspace, on
/// this process's kernel for `T`.
template <gemm_op Op, class T>
void gemm_rows(gemm_problem<T> const& p, int row_begin, int row_end, gemm_workspace<T>& workspace) {
#if MEGAMOE_HAS_AVX512_KERNELS
  if constexpr (std::is_same_v<T, float>) {
    if (kernel_for<T>() == gemm_kernel::avx512) {
      gemm_rows_avx512<Op>(p, row_begin, row_end, workspace);
      return;
    }
  }
#endif
  gemm_rows_eigen<Op>(p, row_begin, row_end, workspace);
}

/// Grows `workspace` to what any share of any of `problems` needs (call before fanning out, so
/// that which thread gets which share never decides whether a step allocates).
template <class T>
void reserve_for(std::span<gemm_problem<T> const> problems, gemm_workspace<T>& workspace) {
  bool const any_product = std::any_of(problems.begin(), problems.end(),
                                       [](auto const& p) { return p.m > 0 && p.n > 0 && p.k > 0; });
  if (!any_product) return;
#if MEGAMOE_HAS_AVX512_KERNELS
  if constexpr (std::is_same_v<T, float>) {
    if (kernel_for<T>() == gemm_kernel::avx512) {
      using blk = avx512::sgemm_blocking;
      workspace.reserve(blk::a_elements, blk::b_elements);
      return;
    }
  }
#endif
  for (auto const& p : problems)
    if (p.m > 0 && p.n > 0 && p.k > 0) {
      auto const b = detail::blocking_of(p);
      workspace.reserve(b.a_elements(), b.b_elements());
    }
}

/// The whole of problem `p` on the calling thread.
template <gemm_op Op, class T>
void gemm(gemm_problem<T> const& p, gemm_workspace<T>& workspace) {
  gemm_rows<Op>(p, 0, p.m, workspace);
}

}  // namespace megamoe::expert
