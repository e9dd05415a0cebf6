// indexshare: a Hunyuan HY V4 DSA layer and stack at kernel level. The contract is in layer.h.
#include "ref/hyv4/layer.h"

#include <algorithm>
#include <cmath>

#include "ref/draw.h"
#include "ref/error.h"
#include "ref/indexer.h"
#include "ref/module_ops.h"
#include "ref/numerics.h"

namespace indexshare::ref::hyv4 {

std::string rope_slice_name(RopeSlice s) { return s == RopeSlice::trailing ? "trailing" : "leading"; }

RopeSlice parse_rope_slice(const std::string& name) {
  if (name == "trailing") return RopeSlice::trailing;
  if (name == "leading") return RopeSlice::leading;
  throw Error("hyv4 rope slice: unknown '" + name + "' (known: trailing, leading)");
}

void Config::validate() const {
  auto at_least_1 = [](int64_t v, const char* field) {
    require(v >= 1, std::string("hyv4 config ") + field + ": must be >= 1, got " + std::to_string(v));
  };
  require(s_q >= 1 && s_q <= s_kv, "hyv4 config s_q: need 1 <= s_q <= s_kv, got s_q " + std::to_string(s_q) +
                                       ", s_kv " + std::to_string(s_kv));
  at_least_1(heads, "heads");
  at_least_1(dim, "dim");
  at_least_1(index_topk, "index_topk");
  at_least_1(h_q, "h_q");
  at_least_1(kv_lora, "kv_lora");
  at_least_1(v_dim, "v_dim");
  require(rope >= 2 && rope % 2 == 0 && rope <= dim,
          "hyv4 config rope: must be even with 2 <= rope <= dim = " + std::to_string(dim) + ", got " +
              std::to_string(rope));
  require(attn_rope >= 0, "hyv4 config attn_rope: must be >= 0, got " + std::to_string(attn_rope));
  require(std::isfinite(norm_eps) && norm_eps >= 0.0f, "hyv4 config norm_eps: must be finite and >= 0");
  require(std::isfinite(rope_theta) && rope_theta > 0.0, "hyv4 config rope_theta: must be finite and > 0");
  require(std::isfinite(sm_scale) && sm_scale > 0.0f, "hyv4 config sm_scale: must be finite and > 0");
}

Config hy_v4_config(int64_t s_kv) {
  Config c;
  c.s_q = c.s_kv = s_kv;
  c.heads = 16, c.dim = 128, c.rope = 64, c.index_topk = 2048;
  c.h_q = 32, c.kv_lora = 512, c.attn_rope = 64, c.v_dim = 256;
  c.sm_scale = 0.0625f;
  return c;
}

namespace {
Tensor<float> draw(const Config& c, const std::string& name, Shape shape, int64_t first, float scale,
                   const Kernels& kern) {
  return draw_rows(kern, c.dist, c.seed, name, std::move(shape), first, scale);
}

Tensor<float> bf16_values(Tensor<float> t) {
  round_bf16_inplace(t);
  return t;
}

Tensor<bf16_t> draw_bf16(const Config& c, const std::string& name, Shape shape, int64_t first, const Kernels& kern) {
  return draw_rows_bf16(kern, c.dist, c.seed, name, std::move(shape), first);
}

float inv_sqrt_f32(int64_t n) { return float(1.0 / std::sqrt(double(n))); }
}  // namespace

LayerInputs make_layer_inputs(const Config& c, int layer, bool with_indexer, const Kernels& kern) {
  c.validate();
  const std::string pre = "layers." + std::to_string(layer) + ".";
  const int64_t first = c.s_kv - c.s_q;
  LayerInputs in;
  in.has_indexer = with_indexer;
  if (with_indexer) {
    in.q = bf16_values(draw(c, pre + "indexer.q", {c.s_q, c.heads, c.dim}, first, 1.0f, kern));
    in.k = bf16_values(draw(c, pre + "indexer.k", {c.s_kv, c.dim}, 0, 1.0f, kern));
    in.k_norm_w = draw(c, pre + "indexer.k_norm_w", {c.dim}, 0, 0.1f, kern);
    for (int64_t i = 0; i < c.dim; ++i) in.k_norm_w[i] = 1.0f + in.k_norm_w[i];
    in.k_norm_b = draw(c, pre + "indexer.k_norm_b", {c.dim}, 0, 0.1f, kern);
    in.weights = draw(c, pre + "indexer.weights", {c.s_q, c.heads}, first, 1.0f, kern);
  }
  in.attn_q = draw_bf16(c, pre + "attn.q", {c.s_q, c.h_q, c.d_qk()}, first, kern);
  in.attn_kv = draw_bf16(c, pre + "attn.kv", {c.s_kv, 1, c.d_qk()}, 0, kern);
  in.w_uv = bf16_values(draw(c, pre + "attn.w_uv", {c.h_q, c.v_dim, c.kv_lora}, 0, inv_sqrt_f32(c.kv_lora), kern));
  in.gate = bf16_values(draw(c, pre + "attn.gate", {c.s_q, c.h_q, c.v_dim}, first, 1.0f, kern));
  if (c.sink) in.sink = draw(c, pre + "attn.sink", {c.h_q}, 0, 1.0f, kern);
  return in;
}

IndexerParams indexer_params(const Config& c) {
  IndexerParams p;
  p.rope = c.rope, p.theta = c.rope_theta, p.slice = c.slice, p.eps = c.norm_eps, p.index_topk = c.index_topk;
  return p;
}

Tensor<float> indexer_weights(const Tensor<float>& raw, int64_t head_dim) {
  require(raw.rank() == 2, "hyv4 indexer weights: expected [s_q, H], got " + shape_str(raw.shape));
  require(head_dim >= 1, "hyv4 indexer weights: head_dim must be >= 1, got " + std::to_string(head_dim));
  const float h_scale = inv_sqrt_f32(raw.dim(1)), d_scale = inv_sqrt_f32(head_dim);
  Tensor<float> w = raw;
  for (int64_t i = 0; i < w.numel(); ++i) w[i] = (w[i] * h_scale) * d_scale;  // two f32 products, in this order
  return w;
}

void rope_slice(Tensor<float>& x, int64_t first_pos, const IndexerParams& p) {
  require(x.rank() >= 2, "hyv4 rope: expected [rows, ..., D], got " + shape_str(x.shape));
  const int64_t D = x.shape.back(), rows = x.dim(0), per_row = x.numel() / std::max<int64_t>(rows, 1);
  require(p.rope >= 2 && p.rope % 2 == 0 && p.rope <= D,
          "hyv4 rope: rope must be even with 2 <= rope <= D = " + std::to_string(D) + ", got " + std::to_string(p.rope));
  const std::vector<float> inv_freq = rope_inv_freq(int(p.rope), p.theta);
  const int64_t off = p.slice == RopeSlice::trailing ? D - p.rope : 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < per_row / D; ++h)
      apply_rope(x.ptr() + r * per_row + h * D + off, int(p.rope), first_pos + r, inv_freq, RopeLayout::interleaved);
}

