// SPDX-License-Identifier: Apache-2.0
// megamoe/model/decoder_block.hpp — the decoder's layers on this rank: each a block (its two
// RMSNorms, its attention, and its FFN: the MoE layer of the configuration or a dense SwiGLU
// FFN), with the modules of the layers under the recipe in one set and, under an FP8 or FP4
// recipe, those of the layers kept in BF16 (the reference's first_last_layers_bf16) in another,
// of bf16_layer_config_t<Config>. This is the one place that chooses which module a layer runs:
// with_attention and with_ffn hand a block's modules to a caller as their own types, so the
// caller's code for an MoE layer and for a dense FFN is chosen by type (is_moe_layer_v).
#pragma once

#include <megamoe/config/config.hpp>
#include <megamoe/config/resolve.hpp>
#include <megamoe/core/by_need.hpp>
#include <megamoe/expert/backends.hpp>
#include <megamoe/model/attention.hpp>
#include <megamoe/model/dense_mlp.hpp>
#include <megamoe/model/linear.hpp>
#include <megamoe/model/moe_layer.hpp>
#include <megamoe/model/moe_types.hpp>
#include <megamoe/model/norm.hpp>
#include <megamoe/parallel/process_groups.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe {

// Multi-head latent attention, defined (with its defaults) in model/mla.hpp, which a
// configuration choosing model::multi_latent_attention includes (core/by_need.hpp).
template <class T, bool QkLayernorm, parallel::cp_comm_type CpComm, class Ops, class Backend,
          int QLoraRank>
class latent_attention;
template <class Ops>
struct mla_operands;

/// Whether a module is an MoE layer (and not a dense FFN).
template <class T>
inline constexpr bool is_moe_layer_v = false;
template <class C>
inline constexpr bool is_moe_layer_v<moe_layer<C>> = true;

/// What a decoder layer's FFN is.
enum class ffn_kind : std::uint8_t { dense, moe };

template <class Config>
class decoder_layers {
 public:
  using scalar = typename moe_layer<Config>::scalar;
  /// Under an FP8 or FP4 recipe the first and last layers may be kept in BF16 (R053).
  static constexpr bool keeps_bf16_layers =
      precision::is_quantized(Config::precision::value.recipe);
  static constexpr parallel::cp_comm_type cp_comm = Config::parallel::cp_comm;
  /// The GEMM backend of attention's and the dense FFNs' linears: the experts' BF16 unit where
  /// the configuration names one (R037: only under a recipe, whose operands are BF16 values over
  /// their units), else the grouped fp32 backend.
  using expert_backend = typename moe_types<Config>::backend;
  using linear_backend = std::conditional_t<expert::multiplies_bf16<expert_backend>, expert_backend,
                                            expert::grouped_gemm>;

  /// Whether the type's layer pattern makes every layer an MoE layer: then no block holds a dense
  /// FFN, and with_ffn has one path.
  static constexpr bool every_layer_moe = [] {
    auto const& pattern = Config::model::value.moe_layers;
    if (!pattern.is_list()) return pattern.every == 1;
    for (int i = 0; i < pattern.length; ++i)
      if (!pattern.is_moe(i)) return false;
    return true;
  }();

  /// Whether layer `layer` of a model of `decoder_layers` layers runs in BF16 rather than under
  /// the recipe (the first and last `given` counts). The MTP depths' layers (past the decoder's)
  /// do as the reference's: under an FP8 recipe always in FP8, under NVFP4 in BF16 (the reference
  /// keeps FP4 out of MTP).
  static bool is_bf16_layer(int decoder_layers, startup_values const& given, int layer) noexcept {
    if constexpr (!keeps_bf16_layers) return false;
    if (layer >= decoder_layers)
      return Config::precision::value.recipe == precision::recipe_id::nvfp4;
    return layer < given.bf16_layers_at_start.value_or(0) ||
           layer >= decoder_layers - given.bf16_layers_at_end.value_or(0);
  }

  /// The modules of this rank's layers that run under one configuration's recipe, each kind in
  /// layer order.
  template <class LayerConfig>
  struct modules {
    using ops = linear_operands_t<typename LayerConfig::precision,
                                  moe_layer<LayerConfig>::quantized_weights>;
    static constexpr bool rounds = rounds_operands_v<ops>;
    static_assert(recipe_operands_included<typename LayerConfig::precision>());
    static_assert(!Config::model::value.mla.enabled() ||
                      by_need::included<by_need::module::latent_attention, LayerConfig>,
                  "megamoe: the configuration chooses model::multi_latent_attention: #include "
                  "<megamoe/model/mla.hpp> before its model is instantiated");
    using attention_type = std::conditional_t<
        Config::model::value.mla.enabled(),
        latent_attention<scalar, Config::model::value.qk_layernorm, cp_comm, ops,
                               linear_backend, Config::model::value.mla.q_lora_rank>,
        causal_attention<scalar, Config::model::value.qk_layernorm, cp_comm, ops, linear_backend>>;
    using dense_type = dense_mlp<scalar, expert::activation_function::swiglu, linear_backend, ops>;
    std::vector<attention_type> attentions;
    std::vector<std::unique_ptr<moe_layer<LayerConfig>>> moes;
    std::vector<dense_type> denses;
  };
  struct no_modules {};
  using recipe_modules = modules<Config>;
  using bf16_modules =
      std::conditional_t<keeps_bf16_layers, modules<bf16_layer_config_t<Config>>, no_modules>;

