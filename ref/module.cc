#include "ref/module.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ref/indexer.h"
#include "ref/module_ops.h"
#include "ref/rng.h"

namespace indexshare::ref {

namespace {

// f32(n^-0.5) from IEEE-rounded operations only.
float inv_sqrt_f32(int64_t n) { return float(1.0 / std::sqrt(double(n))); }

// x must be [S, cols]; returns S.
int64_t require_rows(const Tensor<float>& x, int64_t cols, const std::string& what) {
  require(x.rank() == 2, what + ": expected rank 2 [S, " + std::to_string(cols) + "], got " + shape_str(x.shape));
  require_shape(x, {x.dim(0), cols}, what);
  return x.dim(0);
}

void require_start_pos(int64_t start_pos, const std::string& fn) {
  require(start_pos >= 0, fn + ": start_pos must be >= 0, got " + std::to_string(start_pos));
}

// ---- random weights ----

struct Mixer {
  uint64_t seed;
  std::string prefix, base_prefix;
  float a, b;

  // a * B + b * E over the named streams (see the header). E is drawn a block at a time (a slice
  // of its stream, the same values as a whole fill), so only B takes the tensor's memory.
  Tensor<float> mix(const std::string& name, const Shape& shape) const {
    Tensor<float> base(shape);
    const int64_t n = base.numel();
    fill(base.ptr(), n, Dist::normal, 1.0f, seed, stream_tag(base_prefix + name));
    constexpr int64_t kBlock = 64 * kChunk;
    std::vector<float> own(static_cast<size_t>(std::min(n, kBlock)));
    for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
      const int64_t len = std::min(kBlock, n - b0);
      fill_range(own.data(), b0, len, Dist::normal, 1.0f, seed, stream_tag(prefix + name));
      for (int64_t i = 0; i < len; ++i) {
        const float ab = a * base[b0 + i], be = b * own[size_t(i)];
        base[b0 + i] = ab + be;
      }
    }
    return base;
  }
  // Linear weight [out, in]: bf16(f32(in^-0.5) * mix).
  Tensor<float> linear(const std::string& name, int64_t out, int64_t in) const {
    Tensor<float> w = mix(name, {out, in});
    const float s = inv_sqrt_f32(in);
    for (float& v : w.data) v = round_bf16(s * v);
    return w;
  }
  // Norm weight [n]: bf16(1 + 0.1f * mix).
  Tensor<float> norm_weight(const std::string& name, int64_t n) const {
    Tensor<float> w = mix(name, {n});
    for (float& v : w.data) {
      const float d = 0.1f * v;
      v = round_bf16(1.0f + d);
    }
    return w;
  }
  // Norm bias [n]: bf16(0.1f * mix).
  Tensor<float> norm_bias(const std::string& name, int64_t n) const {
    Tensor<float> w = mix(name, {n});
    for (float& v : w.data) v = round_bf16(0.1f * v);
    return w;
  }
};

Mixer make_mixer(const ModelConfig& cfg, uint64_t seed, const std::string& prefix, float similarity,
                 const std::string& base_prefix, const std::string& fn) {
  require(similarity >= 0.0f && similarity <= 1.0f,  // false for NaN
          fn + ": similarity must be in [0, 1], got " + std::to_string(similarity));
  cfg.validate();
  const float b = float(std::sqrt(1.0 - double(similarity) * double(similarity)));
  return Mixer{seed, prefix, base_prefix, similarity, b};
}

// Rope on dims [off, off + rope) of each of `n` vectors of length `stride` in p (vector i at
// position pos_of(i)), f32 as apply_rope.
template <typename PosOf>
void rope_slices(float* p, int64_t n, int64_t stride, int64_t off, int64_t rope, const std::vector<float>& inv,
                 RopeLayout layout, PosOf pos_of) {
  for (int64_t i = 0; i < n; ++i) apply_rope(p + i * stride + off, int(rope), pos_of(i), inv, layout);
}

}  // namespace

// ---- Weights --------------------------------------------------------------------------------

