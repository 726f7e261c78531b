// SPDX-License-Identifier: Apache-2.0
// megamoe/policy/rule_ids.hpp — the one list of configuration rules and their messages.
//
// Every configuration error megamoe reports, whether a static_assert at compile time or an
// exception at start-up, starts with `megamoe[Rnnn]:`. A static_assert needs a string literal, so
// each message is a macro; the run-time catalogue below is built from the same macros, so both
// sides say the same words. Messages name the slot and say what must hold. Code outside config/
// names a rule by `rules::id` (its name), never by its number.
#pragma once

#include <array>
#include <string_view>

#define MEGAMOE_RULE_R001                                                                         \
  "megamoe[R001]: shape needs hidden<N>, ffn<N> and experts<N>, each positive (or dynamic), and " \
  "shared_ffn<N> must not be negative"
#define MEGAMOE_RULE_R002 "megamoe[R002]: router top_k must be at least 1 and at most shape experts"
#define MEGAMOE_RULE_R003 "megamoe[R003]: parallel::ep must divide shape experts"
#define MEGAMOE_RULE_R004 \
  "megamoe[R004]: router::group_limit num_groups must be positive and divide shape experts"
#define MEGAMOE_RULE_R005 \
  "megamoe[R005]: router::group_limit group_top_k must be at least 1 and at most num_groups"
#define MEGAMOE_RULE_R006 \
  "megamoe[R006]: router top_k must be at least router::group_limit group_top_k"
#define MEGAMOE_RULE_R007                                                                       \
  "megamoe[R007]: router::expert_bias (aux-loss-free balancing) needs sigmoid or sqrtsoftplus " \
  "scores"
#define MEGAMOE_RULE_R008                                                                     \
  "megamoe[R008]: router::softmax_after_topk needs top_k > 1 (softmax over one value has no " \
  "gradient); use softmax_before_topk or sigmoid for k = 1"
#define MEGAMOE_RULE_R009                                                                         \
  "megamoe[R009]: router::capacity is allowed only with aux_loss, seq_aux_loss, global_aux_loss " \
  "or no load balancing (not with sinkhorn)"
#define MEGAMOE_RULE_R010 "megamoe[R010]: router::pad_to_capacity needs a router::capacity factor"
#define MEGAMOE_RULE_R011                                                                     \
  "megamoe[R011]: router::pad_for_quantization needs an FP8 or FP4 precision recipe, and an " \
  "explicit multiple must be the recipe's (16 FP8, 32 MXFP8, 128 NVFP4)"
#define MEGAMOE_RULE_R012                                                                  \
  "megamoe[R012]: router::pad_for_quantization (router-side padding) cannot be used with " \
  "dispatch::all_gather"
#define MEGAMOE_RULE_R013 "megamoe[R013]: dispatch::hierarchical needs parallel::ep > 1"
#define MEGAMOE_RULE_R014 \
  "megamoe[R014]: expert::with_bias (biases on expert linears) needs parallel::etp == 1"
#define MEGAMOE_RULE_R015                                                                      \
  "megamoe[R015]: expert::shared_expert_gate needs a shared expert: shape shared_ffn must be " \
  "positive"
#define MEGAMOE_RULE_R016 \
  "megamoe[R016]: parallel degrees tp, cp, pp, etp and ep must be positive (or dynamic)"
#define MEGAMOE_RULE_R017                                                                  \
  "megamoe[R017]: the world size must be a positive multiple of tp*cp*pp (attention grid " \
  "TPxCPxDPxPP)"
#define MEGAMOE_RULE_R018                                                                \
  "megamoe[R018]: the world size must be a positive multiple of etp*ep*pp (expert grid " \
  "ETPxEPxEDPxPP)"
#define MEGAMOE_RULE_R019                                                               \
  "megamoe[R019]: dispatch::local needs parallel::ep == 1 and parallel::etp == 1; use " \
  "dispatch::all_to_all or dispatch::all_gather"
#define MEGAMOE_RULE_R020                                                                       \
  "megamoe[R020]: make_config takes at most one policy of each kind (shape, router, dispatch, " \
  "expert, precision, parallel, memory, model)"
