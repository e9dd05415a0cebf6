// indexshare: the module level of one DSA layer: the indexer (projections, k LayerNorm, RoPE on
// the pe slice, Hadamard rotation, FP8 act_quant, head weights) and MLA in the absorbed (MQA,
// 576-dim key) form that FlashMLA computes, from a layer input x to the kernel-level tensors of
// ref/indexer.h and ref/attention.h, and back from the attention output to the layer output.
//
// Which semantics
//   DeepSeek-V3.2 fixed reference (the inference/
//   model.py vendored in transformers @220c122): pe-first indexer slice, fp32 weights_proj on
//   x.float(), FP8 round trip of the MLA latent before caching. The indexer's RoPE layout comes
//   from cfg.indexer_rope (half_split for DeepSeek-V3.2, interleaved for GLM-5.x, section 7);
//   MLA's RoPE is always interleaved. Frequencies: cfg.rope_inv_freq() (YaRN when cfg.yarn).
//
// Deliberate simplification: the weights are bf16 values (f32 tensors holding bf16 numbers) and
// every linear layer is ref::linear_bf16 (exact products, double sum ascending, f32 then bf16).
// The real checkpoint's FP8 block-quantized linears (act_quant of the input in 128-blocks,
// 128x128 fp32 weight-block scales, fp8_gemm; section 3.1) are NOT modelled: they would change
// every projection by an FP8 rounding that neither the indexer nor MLA semantics depend on.
//
// Layouts (torch nn.Linear [out, in]; row t of x is absolute position start_pos + t):
//   x    [S, dim]       bf16 values: the layer input after attn_norm
//   qr   [S, q_lora]    bf16 values: RMSNorm(wq_a x), shared by MLA and the indexer
//   indexer q [S, H, D] with the slice order [pe (rope) | nope (D - rope)]   (pe FIRST)
//   MLA q     [S, n_heads, nope + rope] with the slice order [nope | pe]      (nope FIRST)
//   absorbed MLA query / key: [kv_lora latent | rope] = cfg.d_qk() (576 for the real configs)
//
// Errors: shape mismatches throw indexshare::Error naming the function and the tensor
// ("indexer_module wk: expected shape [32, 64], got [...]").
#pragma once

#include <cstdint>
#include <string>

#include "ref/config.h"
#include "ref/module_ops.h"
#include "ref/error.h"
#include "ref/kernels.h"
#include "ref/numerics.h"
#include "ref/tensor.h"

