#include "ref/config.h"

#include <cmath>

#include "ref/error.h"

namespace indexshare {

double ModelConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(double(qk_head_dim()));
  if (yarn) {
    const double m = ref::yarn_mscale(yarn_factor, yarn_mscale);
    s = s * m * m;
  }
  return s;
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  return yarn ? ref::yarn_inv_freq(int(qk_rope_head_dim), rope_theta, yarn_factor, yarn_original_seq_len,
                                   yarn_beta_fast, yarn_beta_slow)
              : ref::rope_inv_freq(int(qk_rope_head_dim), rope_theta);
}

void ModelConfig::validate() const {
  auto pos = [&](int64_t v, const char* f) {
    require(v >= 1, "model config '" + name + "': " + f + " must be >= 1, got " + std::to_string(v));
  };
  pos(n_layers, "n_layers"); pos(dim, "dim"); pos(n_heads, "n_heads"); pos(q_lora_rank, "q_lora_rank");
  pos(kv_lora_rank, "kv_lora_rank"); pos(qk_nope_head_dim, "qk_nope_head_dim");
  pos(qk_rope_head_dim, "qk_rope_head_dim"); pos(v_head_dim, "v_head_dim");
  pos(index_n_heads, "index_n_heads"); pos(index_head_dim, "index_head_dim"); pos(index_topk, "index_topk");
  require(qk_rope_head_dim % 2 == 0, "model config '" + name + "': qk_rope_head_dim must be even");
  require(qk_rope_head_dim <= index_head_dim,
          "model config '" + name + "': qk_rope_head_dim must be <= index_head_dim (indexer rope slice)");
  require((index_head_dim & (index_head_dim - 1)) == 0,
          "model config '" + name + "': index_head_dim must be a power of two (Hadamard)");
  (void)resolve_schedule();
}

namespace {

ModelConfig deepseek_v32() {
  ModelConfig c;
  c.name = "deepseek-v3.2";
  c.n_layers = 61; c.dim = 7168; c.vocab = 129280;
  c.n_heads = 128; c.q_lora_rank = 1536; c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128; c.qk_rope_head_dim = 64; c.v_head_dim = 128;
  c.index_n_heads = 64; c.index_head_dim = 128; c.index_topk = 2048;
  c.indexer_rope = ref::RopeLayout::half_split;  // fixed reference: "rope in indexer is not interleaved"
  c.rope_theta = 10000.0;
  c.yarn = true; c.yarn_factor = 40.0; c.yarn_original_seq_len = 4096;
  c.yarn_beta_fast = 32.0; c.yarn_beta_slow = 1.0; c.yarn_mscale = 1.0;
  c.rms_eps = 1e-6f; c.index_norm_eps = 1e-6f;
  c.n_routed_experts = 256; c.n_shared_experts = 1; c.n_activated_experts = 8;
  c.moe_inter_dim = 2048; c.first_k_dense = 3; c.dense_inter_dim = 18432;
  c.seq = 4096;
  return c;
}

ModelConfig glm5() {
  ModelConfig c;
  c.name = "glm-5";
  c.n_layers = 78; c.dim = 6144; c.vocab = 154880;
  c.n_heads = 64; c.q_lora_rank = 2048; c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 192; c.qk_rope_head_dim = 64; c.v_head_dim = 256;
  c.index_n_heads = 32; c.index_head_dim = 128; c.index_topk = 2048;
  c.indexer_rope = ref::RopeLayout::interleaved;  // indexer_rope_interleave: true
  c.rope_theta = 1e6; c.yarn = false;
  c.rms_eps = 1e-5f; c.index_norm_eps = 1e-6f;
  c.n_routed_experts = 256; c.n_shared_experts = 1; c.n_activated_experts = 8;
  c.moe_inter_dim = 2048; c.first_k_dense = 3; c.dense_inter_dim = 12288;
  c.seq = 4096;
  return c;
}

ModelConfig glm52() {
  ModelConfig c = glm5();
  c.name = "glm-5.2";
  c.rope_theta = 8e6;
  c.schedule.freq = 4;
  c.schedule.offset = 3;  // full layers 0, 1, 2, 6, ..., 74
  return c;
}

// Tiny configurations: every structural feature of the real ones (latent + rope keys, an
// indexer with rope on a slice, Hadamard, FP8), small enough for unit tests; the default
// sequence (64) is four times top-k (16), so the selection is really sparse.
ModelConfig tiny(const std::string& name, bool glm) {
  ModelConfig c = glm ? glm52() : deepseek_v32();
  c.name = name;
  c.n_layers = glm ? 8 : 4; c.dim = 64; c.vocab = 256;
  c.n_heads = 4; c.q_lora_rank = 32; c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16; c.qk_rope_head_dim = 8; c.v_head_dim = 16;
  c.index_n_heads = 4; c.index_head_dim = 32; c.index_topk = 16;
  c.yarn_original_seq_len = glm ? 4096 : 32;  // DeepSeek-style YaRN active at this size
  c.n_routed_experts = 8; c.n_activated_experts = 2; c.moe_inter_dim = 32; c.first_k_dense = 1;
  c.dense_inter_dim = 128;
  c.seq = 64;
  return c;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"deepseek-v3.2", "glm-5", "glm-5.2", "tiny-deepseek", "tiny-glm"};
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig c;
  if (name == "deepseek-v3.2") c = deepseek_v32();
  else if (name == "glm-5") c = glm5();
  else if (name == "glm-5.2") c = glm52();
  else if (name == "tiny-deepseek") c = tiny(name, false);
  else if (name == "tiny-glm") c = tiny(name, true);
  else throw Error("unknown model preset '" + name +
                   "' (expected deepseek-v3.2, glm-5, glm-5.2, tiny-deepseek or tiny-glm)");
  c.validate();
  return c;
}

}  // namespace indexshare