void check_indexer_weights(const ModelConfig& cfg, const IndexerWeights& w) {
  const int64_t H = cfg.index_n_heads, D = cfg.index_head_dim;
  require_shape(w.wq_b, {H * D, cfg.q_lora_rank}, "indexer wq_b");
  require_shape(w.wk, {D, cfg.dim}, "indexer wk");
  require_shape(w.k_norm_w, {D}, "indexer k_norm_w");
  require_shape(w.k_norm_b, {D}, "indexer k_norm_b");
  require_shape(w.weights_proj, {H, cfg.dim}, "indexer weights_proj");
}

void check_mla_weights(const ModelConfig& cfg, const MlaWeights& w) {
  const int64_t nh = cfg.n_heads, nope = cfg.qk_nope_head_dim, rope = cfg.qk_rope_head_dim,
                v = cfg.v_head_dim, kvl = cfg.kv_lora_rank;
  require_shape(w.wq_a, {cfg.q_lora_rank, cfg.dim}, "mla wq_a");
  require_shape(w.q_norm, {cfg.q_lora_rank}, "mla q_norm");
  require_shape(w.wq_b, {nh * (nope + rope), cfg.q_lora_rank}, "mla wq_b");
  require_shape(w.wkv_a, {kvl + rope, cfg.dim}, "mla wkv_a");
  require_shape(w.kv_norm, {kvl}, "mla kv_norm");
  require_shape(w.wkv_b, {nh * (nope + v), kvl}, "mla wkv_b");
  require_shape(w.wo, {cfg.dim, nh * v}, "mla wo");
}

IndexerWeights random_indexer_weights(const ModelConfig& cfg, uint64_t seed, const std::string& prefix,
                                      float similarity, const std::string& base_prefix) {
  const Mixer m = make_mixer(cfg, seed, prefix, similarity, base_prefix, "random_indexer_weights");
  const int64_t H = cfg.index_n_heads, D = cfg.index_head_dim;
  IndexerWeights w;
  w.wq_b = m.linear("indexer.wq_b", H * D, cfg.q_lora_rank);
  w.wk = m.linear("indexer.wk", D, cfg.dim);
  w.k_norm_w = m.norm_weight("indexer.k_norm_w", D);
  w.k_norm_b = m.norm_bias("indexer.k_norm_b", D);
  w.weights_proj = m.linear("indexer.weights_proj", H, cfg.dim);
  return w;
}

MlaWeights random_mla_weights(const ModelConfig& cfg, uint64_t seed, const std::string& prefix, float similarity,
                              const std::string& base_prefix) {
  const Mixer m = make_mixer(cfg, seed, prefix, similarity, base_prefix, "random_mla_weights");
  const int64_t nh = cfg.n_heads, nope = cfg.qk_nope_head_dim, rope = cfg.qk_rope_head_dim,
                v = cfg.v_head_dim, kvl = cfg.kv_lora_rank;
  MlaWeights w;
  w.wq_a = m.linear("mla.wq_a", cfg.q_lora_rank, cfg.dim);
  w.q_norm = m.norm_weight("mla.q_norm", cfg.q_lora_rank);
  w.wq_b = m.linear("mla.wq_b", nh * (nope + rope), cfg.q_lora_rank);
  w.wkv_a = m.linear("mla.wkv_a", kvl + rope, cfg.dim);
  w.kv_norm = m.norm_weight("mla.kv_norm", kvl);
  w.wkv_b = m.linear("mla.wkv_b", nh * (nope + v), kvl);
  w.wo = m.linear("mla.wo", cfg.dim, nh * v);
  return w;
}

// ---- Indexer --------------------------------------------------------------------------------

std::string indexer_variant_name(IndexerVariant v) {
  switch (v) {
    case IndexerVariant::deepseek_fp8: return "deepseek_fp8";
    case IndexerVariant::hf_bf16: return "hf_bf16";
  }
  return "?";
}

IndexerVariant parse_indexer_variant(const std::string& name) {
  for (IndexerVariant v : {IndexerVariant::deepseek_fp8, IndexerVariant::hf_bf16})
    if (indexer_variant_name(v) == name) return v;
  throw Error("unknown indexer variant '" + name + "' (expected deepseek_fp8 or hf_bf16)");
}

