#include "ref/layer.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <numeric>

#include "ref/indexer.h"
#include "ref/numerics.h"
#include "ref/topk.h"

namespace indexshare::ref {

Tensor<float> layer_logits(const Problem& p, const LayerInputs& in, const Kernels& k) {
  require(in.has_indexer, "layer_logits: this layer has no indexer inputs");
  return p.indexer == IndexerMode::fp8
             ? k.logits_fp8(in.index_q8, in.index_k8, in.index_k_scale, in.index_weights, in.ks, in.ke)
             : k.logits_f32(in.index_q, in.index_k, in.index_k_scale, in.index_weights, in.ks, in.ke);
}

bool layer_topk_streams(const Problem& p, const Kernels& k) {
  return p.indexer == IndexerMode::fp8 && k.fused_topk_fp8 != nullptr;
}

Tensor<int32_t> layer_topk(const Problem& p, const LayerInputs& in, const Kernels& k) {
  require(in.has_indexer, "layer_topk: this layer has no indexer inputs");
  if (layer_topk_streams(p, k))
    return k.fused_topk_fp8(in.index_q8, in.index_k8, in.index_k_scale, in.index_weights, in.ks, in.ke, p.index_topk);
  return k.topk(layer_logits(p, in, k), in.ks, in.ke, p.index_topk);
}

AttentionOut layer_attention(const Problem& p, const LayerInputs& in, const Tensor<int32_t>& indices, const Kernels& k) {
  return k.sparse_attention(in.q, in.kv, indices, p.sm_scale(), p.d_v, nullptr, in.sink ? &*in.sink : nullptr);
}

LayerOutputs run_layer(const Problem& p, const LayerInputs& in) {
  LayerOutputs out;
  out.logits = layer_logits(p, in);
  out.topk = topk(out.logits, in.ks, in.ke, p.index_topk);
  out.indices = local_to_kv_rows(out.topk, in.ks);
  out.attn = layer_attention(p, in, out.indices);
  return out;
}

}  // namespace indexshare::ref
