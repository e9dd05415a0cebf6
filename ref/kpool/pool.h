// indexshare: GLM-5.3's pooled indexer keys (KPool-DSA, transformers `glm5_next_text`).
//
// The indexer of a KPool layer does not score tokens: it scores *pools* of P consecutive tokens.
// Pool p covers the tokens pP .. pP + P - 1 (the first non-pad token is f = 0: one sequence, no
// left padding), and exists only when it is complete: there are n_pools = floor(T / P) pools
// over T keys. Its key is a per-channel softmax-weighted sum of its P token keys:
//
//   z[p, j, d]  = f32(g[pP + j, d] + ape[j, d])            "g + ape", the pooling logits (f32 add,
//                                                           as transformers adds two f32 tensors)
//   a[p, j, d]  = softmax_j(z[p, :, d])                     a softmax over the P slots, per channel
//   Kbar[p, d]  = sum_j a[p, j, d] * k[pP + j, d]           not a max, not a mean
//
// Shapes: k [T, D] (the indexer keys, k_norm(wk x), no RoPE: the model is NoPE), g [T, D] (the
// gate scores G x, G = index_kpool_compress_gate [D, hidden]), ape [P, D] (the f32 absolute slot
// embedding index_kpool_compress_ape); z [n_pools, P, D], Kbar [n_pools, D], all f32.
//
// Rounding, by name (PoolRounding):
//   f32      the specification: per (p, d), m = max_j z; e_j = exp_portable(z_j - m) (double;
//            ref/numerics.h, the same bits on every machine); den = sum_j e_j (j ascending);
//            a_j = e_j / den; Kbar = f32(sum_j a_j * k_j) (double, j ascending, multiply then add,
//            never fused): one rounding per output.
//   hf_bf16  transformers with a bf16 model: the softmax in f32, the probabilities cast to the key
//            dtype (bf16), a bf16 product, and a sum of the bf16 products. Emulated here as
//            a_j = bf16(f32(e_j / den)) (e_j, den as above), prod_j = bf16(a_j * bf16(k_j)) (the
//            bf16 x bf16 product is exact in f32, then rounded to bf16), Kbar = bf16(sum_j prod_j)
//            (double, j ascending). torch's f32 exp and its f32 partial sums may differ from this by
//            an f32 ulp before the bf16 roundings, so a probability or the sum can land one bf16
//            ulp apart at a rounding boundary: judge against it within 1 bf16 ulp. Kbar holds bf16
//            values (in f32). With an f32 model transformers computes everything in f32: the f32
//            spec within f32 rounding.
//   SGLang's serving cache (the kernel `kpool_fp8_index`) continues from the f32 result in this
//   order: bf16(Kbar); Hadamard-128 (Sylvester butterfly times 128^-1/2) in f32, then bf16; FP8
//   e4m3 with one scale per pooled key, max(amax, 1e-4) / 448 (`fp32_amax`) or its power-of-two
//   ceiling when `scale_fmt` is set; stored in pages of 64 pooled slots, [64 x 128 e4m3][64 f32
//   scales], 132 B per pooled key. sglang_pooled_fp8 below computes those values (not the pages).
//
// Inputs must be finite: check_pool_inputs (which the layer runs first) throws Error naming the
// tensor and element otherwise; a NaN gate would make a whole pool's softmax NaN, and a pooled key is
// never masked.
#pragma once

#include <cstdint>
#include <string>

#include "ref/numerics.h"
#include "ref/tensor.h"

namespace indexshare::ref::kpool {

enum class PoolRounding { f32, hf_bf16 };
std::string rounding_name(PoolRounding r);          // "f32" / "hf-bf16"
PoolRounding parse_rounding(const std::string& name);  // throws Error naming the bad value

// floor(T / P): the complete pools over T keys (P >= 1, T >= 0).
int64_t complete_pools(int64_t T, int64_t P);

// Checks k [T, D], g [T, D], ape [P, D] (P >= 1, D >= 1, all finite); throws Error naming the
// tensor and the field.
void check_pool_inputs(const Tensor<float>& k, const Tensor<float>& g, const Tensor<float>& ape);

// z [n_pools, P, D] = f32(g[pP + j, d] + ape[j, d]): the pooling logits ("g + ape").
Tensor<float> pool_logits(const Tensor<float>& g, const Tensor<float>& ape);

// Kbar [n_pools, D] from k [T, D] and the logits z [n_pools, P, D] (n_pools = floor(T / P)).
Tensor<float> pool_keys(const Tensor<float>& k, const Tensor<float>& z, PoolRounding rounding);

// One pool's channel d: the operation sequence of pool_keys for z_j = z[j * stride], k_j =
// k[j * stride], j = 0 .. P - 1 (simd/ runs this very sequence per channel).
float pool_channel(const float* z, const float* k, int64_t P, int64_t stride, PoolRounding rounding);

// SGLang's cached form of f32 pooled keys kbar [n, D] (D a power of two): rotated =
// bf16(hadamard(bf16(kbar))) (f32 values; ref::hadamard_transform), then one scale per pooled key,
// s = f32(max(amax, 1e-4) / 448) (pow2: pow2_ceil(s), SGLang's `scale_fmt`), and codes [n, D] =
// e4m3(clamp(rotated / s, +-448)) (f32 divide; ref/numerics.h's saturating encoder).
struct PooledFp8 {
  Tensor<float> rotated;  // [n, D] bf16 values
  Tensor<e4m3_t> codes;   // [n, D]
  Tensor<float> scale;    // [n]
};
PooledFp8 sglang_pooled_fp8(const Tensor<float>& kbar, bool pow2);

}  // namespace indexshare::ref::kpool
