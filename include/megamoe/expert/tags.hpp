// SPDX-License-Identifier: Apache-2.0
// megamoe/expert/tags.hpp — the expert slot (tags only): FFN form and GEMM backend.
//
//   expert::mlp<>                                       SwiGLU, backend chosen at start-up (auto)
//   expert::mlp<expert::gelu, expert::grouped>
//   expert::mlp<expert::swiglu, expert::amx, expert::shared_expert_gate>
//
// Options come in any order, each kind at most once.
#pragma once

#include <megamoe/policy/policy.hpp>

#include <string_view>

namespace megamoe::expert {

/// The kind of the `expert` slot.
struct kind {};

enum class activation_function { swiglu, gelu, squared_relu };

/// Width of fc1's output for an FFN of width `ffn`: 2F for SwiGLU (gate and linear halves).
constexpr int fc1_width(activation_function a, int ffn) {
  return a == activation_function::swiglu ? 2 * ffn : ffn;
}

enum class gemm_backend { auto_, per_expert, grouped, tensor_contraction, amx, avx512_bf16 };
/// The two linear layers of an expert FFN.
enum class linear { fc1, fc2 };
/// Where a precision recipe's dequantized GEMM operands lie: A of every expert GEMM in rows_a, B
/// in weights (fprop, dgrad) or in rows_b (wgrad).
enum class operand_buffer { rows_a, rows_b, weights };

/// Every choice of the expert slot, as plain values.
struct settings {
  activation_function activation = activation_function::swiglu;
  gemm_backend backend = gemm_backend::auto_;
  bool bias = false;                // add_bias_linear on the expert linears
  bool shared_expert_gate = false;  // moe_shared_expert_gate
  friend constexpr bool operator==(settings const&, settings const&) = default;
};

namespace option {
struct activation_kind {};
struct backend_kind {};
struct bias_kind {};
struct shared_gate_kind {};
using all_kinds = boost::mp11::mp_list<activation_kind, backend_kind, bias_kind, shared_gate_kind>;
}  // namespace option

/// silu(x W1) * (x W3), then W2 (fc1 is [H -> 2F]).
struct swiglu : megamoe::detail::set_field<option::activation_kind, &settings::activation,
                                           activation_function::swiglu> {};
/// gelu(x W1), then W2.
struct gelu : megamoe::detail::set_field<option::activation_kind, &settings::activation,
                                         activation_function::gelu> {};
/// relu(x W1)^2, then W2.
struct squared_relu : megamoe::detail::set_field<option::activation_kind, &settings::activation,
                                                 activation_function::squared_relu> {};

/// The backend is picked once at start-up from what the machine offers (visible default).
struct auto_backend
    : megamoe::detail::set_field<option::backend_kind, &settings::backend, gemm_backend::auto_> {};
/// One Eigen matrix product per expert.
struct per_expert : megamoe::detail::set_field<option::backend_kind, &settings::backend,
                                               gemm_backend::per_expert> {};
/// All experts' GEMMs as one piece of work, split over the thread pool by FLOPs.
struct grouped
    : megamoe::detail::set_field<option::backend_kind, &settings::backend, gemm_backend::grouped> {
};
/// Eigen Tensor contractions on the pool's device.
struct tensor_contraction : megamoe::detail::set_field<option::backend_kind, &settings::backend,
                                                       gemm_backend::tensor_contraction> {};
/// AMX tile products (BF16 and the FP8/FP4 recipes).
struct amx
    : megamoe::detail::set_field<option::backend_kind, &settings::backend, gemm_backend::amx> {};
/// The same BF16 products on AVX512-BF16 vector dot products, for CPUs without AMX.
struct avx512_bf16 : megamoe::detail::set_field<option::backend_kind, &settings::backend,
                                                gemm_backend::avx512_bf16> {};

/// Biases on fc1 and fc2 (scaled by the prob, as the reference does); needs ETP = 1 (R014).
struct with_bias : megamoe::detail::set_flag<option::bias_kind, &settings::bias> {};
/// The shared expert's output is multiplied by sigma(x g); needs shape shared_ffn > 0 (R015).
struct shared_expert_gate
    : megamoe::detail::set_flag<option::shared_gate_kind, &settings::shared_expert_gate> {};

/// The routed experts' FFN. Defaults: SwiGLU, auto backend, no biases, no shared-expert gate.
template <class... Options>
struct mlp {
  using policy_kind = kind;
  static constexpr std::string_view name = "mlp";
  static constexpr settings value =
      megamoe::detail::apply_options<option::all_kinds, settings, Options...>(settings{});
};

constexpr std::string_view name_of(activation_function a) {
  switch (a) {
    case activation_function::swiglu: return "swiglu";
    case activation_function::gelu: return "gelu";
    case activation_function::squared_relu: return "squared_relu";
  }
  return "?";
}

constexpr std::string_view name_of(gemm_backend b) {
  switch (b) {
    case gemm_backend::auto_: return "auto";
    case gemm_backend::per_expert: return "per_expert";
    case gemm_backend::grouped: return "grouped";
    case gemm_backend::tensor_contraction: return "tensor";
    case gemm_backend::amx: return "amx";
    case gemm_backend::avx512_bf16: return "avx512_bf16";
  }
  return "?";
}

}  // namespace megamoe::expert