#define MEGAMOE_RULE_R021                                                                       \
  "megamoe[R021]: make_config takes only megamoe policies; see show_unknown_megamoe_policy in " \
  "the errors below for the offending type"
#define MEGAMOE_RULE_R022                                                                         \
  "megamoe[R022]: a configuration needs every slot (shape, router, dispatch, expert, precision, " \
  "parallel, memory, model) to hold a policy of that kind; shape has no default"
#define MEGAMOE_RULE_R023 "megamoe[R023]: a policy takes at most one option of each kind"
#define MEGAMOE_RULE_R024                                                                         \
  "megamoe[R024]: a policy got an option it does not accept; see show_unknown_megamoe_option in " \
  "the errors below for the offending type"
#define MEGAMOE_RULE_R025                                                              \
  "megamoe[R025]: router::sinkhorn cannot be combined with aux_loss, seq_aux_loss or " \
  "global_aux_loss"
#define MEGAMOE_RULE_R026                                                                        \
  "megamoe[R026]: router numbers must be in range: capacity factor > 0, top-k scaling factor > " \
  "0, "                                                                                          \
  "loss coefficients >= 0, expert-bias update rate > 0, 0 <= input jitter < 1"
#define MEGAMOE_RULE_R027                                                                      \
  "megamoe[R027]: a size or degree left to start-up (dynamic), or a run-time router, must be " \
  "resolved before the configuration is used"
#define MEGAMOE_RULE_R028 "megamoe[R028]: MEGAMOE_NUM_THREADS must be a positive integer"
#define MEGAMOE_RULE_R030                                                                          \
  "megamoe[R030]: memory::quantized_activations and memory::quantized_weights need an FP8 or FP4 " \
  "precision recipe"
#define MEGAMOE_RULE_R031                                                                        \
  "megamoe[R031]: router top_k must be at most group_top_k * experts / num_groups (the experts " \
  "of the chosen groups)"
#define MEGAMOE_RULE_R029 "megamoe[R029]: the MPI library must provide at least MPI_THREAD_FUNNELED"
#define MEGAMOE_RULE_R032 \
  "megamoe[R032]: dispatch::hierarchical needs parallel::etp == 1 (whole experts on each rank)"
#define MEGAMOE_RULE_R033                                                                    \
  "megamoe[R033]: dispatch::all_to_all_overlap needs parallel::etp == 1 (each chunk is one " \
  "exchange; dispatch::shared_memory_overlap allows ETP > 1)"
#define MEGAMOE_RULE_R034                                                                      \
  "megamoe[R034]: MEGAMOE_RANKS_PER_NODE must be a positive integer dividing the world size, " \
  "and every node must hold the same number of ranks of each EP group"
#define MEGAMOE_RULE_R036                                                                      \
  "megamoe[R036]: the pipeline's PP x V virtual stages must split the layers: evenly, or the " \
  "first and last stages' given counts with the rest even over the others"
#define MEGAMOE_RULE_R037                                                                 \
  "megamoe[R037]: expert::amx and expert::avx512_bf16 need a bf16, FP8 or FP4 precision " \
  "recipe (they multiply BF16 values); fp32 and fp64 run on expert::grouped, per_expert " \
  "or tensor_contraction"
#define MEGAMOE_RULE_R035                                                                   \
  "megamoe[R035]: MEGAMOE_WATCHDOG_SECONDS must be a number of seconds > 0 (or 0 / unset: " \
  "off)"

#define MEGAMOE_RULE_R038                                                                       \
  "megamoe[R038]: parallel::etp must divide shape ffn (each expert-tensor-parallel rank holds " \
  "an equal share of every expert's FFN width)"
#define MEGAMOE_RULE_R039                                                                 \
  "megamoe[R039]: model layers, heads, query_groups and vocabulary must be positive (or " \
  "dynamic), dense_ffn must not be negative, and norm_epsilon, rope_base and "            \
  "vocab_size_divisible_by must be positive"
#define MEGAMOE_RULE_R040 "megamoe[R040]: model heads must divide shape hidden"
#define MEGAMOE_RULE_R041                                                                       \
  "megamoe[R041]: the head size (shape hidden / model heads) must be even: RoPE rotates pairs " \
  "of dimensions"