IndexerModuleOut indexer_module(const ModelConfig& cfg, const IndexerWeights& w, const Tensor<float>& x,
                                const Tensor<float>& qr, int64_t start_pos, IndexerVariant v,
                                LinearFn linear_fn) {
  const int64_t H = cfg.index_n_heads, D = cfg.index_head_dim, rope = cfg.qk_rope_head_dim;
  const int64_t S = require_rows(x, cfg.dim, "indexer_module x");
  require_shape(qr, {S, cfg.q_lora_rank}, "indexer_module qr");
  check_indexer_weights(cfg, w);
  require(rope <= D, "indexer_module: rope width " + std::to_string(rope) + " exceeds index_head_dim " +
                         std::to_string(D));
  require_start_pos(start_pos, "indexer_module");
  const std::vector<float> inv = cfg.rope_inv_freq();
  IndexerModuleOut o;

  // 1-2. q: projection, RoPE on the leading pe slice of each head, bf16.
  o.q_proj = linear_fn(qr, w.wq_b);
  round_bf16_inplace(o.q_proj);
  o.q_proj.shape = {S, H, D};
  o.q_rope = o.q_proj;
  rope_slices(o.q_rope.ptr(), S * H, D, 0, rope, inv, cfg.indexer_rope,
              [&](int64_t i) { return start_pos + i / H; });
  round_bf16_inplace(o.q_rope);

  // 3. k: projection, LayerNorm (bf16), RoPE on the leading pe slice, bf16.
  o.k_proj = linear_fn(x, w.wk);
  round_bf16_inplace(o.k_proj);
  o.k_norm = Tensor<float>({S, D});
  for (int64_t t = 0; t < S; ++t)
    layer_norm(o.k_proj.ptr() + t * D, o.k_norm.ptr() + t * D, D, w.k_norm_w.ptr(), w.k_norm_b.ptr(),
               cfg.index_norm_eps);
  round_bf16_inplace(o.k_norm);
  o.k_rope = o.k_norm;
  rope_slices(o.k_rope.ptr(), S, D, 0, rope, inv, cfg.indexer_rope, [&](int64_t i) { return start_pos + i; });
  round_bf16_inplace(o.k_rope);

  // 6 (first half). wp = weights_proj(x.float()) in f32, times f32(H^-0.5).
  const Tensor<float> wp = linear_fn(x, w.weights_proj);
  const float h_scale = inv_sqrt_f32(H), d_scale = inv_sqrt_f32(D);

  if (v == IndexerVariant::deepseek_fp8) {
    // 4. Hadamard rotation over all D dims, then bf16.
    o.q_hadamard = o.q_rope;
    for (int64_t i = 0; i < S * H; ++i) hadamard_transform(o.q_hadamard.ptr() + i * D, int(D));
    round_bf16_inplace(o.q_hadamard);
    o.k_hadamard = o.k_rope;
    for (int64_t t = 0; t < S; ++t) hadamard_transform(o.k_hadamard.ptr() + t * D, int(D));
    round_bf16_inplace(o.k_hadamard);
    // 5. act_quant, one block per head vector.
    Quantized qq = quantize(o.q_hadamard, int(D), cfg.index_scale_rule, "indexer_module q");
    Quantized kq = quantize(o.k_hadamard, int(D), cfg.index_scale_rule, "indexer_module k");
    o.q8 = std::move(qq.codes);
    o.k8 = std::move(kq.codes);
    o.q_scale = std::move(qq.scales);
    o.q_scale.shape = {S, H};
    o.k_scale = std::move(kq.scales);
    o.k_scale.shape = {S};
    // 6. weights = ((wp * H^-0.5) * q_scale) * D^-0.5, f32 left to right.
    o.weights = Tensor<float>({S, H});
    for (int64_t i = 0; i < S * H; ++i) {
      const float a = wp[i] * h_scale;
      const float b = a * o.q_scale[i];
      o.weights[i] = b * d_scale;
    }
    o.q = o.q_hadamard;
    o.k = o.k_hadamard;
  } else {
    o.q_scale = Tensor<float>({S, H}, 1.0f);
    o.k_scale = Tensor<float>({S}, 1.0f);
    // 6'. weights = (wp * H^-0.5) * D^-0.5 (HF's D^-0.5 on the dot product, folded in).
    o.weights = Tensor<float>({S, H});
    for (int64_t i = 0; i < S * H; ++i) {
      const float a = wp[i] * h_scale;
      o.weights[i] = a * d_scale;
    }
    o.q = o.q_rope;
    o.k = o.k_rope;
  }
  return o;
}