IndexerOutputs indexer_front(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& k_norm_w,
                             const Tensor<float>& k_norm_b, const Tensor<float>& weights_raw, const IndexerParams& p) {
  require(q.rank() == 3, "hyv4 indexer q: expected [s_q, H, D], got " + shape_str(q.shape));
  require(k.rank() == 2, "hyv4 indexer k: expected [s_kv, D], got " + shape_str(k.shape));
  const int64_t s_q = q.dim(0), H = q.dim(1), D = q.dim(2), s_kv = k.dim(0);
  require(k.dim(1) == D, "hyv4 indexer k: head dim " + std::to_string(k.dim(1)) + " differs from q's " +
                             std::to_string(D));
  require(s_q <= s_kv, "hyv4 indexer: " + std::to_string(s_q) + " query rows but only " + std::to_string(s_kv) +
                           " keys (the queries are the last keys' positions)");
  require_shape(k_norm_w, {D}, "hyv4 indexer k_norm_w");
  require_shape(k_norm_b, {D}, "hyv4 indexer k_norm_b");
  require_shape(weights_raw, {s_q, H}, "hyv4 indexer weights");
  require(p.index_topk >= 1, "hyv4 indexer index_topk: must be >= 1, got " + std::to_string(p.index_topk));
  IndexerOutputs o;
  o.k_norm = Tensor<float>({s_kv, D});
  for (int64_t s = 0; s < s_kv; ++s)
    layer_norm(k.ptr() + s * D, o.k_norm.ptr() + s * D, D, k_norm_w.ptr(), k_norm_b.ptr(), p.eps);
  const int64_t first = s_kv - s_q;
  o.q_rope = q;
  rope_slice(o.q_rope, first, p);
  o.k_rope = o.k_norm;
  rope_slice(o.k_rope, 0, p);
  o.weights = indexer_weights(weights_raw, D);
  o.ks = Tensor<int32_t>({s_q}, 0);
  o.ke = Tensor<int32_t>({s_q});
  for (int64_t t = 0; t < s_q; ++t) o.ke[t] = int32_t(first + t + 1);
  return o;
}