#define MEGAMOE_RULE_R042 "megamoe[R042]: model query_groups must divide model heads"
#define MEGAMOE_RULE_R043                                                                    \
  "megamoe[R043]: retired (it required query_groups == heads; grouped-query attention runs " \
  "now), no configuration breaks it"
#define MEGAMOE_RULE_R044                                                                          \
  "megamoe[R044]: model dense_ffn must be positive when a layer is dense (moe_layer_freq above 1 " \
  "or a 0 in moe_layer_pattern)"
#define MEGAMOE_RULE_R045                                                                      \
  "megamoe[R045]: model moe_layer_freq must be positive, and moe_layer_pattern must list one " \
  "entry per layer, each 0 (dense) or 1 (MoE), at most 256"
#define MEGAMOE_RULE_R046                                                                        \
  "megamoe[R046]: with context parallelism each sequence is cut into 2 CP chunks, so 2 CP must " \
  "divide the sequence length"
#define MEGAMOE_RULE_R047 \
  "megamoe[R047]: attention TP must divide model query_groups (each rank holds whole groups)"
#define MEGAMOE_RULE_R048                                                                          \
  "megamoe[R048]: attention TP must divide the dense FFN width (model dense_ffn) when a layer is " \
  "dense"
#define MEGAMOE_RULE_R049                                                                          \
  "megamoe[R049]: with sequence parallelism TP must divide the positions a rank's sequences hold " \
  "(the sequence length / CP)"
#define MEGAMOE_RULE_R050                                                                        \
  "megamoe[R050]: a pipeline schedule needs at least PP micro-batches per step, and a multiple " \
  "of PP when interleaved (V > 1)"
#define MEGAMOE_RULE_R051                                                                        \
  "megamoe[R051]: the merged forward-backward schedule with PP above 1 needs interleaving (V > " \
  "1), as the reference's overlap_moe_expert_parallel_comm does"
#define MEGAMOE_RULE_R052                                                                   \
  "megamoe[R052]: a BF16 unit asked for by name (amx, avx512_bf16) must be usable in this " \
  "process on every rank: the CPU lists it, the OS grants AMX's tile state, and no "        \
  "MEGAMOE_DISABLE_AMX / MEGAMOE_DISABLE_AVX512 is set"
#define MEGAMOE_RULE_R053                                                                       \
  "megamoe[R053]: layers kept in BF16 at the start and end of the model (the reference's "      \
  "num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16) number from 0 to num_layers each, " \
  "and only under an FP8 or FP4 recipe"
#define MEGAMOE_RULE_R054                                                                         \
  "megamoe[R054]: dispatch::shared_memory needs the dispatcher's tp_ep group on one node (ranks " \
  "that share memory, and one emulated node under MEGAMOE_RANKS_PER_NODE); across nodes use "     \
  "dispatch::hierarchical"
#define MEGAMOE_RULE_R055                                                                         \
  "megamoe[R055]: dispatch::fp8_wire (the reference's moe_dispatch_fwd_dtype) needs fc1's input " \
  "codes made before the dispatch to equal the experts' own: a per-tensor FP8 recipe "            \
  "(precision::fp8_tensorwise<delayed or current>) or row-local blocks whose wgrad copy comes "   \
  "from the rowwise codes (precision::wgrad_from_rowwise<mxfp8 or fp8_blockwise>), and "          \
  "parallel::etp == 1"
#define MEGAMOE_RULE_R056                                                         \
  "megamoe[R056]: precision::wgrad_from_rowwise applies to precision::mxfp8 and " \
  "precision::fp8_blockwise (row-local blocks: a rowwise copy whose wgrad copy differs from it)"
#define MEGAMOE_RULE_R057                                                                        \
  "megamoe[R057]: model::multi_latent_attention needs kv_lora_rank, qk_head_dim and v_head_dim " \
  "positive, q_lora_rank at least 0, qk_pos_emb_head_dim even and positive (RoPE rotates "       \
  "pairs) and num_query_groups equal to num_attention_heads"
