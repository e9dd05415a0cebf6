// indexshare: an analytic cost model of DSA with cross-layer index sharing (IndexShare).
//
// FLOPs and bytes per decoded token, and for a whole prefill, of a DeepSeek-V3.2 / GLM-5 style
// model (MLA + lightning indexer + MoE) under a layer schedule, broken down into seven items.
// Every number is a closed-form function of the ModelConfig, the Schedule, the context length
// and the accounting options below; nothing is measured.
//
// Notation (ModelConfig fields): n layers, d = dim, V = vocab; MLA: h = n_heads, r_q = q_lora_rank,
// r_kv = kv_lora_rank, d_n = qk_nope_head_dim, d_r = qk_rope_head_dim, d_vh = v_head_dim,
// d_qk = r_kv + d_r (absorbed key, 576), d_v = r_kv (latent value, 512); indexer: H =
// index_n_heads, D = index_head_dim, k = index_topk; MoE: E = n_routed_experts, E_a =
// n_activated_experts, E_s = n_shared_experts, I = moe_inter_dim, n_dense = first_k_dense,
// I_dense = dense_inter_dim. F = number of Full layers of the schedule (plus MTP layers, which
// are always Full). L = context length: the number of keys the decoded token attends to,
// itself included (so a token at 0-based position p has L = p + 1).
//
// FLOP accounting. Every matrix product is counted as m = multiply-accumulates, and
// FLOPs = c * m with c = CostOptions::flops_per_mac (default 2). The indexer's q.k products
// are FP8; they are weighted by CostOptions::fp8_score_weight (default 1: an FP8 MAC counts as
// much as a bf16 MAC). Top-k counts CostOptions::topk_ops_per_key operations per scored key
// (default 1: one comparison against the running threshold of a radix / threshold select).
// Element-wise work (norms, RoPE, Hadamard, ReLU and the head-weighted sum of the indexer,
// softmax, SiLU, router sigmoid / top-8, residual adds) is not counted: for GLM-5.2 the indexer's
// ReLU, weight multiply and head sum would add (3H + 1) / (2 H D) = 1.2 % to its scoring term.
//
// Per decoded token at context L (one forward step, batch 1):
//   indexer_proj   Full layers only: wq_b (r_q -> H*D), wk (d -> D), weights_proj (d -> H):
//                    m = r_q*H*D + d*D + d*H per Full layer.
//                    (q_norm(wq_a x) is shared with MLA and counted in mla_proj.)
//   indexer_score  Full layers only: q.k of H heads of width D against the L cached keys:
//                    FLOPs = c * w8 * H*D*L per Full layer (w8 = fp8_score_weight).
//   topk           Full layers only: topk_ops_per_key * L per Full layer.
//   mla_proj       every layer, in the absorbed (MQA, 576-wide key) form that FlashMLA uses for
//                    both sparse decode and sparse prefill: wq_a (d -> r_q), wq_b (r_q -> h*(d_n + d_r)), wkv_a
//                    (d -> r_kv + d_r), the absorbed wkv_b (q_nope -> latent: h*d_n*r_kv, latent
//                    output -> values: h*r_kv*d_vh), wo (h*d_vh -> d):
//                    m = d*r_q + r_q*h*(d_n+d_r) + d*(r_kv+d_r) + h*(d_n+d_vh)*r_kv + h*d_vh*d.
//   sparse_mla     every layer (Full or Shared: a Shared layer attends over the reused indices
//                    with its own cache): MQA over min(k, L) keys of width d_qk, values d_v:
//                    m = h*(d_qk + d_v)*min(k, L).
//   moe_ffn        dense layers (i < n_dense): 3*d*I_dense (gate, up, down); MoE layers:
//                    (E_a + E_s)*3*d*I + d*E (router): m per layer.
//   head           lm head d*V; embeddings 0 FLOPs (a row lookup).
//   MTP            CostOptions::mtp_layers extra layers, each a Full MoE layer (all of the items
//                  above once more) plus eh_proj (2d -> d, m = 2*d*d, counted in head) and one
//                  more pass of the shared lm head (counted in head).
//
// Bytes per decoded token (batch 1, so every weight the token uses is read once):
//   weights        FP8 block-quantized linears at CostOptions::fp8_weight_bytes per parameter
//                  (default 1; the fp32 block scales, 4 B per 128 x 128 block, are ignored);
//                  bf16 tensors at 2 B per parameter: indexer weights_proj, router, lm head and
//                  the embedding row (d values).
//   caches         indexer k cache entry: D FP8 + 4 B fp32 scale per 128 values = 132 B;
//                  MLA FP8 cache entry (FlashMLA): r_kv FP8 + 4 B per 128 + d_r bf16 = 656 B.
//   indexer_proj   weights (r_q*H*D + d*D) FP8 + d*H bf16, plus the k cache write (132 B).
//   indexer_score  k cache read 132*L, fp32 logits written 4*L.
//   topk           fp32 logits read 4*L, int32 indices written 4*min(k, L).
//   mla_proj       weights (the m above, FP8), plus the MLA cache write (656 B).
//   sparse_mla     (656 + 4)*min(k, L): the selected cache entries and their int32 indices.
//   moe_ffn        the used experts' (or dense) weights, FP8, plus the router d*E bf16.
//   head           lm head d*V bf16 (per MTP layer: once more, plus eh_proj 2*d*d FP8) plus the
//                  embedding row d bf16.
//
// Whole prefill of L tokens (positions 1..L, token t attends to t keys, causal sums):
//   FLOPs          the per-token FLOPs summed over t = 1..L: context-independent items times L;
//                  indexer_score c*w8*H*D*S1 and topk ops*S1 with S1 = sum_t t = L(L+1)/2;
//                  sparse_mla c*h*(d_qk + d_v)*Sk with Sk = sum_t min(k, t).
//   bytes          every weight read once (MoE layers: min(E, L*E_a) routed experts plus the
//                  shared ones); cache writes L times the per-token write; indexer_score: k cache
//                  read once per query tile of T = CostOptions::prefill_query_tile tokens,
//                  132 * sum_j min(j*T, L), plus logits written 4*S1; topk: logits read 4*S1,
//                  indices written 4*Sk; sparse_mla: (656 + 4)*Sk (no reuse across queries).
//
// The published GLM-5.2 number ("reducing per-token FLOPs by 2.9x at a 1M context length") is
// compared with flops_ratio(glm-5.2, its schedule, 2^20, decode): the default accounting gives
// 2.73 (whole model, decode, every item); see accounting_alternatives() for the others.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ref/config.h"
#include "ref/schedule.h"

