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

// a * base + b * own, elementwise in f32 (a = sim, b = f32(sqrt(1 - sim^2))).
Tensor<float> mixed(const Problem& p, const std::string& name, int layer, const Shape& shape) {
  const float a = p.sim, b = float(std::sqrt(1.0 - double(p.sim) * double(p.sim)));
  Tensor<float> base = generate(p, "stack." + name, shape);
  const Tensor<float> own = generate(p, "layers." + std::to_string(layer) + "." + name, shape);
  for (int64_t i = 0; i < base.numel(); ++i) base[i] = a * base[i] + b * own[i];
  return base;
}

}  // namespace

LayerInputs make_layer_inputs(const Problem& p, int layer, bool with_indexer) {
  p.validate();
  const int64_t s_q = p.s_q, s_kv = p.s_kv, H = p.index_n_heads, D = p.index_head_dim;
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  LayerInputs in;
  in.has_indexer = with_indexer;
  // Causal bounds: query row t belongs to sequence i = t / seq_q, whose keys are the kv rows
  // [i * seq_kv, (i + 1) * seq_kv); it is position start + (t mod seq_q) of that sequence and sees
  // its keys [0, start + (t mod seq_q)].
  in.ks = Tensor<int32_t>({s_q});
  in.ke = Tensor<int32_t>({s_q});
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t seq = t / p.seq_q(), local = t % p.seq_q();
    in.ks[t] = int32_t(seq * p.seq_kv());
    in.ke[t] = int32_t(seq * p.seq_kv() + p.start_pos() + local + 1);
  }

  if (with_indexer) {
    // 1. Cross-layer mix of q, k and the raw head weights.
    Tensor<float> q = mixed(p, "indexer.q", layer, {s_q, H, D});
    Tensor<float> k = mixed(p, "indexer.k", layer, {s_kv, D});
    Tensor<float> w = mixed(p, "indexer.weights", layer, {s_q, H});
    // 2. Recency and sink dims (see the header).
    const float g = float(2.0 * std::pow(double(D), 0.25));
    if (D >= 2 && (p.recency > 0 || p.sinks > 0)) {
      for (int64_t t = 0; t < s_q; ++t)
        for (int64_t h = 0; h < H; ++h) {
          const float sg = w.at(t, h) < 0 ? -g : g;
          q.at(t, h, D - 1) = sg;
          q.at(t, h, D - 2) = sg;
        }
      for (int64_t s = 0; s < s_kv; ++s) {
        k.at(s, D - 1) = p.recency * g * float(s + 1) / float(s_kv);
        k.at(s, D - 2) = s < p.sinks ? g : 0.0f;
      }
    }
    // 3. bf16, then FP8 codes with one scale per head vector (fp8 mode).
    for (float& v : q.data) v = round_bf16(v);
    for (float& v : k.data) v = round_bf16(v);
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
    // 4. Weights: weights_proj(x) * H^-0.5 * q_scale * D^-0.5, left to right in f32.
    const float h_scale = float(1.0 / std::sqrt(double(H))), d_scale = float(1.0 / std::sqrt(double(D)));
    in.index_weights = std::move(w);
    for (int64_t i = 0; i < s_q * H; ++i)
      in.index_weights[i] = in.index_weights[i] * h_scale * in.index_q_scale[i] * d_scale;
  }

  // Attention inputs: the layer's own streams.
  in.q = to_bf16(generate(p, prefix + "attn.q", {s_q, p.h_q, p.d_qk}));
  in.kv = to_bf16(generate(p, prefix + "attn.kv", {s_kv, 1, p.d_qk}));
  if (p.sink != SinkMode::none) {
    const float inf = std::numeric_limits<float>::infinity();
    if (p.sink == SinkMode::random) in.sink = generate(p, prefix + "attn.sink", {p.h_q});
    if (p.sink == SinkMode::pinf) in.sink = Tensor<float>({p.h_q}, inf);
    if (p.sink == SinkMode::ninf) in.sink = Tensor<float>({p.h_q}, -inf);
  }
  return in;
}

Tensor<float> layer_logits(const Problem& p, const LayerInputs& in) {
  require(in.has_indexer, "layer_logits: this layer has no indexer inputs");
  return p.indexer == IndexerMode::fp8
             ? indexer_logits_fp8(in.index_q8, in.index_k8, in.index_k_scale, in.index_weights, in.ks, in.ke)
             : indexer_logits_f32(in.index_q, in.index_k, in.index_k_scale, in.index_weights, in.ks, in.ke);
}

AttentionOut layer_attention(const Problem& p, const LayerInputs& in, const Tensor<int32_t>& indices) {
  return sparse_attention(in.q, in.kv, indices, p.sm_scale(), p.d_v, nullptr, in.sink ? &*in.sink : nullptr);
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
