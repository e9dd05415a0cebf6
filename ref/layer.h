// indexshare: one DSA layer at kernel level, from generated inputs to attention outputs.
//
//   indexer inputs -> indexer_logits -> topk (local positions) -> local_to_kv_rows
//                  -> sparse_attention (FlashMLA sparse prefill)
//
// Generated inputs (stream names are the golden tensor names, so every tensor has its own
// reproducible random stream under the problem's seed):
//   indexer.q       [s_q, H, D]   dist values rounded to bf16 (the Hadamard output is bf16),
//                                 then (fp8 mode) quantized per (t, h) with the problem's scale
//                                 rule, block D: codes plus q_scale [s_q, H]
//   indexer.k       [s_kv, D]     likewise, k_scale [s_kv] (bf16 mode: k_scale = 1)
//   indexer.weights [s_q, H]      f32: dist * H^-0.5 * q_scale * D^-0.5, left to right in f32
//                                 (the upstream `weights_proj(x) * H^-0.5 * q_scale * D^-0.5`)
//   indexer.ks/ke   [s_q]         0 and s_kv - s_q + t + 1: causal, the row sees its own key
//   attn.q          [s_q, h_q, d_qk]   bf16(dist)
//   attn.kv         [s_kv, 1, d_qk]    bf16(dist)
//   attn.sink       [h_q]              per the sink option: dist, +inf or -inf
#pragma once

#include <optional>
#include <string>

#include "ref/attention.h"
#include "ref/problem.h"
#include "ref/tensor.h"

namespace indexshare::ref {

struct LayerInputs {
  // Indexer, FP8 mode (codes) or bf16 mode (values in f32); the unused pair is empty.
  Tensor<e4m3_t> index_q8;       // [s_q, H, D]
  Tensor<e4m3_t> index_k8;       // [s_kv, D]
  Tensor<float> index_q;         // [s_q, H, D] (bf16 mode)
  Tensor<float> index_k;         // [s_kv, D]   (bf16 mode)
  Tensor<float> index_q_scale;   // [s_q, H]    (1 in bf16 mode)
  Tensor<float> index_k_scale;   // [s_kv]
  Tensor<float> index_weights;   // [s_q, H]
  Tensor<int32_t> ks, ke;        // [s_q]
  // Attention.
  Tensor<bf16_t> q;              // [s_q, h_q, d_qk]
  Tensor<bf16_t> kv;             // [s_kv, 1, d_qk]
  std::optional<Tensor<float>> sink;  // [h_q]
};

struct LayerOutputs {
  Tensor<float> logits;          // [s_q, s_kv]
  Tensor<int32_t> topk;          // [s_q, topk] local positions, -1 padded
  Tensor<int32_t> indices;       // [s_q, 1, topk] kv rows used by the attention
  AttentionOut attn;
};

// `prefix` selects the random streams ("layers.0." gives "layers.0.indexer.q", ...).
LayerInputs make_layer_inputs(const Problem& p, const std::string& prefix = "layers.0.");
LayerOutputs run_layer(const Problem& p, const LayerInputs& in);

// Generated tensor of `shape` from the stream `name` (values of p.dist times `scale`).
Tensor<float> generate(const Problem& p, const std::string& name, const Shape& shape, float scale = 1.0f);

}  // namespace indexshare::ref
