// simd/stack.cc: the layer stack on the simd kernels, mirroring ref/stack.cc step for step.
#include "simd/simd.h"

#include "ref/topk.h"

namespace indexshare::simd {

std::vector<ref::StackLayerOutputs> run_stack(const Problem& p, const Schedule& schedule,
                                              const std::vector<ref::LayerInputs>& inputs, bool keep_logits) {
  schedule.validate();
  require(int(inputs.size()) == schedule.n_layers(),
          "stack: " + std::to_string(inputs.size()) + " layer inputs for a schedule of " +
              std::to_string(schedule.n_layers()) + " layers");
  std::vector<ref::StackLayerOutputs> out(inputs.size());
  const Tensor<int32_t>* current = nullptr;
  for (int l = 0; l < schedule.n_layers(); ++l) {
    const ref::LayerInputs& in = inputs[size_t(l)];
    ref::StackLayerOutputs& o = out[size_t(l)];
    o.layer = l;
    o.kind = schedule.kinds[size_t(l)];
    o.source = schedule.source(l);
    if (o.kind == LayerKind::full)
      require(in.has_indexer, "stack: Full layer " + std::to_string(l) + " has no indexer inputs");
    if (in.has_indexer) {
      if (!keep_logits && p.indexer == IndexerMode::fp8) {
        // Streaming: the [s_q, s_kv] logits are never materialised.
        o.own_topk = indexer_topk_fp8(in.index_q8, in.index_k8, in.index_k_scale, in.index_weights, in.ks, in.ke, p.index_topk);
      } else {
        Tensor<float> logits = p.indexer == IndexerMode::fp8
            ? indexer_logits_fp8(in.index_q8, in.index_k8, in.index_k_scale, in.index_weights, in.ks, in.ke)
            : indexer_logits_f32(in.index_q, in.index_k, in.index_k_scale, in.index_weights, in.ks, in.ke);
        o.own_topk = topk(logits, in.ks, in.ke, p.index_topk);
        if (keep_logits) o.logits = std::move(logits);
      }
    }
    if (o.kind == LayerKind::full) current = &o.own_topk;
    o.used_topk = *current;
    o.indices = ref::local_to_kv_rows(o.used_topk, in.ks);
    o.attn = sparse_attention(in.q, in.kv, o.indices, p.sm_scale(), p.d_v, nullptr, in.sink ? &*in.sink : nullptr);
  }
  return out;
}

}  // namespace indexshare::simd
