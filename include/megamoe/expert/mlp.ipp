// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/mlp.ipp — the grouped experts' FFN for each activation in float and double on the
// grouped GEMM, compiled once under MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp).
#pragma once

#include <megamoe/expert/mlp.hpp>

namespace megamoe::expert {

#if !MEGAMOE_HEADER_ONLY
template class grouped_mlp<activation_function::swiglu, grouped_gemm, float>;
template class grouped_mlp<activation_function::gelu, grouped_gemm, float>;
template class grouped_mlp<activation_function::squared_relu, grouped_gemm, float>;
template class grouped_mlp<activation_function::swiglu, grouped_gemm, double>;
template class grouped_mlp<activation_function::gelu, grouped_gemm, double>;
template class grouped_mlp<activation_function::squared_relu, grouped_gemm, double>;
#endif

}  // namespace megamoe::expert
