#include "ref/v4/layer.h"

#include <algorithm>
#include <cmath>

#include "ref/error.h"
#include "ref/numerics.h"

namespace indexshare::ref::v4 {

std::string layer_type_name(LayerType t) {
  switch (t) {
    case LayerType::sliding: return "sliding_attention";
    case LayerType::csa: return "compressed_sparse_attention";
    case LayerType::hca: return "heavily_compressed_attention";
  }
  return "?";
}

char layer_type_char(LayerType t) { return t == LayerType::sliding ? 'S' : t == LayerType::csa ? 'C' : 'H'; }

LayerType parse_layer_type(const std::string& name) {
  for (LayerType t : {LayerType::sliding, LayerType::csa, LayerType::hca})
    if (name == layer_type_name(t) || name == std::string(1, layer_type_char(t))) return t;
  throw Error("v4 layer type: unknown value '" + name + "' (expected S, C, H or sliding_attention, "
              "compressed_sparse_attention, heavily_compressed_attention)");
}

float Config::sm_scale() const { return float(1.0 / std::sqrt(double(head_dim))); }

void Config::validate() const {
  auto positive = [](int64_t v, const char* name) {
    require(v >= 1, std::string("v4 config ") + name + ": must be >= 1, got " + std::to_string(v));
  };
  positive(n_tokens, "n_tokens");
  positive(n_heads, "n_heads");
  positive(head_dim, "head_dim");
  positive(window, "window");
  positive(csa_ratio, "csa_ratio");
  positive(hca_ratio, "hca_ratio");
  positive(index_n_heads, "index_n_heads");
  positive(index_head_dim, "index_head_dim");
  positive(index_topk, "index_topk");
  for (const RopeParams* r : {&main_rope, &compress_rope})
    require(r->rope_dim >= 2 && r->rope_dim % 2 == 0 && r->rope_dim <= head_dim && r->rope_dim <= index_head_dim,
            "v4 config rope_dim: must be even, >= 2 and <= head_dim and index_head_dim, got " +
                std::to_string(r->rope_dim));
  require(n_tokens + n_tokens / std::min(csa_ratio, hca_ratio) < (int64_t(1) << 31),
          "v4 config n_tokens: kv_full rows must fit int32");
}

Config tiny_config() {
  Config c;
  c.main_rope.rope_dim = 16;
  c.compress_rope = v4_compress_rope();
  c.compress_rope.rope_dim = 16;
  c.compress_rope.original_max_pos = 32;
  return c;
}

Config flash_config(int64_t n_tokens) {
  Config c;
  c.n_tokens = n_tokens;
  c.n_heads = 64;
  c.head_dim = 512;
  c.window = 128;
  c.csa_ratio = 4;
  c.hca_ratio = 128;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.main_rope = v4_main_rope();
  c.compress_rope = v4_compress_rope();
  return c;
}

CompressorParams compressor_params(const Config& cfg, LayerType t) {
  require(t != LayerType::sliding, "compressor_params: a sliding-window layer has no compressor");
  CompressorParams p;
  p.ratio = t == LayerType::csa ? cfg.csa_ratio : cfg.hca_ratio;
  p.overlap = t == LayerType::csa;
  p.eps = cfg.eps;
  p.rope = cfg.compress_rope;
  return p;
}

CompressorParams indexer_compressor_params(const Config& cfg) { return compressor_params(cfg, LayerType::csa); }

namespace {

Tensor<float> gen(const Config& cfg, const std::string& name, const Shape& shape, Dist dist, float scale,
                  const Kernels& kern) {
  Tensor<float> t(shape);
  kern.fill_range(t.ptr(), 0, t.numel(), dist, scale, cfg.seed, stream_tag(name));
  return t;
}

Tensor<float> gen_bf16_values(const Config& cfg, const std::string& name, const Shape& shape, const Kernels& kern) {
  Tensor<float> t = gen(cfg, name, shape, cfg.dist, 1.0f, kern);
  for (float& v : t.data) v = round_bf16(v);
  return t;
}

Tensor<bf16_t> gen_bf16(const Config& cfg, const std::string& name, const Shape& shape, const Kernels& kern) {
  Tensor<bf16_t> t(shape);
  kern.fill_range_bf16(t.ptr(), 0, t.numel(), cfg.dist, 1.0f, cfg.seed, stream_tag(name));
  return t;
}

// 1 + uniform x 0.25, in f32: a norm weight near 1.
Tensor<float> gen_norm_weight(const Config& cfg, const std::string& name, int64_t n, const Kernels& kern) {
  Tensor<float> t = gen(cfg, name, {n}, Dist::uniform, 0.25f, kern);
  for (float& v : t.data) v = 1.0f + v;
  return t;
}

}  // namespace

LayerInputs make_layer_inputs(const Config& cfg, int layer, LayerType type, bool with_indexer, const Kernels& kern) {
  cfg.validate();
  require(!with_indexer || type == LayerType::csa, "v4 make_layer_inputs: only C4A layers have an indexer");
  const std::string pre = "layers." + std::to_string(layer) + ".";
  const int64_t T = cfg.n_tokens, D = cfg.head_dim;
  LayerInputs in;
  in.type = type;
  in.q = gen_bf16(cfg, pre + "attn.q", {T, cfg.n_heads, D}, kern);
  in.kv = gen_bf16(cfg, pre + "attn.kv", {T, D}, kern);
  in.sink = gen(cfg, pre + "attn.sink", {cfg.n_heads}, cfg.dist, 1.0f, kern);
  if (type != LayerType::sliding) {
    const CompressorParams cp = compressor_params(cfg, type);
    const int64_t width = cp.overlap ? 2 * D : D;
    in.comp_kv = gen_bf16_values(cfg, pre + "compressor.kv", {T, width}, kern);
    in.comp_gate = gen_bf16_values(cfg, pre + "compressor.gate", {T, width}, kern);
    in.comp_bias = gen(cfg, pre + "compressor.position_bias", {cp.ratio, width}, cfg.dist, 0.5f, kern);
    in.comp_norm = gen_norm_weight(cfg, pre + "compressor.norm_weight", D, kern);
  }
  in.has_indexer = with_indexer;
  if (with_indexer) {
    const int64_t DI = cfg.index_head_dim, HI = cfg.index_n_heads;
    in.index_kv = gen_bf16_values(cfg, pre + "indexer.kv", {T, 2 * DI}, kern);
    in.index_gate = gen_bf16_values(cfg, pre + "indexer.gate", {T, 2 * DI}, kern);
    in.index_bias = gen(cfg, pre + "indexer.position_bias", {cfg.csa_ratio, 2 * DI}, cfg.dist, 0.5f, kern);
    in.index_norm = gen_norm_weight(cfg, pre + "indexer.norm_weight", DI, kern);
    in.index_q = gen_bf16_values(cfg, pre + "indexer.q", {T, HI, DI}, kern);
    // weights_proj(x) (bf16) * H^-0.5, in f32.
    in.index_weights = gen_bf16_values(cfg, pre + "indexer.weights", {T, HI}, kern);
    const float h_scale = float(1.0 / std::sqrt(double(HI)));
    for (float& v : in.index_weights.data) v = v * h_scale;
  }
  return in;
}

Tensor<int32_t> window_indices(int64_t T, int64_t W) {
  Tensor<int32_t> idx({T, W});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < W; ++i) {
      const int64_t pos = t - W + 1 + i;
      idx.at(t, i) = pos >= 0 ? int32_t(pos) : -1;
    }
  return idx;
}

