// indexshare: sparse attention with FlashMLA `flash_mla_sparse_fwd` semantics, and the dense
// causal attention it must equal when every key is selected.
//
// Shapes: q bf16 [s_q, h_q, d_qk]; kv bf16 [s_kv, 1, d_qk] (one kv head; V = kv[:, 0, :d_v]);
// indices int32 [s_q, 1, topk] (rows of kv); optional topk_length int32 [s_q];
// optional attn_sink f32 [h_q]. Outputs: out f32 [s_q, h_q, d_v] (from double math),
// out_bf16 [s_q, h_q, d_v] (= bf16(out), round to nearest even), max_logits and lse f32 [s_q, h_q].
//
// Semantics, for each query row t and head h:
//   slots    j < topk_length[t] (all topk slots without topk_length); an index outside [0, s_kv)
//            is ignored wherever it sits (-1 padding, but also any other negative or too large
//            value); a duplicated index counts once per occurrence.
//   logits   P_i = (q[t,h,:] . kv[i, 0, :]) * sm_scale over the valid indices i
//   outputs  max_logits = max P;  lse = ln sum exp(P)  (natural log, WITHOUT the sink);
//            out = sum softmax(P)_i * V[i]
//   sink     out *= exp(lse) / (exp(lse) + exp(sink[h])) = 1 / (1 + exp(sink[h] - lse));
//            sink +inf gives out = 0, -inf leaves out unchanged; lse and max_logits unaffected.
//   empty    a row with no valid index: out = 0, lse = +inf, max_logits = -inf (FlashMLA HEAD).
// Arithmetic, all in double, each output rounded to f32 once at the end:
//   order    the valid indices are sorted ascending by kv row before any sum, so the result does
//            not depend on the order of the slots (slot order carries no meaning in any GPU
//            stack) and a sparse call that selects every key equals the dense call bit for bit.
//   q . k    the 8-part order (dot8 below): part r (r = 0..7) sums the products of the dims
//            d = r (mod 8) with d ascending; dot = ((part0 + part4) + (part2 + part6)) +
//            ((part1 + part5) + (part3 + part7)): what an 8-wide vector loop over d followed by
//            halving folds computes, so simd/ performs exactly these operations. bf16 x bf16
//            products are exact in double.
//   exp      exp_portable (ref/numerics.h): the same bits on every machine and in simd/.
//   lse      m + log(l) with the C library's log (once per row and head).
//   P . V    acc = fma(p_i, V[i][c], acc) over i ascending, one fused multiply-add per term.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ref/tensor.h"

namespace indexshare::ref {

struct AttentionOut {
  Tensor<float> out;       // [s_q, h_q, d_v]
  Tensor<bf16_t> out_bf16; // [s_q, h_q, d_v]
  Tensor<float> max_logits;// [s_q, h_q]
  Tensor<float> lse;       // [s_q, h_q]
};

// The shape checks both attention functions start with (q rank 3, kv [s_kv, 1, d_qk] with q's
// d_qk, 1 <= d_v <= d_qk, sink [h_q]); throws Error naming the tensor. simd/ calls it too.
void check_attention_inputs(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, int64_t d_v,
                            const Tensor<float>* attn_sink);

// The valid kv rows of query row t: the slots j < topk_length[t] (every slot without topk_length)
// whose index lies in [0, s_kv), sorted ascending, duplicates kept: the order every sum over a
// row's keys runs in (the forward, its backward and the bounds).
std::vector<int64_t> valid_kv_rows(const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length, int64_t t,
                                   int64_t s_kv);

AttentionOut sparse_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                              const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                              const Tensor<int32_t>* topk_length = nullptr,
                              const Tensor<float>* attn_sink = nullptr);

// Dense attention: row t attends to every kv row in [ks[t], ke[t]) (the causal window of the
// row in the flattened key tensor), with the same outputs and rules as sparse_attention.
AttentionOut dense_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                             int64_t d_v, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                             const Tensor<float>* attn_sink = nullptr);

}  // namespace indexshare::ref
