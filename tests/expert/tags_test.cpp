// SPDX-License-Identifier: Apache-2.0
// The expert slot (expert/tags.hpp) as plain values: the defaults of `expert::mlp<>` (SwiGLU, the
// auto backend, no biases, no shared-expert gate), that every option writes its own field and
// nothing else whatever the order, fc1's width per activation, and the names describe() prints.
// tests/static/config_static.cpp checks the options together within a configuration.
#include <megamoe/expert/tags.hpp>

#include <gtest/gtest.h>

#include <string_view>

namespace ex = megamoe::expert;

namespace {

using ex::activation_function;
using ex::gemm_backend;

/// mlp<>'s settings with one change.
template <class Change>
constexpr ex::settings default_with(Change change) {
  ex::settings s;
  change(s);
  return s;
}

static_assert(ex::mlp<>::value == ex::settings{});
static_assert(ex::mlp<ex::swiglu, ex::auto_backend>::value == ex::mlp<>::value);
static_assert(ex::mlp<ex::gelu>::value ==
              default_with([](ex::settings& s) { s.activation = activation_function::gelu; }));
static_assert(ex::mlp<ex::squared_relu>::value == default_with([](ex::settings& s) {
                s.activation = activation_function::squared_relu;
              }));
static_assert(ex::mlp<ex::per_expert>::value ==
              default_with([](ex::settings& s) { s.backend = gemm_backend::per_expert; }));
static_assert(ex::mlp<ex::grouped>::value ==
              default_with([](ex::settings& s) { s.backend = gemm_backend::grouped; }));
static_assert(ex::mlp<ex::tensor_contraction>::value ==
              default_with([](ex::settings& s) { s.backend = gemm_backend::tensor_contraction; }));
static_assert(ex::mlp<ex::amx>::value ==
              default_with([](ex::settings& s) { s.backend = gemm_backend::amx; }));
static_assert(ex::mlp<ex::avx512_bf16>::value ==
              default_with([](ex::settings& s) { s.backend = gemm_backend::avx512_bf16; }));
static_assert(ex::mlp<ex::with_bias>::value ==
              default_with([](ex::settings& s) { s.bias = true; }));
static_assert(ex::mlp<ex::shared_expert_gate>::value ==
              default_with([](ex::settings& s) { s.shared_expert_gate = true; }));
static_assert(
    ex::mlp<ex::shared_expert_gate, ex::gelu, ex::with_bias, ex::tensor_contraction>::value ==
    ex::mlp<ex::tensor_contraction, ex::with_bias, ex::gelu, ex::shared_expert_gate>::value);

TEST(ExpertSettings, DefaultsAreSwigluOnTheAutoBackend) {
  constexpr ex::settings s = ex::mlp<>::value;
  EXPECT_EQ(s.activation, activation_function::swiglu);
  EXPECT_EQ(s.backend, gemm_backend::auto_);
  EXPECT_FALSE(s.bias);
  EXPECT_FALSE(s.shared_expert_gate);
  EXPECT_EQ(ex::mlp<>::name, std::string_view("mlp"));
  ex::settings other = s;
  other.shared_expert_gate = true;
  EXPECT_FALSE(other == s);
}

TEST(ExpertSettings, Fc1IsTwiceAsWideForSwiglu) {
  EXPECT_EQ(ex::fc1_width(activation_function::swiglu, 24), 48);  // gate and linear halves
  EXPECT_EQ(ex::fc1_width(activation_function::gelu, 24), 24);
  EXPECT_EQ(ex::fc1_width(activation_function::squared_relu, 24), 24);
  static_assert(ex::fc1_width(activation_function::swiglu, 1) == 2);
}

TEST(ExpertSettings, NamesAreDescribesValues) {
  EXPECT_EQ(ex::name_of(activation_function::swiglu), "swiglu");
  EXPECT_EQ(ex::name_of(activation_function::gelu), "gelu");
  EXPECT_EQ(ex::name_of(activation_function::squared_relu), "squared_relu");
  EXPECT_EQ(ex::name_of(static_cast<activation_function>(42)), "?");
  EXPECT_EQ(ex::name_of(gemm_backend::auto_), "auto");
  EXPECT_EQ(ex::name_of(gemm_backend::per_expert), "per_expert");
  EXPECT_EQ(ex::name_of(gemm_backend::grouped), "grouped");
  EXPECT_EQ(ex::name_of(gemm_backend::tensor_contraction), "tensor");
  EXPECT_EQ(ex::name_of(gemm_backend::amx), "amx");
  EXPECT_EQ(ex::name_of(gemm_backend::avx512_bf16), "avx512_bf16");
  EXPECT_EQ(ex::name_of(static_cast<gemm_backend>(42)), "?");
}

}  // namespace
