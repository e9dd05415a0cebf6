#include "ref/layer.h"

#include <cmath>
#include <limits>

#include "ref/indexer.h"
#include "ref/numerics.h"
#include "ref/topk.h"

namespace indexshare::ref {

Tensor<float> generate(const Problem& p, const std::string& name, const Shape& shape, float scale) {
  Tensor<float> t(shape);
  fill(t.ptr(), t.numel(), p.dist, scale, p.seed, stream_tag(name));
  return t;
}

namespace {
Tensor<bf16_t> to_bf16(const Tensor<float>& x) {
  Tensor<bf16_t> y(x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}
void round_to_bf16(Tensor<float>& x) {
  for (float& v : x.data) v = round_bf16(v);
}
}  // namespace

LayerInputs make_layer_inputs(const Problem& p, const std::string& prefix) {
  p.validate();
  const int64_t s_q = p.s_q, s_kv = p.s_kv, H = p.index_n_heads, D = p.index_head_dim;
  LayerInputs in;
  // Indexer q and k: bf16 values, then FP8 codes with one scale per head vector.
  Tensor<float> q = generate(p, prefix + "indexer.q", {s_q, H, D});
  Tensor<float> k = generate(p, prefix + "indexer.k", {s_kv, D});
  round_to_bf16(q);
  round_to_bf16(k);
  if (p.indexer == IndexerMode::fp8) {
    Quantized qq = quantize(q, int(D), p.scale, prefix + "indexer.q");
    Quantized kq = quantize(k, int(D), p.scale, prefix + "indexer.k");
    in.index_q8 = std::move(qq.codes);
    in.index_k8 = std::move(kq.codes);
    in.index_q_scale = Tensor<float>({s_q, H});
    in.index_q_scale.data = std::move(qq.scales.data);
    in.index_k_scale = Tensor<float>({s_kv});
    in.index_k_scale.data = std::move(kq.scales.data);
  } else {
    in.index_q = std::move(q);
    in.index_k = std::move(k);
    in.index_q_scale = Tensor<float>({s_q, H}, 1.0f);
    in.index_k_scale = Tensor<float>({s_kv}, 1.0f);
  }
  // Weights: weights_proj(x) * H^-0.5 * q_scale * D^-0.5, evaluated left to right in f32.
  const float h_scale = float(1.0 / std::sqrt(double(H))), d_scale = float(1.0 / std::sqrt(double(D)));
  in.index_weights = generate(p, prefix + "indexer.weights", {s_q, H});
  for (int64_t i = 0; i < s_q * H; ++i)
    in.index_weights[i] = in.index_weights[i] * h_scale * in.index_q_scale[i] * d_scale;
  // Causal bounds: query row t is position start + t and sees keys [0, start + t].
  in.ks = Tensor<int32_t>({s_q}, 0);
  in.ke = Tensor<int32_t>({s_q});
  for (int64_t t = 0; t < s_q; ++t) in.ke[t] = int32_t(p.start_pos() + t + 1);
  // Attention inputs.
  in.q = to_bf16(generate(p, prefix + "attn.q", {s_q, p.h_q, p.d_qk}));
  in.kv = to_bf16(generate(p, prefix + "attn.kv", {s_kv, 1, p.d_qk}));
  if (p.sink != SinkMode::none) {
    Tensor<float> sink({p.h_q});
    if (p.sink == SinkMode::random) sink = generate(p, prefix + "attn.sink", {p.h_q});
    const float inf = std::numeric_limits<float>::infinity();
    if (p.sink == SinkMode::pinf) sink = Tensor<float>({p.h_q}, inf);
    if (p.sink == SinkMode::ninf) sink = Tensor<float>({p.h_q}, -inf);
    in.sink = std::move(sink);
  }
  return in;
}

LayerOutputs run_layer(const Problem& p, const LayerInputs& in) {
  LayerOutputs out;
  out.logits = p.indexer == IndexerMode::fp8
                   ? indexer_logits_fp8(in.index_q8, in.index_k8, in.index_k_scale, in.index_weights, in.ks, in.ke)
                   : indexer_logits_f32(in.index_q, in.index_k, in.index_k_scale, in.index_weights, in.ks, in.ke);
  out.topk = topk(out.logits, in.ks, in.ke, p.index_topk);
  out.indices = local_to_kv_rows(out.topk, in.ks);
  out.attn = sparse_attention(in.q, in.kv, out.indices, p.sm_scale(), p.d_v, nullptr,
                              in.sink ? &*in.sink : nullptr);
  return out;
}

}  // namespace indexshare::ref
