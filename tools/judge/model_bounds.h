// indexshare: the bound of a transformers model's own attention (attn.model_out of a model dump)
// against the golden's latent output; judge/model_bounds.cc.
#pragma once

#include <vector>

#include "ref/tensor.h"

namespace indexshare::cmp {

// ---- A transformers model's own attention (python -m indexshare.dump) ---------------------------
// HF's eager/sdpa MLA is dense and non-absorbed: for head h it expands the normalised latent c_i
// [r] (kv[i, 0, :r], bf16) into k_nope = bf16(c_i W_uk[h]^T) and V_i = bf16(c_i W_uv[h]^T), attends
// with the top-k mask, and hands o_proj the per-head context out[t, h, :v] in the model dtype. The
// golden's attn.out is the absorbed latent output o[t, h, :] = sum_i p_i c_i [r], so the expected
// model output is its image under W_uv (map_latent_output):
//   expected[t, h, j] = sum_r W_uv[h, j, r] o[t, h, r]      (double, r ascending, rounded to f32 once)
// which equals sum_i p_i (c_i W_uv[h]^T)_j exactly by linearity. The model differs from it by its
// rounding; model_attention_bounds derives a per-element bound for that rounding, worst case,
// with no multiple. For query row t, head h, the valid keys i of the row (the indices used; S the
// key count of the dense reduction, masked keys adding exact zeros), u = 2^-8 (bf16; round to
// nearest gives half, the factor 2 covers truncating hardware), e = 2^-24 (f32), c_i = kv[i, 0, :r]:
//   x_i exact logit sm q[t,h].kv[i] (the golden's inputs), p_i = softmax(x)_i,
//   k_in = (c_i W_uk[h]^T)_n and V_ij = (c_i W_uv[h]^T)_j exact (double), with their magnitudes
//   Km_in = sum_r |W_uk[h,n,r] c_i,r|, M_ij = sum_r |W_uv[h,j,r] c_i,r|, and per key
//   A1 = sum_r |q_abs,r c_i,r|, A2 = sum_n |q_nope,n k_in|, A3 = sum_n |q_nope,n| Km_in,
//   A4 = sum_{rope} |q k| (each the magnitude of one part of the logit):
// 1. logit error |x_model,i - x_i| <= delta_i:
//      delta_i = sm [ (1 + u) u A1            the golden's q_abs = bf16(q_nope W_uk)
//                   + u A2                    the model's k_nope rounded to bf16
//                   + (n + r) e A3            their f32 sums (over n = nope in q_abs, r in kv_b_proj)
//                   + (d_qk + 2) e (1 + u)(A3 + A4) ]   the model's f32 dot over d_qk
//              + (2u + u^2) |x_i|   logits_rounded (eager): q.k rounded to bf16, then q.k * scaling again
//              + 4 e |x_i|          otherwise (sdpa): logits in f32 (torch's sdpa kernels compute q.k in
//                                   f32; its math path, which CPU takes when v_head_dim != qk_head_dim,
//                                   upcasts bf16 to f32 unless torch.backends.cuda.
//                                   allow_fp16_bf16_reduction_math_sdp(True), which the dump records and
//                                   which then counts as logits_rounded)
// 2. probabilities: with Lb = ln sum_i p_i e^delta_i (>= |ln of the perturbed normaliser|, by
//    Jensen) and a_i = delta_i + Lb, |p'_i - p_i| <= p_i (e^a_i - 1) <= the model's p'_i <= p_i e^a_i.
// 3. with vr_ij = u |V_ij| + (1 + u) r e M_ij (the model's V = bf16 of an f32 sum over r) and
//    W_j = sum_i p_i e^a_i (|V_ij| + vr_ij) (bounds sum_i p'_i |V_model,ij|):
//    bound[t,h,j] = sum_i p_i (e^a_i - 1) |V_ij|          the logit error moving every p_i
//                 + sum_i p_i e^a_i vr_ij                 V rounded
//                 + (u + (S + 8) e) W_j                   P cast to bf16 after an f32 softmax over S
//                                                         keys (eager), or exps rounded to bf16 with
//                                                         f32 rescaling (sdpa's flash kernel)
//                 + (S + 2) e (1 + 2u)(1 + u) W_j         P.V accumulated in f32 over S keys
//    then bound += u (|expected| + bound)                 the output rounded to bf16
//         bound += 2 e sum_r |W_uv[h,j,r]| |o_r| + e |expected|   the golden's latent in f32, and
//                                                         expected rounded to f32
// Cost O(s_kv h r (n + v) + s_q h topk (d_qk + n + v)), the order of the attention itself.
// Measured on the tests' tiny GLM and DeepSeek-V3.2 models with peaked logits (rms ~2): max
// |err| / bound 0.10-0.13 (sdpa), 0.11-0.13 (eager), 0.09-0.10 (DeepSeek-V3.2, sdpa). Systematic
// errors far below the bound are the structure tests' (floor kFloorOut).
// Shapes: q bf16 [s_q, h, r + R], kv bf16 [s_kv, 1, r + R], indices [s_q, 1, topk] (kv rows),
// q_nope bf16 [s_q, h, n], w_uk bf16 [h, n, r], w_uv bf16 [h, v, r], latent [s_q, h, r] (the
// golden's out), expected [s_q, h, v] (map_latent_output). Throws Error on mismatched shapes.
constexpr double kModelUnit = 0x1p-8;
Tensor<float> map_latent_output(const Tensor<float>& latent, const Tensor<bf16_t>& w_uv);
std::vector<float> model_attention_bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                           float sm_scale, const Tensor<bf16_t>& q_nope, const Tensor<bf16_t>& w_uk,
                                           const Tensor<bf16_t>& w_uv, const Tensor<float>& latent,
                                           const Tensor<float>& expected, bool logits_rounded);

}  // namespace indexshare::cmp