IndexerKeys indexer_keys(const IndexerModuleOut& out) { return IndexerKeys{out.k8, out.k, out.k_scale}; }

IndexerKeys concat_keys(const IndexerKeys& earlier, const IndexerKeys& later) {
  return IndexerKeys{concat_rows(earlier.k8, later.k8), concat_rows(earlier.k, later.k),
                     concat_rows(earlier.k_scale, later.k_scale)};
}

Tensor<float> indexer_module_logits(const IndexerModuleOut& queries, const IndexerKeys& keys, IndexerVariant v,
                                    const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, const Kernels& k) {
  if (v == IndexerVariant::deepseek_fp8) {
    require(queries.q8.rank() == 3 && keys.k8.rank() == 2,
            "indexer_module_logits: deepseek_fp8 needs q8 [S, H, D] and k8 [s_kv, D], got q8 " +
                shape_str(queries.q8.shape) + " and k8 " + shape_str(keys.k8.shape) +
                " (an hf_bf16 output has no FP8 codes)");
    return k.logits_fp8(queries.q8, keys.k8, keys.k_scale, queries.weights, ks, ke);
  }
  return k.logits_f32(queries.q, keys.k, keys.k_scale, queries.weights, ks, ke);
}

Tensor<float> indexer_module_logits(const IndexerModuleOut& out, IndexerVariant v, const Tensor<int32_t>& ks,
                                    const Tensor<int32_t>& ke, const Kernels& k) {
  return indexer_module_logits(out, indexer_keys(out), v, ks, ke, k);
}

// ---- MLA ------------------------------------------------------------------------------------

MlaQuery mla_query(const ModelConfig& cfg, const MlaWeights& w, const Tensor<float>& x, int64_t start_pos,
                   LinearFn linear_fn, HeadLinearFn head_fn) {
  const int64_t nh = cfg.n_heads, nope = cfg.qk_nope_head_dim, rope = cfg.qk_rope_head_dim,
                v = cfg.v_head_dim, kvl = cfg.kv_lora_rank, qlr = cfg.q_lora_rank;
  const int64_t S = require_rows(x, cfg.dim, "mla_query x");
  check_mla_weights(cfg, w);
  require_start_pos(start_pos, "mla_query");
  const std::vector<float> inv = cfg.rope_inv_freq();
  MlaQuery o;

  // qr = bf16(RMSNorm(wq_a x)).
  o.qr = linear_fn(x, w.wq_a);
  round_bf16_inplace(o.qr);
  for (int64_t t = 0; t < S; ++t) rms_norm(o.qr.ptr() + t * qlr, o.qr.ptr() + t * qlr, qlr, w.q_norm.ptr(), cfg.rms_eps);
  round_bf16_inplace(o.qr);

  // q = wq_b qr viewed [S, nh, nope + rope]; interleaved RoPE on the trailing pe slice, bf16.
  Tensor<float> q = linear_fn(o.qr, w.wq_b);
  round_bf16_inplace(q);
  q.shape = {S, nh, nope + rope};
  rope_slices(q.ptr(), S * nh, nope + rope, nope, rope, inv, RopeLayout::interleaved,
              [&](int64_t i) { return start_pos + i / nh; });
  round_bf16_inplace(q);

  // Absorb W_uk into q_nope: q_abs[t, h, c] = sum_n q_nope[t, h, n] W_uk[h][n][c] (double, n
  // ascending), W_uk[h] read in place from wkv_b as an [out = kv_lora, in = nope] matrix.
  o.q_nope = Tensor<float>({S, nh, nope});
  for (int64_t t = 0; t < S; ++t)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t n = 0; n < nope; ++n) o.q_nope.at(t, h, n) = q.at(t, h, n);
  const HeadWeights w_uk{w.wkv_b.ptr(), nh, kvl, nope, (nope + v) * kvl, /*o_stride=*/1, /*i_stride=*/kvl};
  const Tensor<float> q_abs = head_fn(o.q_nope, w_uk);
  o.q = Tensor<bf16_t>({S, nh, kvl + rope});
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t c = 0; c < kvl; ++c) o.q.at(t, h, c) = f32_to_bf16(q_abs.at(t, h, c));
      for (int64_t r = 0; r < rope; ++r) o.q.at(t, h, kvl + r) = f32_to_bf16(q.at(t, h, nope + r));
    }
  }
  return o;
}