namespace indexshare::ref {

// ---- Weights --------------------------------------------------------------------------------

// The indexer of one full layer (names as in the checkpoint's self_attn.indexer.*).
struct IndexerWeights {
  Tensor<float> wq_b;          // [H*D, q_lora]
  Tensor<float> wk;            // [D, dim]
  Tensor<float> k_norm_w;      // [D]   LayerNorm weight
  Tensor<float> k_norm_b;      // [D]   LayerNorm bias
  Tensor<float> weights_proj;  // [H, dim]
};

// MLA of one layer.
struct MlaWeights {
  Tensor<float> wq_a;     // [q_lora, dim]
  Tensor<float> q_norm;   // [q_lora]   RMSNorm weight
  Tensor<float> wq_b;     // [n_heads*(nope+rope), q_lora]
  Tensor<float> wkv_a;    // [kv_lora+rope, dim]
  Tensor<float> kv_norm;  // [kv_lora]  RMSNorm weight
  Tensor<float> wkv_b;    // [n_heads*(nope+v), kv_lora]: head h's block is rows
                          //   [h*(nope+v), (h+1)*(nope+v)), W_uk = its first nope rows,
                          //   W_uv = its last v rows
  Tensor<float> wo;       // [dim, n_heads*v]
};

// Throw Error naming the tensor when a weight's shape does not match cfg.
void check_indexer_weights(const ModelConfig& cfg, const IndexerWeights& w);
void check_mla_weights(const ModelConfig& cfg, const MlaWeights& w);

// Random weights with a cross-layer similarity knob. Each tensor named N ("indexer.wq_b",
// "indexer.wk", "indexer.k_norm_w", "indexer.k_norm_b", "indexer.weights_proj"; "mla.wq_a",
// "mla.q_norm", "mla.wq_b", "mla.wkv_a", "mla.kv_norm", "mla.wkv_b", "mla.wo") is
//   B = fill(Dist::normal, scale 1, seed, stream_tag(base_prefix + N))   (shared by all layers)
//   E = fill(Dist::normal, scale 1, seed, stream_tag(prefix + N))        (this layer's own)
//   a = similarity,  b = f32(sqrt(1 - a^2)) (double 1 - a*a, correctly rounded sqrt, then f32)
//   mix = a * B + b * E                            (f32: two rounded products, one rounded sum)
//   linear weight [out, in]: round_bf16(f32(1 / sqrt(in)) * mix)    (fan_in^-0.5, f32 product)
//   norm weight:             round_bf16(1 + 0.1f * mix)             (f32, left to right)
//   k_norm_b:                round_bf16(0.1f * mix)
// Every operation is an IEEE-rounded one, so the bits are the same on every machine.
// Similarity 1 gives b = 0: every prefix gets the base weights exactly. Similarity 0 gives
// independent layers (a = 0). The correlation of two layers' entries is a^2. prefix ==
// base_prefix is allowed (then B == E). similarity outside [0, 1] or NaN throws Error.
// cfg is validated (ModelConfig::validate).
IndexerWeights random_indexer_weights(const ModelConfig& cfg, uint64_t seed, const std::string& prefix,
                                      float similarity, const std::string& base_prefix);
MlaWeights random_mla_weights(const ModelConfig& cfg, uint64_t seed, const std::string& prefix,
                              float similarity, const std::string& base_prefix);

// ---- Helpers --------------------------------------------------------------------------------

// Concatenation along dim 0 (e.g. a key cache of earlier chunks followed by this chunk's keys):
// both tensors must have the same rank >= 1 and the same trailing dims (Error otherwise). A
// default-constructed tensor (shape {}, no data) counts as zero rows, so a cache can start empty.
template <typename T>
Tensor<T> concat_rows(const Tensor<T>& a, const Tensor<T>& b) {
  const bool a_empty = a.shape.empty() && a.data.empty();
  const bool b_empty = b.shape.empty() && b.data.empty();
  if (a_empty) return b;
  if (b_empty) return a;
  require(a.rank() >= 1 && a.rank() == b.rank(),
          "concat_rows: ranks differ or are 0 (" + shape_str(a.shape) + " and " + shape_str(b.shape) + ")");
  for (int i = 1; i < a.rank(); ++i)
    require(a.dim(i) == b.dim(i), "concat_rows: trailing dims differ (" + shape_str(a.shape) + " and " +
                                      shape_str(b.shape) + ")");
  Tensor<T> out;
  out.shape = a.shape;
  out.shape[0] = a.dim(0) + b.dim(0);
  out.data.reserve(a.data.size() + b.data.size());
  out.data.insert(out.data.end(), a.data.begin(), a.data.end());
  out.data.insert(out.data.end(), b.data.begin(), b.data.end());
  return out;
}

// ---- Indexer --------------------------------------------------------------------------------

enum class IndexerVariant {
  deepseek_fp8,  // fixed DeepSeek reference: Hadamard, FP8 act_quant, DeepGEMM fp8_mqa_logits
  hf_bf16,       // HF transformers DeepseekV32Indexer / GlmMoeDsaIndexer: no Hadamard, no FP8
};
std::string indexer_variant_name(IndexerVariant v);          // "deepseek_fp8" / "hf_bf16"
IndexerVariant parse_indexer_variant(const std::string& name);  // throws Error naming the value

// Every intermediate of the indexer for the rows of x (f32 tensors hold bf16 values unless noted).
struct IndexerModuleOut {
  Tensor<float> q_proj;      // [S, H, D]  linear_bf16(qr, wq_b)
  Tensor<float> q_rope;      // [S, H, D]  RoPE on dims [0, rope) of each head, bf16; [rope, D) = q_proj
  Tensor<float> q_hadamard;  // [S, H, D]  bf16(Hadamard over D) of q_rope   (deepseek_fp8 only)
  Tensor<float> k_proj;      // [S, D]     linear_bf16(x, wk)
  Tensor<float> k_norm;      // [S, D]     bf16(LayerNorm(k_proj))
  Tensor<float> k_rope;      // [S, D]     RoPE on dims [0, rope), bf16
  Tensor<float> k_hadamard;  // [S, D]     bf16(Hadamard) of k_rope           (deepseek_fp8 only)
  Tensor<e4m3_t> q8;         // [S, H, D]  FP8 codes of q_hadamard            (deepseek_fp8 only)
  Tensor<e4m3_t> k8;         // [S, D]     FP8 codes of k_hadamard            (deepseek_fp8 only)
  Tensor<float> q_scale;     // [S, H]     act_quant scales (hf_bf16: 1)
  Tensor<float> k_scale;     // [S]        act_quant scales (hf_bf16: 1)
  Tensor<float> weights;     // [S, H]     f32 head weights, all scales folded in (see below)
  Tensor<float> q;           // [S, H, D]  deepseek_fp8: q_hadamard; hf_bf16: q_rope
  Tensor<float> k;           // [S, D]     deepseek_fp8: k_hadamard; hf_bf16: k_rope
};

// The indexer of one full layer for the rows of x (absolute positions start_pos + t).
// x [S, dim] and qr [S, q_lora] hold bf16 values; start_pos >= 0. H = cfg.index_n_heads,
// D = cfg.index_head_dim, rope = cfg.qk_rope_head_dim, layout = cfg.indexer_rope.
//   1. q_proj = linear_bf16(qr, wq_b) viewed [S, H, D].
//   2. q_rope: per (t, h) apply_rope(dims [0, rope), start_pos + t, cfg.rope_inv_freq(),
//      cfg.indexer_rope) in f32, then bf16 (dims [rope, D) untouched: pe-first slice).
//   3. k_proj = linear_bf16(x, wk); k_norm = bf16(layer_norm(k_proj, k_norm_w, k_norm_b,
//      cfg.index_norm_eps)) (double, one f32 rounding, then bf16); k_rope as step 2.
//   deepseek_fp8:
//   4. q_hadamard / k_hadamard = bf16(hadamard_transform over all D dims) of each q head / k row
//      (f32 butterfly, times f32(D^-0.5), then bf16: rotate_activation).
//   5. (q8, q_scale) = quantize(q_hadamard, block D, cfg.index_scale_rule); likewise (k8, k_scale).
//   6. weights[t, h] = ((wp[t, h] * f32(H^-0.5)) * q_scale[t, h]) * f32(D^-0.5), f32 products left
//      to right, where wp = linear(x, weights_proj) (f32 output: `weights_proj(x.float())`).
//   hf_bf16:
//   4'. no Hadamard, no FP8: q = q_rope, k = k_rope, q_scale = 1, k_scale = 1, q8/k8/q_hadamard/
//      k_hadamard empty.
//   6'. weights[t, h] = (wp[t, h] * f32(H^-0.5)) * f32(D^-0.5). HF multiplies the dot products by
//      D^-0.5 before the ReLU; folding the positive constant into the weights is equal in exact
//      arithmetic (ReLU(c y) = c ReLU(y) for c > 0) but may differ by f32 roundings. HF runs
//      weights_proj in the model dtype (a bf16 output); the f32 projection of the fixed reference
//      is kept here so that the two variants differ only by the Hadamard rotation and FP8.
// f32(n^-0.5) is f32(1 / sqrt(double(n))) (IEEE division and sqrt, deterministic; the same f32 as
// Python's n ** -0.5 rounded to f32).
// Keys and queries of a row depend only on that row (and its position), so a sequence may be
// computed in chunks (start_pos = rows before the chunk): concatenating the chunks' keys with
// concat_rows / concat_keys gives the keys of the whole sequence bit for bit.
// linear_fn: the projection engine (ref::linear, or simd::linear: the same bits, faster); every
// linear layer of the module functions below goes through it, all other steps are ref's.
IndexerModuleOut indexer_module(const ModelConfig& cfg, const IndexerWeights& w, const Tensor<float>& x,
                                const Tensor<float>& qr, int64_t start_pos, IndexerVariant v,
                                LinearFn linear_fn = linear);

// The key side of the indexer (what a k-cache holds), possibly longer than the query rows.
struct IndexerKeys {
  Tensor<e4m3_t> k8;      // [s_kv, D] (deepseek_fp8; empty for hf_bf16)
  Tensor<float> k;        // [s_kv, D] bf16 values (hf_bf16 keys; deepseek_fp8: k_hadamard)
  Tensor<float> k_scale;  // [s_kv]
};
IndexerKeys indexer_keys(const IndexerModuleOut& out);
// Rows of `earlier` then rows of `later` (each field by concat_rows; empty fields stay empty).
IndexerKeys concat_keys(const IndexerKeys& earlier, const IndexerKeys& later);

// Kernel-level logits [s_q, s_kv] for the query rows of `queries` against `keys`:
//   deepseek_fp8: indexer_logits_fp8(queries.q8, keys.k8, keys.k_scale, queries.weights, ks, ke)
//   hf_bf16:      indexer_logits_f32(queries.q,  keys.k,  keys.k_scale, queries.weights, ks, ke)
// ks / ke [s_q]: the half-open key bounds of each row (causal: ks = 0, ke = start_pos + t + 1).
// k: the kernel table (ref/kernels.h) the logits run on.
Tensor<float> indexer_module_logits(const IndexerModuleOut& queries, const IndexerKeys& keys,
                                    IndexerVariant v, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                                    const Kernels& k = {});
// Same, with the keys of the same rows (indexer_keys(out)).
Tensor<float> indexer_module_logits(const IndexerModuleOut& out, IndexerVariant v, const Tensor<int32_t>& ks,
                                    const Tensor<int32_t>& ke, const Kernels& k = {});

// ---- MLA (absorbed / MQA form) ------------------------------------------------------------------

struct MlaQuery {
  Tensor<float> qr;      // [S, q_lora] bf16 values: bf16(RMSNorm(linear_bf16(x, wq_a))), shared
                         //   with the indexer
  Tensor<float> q_nope;  // [S, n_heads, nope] bf16 values: the nope slice before absorption
  Tensor<bf16_t> q;      // [S, n_heads, kv_lora + rope]: [q_abs | q_pe]
};

// Queries of MLA for the rows of x (positions start_pos + t).
//   qr     = bf16(rms_norm(linear_bf16(x, wq_a), q_norm, cfg.rms_eps))
//   qfull  = linear_bf16(qr, wq_b) viewed [S, n_heads, nope + rope], split [nope | pe]
//   q_pe   = bf16(apply_rope(pe, start_pos + t, cfg.rope_inv_freq(), interleaved))  (f32 rope)
//   q_abs[t, h, c] = bf16(f32( sum_{n = 0..nope-1 ascending} q_nope[t,h,n] * W_uk[h][n][c] ))
//            with W_uk[h][n][c] = wkv_b[h*(nope+v) + n, c]; products exact in double, the sum in
//            double, rounded to f32 then to bf16 (an fp32-accumulating bf16 einsum): head_linear
//            of q_nope with W_uk[h] read transposed (HeadWeights in ref/module_ops.h)
//   q[t, h] = [q_abs (kv_lora) | q_pe (rope)]
// linear_fn runs the projections, head_fn the absorption (ref's or simd's: the same bits).
MlaQuery mla_query(const ModelConfig& cfg, const MlaWeights& w, const Tensor<float>& x, int64_t start_pos,
                   LinearFn linear_fn = linear, HeadLinearFn head_fn = head_linear);

// The absorbed MQA key/value rows of x: [S, 1, kv_lora + rope] (the kv of sparse_attention;
// V = the first kv_lora columns).
//   kv     = linear_bf16(x, wkv_a) -> [kv_lora | rope]
//   latent = bf16(rms_norm(kv[:kv_lora], kv_norm, cfg.rms_eps))
//   fp8_roundtrip (the fixed DeepSeek reference's FP8 KV-cache simulation): latent =
//            bf16(dequantize(quantize(latent, block min(128, kv_lora), cfg.index_scale_rule)))
//            (with a power-of-two scale the dequantized value is already a bf16 value; the
//            reference uses its scale_fmt, ue8m0, which is cfg.index_scale_rule in the presets)
//   k_pe   = bf16(apply_rope(kv[kv_lora:], start_pos + t, cfg.rope_inv_freq(), interleaved))
//   row    = [latent | k_pe]
Tensor<bf16_t> mla_kv(const ModelConfig& cfg, const MlaWeights& w, const Tensor<float>& x, int64_t start_pos,
                      bool fp8_roundtrip, LinearFn linear_fn = linear);

// The value up-projection of the absorbed form: o_lat [S, n_heads, kv_lora] (f32 attention output,
// AttentionOut::out) -> [S, n_heads, v] bf16 values:
//   o[t, h, j] = bf16(f32( sum_{c ascending} bf16(o_lat[t,h,c]) * W_uv[h][j][c] ))   (double sum)
//   with W_uv[h][j][c] = wkv_b[h*(nope+v) + nope + j, c]: head_linear of bf16(o_lat) with W_uv[h]
//   (run by head_fn), rounded to bf16.
Tensor<float> mla_value_up(const ModelConfig& cfg, const MlaWeights& w, const Tensor<float>& o_lat,
                           HeadLinearFn head_fn = head_linear);

// The layer's attention output: linear_bf16(mla_value_up(o_lat) viewed [S, n_heads*v], wo) ->
// [S, dim] bf16 values. The softmax scale of the attention in between is cfg.softmax_scale()
// (qk_head_dim^-0.5, times the YaRN mscale^2 for DeepSeek), d_v = cfg.kv_lora_rank.
Tensor<float> mla_output(const ModelConfig& cfg, const MlaWeights& w, const Tensor<float>& o_lat,
                         LinearFn linear_fn = linear, HeadLinearFn head_fn = head_linear);

}  // namespace indexshare::ref
