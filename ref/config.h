// indexshare: model configurations (the numbers of DeepSeek-V3.2, GLM-5 and GLM-5.2, plus tiny
// configurations with the same structure for tests), as used by the module-level indexer and
// MLA, the layer stack and the cost model.
//
// Sources: DeepSeek-V3.2's inference/config_671B_v3.2.json and its HF config; for the GLM-5 family
// transformers' GlmMoeDsaConfig defaults and GLM-5.2's config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ref/module_ops.h"
#include "ref/numerics.h"
#include "ref/schedule.h"

namespace indexshare {

struct ModelConfig {
  std::string name;
  int n_layers = 0;
  int64_t dim = 0;                // hidden size
  int64_t vocab = 0;
  // MLA
  int64_t n_heads = 0;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;       // latent width: the first kv_lora_rank dims of a 576-dim key
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;   // also the indexer's rope width
  int64_t v_head_dim = 0;
  // Indexer
  int64_t index_n_heads = 0;      // H
  int64_t index_head_dim = 0;     // D
  int64_t index_topk = 0;
  ref::RopeLayout indexer_rope = ref::RopeLayout::half_split;  // MLA rope is always interleaved
  ScaleRule index_scale_rule = ScaleRule::deepseek_ue8m0;
  // RoPE
  double rope_theta = 10000.0;
  bool yarn = false;              // DeepSeek: YaRN frequencies and mscale
  double yarn_factor = 1.0;
  int yarn_original_seq_len = 4096;
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0, yarn_mscale = 1.0;
  // Norms
  float rms_eps = 1e-6f;          // q_norm, kv_norm, layer norms
  float index_norm_eps = 1e-6f;   // the indexer's k LayerNorm
  // MoE FFN (for the cost model)
  int64_t n_routed_experts = 0, n_shared_experts = 0, n_activated_experts = 0;
  int64_t moe_inter_dim = 0, first_k_dense = 0, dense_inter_dim = 0;
  // Layer schedule (freq/offset rule or pattern)
  ScheduleSpec schedule;
  // Default sequence length for generated stacks.
  int64_t seq = 0;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t d_qk() const { return kv_lora_rank + qk_rope_head_dim; }   // absorbed MQA key (576)
  int64_t d_v() const { return kv_lora_rank; }                       // latent value (512)
  // MLA softmax scale: qk_head_dim^-0.5, times yarn_mscale(factor, mscale)^2 with YaRN.
  double softmax_scale() const;
  // Rope inverse frequencies for rope width qk_rope_head_dim (YaRN when enabled).
  std::vector<float> rope_inv_freq() const;
  Schedule resolve_schedule() const { return indexshare::resolve_schedule(n_layers, schedule); }
  void validate() const;  // throws Error naming the field
};

// Presets: deepseek-v3.2, glm-5, glm-5.2 (real shapes), tiny-deepseek, tiny-glm (small shapes
// with the same structure, sequences longer than top-k). Throws Error for an unknown name.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

}  // namespace indexshare
