// indexshare diff: per-element bounds for a HY V4 set's indexer intermediates and gated output
// (tools/lib/golden_hyv4.h). The contract and notation are judge/v4_bounds.h's: f32 arithmetic in
// any order (reduction trees, FMA or not, approximate exp / rsqrt / sin / cos); u = 2^-24,
// gamma(n) = n u / (1 - n u); the bound on |candidate - golden| is TWICE one computation's error
// from the exact value (the golden's own roundings are of the same class), first order in u,
// computed in double from the golden's inputs and stored as the f32 at or above it (cmp::bound_f32).
//
//   k_norm   LayerNorm y = (x - mu) r w + b, r = (var + eps)^-1/2, over the D dims of a key, the
//            mean and variance in one or two passes:
//              e_mu = gamma(D + 1) sum |x| / D,  e_c = e_mu + u |x - mu|
//              e_var = gamma(D + 2) sum x^2 / D + 2 |mu| e_mu   (covers E[x^2] - mu^2 as well)
//              e_r = r^3 / 2 e_var + 4 u r                        (the add and an approximate rsqrt)
//              e_y = |w| (r e_c + |x - mu| e_r) + gamma(3) (|(x - mu) r w| + |b|)
//   RoPE     the rope slice (trailing, or leading for the layout hypothesis) of each head at the
//            row's position pos, pairs (a, b) of the input with bound (e_a, e_b):
//              e_a' = e_b' = e_a + e_b + 2 (eps_cs + gamma(2)) (|a| + |b|),  eps_cs = 8 u (pos f_j + 1)
//            (the pass slice: the input's bound, 0 for the exact bf16 q)
//   weights  (raw * f32(H^-1/2)) * f32(D^-1/2), or one product by f32((H D)^-1/2): 6 u |w|
//   scores   I[t, s] = sum_h w_h ReLU(q_h . k_s), s < ke[t] (0 elsewhere: the -inf are compared exactly):
//              e_dot,h = gamma(D + 2) sum_d |q_hd k_sd| + sum_d (e_q,hd |k_sd| + |q_hd| e_k,sd)
//              e_I = 2 [sum_h (|w_h| e_dot,h + e_w,h ReLU(dot_h)) + gamma(H + 2) sum_h |w_h| ReLU(dot_h)]
//            (the input bounds e_q, e_k, e_w: the bounds above, halved; ReLU is 1-Lipschitz)
//   o_v      o[t, h, j] = sum_c W_uv[h, j, c] out[t, h, c], out within b_out:
//              e_o = sum_c |W| b_out,c + 2 gamma(dv + 1) sum_c |W out|
//   gated    g = o_v sigmoid(gate), the sigmoid within 8 u sig (exp to 4 ulp, the add and the division):
//              e_g = sig e_o + 2 (8 u sig |o_v| + gamma(2) |g|)
#pragma once

#include <cstdint>
#include <vector>

#include "ref/hyv4/layer.h"
#include "ref/tensor.h"

namespace indexshare::diff::hyb {

// Bounds for the LayerNorm of k [s_kv, D] with w, b [D].
std::vector<float> k_norm_bounds(const Tensor<float>& k, const Tensor<float>& w, const Tensor<float>& b);
// Bounds for rope_slice(x, first_pos, p) of x [rows, ..., D] whose elements are within in_bound
// (empty: exact), row r at position first_pos + r; p.slice says which dims rotate.
std::vector<float> rope_bounds(const Tensor<float>& x, const std::vector<float>& in_bound, int64_t first_pos,
                               const ref::hyv4::IndexerParams& p);
// Bounds for indexer_weights (any f32 evaluation of the scaling).
std::vector<float> weights_bounds(const Tensor<float>& weights);
// Bounds for the scores [s_q, s_kv] from q_rope [s_q, H, D], k_rope [s_kv, D], weights [s_q, H],
// the causal ends ke [s_q] and the three inputs' bounds.
std::vector<float> score_bounds(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w,
                                const Tensor<int32_t>& ke, const std::vector<float>& q_bound,
                                const std::vector<float>& k_bound, const std::vector<float>& w_bound);
// Bounds for o_v [s_q, h_q, V] from the kernel output out [s_q, h_q, dv], its bounds and w_uv [h_q, V, dv].
std::vector<float> o_v_bounds(const Tensor<float>& out, const std::vector<float>& out_bound, const Tensor<float>& w_uv);
// Bounds for gated from o_v, its bounds and gate [s_q, h_q, V].
std::vector<float> gated_bounds(const Tensor<float>& o_v, const std::vector<float>& o_v_bound, const Tensor<float>& gate);

}  // namespace indexshare::diff::hyb