Tensor<bf16_t> mla_kv(const ModelConfig& cfg, const MlaWeights& w, const Tensor<float>& x, int64_t start_pos,
                      bool fp8_roundtrip, LinearFn linear_fn) {
  const int64_t rope = cfg.qk_rope_head_dim, kvl = cfg.kv_lora_rank;
  const int64_t S = require_rows(x, cfg.dim, "mla_kv x");
  check_mla_weights(cfg, w);
  require_start_pos(start_pos, "mla_kv");
  const std::vector<float> inv = cfg.rope_inv_freq();

  Tensor<float> kv = linear_fn(x, w.wkv_a);  // [S, kvl + rope]
  round_bf16_inplace(kv);
  // Latent: RMSNorm over the first kvl columns, bf16.
  Tensor<float> latent({S, kvl});
  for (int64_t t = 0; t < S; ++t) rms_norm(kv.ptr() + t * (kvl + rope), latent.ptr() + t * kvl, kvl, w.kv_norm.ptr(), cfg.rms_eps);
  round_bf16_inplace(latent);
  if (fp8_roundtrip) {
    const int block = int(std::min<int64_t>(128, kvl));
    latent = dequantize(quantize(latent, block, cfg.index_scale_rule, "mla_kv latent"), block);
    round_bf16_inplace(latent);
  }
  // k_pe: interleaved RoPE on the trailing rope columns, bf16.
  rope_slices(kv.ptr(), S, kvl + rope, kvl, rope, inv, RopeLayout::interleaved,
              [&](int64_t i) { return start_pos + i; });
  round_bf16_inplace(kv);

  Tensor<bf16_t> out({S, 1, kvl + rope});
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t c = 0; c < kvl; ++c) out.at(t, 0, c) = f32_to_bf16(latent.at(t, c));
    for (int64_t r = 0; r < rope; ++r) out.at(t, 0, kvl + r) = f32_to_bf16(kv.at(t, kvl + r));
  }
  return out;
}

Tensor<float> mla_value_up(const ModelConfig& cfg, const MlaWeights& w, const Tensor<float>& o_lat,
                           HeadLinearFn head_fn) {
  const int64_t nh = cfg.n_heads, nope = cfg.qk_nope_head_dim, v = cfg.v_head_dim, kvl = cfg.kv_lora_rank;
  require(o_lat.rank() == 3, "mla_value_up o_lat: expected rank 3 [S, n_heads, kv_lora], got " +
                                 shape_str(o_lat.shape));
  const int64_t S = o_lat.dim(0);
  require_shape(o_lat, {S, nh, kvl}, "mla_value_up o_lat");
  check_mla_weights(cfg, w);
  // o = bf16(head_linear(bf16(o_lat), W_uv)): W_uv[h] read in place from wkv_b's rows
  // h * (nope + v) + nope + j as an [out = v, in = kv_lora] matrix.
  Tensor<float> lat = o_lat;
  round_bf16_inplace(lat);
  const HeadWeights w_uv{w.wkv_b.ptr() + nope * kvl, nh, v, kvl, (nope + v) * kvl, /*o_stride=*/kvl, /*i_stride=*/1};
  Tensor<float> o = head_fn(lat, w_uv);
  round_bf16_inplace(o);
  return o;
}

Tensor<float> mla_output(const ModelConfig& cfg, const MlaWeights& w, const Tensor<float>& o_lat,
                         LinearFn linear_fn, HeadLinearFn head_fn) {
  Tensor<float> o = mla_value_up(cfg, w, o_lat, head_fn);
  o.shape = {o.dim(0), cfg.n_heads * cfg.v_head_dim};
  Tensor<float> y = linear_fn(o, w.wo);
  round_bf16_inplace(y);
  return y;
}

}  // namespace indexshare::ref
