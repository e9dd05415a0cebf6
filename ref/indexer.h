// indexshare: the indexer's logits at kernel level, with DeepGEMM `fp8_mqa_logits` semantics.
//
//   logits[t, s] = k_scale[s] * sum_h weights[t, h] * ReLU(q[t, h, :] . k[s, :])   ks[t] <= s < ke[t]
//   logits[t, s] = -inf                                                            otherwise
//
// Shapes: q [s_q, H, D], k [s_kv, D], k_scale [s_kv] (f32), weights [s_q, H] (f32),
// ks / ke [s_q] (int32, half-open bounds, 0 <= ks <= ke <= s_kv); out [s_q, s_kv] f32.
// q carries no scale of its own: the q scale, D^-0.5 and H^-0.5 are folded into `weights`.
//
// Evaluation order (the rule the SIMD path reproduces bit for bit):
//   1. dot_h = sum over d = 0..D-1, ascending, of q[t,h,d] * k[s,d], in double.
//      FP8 mode: every e4m3 value is an integer multiple of 2^-9 of magnitude <= 448 < 2^9, so a
//      product is an integer multiple of 2^-18 of magnitude < 2^18 (that is, an integer below 2^36
//      times 2^-18) and D such products sum to an integer below D * 2^36 times 2^-18. For
//      D <= 2^17 that integer stays below 2^53, so every product and every partial sum is exact
//      in double: the dot product is the exact real number, whatever the order.
//   2. acc = 0; for h = 0..H-1 ascending: acc = acc + double(weights[t,h]) * max(dot_h, 0),
//      a double multiply then a double add (never fused).
//   3. logits[t, s] = float(acc * double(k_scale[s])): the only rounding to f32.
// Unquantized mode (the HF transformers indexer: no Hadamard, no FP8) takes q and k as f32
// (bf16 values widened) and follows the same order; its dot products are exact per product
// (f32 x f32 fits in double) but the sum of D products rounds in double; k_scale is usually 1.
#pragma once

#include <cstdint>

#include "ref/tensor.h"

namespace indexshare::ref {

// Checks the shapes and the row bounds shared by both modes; throws Error naming the tensor.
void check_indexer_inputs(const Shape& q, const Shape& k, const Tensor<float>& k_scale,
                          const Tensor<float>& weights, const Tensor<int32_t>& ks,
                          const Tensor<int32_t>& ke);

// FP8 mode: q e4m3 [s_q, H, D], k e4m3 [s_kv, D].
Tensor<float> indexer_logits_fp8(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                                 const Tensor<float>& k_scale, const Tensor<float>& weights,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke);

// Unquantized mode: q f32 [s_q, H, D], k f32 [s_kv, D].
Tensor<float> indexer_logits_f32(const Tensor<float>& q, const Tensor<float>& k,
                                 const Tensor<float>& k_scale, const Tensor<float>& weights,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke);

}  // namespace indexshare::ref