Tensor<int32_t> attention_indices(const Config& cfg, LayerType type, int64_t n_c, const Tensor<int32_t>* blocks) {
  const int64_t T = cfg.n_tokens, W = cfg.window;
  int64_t width = 0;
  if (type == LayerType::csa) {
    require(blocks != nullptr && blocks->rank() == 2 && blocks->dim(0) == T,
            "v4 attention_indices blocks: expected [T = " + std::to_string(T) + ", k]");
    width = blocks->dim(1);
  }
  if (type == LayerType::hca) width = n_c;
  const Tensor<int32_t> win = window_indices(T, W);
  Tensor<int32_t> idx({T, 1, W + width});
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < W; ++i) idx.at(t, 0, i) = win.at(t, i);
    for (int64_t j = 0; j < width; ++j) {
      int64_t e = -1;
      if (type == LayerType::csa) {
        const int32_t b = blocks->at(t, j);
        require(b < n_c, "v4 attention_indices blocks: block " + std::to_string(b) + " at row " + std::to_string(t) +
                             " is not below n_c = " + std::to_string(n_c));
        e = b >= 0 ? b : -1;
      } else if (j < (t + 1) / cfg.hca_ratio) {
        e = j;
      }
      idx.at(t, 0, W + j) = e >= 0 ? int32_t(T + e) : -1;
    }
  }
  return idx;
}

