// indexshare: a toy DSA model at module level, to give stacks realistic cross-layer structure.
//
// An attention-only residual stack (no MoE, no embeddings beyond a random input):
//     x_l   = bf16(RMSNorm(h_l, attn_norm_l))                           (rms_eps of the config)
//     q_l   = mla_query(x_l)        kv_l = mla_kv(x_l) appended to layer l's latent cache
//     Full  : indexer_module(x_l, qr_l) -> keys appended to layer l's indexer cache,
//             logits over [0, pos] -> top-k positions -> current
//     Shared: the positions of the most recent Full layer (`current`); its own would-be top-k
//             is computed when it carries an indexer (own_indexer_on_shared) and never used
//     o_l   = sparse_attention(q_l, cache_l, positions) with the config's softmax scale
//     h_l+1 = bf16(h_l + mla_output(o_l))
// Per-layer weights are a shared base plus scaled per-layer noise (random_*_weights with the
// model's similarity), so the layers' top-k sets overlap because the weights do and because the
// residual stream carries the same tokens through every layer, as in real models.
//
// Prefill in chunks and decode: `forward` takes rows at positions [start, start + S) and the
// caches of positions [0, start); row t may use keys [0, start + t]. A whole prefill in one call
// equals the same prefill in chunks bit for bit, and decode with next_n query tokens is a chunk of
// next_n rows (row t sees keys <= context_len - next_n + t).
#pragma once

#include <string>
#include <vector>

#include "ref/attention.h"
#include "ref/config.h"
#include "ref/kernels.h"
#include "ref/module.h"
#include "ref/schedule.h"

namespace indexshare::ref {

struct ToyLayer {
  bool has_indexer = true;
  IndexerWeights indexer;   // empty without an indexer
  MlaWeights mla;
  Tensor<float> attn_norm;  // [dim]
};

struct ToyModel {
  ModelConfig cfg;
  Schedule schedule;
  IndexerVariant variant = IndexerVariant::deepseek_fp8;
  bool fp8_kv_roundtrip = false;
  std::vector<ToyLayer> layers;
};

// Seeded random weights: base streams "model.*", per-layer streams "layers.{l}.*", mixed with
// `similarity` in [0, 1]. Shared layers get an indexer only with own_indexer_on_shared.
ToyModel make_toy_model(const ModelConfig& cfg, const Schedule& schedule, uint64_t seed, float similarity,
                        IndexerVariant variant, bool own_indexer_on_shared, bool fp8_kv_roundtrip = false);

// Random input hidden states [S, dim] (bf16 values, N(0,1)-like) for positions [start, start + S).
Tensor<float> toy_hidden(const ModelConfig& cfg, uint64_t seed, int64_t start, int64_t S);

struct ToyCache {  // per layer: the latent KV rows and the indexer keys of positions [0, len)
  int64_t len = 0;
  std::vector<Tensor<bf16_t>> kv;       // [len, 1, d_qk]
  std::vector<IndexerKeys> index_keys;  // empty for layers without an indexer
};

struct ToyLayerTrace {
  Tensor<float> x;                 // [S, dim] normed input
  Tensor<float> qr;                // [S, q_lora] MlaQuery::qr (shared by MLA and the indexer)
  IndexerModuleOut indexer;        // empty without an indexer
  Tensor<float> logits;            // [S, len + S] own indexer logits (empty without an indexer)
  Tensor<int32_t> own_topk;        // [S, topk] own top-k (Full: used; Shared: would-be)
  Tensor<int32_t> used_topk;       // [S, topk] positions the attention used
  Tensor<bf16_t> q;                // [S, n_heads, d_qk]
  AttentionOut attn;               // over the cache including this chunk
  Tensor<float> out;               // [S, dim] mla_output
};

struct ToyForward {
  std::vector<ToyLayerTrace> layers;
  Tensor<float> h_out;             // [S, dim]
};

// One forward pass over S rows at positions [cache.len, cache.len + S); appends to the cache.
ToyForward forward(const ToyModel& m, ToyCache& cache, const Tensor<float>& h, const Kernels& k = {});

}  // namespace indexshare::ref
