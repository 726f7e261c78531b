// SPDX-License-Identifier: Apache-2.0
// Run under mpiexec. Training on a job (TP x CP x DP, EP) against one rank on the same global
// batches:
//   - fp64, clipping every step (threshold 1e-3): the loss of every step and, after the last,
//     every parameter this rank holds equal the one-rank run's (1e-9 relative);
//   - fp32: the first micro-batch's loss and every gradient after reduce_gradients equal one
//     rank's on the same global batch (1e-5 of the tensor's largest entry);
//   - FP8 (current scaling) with memory::quantized_weights against the same job keeping fp32
//     weights: every step's loss and the expert weights' and attention's weight codes after the
//     last are the same bits, and the optimizer keeps this rank's shard of those weights in fp32
//     (1/EDP of the experts', 1/(TP DP CP) of whole attention and dense-FFN weights, 1/(DP CP) of
//     their TP shards; the amaxes of a weight's ETP or TP shards are reduced over them).
// The one-rank run uses micro_batches x DP micro-batches of the same size, which hold exactly the
// same sequences (train/trainer.hpp).
//
// Under CP every rank of a CP group takes the same micro-batches, each its two chunks of them;
// both key/value exchanges run (p2p with every router, all_gather with softmax).
//
// Under TP each rank holds its shards (compared element by element through their numbering).
//
// Multi-head latent attention trains alike in every layout too (sigmoid with expert bias, and
// under CP the all_gather exchange).
//
//   mpiexec -n 4 megamoe_training_mpi --ep 2 [--tp 2] [--cp 2] [--etp 2] [--steps 3]
#include "support/sample_data.hpp"
#include "support/tally.hpp"

#include <megamoe/config/config.hpp>
#include <megamoe/model/mla.hpp>
#include <megamoe/model/transformer.hpp>
#include <megamoe/parallel/gradients.hpp>
#include <megamoe/parallel/process_groups.hpp>
#include <megamoe/precision/operands.hpp>
#include <megamoe/train/trainer.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace mm = megamoe;
namespace mt = megamoe::train;
namespace rt = megamoe::router;