#define MEGAMOE_RULE_R058                                                             \
  "megamoe[R058]: model::multi_token_prediction needs mtp_num_layers at least 0 and " \
  "mtp_loss_scaling_factor finite and at least 0"

namespace megamoe {

namespace rules {
/// Every rule by name; the value is its number (the nnn of megamoe[Rnnn]).
enum class id : int {
  shape_sizes_valid = 1,
  top_k_within_experts = 2,
  ep_divides_experts = 3,
  groups_divide_experts = 4,
  group_top_k_within_groups = 5,
  top_k_at_least_group_top_k = 6,
  expert_bias_needs_sigmoid_family = 7,
  softmax_after_topk_needs_k_above_one = 8,
  capacity_needs_compatible_balancing = 9,
  pad_to_capacity_needs_capacity = 10,
  quantization_padding_matches_recipe = 11,
  router_padding_not_with_all_gather = 12,
  hierarchical_needs_expert_parallelism = 13,
  expert_bias_linear_needs_etp_one = 14,
  shared_expert_width_positive = 15,
  degrees_positive = 16,
  world_fits_attention_grid = 17,
  world_fits_expert_grid = 18,
  local_dispatch_needs_one_expert_rank = 19,
  one_policy_per_kind = 20,
  only_megamoe_policies = 21,
  every_slot_filled = 22,
  one_option_per_kind = 23,
  only_accepted_options = 24,
  sinkhorn_without_aux_losses = 25,
  router_numbers_in_range = 26,
  values_resolved = 27,
  num_threads_positive = 28,
  mpi_thread_level_funneled = 29,
  quantized_storage_needs_quantized_recipe = 30,
  top_k_within_chosen_groups = 31,
  hierarchical_needs_etp_one = 32,
  overlap_needs_etp_one = 33,
  ranks_per_node_valid = 34,
  watchdog_seconds_valid = 35,
  pipeline_stages_divide_layers = 36,
  bf16_backends_need_a_recipe = 37,
  etp_divides_ffn = 38,
  model_sizes_valid = 39,
  heads_divide_hidden = 40,
  head_size_even = 41,
  query_groups_divide_heads = 42,
  attention_is_multi_head_retired = 43,
  dense_ffn_for_dense_layers = 44,
  moe_layer_pattern_valid = 45,
  context_chunks_divide_sequence = 46,
  tp_divides_query_groups = 47,
  tp_divides_dense_ffn = 48,
  tp_divides_sequence_shard = 49,
  pipeline_micro_batches = 50,
  merged_schedule_needs_interleaving = 51,
  bf16_unit_usable = 52,
  bf16_edge_layers = 53,
  shared_memory_needs_one_node = 54,
  fp8_wire_needs_codes_made_at_source = 55,
  wgrad_from_rowwise_needs_row_blocks = 56,
  mla_sizes_valid = 57,
  mtp_valid = 58,
};
}  // namespace rules

/// One configuration rule: its number, a short name that reads as the claim it checks, and the
/// message printed when it is broken.
struct rule_info {
  int id;
  std::string_view name;
  std::string_view message;
};

/// Every rule megamoe checks, in id order. `rule_catalog[i].id == i + 1`.
inline constexpr std::array<rule_info, 58> rule_catalog{{
    {1, "shape_sizes_valid", MEGAMOE_RULE_R001},
    {2, "top_k_within_experts", MEGAMOE_RULE_R002},
    {3, "ep_divides_experts", MEGAMOE_RULE_R003},
    {4, "groups_divide_experts", MEGAMOE_RULE_R004},
    {5, "group_top_k_within_groups", MEGAMOE_RULE_R005},
    {6, "top_k_at_least_group_top_k", MEGAMOE_RULE_R006},
    {7, "expert_bias_needs_sigmoid_family", MEGAMOE_RULE_R007},
    {8, "softmax_after_topk_needs_k_above_one", MEGAMOE_RULE_R008},
    {9, "capacity_needs_compatible_balancing", MEGAMOE_RULE_R009},
    {10, "pad_to_capacity_needs_capacity", MEGAMOE_RULE_R010},
    {11, "quantization_padding_matches_recipe", MEGAMOE_RULE_R011},
    {12, "router_padding_not_with_all_gather", MEGAMOE_RULE_R012},
    {13, "hierarchical_needs_expert_parallelism", MEGAMOE_RULE_R013},
    {14, "expert_bias_linear_needs_etp_one", MEGAMOE_RULE_R014},
    {15, "shared_expert_width_positive", MEGAMOE_RULE_R015},
    {16, "degrees_positive", MEGAMOE_RULE_R016},
    {17, "world_fits_attention_grid", MEGAMOE_RULE_R017},
    {18, "world_fits_expert_grid", MEGAMOE_RULE_R018},
    {19, "local_dispatch_needs_one_expert_rank", MEGAMOE_RULE_R019},
    {20, "one_policy_per_kind", MEGAMOE_RULE_R020},
    {21, "only_megamoe_policies", MEGAMOE_RULE_R021},
    {22, "every_slot_filled", MEGAMOE_RULE_R022},
    {23, "one_option_per_kind", MEGAMOE_RULE_R023},
    {24, "only_accepted_options", MEGAMOE_RULE_R024},
    {25, "sinkhorn_without_aux_losses", MEGAMOE_RULE_R025},
    {26, "router_numbers_in_range", MEGAMOE_RULE_R026},
    {27, "values_resolved", MEGAMOE_RULE_R027},
    {28, "num_threads_positive", MEGAMOE_RULE_R028},
    {29, "mpi_thread_level_funneled", MEGAMOE_RULE_R029},
    {30, "quantized_storage_needs_quantized_recipe", MEGAMOE_RULE_R030},
    {31, "top_k_within_chosen_groups", MEGAMOE_RULE_R031},
    {32, "hierarchical_needs_etp_one", MEGAMOE_RULE_R032},
    {33, "overlap_needs_etp_one", MEGAMOE_RULE_R033},
    {34, "ranks_per_node_valid", MEGAMOE_RULE_R034},
    {35, "watchdog_seconds_valid", MEGAMOE_RULE_R035},
    {36, "pipeline_stages_divide_layers", MEGAMOE_RULE_R036},
    {37, "bf16_backends_need_a_recipe", MEGAMOE_RULE_R037},
    {38, "etp_divides_ffn", MEGAMOE_RULE_R038},
    {39, "model_sizes_valid", MEGAMOE_RULE_R039},
    {40, "heads_divide_hidden", MEGAMOE_RULE_R040},
    {41, "head_size_even", MEGAMOE_RULE_R041},
    {42, "query_groups_divide_heads", MEGAMOE_RULE_R042},
    {43, "attention_is_multi_head_retired", MEGAMOE_RULE_R043},
    {44, "dense_ffn_for_dense_layers", MEGAMOE_RULE_R044},
    {45, "moe_layer_pattern_valid", MEGAMOE_RULE_R045},
    {46, "context_chunks_divide_sequence", MEGAMOE_RULE_R046},
    {47, "tp_divides_query_groups", MEGAMOE_RULE_R047},
    {48, "tp_divides_dense_ffn", MEGAMOE_RULE_R048},
    {49, "tp_divides_sequence_shard", MEGAMOE_RULE_R049},
    {50, "pipeline_micro_batches", MEGAMOE_RULE_R050},
    {51, "merged_schedule_needs_interleaving", MEGAMOE_RULE_R051},
    {52, "bf16_unit_usable", MEGAMOE_RULE_R052},
    {53, "bf16_edge_layers", MEGAMOE_RULE_R053},
    {54, "shared_memory_needs_one_node", MEGAMOE_RULE_R054},
    {55, "fp8_wire_needs_codes_made_at_source", MEGAMOE_RULE_R055},
    {56, "wgrad_from_rowwise_needs_row_blocks", MEGAMOE_RULE_R056},
    {57, "mla_sizes_valid", MEGAMOE_RULE_R057},
    {58, "mtp_valid", MEGAMOE_RULE_R058},
}};

/// The catalogue entry of rule `id` (1-based).
constexpr rule_info const& rule(int id) {
  return rule_catalog.at(static_cast<std::size_t>(id - 1));
}
constexpr rule_info const& rule(rules::id which) {
  return rule(static_cast<int>(which));
}

}  // namespace megamoe