  /// A layer: its norms and where its attention and FFN lie among its recipe's modules.
  struct block {
    rms_norm<scalar> input_norm;
    rms_norm<scalar> pre_mlp_norm;
    int layer = 0;      // in the whole model
    bool bf16 = false;  // its modules are bf16_modules'
    int attention = 0;  // index into attentions
    ffn_kind ffn = ffn_kind::dense;
    int ffn_index = 0;  // index into moes or denses
  };

  /// Adds layer `layer` of the model (`v` resolved; its BF16-ness and kind given) with its
  /// modules: on a job (`groups`) or on one rank; `layer_given` the start-up values of its MoE
  /// layer.
  void add(int layer, bool bf16, bool moe, config_values const& v,
           parallel::process_groups const* groups, startup_values const& layer_given) {
    auto const& m = v.model;
    int const H = v.shape.hidden, tp = v.parallel.tp;
    blocks_.push_back(block{rms_norm<scalar>(H, m.norm_epsilon),
                            rms_norm<scalar>(H, m.norm_epsilon), layer, bf16});
    auto& b = blocks_.back();
    with_modules(b, [&](auto& modules) {
      using ops = typename std::decay_t<decltype(modules)>::ops;
      using layer_type = typename decltype(modules.moes)::value_type::element_type;
      auto const* amax_group = groups == nullptr ? nullptr : &groups->tp_cp();
      auto operands = [&](std::uint64_t base, int which) {
        return make_linear_operands<ops>((base << 32) + 2 * layer + which, amax_group);
      };
      // Stochastic rounding seeded by the module's place in the whole model: attention 2i,
      // dense FFN 2i + 1 past the MoE layers' seeds; MLA's up and proj past those.
      b.attention = static_cast<int>(modules.attentions.size());
      if constexpr (Config::model::value.mla.enabled())
        modules.attentions.emplace_back(
            H, m.heads, m.mla, m.rope_base, m.norm_epsilon, tp,
            mla_operands<ops>{operands(1, 0), operands(3, 0), operands(3, 1)});
      else
        modules.attentions.emplace_back(H, m.heads, m.query_groups, m.rope_base, m.norm_epsilon,
                                        tp, operands(1, 0));
      if (v.parallel.cp > 1) modules.attentions.back().set_context_parallel(groups->cp());
      if (moe) {
        b.ffn = ffn_kind::moe;
        b.ffn_index = static_cast<int>(modules.moes.size());
        if (groups != nullptr) {
          modules.moes.push_back(std::make_unique<layer_type>(*groups, layer, layer_given));
        } else {
          if constexpr (!layer_type::distributed)
            modules.moes.push_back(std::make_unique<layer_type>(layer, layer_given));
        }
      } else {
        b.ffn_index = static_cast<int>(modules.denses.size());
        modules.denses.emplace_back(H, m.dense_ffn / tp, operands(1, 1));
      }
    });
  }