namespace {

namespace md = mm::model;
// Grouped-query attention (4 heads in 2 groups), so TP 2 splits whole groups.
using decoder = md::decoder<md::layers<2>, md::heads<4>, md::query_groups<2>, md::vocabulary<256>,
                            md::dense_ffn<20>, md::moe_layer_freq<2>>;
using softmax_aux = rt::top_k<2, rt::aux_loss<1e-2>, rt::z_loss<1e-3>>;
// Multi-head latent attention (4 heads, query rank 6, latent rank 4, head parts 3 + 4 and values
// of 5), so TP 2 splits whole heads and a mixed-up layout cannot pass; its latents normed
// (qk_layernorm), so the replicated norms' gradients are summed over TP too.
using mla_decoder = md::decoder<md::layers<2>, md::heads<4>, md::vocabulary<256>, md::dense_ffn<20>,
                                md::moe_layer_freq<2>, md::multi_latent_attention<6, 4, 3, 4, 5>,
                                md::qk_layernorm<>>;
// Two multi-token prediction depths after an MoE last layer, so each depth's layer is an MoE
// layer too (EP, ETP and the routers' losses inside MTP), with grouped-query attention.
using mtp_decoder =
    md::decoder<md::layers<2>, md::heads<4>, md::query_groups<2>, md::vocabulary<256>,
                md::dense_ffn<20>, md::moe_layer_pattern<0, 1>, md::multi_token_prediction<2, 0.3>>;
template <class Dispatch, class Precision, class Parallel, class Memory = mm::memory::keep_all,
          class Router = softmax_aux, class Decoder = decoder>
using config =
    mm::make_config<mm::shape<mm::hidden<16>, mm::ffn<12>, mm::experts<8>>, Router, Dispatch,
                    mm::expert::mlp<mm::expert::swiglu>, Precision, Parallel, Memory, Decoder>;
// The dropless routers every layout must train alike (a capacity limit sees tokens in another
// order per layout): softmax with aux and z loss, sequence aux loss, global aux loss, and sigmoid
// scores with the aux-loss-free expert bias.
using seq_aux = rt::top_k<2, rt::seq_aux_loss<1e-2>>;
using global_aux = rt::top_k<2, rt::global_aux_loss<1e-2>>;
using sigmoid_bias = rt::top_k<2, rt::sigmoid, rt::expert_bias<1e-2>>;
using mapped = mm::parallel::mapping<mm::parallel::tp<mm::dynamic>, mm::parallel::cp<mm::dynamic>,
                                     mm::parallel::pp<mm::dynamic>, mm::parallel::etp<mm::dynamic>,
                                     mm::parallel::ep<mm::dynamic>>;
// Context parallelism's other key/value exchange (mapped's is p2p, the default).
using gathered =
    mm::parallel::mapping<mm::parallel::tp<mm::dynamic>, mm::parallel::cp<mm::dynamic>,
                          mm::parallel::pp<mm::dynamic>, mm::parallel::etp<mm::dynamic>,
                          mm::parallel::ep<mm::dynamic>,
                          mm::parallel::cp_comm<mm::parallel::cp_comm_type::all_gather>>;
using one_rank = mm::parallel::mapping<>;

constexpr int seq = 8, micro = 2;

mt::train_settings settings(int steps, int micro_batches) {
  mt::train_settings s;
  s.seq_length = seq;
  s.micro_batch = micro;
  s.micro_batches = micro_batches;
  s.steps = steps;
  s.schedule = {1e-2, 1e-3, 1, steps};
  return s;
}

template <class Model>
std::map<std::string, mm::row_matrix<double>> tensors(Model& model, bool gradients) {
  std::map<std::string, mm::row_matrix<double>> out;
  model.for_each_parameter([&](std::string_view name, auto value, auto grad, mm::parameter_kind) {
    out.emplace(std::string(name), (gradients ? grad : value).template cast<double>());
  });
  return out;
}

/// Each element this rank holds, by its place in the whole parameter (TP and ETP shards too).
using numbered_values = std::map<std::string, std::vector<std::pair<std::uint64_t, double>>>;
template <class Model>
numbered_values numbered(Model& model, bool gradients) {
  numbered_values out;
  model.for_each_numbered_parameter([&](std::string_view name, auto value, auto grad,
                                        mm::parameter_kind, mm::element_numbering const& n) {
    auto const& m = gradients ? grad : value;
    auto& list = out[std::string(name)];
    for (Eigen::Index r = 0; r < m.rows(); ++r)
      for (Eigen::Index c = 0; c < m.cols(); ++c)
        list.emplace_back(n.global(r, c), static_cast<double>(m(r, c)));
  });
  return out;
}

void compare(mm::testing::tally& result, std::string const& what, numbered_values const& mine,
             std::map<std::string, mm::row_matrix<double>> const& reference, double rtol,
             bool scale_by_largest) {
  for (auto const& [name, elements] : mine) {
    auto const it = reference.find(name);
    if (it == reference.end()) {
      result.close(what + " " + name + " has no one-rank twin", 1.0, 0.0, 1.0, 0.0);
      continue;
    }
    double const largest = std::max(1e-30, it->second.cwiseAbs().maxCoeff());
    for (auto const& [at, value] : elements) {
      if (at >= static_cast<std::uint64_t>(it->second.size())) {
        result.close(what + " " + name + " element beyond the whole tensor", 1.0, 0.0, 1.0, 0.0);
        continue;
      }
      double const r = it->second.data()[at];
      result.close(what + " " + name, value, r,
                   scale_by_largest ? largest : std::max(1.0, std::abs(r)), rtol);
    }
  }
}

/// fp64 steps through the trainer (clipping every step: losses, then parameters, 1e-9) and the
/// fp32 first global batch (loss and reduced gradients, 1e-5) of the job against one rank, with
/// `Router`.
template <class Router, class Mapping = mapped, class Decoder = decoder>
void against_one_rank(mm::parallel::process_groups const& groups,
                      mm::testing::sample_corpus const& corpus, mm::context& ctx,
                      mm::testing::tally& result, int steps, std::string const& what) {
  int const DP = groups.dp().size(), CP = groups.cp().size();
  // fp64, whole steps through the trainer, clipping every step.
  {
    using job_config = config<mm::dispatch::all_to_all, mm::precision::fp64, Mapping,
                              mm::memory::keep_all, Router, Decoder>;
    using one_config = config<mm::dispatch::local, mm::precision::fp64, one_rank,
                              mm::memory::keep_all, Router, Decoder>;
    mt::train_settings s = settings(steps, 1);
    s.optimizer.clip_grad = 1e-3;
    mm::transformer<job_config> model(groups);
    model.initialize(9, 0.3);
    mt::trainer<job_config> job(groups, model, corpus(s.seq_length), s);
    mt::train_settings s1 = s;
    s1.micro_batches = s.micro_batches * DP;
    mm::transformer<one_config> one;
    one.initialize(9, 0.3);
    mt::trainer<one_config> reference(one, corpus(s1.seq_length), s1);
    for (int k = 1; k <= steps; ++k) {
      auto const a = job.step(ctx);
      auto const b = reference.step(ctx);
      result.close(what + "loss of step " + std::to_string(k), a.loss, b.loss, 1.0, 1e-9);
      result.close(what + "MTP loss of step " + std::to_string(k), a.mtp_loss, b.mtp_loss, 1.0,
                   1e-9);
      result.close(what + "clipped at step " + std::to_string(k), a.clip_factor < 1 ? 1 : 0, 1, 1,
                   0);
    }
    compare(result, what + "fp64 parameter after the steps", numbered(model, false),
            tensors(one, false), 1e-9, false);
    // Each rank holds only its shard: under TP every tensor-parallel parameter is 1/TP of the
    // whole (the vocabulary of 256 pads to parts of 128), and there are some.
    int const TP = groups.tp().size();
    auto const whole = tensors(one, false);
    int shards = 0;
    model.for_each_parameter([&](std::string_view name, auto value, auto, mm::parameter_kind kind) {
      if (kind != mm::parameter_kind::tensor_parallel) return;
      ++shards;
      result.close(what + "elements of the shard of " + std::string(name),
                   static_cast<double>(value.size()) * TP,
                   static_cast<double>(whole.at(std::string(name)).size()), 1.0, 0.0);
    });
    result.close(what + "tensor-parallel parameters held", shards > 0 ? 1 : 0, TP > 1 ? 1 : 0, 1,
                 0);
  }
  // fp32, the first global batch's gradients.
  {
    using job_config = config<mm::dispatch::all_to_all, mm::precision::fp32, Mapping,
                              mm::memory::keep_all, Router, Decoder>;
    using one_config = config<mm::dispatch::local, mm::precision::fp32, one_rank,
                              mm::memory::keep_all, Router, Decoder>;
    mm::transformer<job_config> model(groups);
    mm::transformer<one_config> one;
    model.initialize(4, 0.3);
    one.initialize(4, 0.3);
    std::vector<std::int32_t> tokens(seq * micro), targets(tokens.size());
    ctx.step.loss_backward_scale = CP;  // the reference's cp / micro-batches
    model.zero_grad();
    one.zero_grad();
    corpus(seq).training_batch(groups.dp().rank() * micro, seq, micro, tokens, targets);
    auto const mine = model.forward(ctx, tokens, targets, seq, micro);
    // And computes only its part: each attention keeps its S/CP x B input rows, its 1/TP of the
    // q k v and context columns and of the heads' log-sum-exp (and with all_gather the gathered
    // keys and values of its groups).
    // MLA keeps its input, the two normed latents and the norms' inputs and inverse RMS (whole),
    // and its heads' queries, keys, up-projected keys and values, and context.
    {
      auto const& m = model.model_settings();
      int const TP = groups.tp().size(), H = model.hidden_size(), d = H / m.heads;
      double const N = double(seq) / CP * micro, W = double(m.heads + 2 * m.query_groups) * d;
      bool const gathers = CP > 1 && Mapping::cp_comm == mm::parallel::cp_comm_type::all_gather;
      double per_layer = 0.0;
      if constexpr (Decoder::value.mla.enabled()) {
        auto const& a = m.mla;
        double const n = double(m.heads) / TP, qk = a.qk_head_dim + a.qk_pos_emb_head_dim;
        double const latents = 2.0 * N * (a.q_lora_rank + a.kv_lora_rank) + 2.0 * N;
        double const heads = N * n * (2 * qk + a.qk_head_dim + 2 * a.v_head_dim) + N * n;
        double const gathered = gathers ? double(seq) * micro * n * (qk + a.v_head_dim) : 0.0;
        per_layer = N * H + latents + heads + gathered;
      } else {
        double const gathered = gathers ? double(seq) * micro * 2 * m.query_groups * d / TP : 0.0;
        per_layer = N * H + N * W / TP + N * H / TP + N * m.heads / TP + gathered;
      }
      result.close(what + "attention's saved bytes",
                   static_cast<double>(model.attention_saved_bytes()),
                   per_layer * (m.layers + m.mtp_num_layers) * sizeof(float), 1.0, 0.0);
    }
    model.backward(ctx, 1.0f);
    mm::parallel::reduce_gradients(groups, model);
    // A CP rank's mean is over its chunks (an MTP depth's: its share of the valid targets).
    std::vector<double> loss{mine.cross_entropy / CP, mine.mtp_loss / CP};
    mm::parallel::all_reduce_sum(groups.dp_cp(), std::span<double>(loss));
    // One rank: the DP ranks' micro-batches in turn, each weighted 1/DP.
    ctx.step.loss_backward_scale = 1.0 / DP;
    double total = 0.0, total_mtp = 0.0;
    for (int r = 0; r < DP; ++r) {
      corpus(seq).training_batch(r * micro, seq, micro, tokens, targets);
      auto const out = one.forward(ctx, tokens, targets, seq, micro);
      total += out.cross_entropy;
      total_mtp += out.mtp_loss;
      one.backward(ctx, static_cast<float>(1.0 / DP));
    }
    result.close(what + "fp32 loss of the first global batch", loss[0] / DP, total / DP, 1.0, 1e-5);
    result.close(what + "fp32 MTP loss of the first global batch", loss[1] / DP, total_mtp / DP,
                 1.0, 1e-5);
    compare(result, what + "fp32 gradient", numbered(model, true), tensors(one, true), 1e-5, true);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return mm::parallel::run_main(argc, argv, [&](mm::parallel::environment& env) {
    mm::parallel::degrees d;
    int steps = 3;
    mm::parallel::check_on_every_rank(env.world(), [&] {
      for (int i = 1; i + 1 < argc; i += 2) {
        std::string const key = argv[i];
        if (key == "--ep")
          d.ep = std::stoi(argv[i + 1]);
        else if (key == "--tp")
          d.tp = std::stoi(argv[i + 1]);
        else if (key == "--cp")
          d.cp = std::stoi(argv[i + 1]);
        else if (key == "--pp")
          d.pp = std::stoi(argv[i + 1]);
        else if (key == "--etp")
          d.etp = std::stoi(argv[i + 1]);
        else if (key == "--steps")
          steps = std::stoi(argv[i + 1]);
        else
          throw mm::input_error("unknown argument " + key);
      }
    });
    auto const& world = env.world();
    mm::parallel::process_groups const groups(world, d);
    int const DP = groups.dp().size(), CP = groups.cp().size();
    mm::testing::sample_corpus const corpus;
    mm::context ctx(1);
    mm::testing::tally result;

    against_one_rank<softmax_aux>(groups, corpus, ctx, result, steps, "");
    against_one_rank<seq_aux>(groups, corpus, ctx, result, steps, "seq aux: ");
    // The global aux loss takes a running mean of its counts over the micro-batches a rank has
    // seen (the reference's), so DP ranks and one rank accumulating DP micro-batches differ by
    // design: compared where DP is 1.
    if (groups.dp().size() == 1)
      against_one_rank<global_aux>(groups, corpus, ctx, result, steps, "global aux: ");
    against_one_rank<sigmoid_bias>(groups, corpus, ctx, result, steps, "sigmoid, expert bias: ");
    against_one_rank<sigmoid_bias, mapped, mla_decoder>(groups, corpus, ctx, result, steps,
                                                        "MLA, sigmoid, expert bias: ");
    if (CP > 1)
      against_one_rank<softmax_aux, gathered, mla_decoder>(groups, corpus, ctx, result, steps,
                                                           "MLA, all_gather: ");
    if (CP > 1)
      against_one_rank<softmax_aux, gathered>(groups, corpus, ctx, result, steps, "all_gather: ");
    against_one_rank<softmax_aux, mapped, mtp_decoder>(groups, corpus, ctx, result, steps, "MTP: ");
    // FP8 with the expert weights held as codes, against the same job keeping them in fp32.
    {
      using fp8 = mm::precision::fp8_tensorwise<mm::precision::current>;
      using plain_config = config<mm::dispatch::all_to_all, fp8, mapped>;
      using codes_config = config<mm::dispatch::all_to_all, fp8, mapped,
                                  mm::memory::plan<mm::memory::quantized_weights>>;
      mt::train_settings const s = settings(steps, 2);
      mm::transformer<plain_config> plain(groups);
      mm::transformer<codes_config> codes(groups);
      plain.initialize(3, 0.3);
      codes.initialize(3, 0.3);
      mt::trainer<plain_config> plain_job(groups, plain, corpus(s.seq_length), s);
      mt::trainer<codes_config> codes_job(groups, codes, corpus(s.seq_length), s);
      for (int k = 1; k <= steps; ++k) {
        auto const a = plain_job.step(ctx);
        auto const b = codes_job.step(ctx);
        result.close("quantized weights: loss of step " + std::to_string(k), b.loss, a.loss, 1.0,
                     0.0);
      }
      // One more forward: the plain job quantizes its updated fp32 weights.
      std::vector<std::int32_t> tokens(seq * micro), targets(tokens.size());
      corpus(seq).training_batch(groups.dp().rank() * micro, seq, micro, tokens, targets);
      result.close("quantized weights: loss after the last update",
                   codes.forward(ctx, tokens, targets, seq, micro).cross_entropy,
                   plain.forward(ctx, tokens, targets, seq, micro).cross_entropy, 1.0, 0.0);
      std::int64_t expert_elements = 0;
      using role = mm::precision::operand_role;
      // Every layer runs under the recipe (none is kept in BF16).
      auto const plain_layers = plain.recipe_moe_layers();
      auto const codes_layers = codes.recipe_moe_layers();
      result.close("quantized weights: MoE layers under the recipe",
                   static_cast<double>(codes_layers.size()),
                   static_cast<double>(plain_layers.size()), 1.0, 0.0);
      for (std::size_t i = 0; i < codes_layers.size() && i < plain_layers.size(); ++i) {
        auto const* m = codes_layers[i];
        auto const& p = *plain_layers[i];
        int const L = m->local_experts(), H = m->hidden_size(), F = m->local_ffn();
        expert_elements += std::int64_t{L} * (2 * F * H + H * F);
        for (auto l : {mm::expert::linear::fc1, mm::expert::linear::fc2})
          for (int e = 0; e < L; ++e) {
            auto const& mine = m->routed_operands().codes_of(
                l, role::weight, mm::precision::operand_usage::rowwise, e);
            auto const& theirs = p.routed_operands().codes_of(
                l, role::weight, mm::precision::operand_usage::rowwise, e);
            result.close("quantized weights: codes of expert " + std::to_string(e),
                         mine.codes == theirs.codes && mine.scale_inv == theirs.scale_inv ? 1 : 0,
                         1, 1, 0);
          }
      }
      // Attention's and the dense FFNs' weights, as codes too: the plain model's copies of them,
      // whole (sharded over TP x DP x CP) or TP shards (over DP x CP).
      std::int64_t dense_elements = 0, tp_elements = 0;
      plain.for_each_parameter([&](std::string_view name, auto, auto grad, mm::parameter_kind k) {
        bool const linear = name.ends_with("self_attention.linear_qkv.weight") ||
                            name.ends_with("self_attention.linear_proj.weight") ||
                            name.ends_with("mlp.linear_fc1.weight") ||
                            name.ends_with("mlp.linear_fc2.weight");
        if (!linear) return;
        (k == mm::parameter_kind::tensor_parallel ? tp_elements : dense_elements) += grad.size();
      });
      auto shard_of = [](std::int64_t n, boost::mpi::communicator const& g) {
        return static_cast<double>(n * (g.rank() + 1) / g.size() - n * g.rank() / g.size());
      };
      double const shard = shard_of(expert_elements, groups.expert_dp()) +
                           shard_of(dense_elements, groups.tp_dp_cp()) +
                           shard_of(tp_elements, groups.dp_cp());
      // The projections' codes after the last update, as the plain job's last forward made them.
      std::vector<std::vector<std::uint8_t>> plain_codes, held_codes;
      auto keep = [](std::vector<std::vector<std::uint8_t>>& out) {
        return [&out](int, auto& attention, auto&) {
          for (auto l : {mm::expert::linear::fc1, mm::expert::linear::fc2})
            out.push_back(attention.linears()
                              .operands()
                              .codes_of(l, role::weight, mm::precision::operand_usage::rowwise, 0)
                              .codes);
        };
      };
      plain.for_each_layer_modules(keep(plain_codes));
      codes.for_each_layer_modules(keep(held_codes));
      result.close("quantized weights: attention's weight codes",
                   !held_codes.empty() && held_codes == plain_codes ? 1 : 0, 1, 1, 0);
      result.close("quantized weights: fp32 master elements",
                   static_cast<double>(codes_job.optimizer().master_bytes()) / sizeof(float), shard,
                   1.0, 0.0);
      result.close("quantized weights: no fp32 master in a layer",
                   !codes_layers.empty() && codes_layers.front()->holds_weight_values() ? 1 : 0, 0,
                   1, 0);
    }
    return result.finish(world,
                         "training on " + std::to_string(world.size()) + " ranks (TP " +
                             std::to_string(groups.tp().size()) + ", DP " + std::to_string(DP) +
                             ", CP " + std::to_string(CP) + ", EP " +
                             std::to_string(groups.ep().size()) + ", EDP " +
                             std::to_string(groups.expert_dp().size()) + ")",
                         "all equal one rank's");
  });
}