IndexerOutputs run_indexer(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& k_norm_w,
                           const Tensor<float>& k_norm_b, const Tensor<float>& weights_raw, const IndexerParams& p,
                           const Kernels& kern) {
  IndexerOutputs o = indexer_front(q, k, k_norm_w, k_norm_b, weights_raw, p);
  const Tensor<float> ones({k.dim(0)}, 1.0f);
  o.scores = kern.logits_f32(o.q_rope, o.k_rope, ones, o.weights, o.ks, o.ke);
  o.indices = kern.topk(o.scores, o.ks, o.ke, p.index_topk);
  return o;
}

AttentionOutputs gated_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                 const Tensor<float>& sink, float sm_scale, int64_t d_v, const Tensor<float>* w_uv,
                                 const Tensor<float>& gate, const Kernels& kern) {
  require(q.rank() == 3, "hyv4 attention q: expected [s_q, h_q, d_qk], got " + shape_str(q.shape));
  const int64_t s_q = q.dim(0), h_q = q.dim(1);
  require(indices.rank() == 2 && indices.dim(0) == s_q,
          "hyv4 attention indices: expected [s_q=" + std::to_string(s_q) + ", topk], got " + shape_str(indices.shape));
  const int64_t v = w_uv ? (w_uv->rank() == 3 ? w_uv->dim(1) : -1) : d_v;
  if (w_uv) require_shape(*w_uv, {h_q, v, d_v}, "hyv4 attention w_uv");
  require_shape(gate, {s_q, h_q, v}, "hyv4 attention gate");
  Tensor<int32_t> idx = indices;
  idx.shape = {s_q, 1, indices.dim(1)};  // FlashMLA's [s_q, 1, topk]
  AttentionOutputs o;
  // The sink is an unscaled logit, which is what the kernel's attn_sink is (layer.h): unchanged.
  if (sink.numel()) require_shape(sink, {h_q}, "hyv4 attention sink");
  o.attn = kern.sparse_attention(q, kv, idx, sm_scale, d_v, nullptr, sink.numel() ? &sink : nullptr);
  if (w_uv) {
    const HeadWeights hw{w_uv->ptr(), h_q, v, d_v, v * d_v, d_v, 1};
    o.o_v = kern.head_linear(o.attn.out, hw);
  } else {
    o.o_v = o.attn.out;
  }
  o.gated = Tensor<float>(o.o_v.shape);
  o.gated_bf16 = Tensor<bf16_t>(o.o_v.shape);
  for (int64_t i = 0; i < o.gated.numel(); ++i) {
    const float sig = float(1.0 / (1.0 + exp_portable(-double(gate[i]))));
    o.gated[i] = o.o_v[i] * sig;
    o.gated_bf16[i] = f32_to_bf16(o.gated[i]);
  }
  return o;
}

namespace {
AttentionOutputs layer_attention(const Config& c, const LayerInputs& in, const Tensor<int32_t>& indices,
                                 const Kernels& kern) {
  return gated_attention(in.attn_q, in.attn_kv, indices, in.sink, c.sm_scale, c.kv_lora, &in.w_uv, in.gate, kern);
}
}  // namespace

LayerOutputs run_layer(const Config& c, const LayerInputs& in, int layer, const Kernels& kern) {
  c.validate();
  require(in.has_indexer, "hyv4 layer: this layer has no indexer inputs (a Shared layer)");
  LayerOutputs o;
  o.layer = o.source = layer;
  o.indexer = run_indexer(in.q, in.k, in.k_norm_w, in.k_norm_b, in.weights, indexer_params(c), kern);
  o.indices = o.indexer->indices;
  o.attn = layer_attention(c, in, o.indices, kern);
  return o;
}

std::vector<LayerOutputs> run_stack(const Config& c, const Schedule& s, const Kernels& kern) {
  c.validate();
  s.validate();
  std::vector<LayerOutputs> out;
  for (int l = 0; l < s.n_layers(); ++l) {
    const bool full = s.is_full(l);
    const LayerInputs in = make_layer_inputs(c, l, full, kern);
    if (full) {
      out.push_back(run_layer(c, in, l, kern));
      continue;
    }
    LayerOutputs o;
    o.layer = l;
    o.full = false;
    o.source = s.source(l);
    o.indices = out[size_t(o.source)].indices;
    o.attn = layer_attention(c, in, o.indices, kern);
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace indexshare::ref::hyv4
