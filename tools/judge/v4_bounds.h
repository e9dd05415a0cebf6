// indexshare diff: per-element bounds for a DeepSeek-V4 set's compressor entries, indexer scores
// and rotated attention output (tools/lib/golden_v4.h). The contract: f32 arithmetic in any order
// (a GPU kernel's reduction trees, FMA or not, approximate exp / rsqrt / sin / cos).
//
// Notation: u = 2^-24, gamma(n) = n u / (1 - n u) (Higham: a sum or product chain of n f32
// operations in any order has a relative error at most gamma(n) of its magnitude sum). The bound
// on |candidate - golden| is TWICE the bound derived below for one computation's error from the
// exact value: the golden's own arithmetic (f32 weights, f32 roundings of the pooled value, norm
// and RoPE) is of the same class, and |cand - gold| <= |cand - exact| + |gold - exact|. The
// derivation is first order in u: the second-order terms (products of two gammas, about 1e-12
// relative) are far inside that factor 2. Bounds are computed in double from the golden's inputs
// and stored as the f32 at or above them (cmp::bound_f32).
//
// Compressor entry (ref/v4/compressor.h) w, channel c, over its n_s slots j (2m with overlap, m
// for w = 0 or without overlap): z_j = f32(gate + bias) (one rounding, the same in any order),
//   softmax weights   p_j = exp(z_j - max z) / sum: each within eps_p p_j,
//                     eps_p = gamma(n_s + 8) + 3 u (max z - min z)
//                     (max subtraction, exp at <= 4 ulp, the n_s-term sum, the division; the
//                     rounding of the exponent's argument moves exp by u |z_j - max| relative,
//                     3 u dz also covers exp2(x log2 e) evaluations)
//   pooled            P_c = sum_j p_j v_j: e_P = (eps_p + gamma(n_s)) A_c, A_c = sum_j p_j |v_j|
//   RMSNorm           r = (sum_c P_c^2 / D + eps)^-1/2, y_c = P_c r w_c:
//                     e_r = r^3 / D sum_c |P_c| e_P,c + r (gamma(D + 2) / 2 + 4 u)
//                     (dr / dP_c = -r^3 P_c / D; the mean of D squares and the rsqrt)
//                     e_y = |w_c| (r e_P + |P_c| e_r) + gamma(2) |y_c|
//   RoPE              on the trailing rope_dim channels, pairs (a, b) at position pos = w m:
//                     a' = a cos - b sin, b' = b cos + a sin (|cos|, |sin| <= 1):
//                     e_a' = e_a + e_b + (eps_cs + gamma(2)) (|a| + |b|), the same for b', with
//                     eps_cs = 8 u (pos inv_freq_j + 1): cos / sin of an angle that two
//                     implementations compute with inv_freq to a few ulp (double vs f32 pow) and
//                     the product pos inv_freq rounded, u times the angle each
// Indexer score I[t, s] = D_I^-1/2 sum_h w_h ReLU(q_h . K_s), s causal (golden -inf elsewhere):
//   dot               |d dot_h| <= gamma(D_I + 2 log2 D_I + 4) |q_h|_2 |K_s|_2 + sum_d |q_hd| e_K,sd
//                     (any order, the Hadamard rotation of both sides included: orthogonal, its
//                     butterflies log2 D_I roundings per element; e_K: the entries' bound above,
//                     so a candidate scoring its own in-bound entries passes); ReLU is 1-Lipschitz
//   sum               e_I = D_I^-1/2 [sum_h |w_h| |d dot_h| + gamma(H_I + 3) sum_h |w_h| ReLU(dot_h)]
// Rotated attention output (attn.out_rotated, the inverse RoPE at the query position t): from
// the kernel output's bound b (ref/bounds.h) on the pair (a, b):
//   e_a' = b_a + b_b + 2 (eps_cs + gamma(2)) (|a| + |b|)   (eps_cs at pos = t), the others b.
#pragma once

#include <cstdint>
#include <vector>

#include "ref/tensor.h"
#include "ref/v4/compressor.h"
#include "ref/v4/indexer.h"

namespace indexshare::diff::v4b {

// Bounds for compress(kv, gate, bias, norm_weight, p)'s entries [n_w, D] (the same inputs).
std::vector<float> compressor_bounds(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& bias,
                                     const Tensor<float>& norm_weight, const ref::v4::CompressorParams& p);

// Bounds for index_scores(q, k_comp, weights, ratio, ...) [T, n_b]; k_bound: the entries' bounds
// [n_b * D_I] (compressor_bounds of the indexer's compressor). 0 on the non-causal positions.
std::vector<float> index_score_bounds(const Tensor<float>& q, const Tensor<float>& k_comp, const Tensor<float>& weights,
                                      int64_t ratio, const std::vector<float>& k_bound);
// The same bound with each row's visible entries [0, ke[t]) given (GLM-5.3's pooled scores,
// judge/kpool.cc: ke the pools visible to the row).
std::vector<float> index_score_bounds(const Tensor<float>& q, const Tensor<float>& k_comp, const Tensor<float>& weights,
                                      const Tensor<int32_t>& ke, const std::vector<float>& k_bound);

// One softmax-weighted pool sum_j softmax_j(z) v_j over n slots (z the f32 logits): one
// computation's error from the exact value, (eps_p + gamma(n)) sum_j p_j |v_j| (the header's
// "softmax weights" and "pooled" lines); the exact value (double) in *pooled.
double softmax_pool_error(const double* z, const double* v, size_t n, double* pooled);

// Bounds for the inverse-RoPE'd output [T, H, D] from the kernel output `out` and its bounds.
std::vector<float> rotated_bounds(const Tensor<float>& out, const std::vector<float>& out_bound,
                                  const ref::v4::RopeParams& rope);

}  // namespace indexshare::diff::v4b