  void reserve(std::size_t n) { blocks_.reserve(n); }
  [[nodiscard]] std::vector<block>& blocks() noexcept { return blocks_; }
  [[nodiscard]] std::vector<block> const& blocks() const noexcept { return blocks_; }
  [[nodiscard]] block& operator[](int i) { return blocks_[static_cast<std::size_t>(i)]; }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(blocks_.size()); }

  /// f(modules) for the modules of block b's layer: the recipe's, or those kept in BF16.
  template <class F>
  void with_modules(block const& b, F&& f) {
    if constexpr (keeps_bf16_layers)
      if (b.bf16) return f(bf16_);
    f(recipe_);
  }
  template <class F>
  void with_modules(block const& b, F&& f) const {
    if constexpr (keeps_bf16_layers)
      if (b.bf16) return f(bf16_);
    f(recipe_);
  }
  /// f(modules) for each set of modules: the recipe's, then those kept in BF16.
  template <class F>
  void for_each_modules(F&& f) {
    f(recipe_);
    if constexpr (keeps_bf16_layers) f(bf16_);
  }
  template <class F>
  void with_attention(block const& b, F&& f) {
    with_modules(b, [&](auto& m) { f(m.attentions[static_cast<std::size_t>(b.attention)]); });
  }
  template <class F>
  void with_attention(block const& b, F&& f) const {
    with_modules(b, [&](auto& m) { f(m.attentions[static_cast<std::size_t>(b.attention)]); });
  }
  /// f(ffn) with block b's MoE layer or dense FFN (is_moe_layer_v tells which).
  template <class F>
  void with_ffn(block const& b, F&& f) {
    with_modules(b, [&](auto& m) {
      auto const at = static_cast<std::size_t>(b.ffn_index);
      if constexpr (every_layer_moe)
        f(*m.moes[at]);
      else if (b.ffn == ffn_kind::moe)
        f(*m.moes[at]);
      else
        f(m.denses[at]);
    });
  }
  /// f(module, name) for block b's modules in the reference's order, each with its name under the
  /// layer's: input_layernorm, self_attention, pre_mlp_layernorm, mlp (the MoE layer or dense FFN).
  template <class F>
  void for_each_named_module(block& b, F&& f) {
    f(b.input_norm, ".input_layernorm");
    with_attention(b, [&](auto& a) { f(a, ".self_attention"); });
    f(b.pre_mlp_norm, ".pre_mlp_layernorm");
    with_ffn(b, [&](auto& ffn) { f(ffn, ".mlp"); });
  }
  /// f(module) for every module of block i, in order: its norms, attention and FFN.
  template <class F>
  void for_each_block_module(int i, F&& f) {
    auto& b = blocks_[static_cast<std::size_t>(i)];
    f(b.input_norm);
    with_attention(b, f);
    f(b.pre_mlp_norm);
    with_ffn(b, f);
  }

  /// This rank's MoE layers that run under the recipe (all but those kept in BF16), in order.
  [[nodiscard]] std::vector<moe_layer<Config> const*> recipe_moe_layers() const {
    std::vector<moe_layer<Config> const*> out;
    for (auto const& m : recipe_.moes) out.push_back(m.get());
    return out;
  }

  /// Once per global batch: the MoE layers' expert-bias updates and every module's end of step
  /// for the recipe's operands (delayed scaling's amaxes over `replicas`).
  void finish_global_batch(parallel::communicator_max const& replicas) {
    for_each_modules([&](auto& m) {
      for (auto& l : m.moes) l->finish_global_batch();
      if constexpr (std::remove_reference_t<decltype(m)>::rounds) {
        for (auto& a : m.attentions)
          a.for_each_linears([&](std::string_view, auto& l) { l.end_of_step(replicas); });
        for (auto& d : m.denses) d.end_of_step(replicas);
      }
    });
  }
  /// Before a global batch that may run again (a recomputed step): every module keeps the state
  /// its passes change; discard_global_batch() brings it back and the MoE layers forget their
  /// counts. The attentions' and dense FFNs' operands change only their amaxes within a step.
  void begin_global_batch() {
    for_each_recipe_operands([](auto& ops) { ops.begin_global_batch(); },
                             [](auto& moe) { moe.begin_global_batch(); });
  }
  void discard_global_batch() {
    for_each_recipe_operands([](auto& ops) { ops.discard_global_batch(); },
                             [](auto& moe) { moe.discard_global_batch(); });
  }
  void zero_grad() {
    for (auto& b : blocks_) {
      b.input_norm.zero_grad();
      b.pre_mlp_norm.zero_grad();
    }
    for_each_modules([](auto& m) {
      for (auto& a : m.attentions) a.zero_grad();
      for (auto& d : m.denses) d.zero_grad();
      for (auto& l : m.moes) l->zero_grad();
    });
  }
  /// Training steps the recipe's operands have ended (all modules alike).
  [[nodiscard]] std::uint64_t operand_steps() const noexcept {
    if constexpr (recipe_modules::rounds)
      if (!recipe_.attentions.empty()) return first_steps_taken(recipe_.attentions.front());
    if constexpr (keeps_bf16_layers)
      if (!bf16_.attentions.empty()) return first_steps_taken(bf16_.attentions.front());
    return recipe_.moes.empty() ? 0 : recipe_.moes.front()->operand_steps();
  }
  void set_operand_steps(std::uint64_t steps) noexcept {
    for_each_modules([&](auto& m) {
      for (auto& l : m.moes) l->set_operand_steps(steps);
      if constexpr (std::remove_reference_t<decltype(m)>::rounds) {
        for (auto& a : m.attentions)
          a.for_each_linears(
              [&](std::string_view, auto& l) { l.operands().set_steps_taken(steps); });
        for (auto& d : m.denses) d.operands().set_steps_taken(steps);
      }
    });
  }

 private:
  /// of_operands(ops) for each attention linear's and dense FFN's recipe operands, of_moe(layer)
  /// for each MoE layer.
  template <class OfOperands, class OfMoe>
  void for_each_recipe_operands(OfOperands&& of_operands, OfMoe&& of_moe) {
    for_each_modules([&](auto& m) {
      for (auto& l : m.moes) of_moe(*l);
      if constexpr (std::remove_reference_t<decltype(m)>::rounds) {
        for (auto& a : m.attentions)
          a.for_each_linears([&](std::string_view, auto& l) { of_operands(l.operands()); });
        for (auto& d : m.denses) of_operands(d.operands());
      }
    });
  }

  /// Training steps an attention's recipe operands have ended.
  template <class Attention>
  static std::uint64_t first_steps_taken(Attention const& a) {
    std::uint64_t steps = 0;
    bool first = true;
    a.for_each_linears([&](std::string_view, auto& l) {
      if (first) steps = l.operands().steps_taken();
      first = false;
    });
    return steps;
  }

  std::vector<block> blocks_;
  recipe_modules recipe_;
  [[no_unique_address]] bf16_modules bf16_;
};

}  // namespace megamoe
