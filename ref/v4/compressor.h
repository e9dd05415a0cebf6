// indexshare: DeepSeek-V4's KV compressor (CSA ratio 4 with overlapping windows, HCA ratio 128),
// the RoPE settings of V4's layers, and the inverse RoPE of the attention output.
//
// A compressor turns every complete window of `ratio` = m source tokens into one compressed entry
// of D channels (the attention's D = 512, or the indexer's D_I = 128). Its inputs are the two
// projections of the layer's input, kv = x W_kv and gate = x W_z, one row per token, and two
// learned tensors, a position bias per slot and an RMSNorm weight:
//
//   kv, gate       [T, width]   f32 (bf16 values in a bf16 model); width = 2D (overlap) or D
//   position_bias  [m, width]   f32
//   norm_weight    [D]          f32
//   out            [n_w, D]     f32, n_w = floor(T / m): only complete windows make an entry
//
// Entry w (w = 0 .. n_w - 1), channel c (0 <= c < D), over its slots j:
//   overlap (CSA, m = 4): 2m slots. Each token carries two halves, Ca = kv[:, :D] (its share of
//     the NEXT window's entry) and Cb = kv[:, D:] (its share of its own window's entry).
//       slot j <  m: token (w - 1) m + j, value kv[tok, c],     logit gate[tok, c]     + bias[j, c]
//       slot j >= m: token w m + j - m,   value kv[tok, D + c], logit gate[tok, D + c] + bias[j - m, D + c]
//     For w = 0 the first m slots do not exist (transformers: kv 0 with gate -inf, weight 0).
//   no overlap (HCA, m = 128): m slots, slot j is token w m + j: kv[tok, c], gate[tok, c] + bias[j, c].
//   z_j    = f32(gate + bias)                       (one f32 add, as torch's bf16 + f32 parameter)
//   p_j    = f32(e_j / sum_j e_j), e_j = exp_portable(double(z_j) - max_j z_j)
//            (double; e_j and the sum over ascending j in double; each weight rounded to f32 once:
//            the f32 softmax of transformers and Megatron)
//   pooled = f32(sum_j double(p_j) * double(value_j))  (j ascending, exact products, double sum)
//   y      = rms_norm(pooled, norm_weight, eps)       (ref/module_ops.h: double, rounded once)
//   out    = y with RoPE on its trailing rope_dim channels, interleaved pairs (2i, 2i+1), at the
//            position w * m (ref::apply_rope: f32 arithmetic), with the layer's compress RoPE.
//
// Rounding points, and the two upstream variants:
//   Megatron keeps the f32 weights and f32 products: that is this function (one rounding of the
//   weights, one of the pooled value, one in the norm, f32 RoPE).
//   transformers casts the weights to the kv dtype before multiplying (`softmax(...).to(kv.dtype)`),
//   so in a bf16 model the weights, each product and the pooled sum are bf16, the norm's output is
//   bf16 and the RoPE uses bf16 cos/sin. In an f32 model that cast is a no-op and transformers
//   computes the f32 variant up to the order of its sums (tests/python/test_v4_hf.py).
//   Both by name (CompressorRounding):
//     "f32" / "megatron" (default)  as above
//     "hf_bf16" / "hf"              transformers in a bf16 model (kv and gate bf16 values):
//        p_j     = bf16(f32 weight above)                      (.to(kv.dtype))
//        prod_j  = bf16(p_j * value_j)                         (bf16 x bf16, exact in f32, one rounding)
//        pooled  = bf16(f32(sum_j prod_j))                     (double sum, j ascending; torch's f32
//                                                              accumulator cast to bf16)
//        y       = bf16(rms_norm(pooled, norm_weight, eps))    (f32 as above, then bf16)
//        RoPE    c16 = bf16(c), s16 = bf16(s) (c, s as ref::apply_rope);
//                a' = bf16(a * c16 - b * s16), b' = bf16(b * c16 + a * s16)  (f32 products and sum)
//      torch's f32 softmax and mean (its own exp and reduction order) could move a value across a
//      bf16 rounding boundary (one bf16 ulp); on the cross-check's inputs transformers' bf16
//      compressor agrees bit for bit (tests/python/test_v4_hf.py).
//
// Gates must be finite (a window whose logits are all -inf has no softmax); kv may be anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ref/tensor.h"

namespace indexshare::ref::v4 {

// RoPE of a V4 layer: plain (theta only) or DeepSeek's YaRN (ref::yarn_inv_freq) with the
// attention factor forced to 1 (V4 never multiplies cos/sin by YaRN's mscale).
//   V4 "main" (sliding-window layers):  theta 10000, no YaRN
//   V4 "compress" (CSA / HCA layers, their compressors and indexer): theta 160000, YaRN factor 16,
//     original_max_position_embeddings 65536, beta_fast 32, beta_slow 1 (V4-Flash's config)
struct RopeParams {
  int rope_dim = 64;
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  int original_max_pos = 4096;
  double beta_fast = 32.0, beta_slow = 1.0;
};
RopeParams v4_main_rope();
RopeParams v4_compress_rope();
// rope_dim / 2 inverse frequencies (ref::rope_inv_freq or ref::yarn_inv_freq).
std::vector<float> inv_freq(const RopeParams& r);

// The conjugate rotation of ref::apply_rope's interleaved layout (`-sin`): for each pair j,
//   angle = f32(pos) * inv_freq[j];  c = f32(cos(angle)), s = f32(sin(angle))  (as apply_rope)
//   a' = a * c + b * s ;  b' = b * c - a * s         (f32 products and sums, no FMA)
// apply_rope then apply_rope_inverse at the same position is the identity up to rounding.
void apply_rope_inverse(float* x, int rope_dim, int64_t pos, const std::vector<float>& inv_freq);
// The same rotation in two steps, for many vectors at one position (every head of a row): c[j] and
// s[j] (inv_freq.size() each) as above, then the rotation with them; the bits are the one-call form's.
void rope_cos_sin(int64_t pos, const std::vector<float>& inv_freq, float* c, float* s);
void apply_rope_inverse(float* x, int rope_dim, const float* c, const float* s);

enum class CompressorRounding { f32, hf_bf16 };
std::string rounding_name(CompressorRounding r);            // "f32" / "hf_bf16"
CompressorRounding parse_rounding(const std::string& name);  // also "megatron" / "hf"; Error otherwise

struct CompressorParams {
  CompressorRounding rounding = CompressorRounding::f32;
  int64_t ratio = 4;      // m
  bool overlap = true;    // CSA: true (width 2D); HCA: false (width D)
  float eps = 1e-6f;      // RMSNorm epsilon (config.rms_norm_eps)
  RopeParams rope = v4_compress_rope();
};

// Checks shapes and params (kv and gate [T, width], bias [m, width], norm_weight [D],
// ratio >= 1, rope_dim even and <= D); throws Error naming the tensor. simd calls it too.
void check_compressor_inputs(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& position_bias,
                             const Tensor<float>& norm_weight, const CompressorParams& p);

// The compressed entries [floor(T / m), D] (see the header).
Tensor<float> compress(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& position_bias,
                       const Tensor<float>& norm_weight, const CompressorParams& p);

// One entry: window w's D channels into out[0, D); freq = inv_freq(p.rope). compress() is this
// for w = 0 .. n_w - 1; simd runs the same per-window sequence over windows in parallel.
void compress_window(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& position_bias,
                     const Tensor<float>& norm_weight, const CompressorParams& p, const std::vector<float>& freq,
                     int64_t w, float* out);

}  // namespace indexshare::ref::v4