namespace indexshare {

// Item names, in the order every CostBreakdown lists them.
inline constexpr const char* kCostIndexerProj = "indexer_proj";
inline constexpr const char* kCostIndexerScore = "indexer_score";
inline constexpr const char* kCostTopk = "topk";
inline constexpr const char* kCostMlaProj = "mla_proj";
inline constexpr const char* kCostSparseMla = "sparse_mla";
inline constexpr const char* kCostMoeFfn = "moe_ffn";
inline constexpr const char* kCostHead = "head";
std::vector<std::string> cost_item_names();

struct CostItem {
  std::string name;
  double flops = 0;
  double bytes = 0;
};

struct CostBreakdown {
  std::vector<CostItem> items;  // the seven items, in cost_item_names() order
  double total_flops() const;
  double total_bytes() const;
  // The item called `name`; throws Error naming it if there is none.
  const CostItem& item(const std::string& name) const;
  // FLOPs / bytes summed over the named items (all items when `names` is empty).
  double flops_of(const std::vector<std::string>& names) const;
  double bytes_of(const std::vector<std::string>& names) const;
  // Share of the indexer (indexer_proj + indexer_score + topk) in the total FLOPs / bytes.
  double indexer_flops_share() const;
  double indexer_bytes_share() const;
};

struct CostOptions {
  double flops_per_mac = 2.0;        // c: 2 counts a MAC as a multiply and an add; 1 counts MACs
  double fp8_score_weight = 1.0;     // w8: weight of an FP8 indexer-scoring MAC vs a bf16 MAC
  double topk_ops_per_key = 1.0;     // top-k operations per scored key
  int mtp_layers = 0;                // MTP / nextn layers run per decoded token (always Full)
  double fp8_weight_bytes = 1.0;     // bytes per parameter of an FP8 block-quantized linear
  int64_t prefill_query_tile = 64;   // T: prefill queries sharing one read of the indexer k cache
  void validate() const;             // throws Error naming the bad field
};

// Cache entry sizes in bytes per token and layer (132 and 656 for the real models).
double indexer_cache_entry_bytes(const ModelConfig& cfg);  // D + 4*ceil(D/128)
double mla_cache_entry_bytes(const ModelConfig& cfg);      // r_kv + 4*ceil(r_kv/128) + 2*d_r

// Causal sums used by the prefill formulas: sum_{t=1..L} t and sum_{t=1..L} min(k, t).
double causal_sum(int64_t length);
double causal_topk_sum(int64_t length, int64_t topk);

// One decoded token at context L >= 1 (the token attends to L keys, itself included).
// Throws Error if the config is invalid, the schedule does not have cfg.n_layers layers, or
// L < 1.
CostBreakdown decode_cost(const ModelConfig& cfg, const Schedule& schedule, int64_t context,
                          const CostOptions& options = {});

// The whole prefill of L >= 1 tokens from position 0 (token t = 1..L attends to t keys).
CostBreakdown prefill_cost(const ModelConfig& cfg, const Schedule& schedule, int64_t length,
                           const CostOptions& options = {});

enum class CostMode { decode, prefill };
std::string cost_mode_name(CostMode mode);  // "decode" / "prefill"
CostBreakdown cost(const ModelConfig& cfg, const Schedule& schedule, int64_t context, CostMode mode,
                   const CostOptions& options = {});

// FLOPs with every layer Full divided by FLOPs with `schedule`, summed over `items` (every item
// when empty): the "per-token FLOPs reduction" of IndexShare. 1 for an all-full schedule.
double flops_ratio(const ModelConfig& cfg, const Schedule& schedule, int64_t context, CostMode mode,
                   const CostOptions& options = {}, const std::vector<std::string>& items = {});

// The schedule with every layer Full, for cfg.n_layers layers.
Schedule all_full_schedule(const ModelConfig& cfg);

// An accounting: what "per-token FLOPs" counts. The first entry is the default one.
struct Accounting {
  std::string name;
  std::string description;
  CostMode mode = CostMode::decode;
  CostOptions options;
  std::vector<std::string> items;  // empty: every item
};
std::vector<Accounting> accounting_alternatives();
double flops_ratio(const ModelConfig& cfg, const Schedule& schedule, int64_t context,
                   const Accounting& accounting);

// ---- custom configurations --------------------------------------------------------------------
//
// A config file is a JSON object whose keys are the ModelConfig field names:
//   required integers  n_layers dim vocab n_heads q_lora_rank kv_lora_rank qk_nope_head_dim
//                      qk_rope_head_dim v_head_dim index_n_heads index_head_dim index_topk
//                      n_routed_experts n_shared_experts n_activated_experts moe_inter_dim
//                      first_k_dense dense_inter_dim
//   optional           name (string, default: the file name), indexer_rope ("half_split" /
//                      "interleaved"), index_scale_rule ("deepseek_ue8m0" / "flashmla_pow2" /
//                      "fp32_amax"), rope_theta, yarn (bool), yarn_factor,
//                      yarn_original_seq_len, yarn_beta_fast, yarn_beta_slow, yarn_mscale,
//                      rms_eps, index_norm_eps, seq (integer);
//   schedule, like the HF config (each optional, null = not set): index_topk_freq (integer,
//                      default 1), index_skip_topk_offset (integer, default 2),
//                      index_topk_pattern (F/S string), indexer_types (list of "full"/"shared").
// Keys starting with '_' are comments and ignored; any other unknown key is an error. Omitted
// optional fields keep the ModelConfig defaults. The result is validated (ModelConfig::validate
// plus the MoE fields: non-negative, n_activated_experts <= n_routed_experts, first_k_dense <=
// n_layers). Errors throw Error naming the file and the field.
ModelConfig load_config_json(const std::string& path);
// The same from JSON text; `source` names it in error messages.
ModelConfig parse_config_json(const std::string& text, const std::string& source);
// The JSON text of a config, in the format above (every field written); parse_config_json of it
// gives back an equal config.
std::string config_json_text(const ModelConfig& cfg);

}  // namespace indexshare