namespace {

// [T tokens ; bf16(entries)] as [T + n_c, 1, D].
Tensor<bf16_t> concat_kv(const Tensor<bf16_t>& kv, const Tensor<float>& entries) {
  const int64_t T = kv.dim(0), D = kv.dim(1), n_c = entries.numel() ? entries.dim(0) : 0;
  Tensor<bf16_t> full({T + n_c, 1, D});
  std::copy(kv.data.begin(), kv.data.end(), full.data.begin());
  for (int64_t i = 0; i < n_c * D; ++i) full[T * D + i] = f32_to_bf16(entries[i]);
  return full;
}

}  // namespace

void attend(const Config& cfg, LayerType type, const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
            const Tensor<float>& sink, const Tensor<float>& entries, const Tensor<int32_t>* blocks, LayerOutputs& out,
            const Kernels& kern) {
  const int64_t T = cfg.n_tokens, D = cfg.head_dim;
  require_shape(q, Shape{T, cfg.n_heads, D}, "v4 attn.q");
  require_shape(kv, Shape{T, D}, "v4 attn.kv");
  require_shape(sink, Shape{cfg.n_heads}, "v4 attn.sink");
  require(type == LayerType::sliding ? entries.numel() == 0 : entries.rank() == 2 && entries.dim(1) == D,
          "v4 compressor.entries: expected [n_c, D = " + std::to_string(D) + "], got " + shape_str(entries.shape));
  const int64_t n_c = entries.numel() ? entries.dim(0) : 0;
  // 3. One sparse attention over window and compressed entries, with the sink.
  out.indices = attention_indices(cfg, type, n_c, blocks);
  out.kv_full = concat_kv(kv, entries);
  out.attn = kern.sparse_attention(q, out.kv_full, out.indices, cfg.sm_scale(), D, nullptr, &sink);
  // 4. The inverse RoPE at the query position on the output's trailing rope_dim channels (f32).
  const RopeParams& rope = type == LayerType::sliding ? cfg.main_rope : cfg.compress_rope;
  const std::vector<float> freq = inv_freq(rope);
  std::vector<float> c(freq.size()), s(freq.size());
  for (int64_t t = 0; t < T; ++t) {
    rope_cos_sin(t, freq, c.data(), s.data());  // one row's angles, for all its heads
    for (int64_t h = 0; h < cfg.n_heads; ++h) apply_rope_inverse(&out.attn.out.at(t, h, D - rope.rope_dim), rope.rope_dim, c.data(), s.data());
  }
  for (int64_t i = 0; i < out.attn.out.numel(); ++i) out.attn.out_bf16[i] = f32_to_bf16(out.attn.out[i]);
}

LayerOutputs run_layer(const Config& cfg, const LayerInputs& in, const Tensor<int32_t>* shared_blocks,
                       const Kernels& kern) {
  cfg.validate();
  const int64_t T = cfg.n_tokens;
  LayerOutputs out;
  // 1. The compressor's entries.
  if (in.type != LayerType::sliding)
    out.entries = kern.v4_compress(in.comp_kv, in.comp_gate, in.comp_bias, in.comp_norm, compressor_params(cfg, in.type));
  const int64_t n_c = out.entries.numel() ? out.entries.dim(0) : 0;
  // 2. C4A: the blocks, from the layer's own indexer (Full) or from its source (Shared).
  if (in.type == LayerType::csa) {
    if (shared_blocks) {
      require_shape(*shared_blocks, Shape{T, std::min(cfg.index_topk, n_c)}, "v4 shared blocks");
      out.blocks = *shared_blocks;
    } else {
      require(in.has_indexer, "v4 run_layer: a Full C4A layer needs indexer inputs");
      out.index_entries = kern.v4_compress(in.index_kv, in.index_gate, in.index_bias, in.index_norm,
                                           indexer_compressor_params(cfg));
      out.index_scores = index_scores(in.index_q, out.index_entries, in.index_weights, cfg.csa_ratio, cfg.rotation, kern);
      out.blocks = select_blocks(out.index_scores, cfg.csa_ratio, cfg.index_topk, kern);
    }
  }
  // 3-4. The attention over window and compressed entries, then the inverse RoPE.
  attend(cfg, in.type, in.q, in.kv, in.sink, out.entries, in.type == LayerType::csa ? &out.blocks : nullptr, out, kern);
  return out;
}

}  // namespace indexshare::ref::v4
