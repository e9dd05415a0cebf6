// indexshare: the backward of the sparse attention (ref/attention.h): the exact gradients a sparse
// MLA training kernel (TileLang's sparse_mla_bwd and its relatives) must produce, and beside them a
// kernel-like low-precision emulation from which a judge can size its tolerances.
//
// Shapes: the forward's inputs, q bf16 [s_q, h_q, d_qk]; kv bf16 [s_kv, 1, d_qk] (one kv head:
// K = kv[:, 0, :] and V = kv[:, 0, :d_v] share the latent); indices int32 [s_q, 1, topk] (rows of
// kv); optional topk_length int32 [s_q]; optional attn_sink f32 [h_q]; and dO bf16 [s_q, h_q, d_v],
// the gradient of the loss with respect to the forward's out.
//
// Policies (the forward's, ref/attention.h):
//   slots    row t uses its slots j < topk_length[t] (all topk without topk_length); an index
//            outside [0, s_kv) (-1 padding or any other) is ignored wherever it sits, and so are
//            the slots past topk_length whatever they hold.
//   dups     a duplicated index counts once per occurrence: each occurrence is one term of the
//            softmax and adds its own contribution to dkv (TileLang's kernel adds every occurrence;
//            its autograd reference counts each index once: we follow our forward and the kernel).
//   empty    a row without a valid index has out 0 and no dependence on anything: Delta = 0,
//            dq = 0, P = dS = 0, and it adds nothing to dkv or d_sink.
//
// Math for query row t, head h, over its valid kv rows i (sorted ascending, duplicates kept):
//   s_i    = sm_scale * q[t,h,:] . kv[i,:]            the forward's logits
//   lse    = ln sum_i exp(s_i)                        (natural log, without the sink: the forward's)
//   f      = 1 / (1 + exp(sink[h] - lse))             the forward's sink factor (1 without a sink)
//   P_i    = f exp(s_i - lse) = exp(s_i) / (sum_j exp(s_j) + exp(sink[h]))
//            the probabilities with the sink folded in: the sink is one more logit whose value row
//            is zero, so out = sum_i P_i V_i and the usual softmax backward holds with this P
//   dP_i   = dO[t,h,:] . V_i
//   Delta  = sum_i P_i dP_i                           = sum_c O_c dO_c (c < d_v) with O = sum_i P_i V_i
//            the forward's EXACT out (the two are equal in exact arithmetic; the backward forms the
//            first, which needs no O): a kernel that forms Delta from its bf16 out (TileLang's
//            does) carries that rounding into every dS, within the judge's bounds
//            (delta_from_bf16_out); Delta summed in bf16 is the bug the judge names
//   dS_i   = P_i (dP_i - Delta)                       dL/ds_i, with respect to the SCALED logit
//            (TileLang's dS is sm_scale times this: it differentiates the raw q . k)
//   dq     = sm_scale sum_i dS_i kv[i, :]             (all d_qk columns)
//   dkv[j] = sm_scale sum_{(t,h,i): i = j} dS_i q[t,h,:]      the K part, all d_qk columns
//          +          sum_{(t,h,i): i = j} P_i dO[t,h,:]      the V part, columns < d_v only
//   d_sink[h] = -sum_t (1 - f) Delta                  out = f out0 and df/dsink = -f (1 - f), so
//            dL/dsink = -(1 - f) dO . out; equivalently P_sink (0 - Delta) with P_sink = 1 - f.
//            A sink of +inf (f = 0, out = 0) and -inf (f = 1) both give 0.
//
// Arithmetic, all in double, each output rounded to f32 once at the end (bf16 copies of dq and dkv
// are bf16 of those f32, round to nearest even):
//   forward  s_i (the 8-part dot of ref/attention.h), m = max s_i, e_i = exp_portable(s_i - m),
//            l = sum e_i (i ascending), lse = m + log(l), factor = (1 / l) * f: the forward's
//            operations, so lse equals ref::sparse_attention's bit for bit (a test). O itself is
//            not formed (the forward's P.V, d_v multiply-adds per key and head, is not needed)
//   P_i      e_i * factor
//   dP_i     the 8-part dot of dO and V_i (bf16 x bf16 products, exact in double)
//   Delta    acc = fma(P_i, dP_i, acc) over the sorted valid list, i ascending, from 0
//   dS_i     P_i * (dP_i - Delta)
//   dq       a_d = fma(dS_i, kv[i,d], a_d), i ascending, from 0 (a fused multiply-add chain, as
//            the forward's O); dq = f32(sm_scale * a_d)
//   dkv      A_K[j,d] = fma(dS_i, q[t,h,d], A_K[j,d]) and A_V[j,c] = fma(P_i, dO[t,h,c], A_V[j,c])
//            over query rows t ascending, then heads h ascending, then the row's sorted valid list
//            ascending (a duplicate's occurrences one after the other); dkv[j,c] =
//            f32(sm_scale * A_K[j,c] + A_V[j,c]) for c < d_v, f32(sm_scale * A_K[j,c]) beyond;
//            kv rows nobody selects get 0
//   d_sink   acc = 0, then acc -= (1 - f) * Delta over t ascending (rows with keys only)
// The order of the slots never matters (the valid rows are sorted first), so permuting a row's
// slots or padding it with -1 anywhere gives the same bits.
// Memory: the per-slot outputs p and ds are [s_q, h_q, topk] f32 each (2 GiB each at s_q 4096,
// h_q 64, top-k 2048): `slots = false` leaves them out (shape [s_q, h_q, 0]). ref holds one (t, h)'s
// doubles at a time; simd/ processes chunks of query rows, so that its double P and dS exist for
// one chunk only (the order above is per element, so chunking changes no bit).
//
// Changes from the first version of this specification (for a fast bit-identical simd/ mirror):
// dq's and dkv's chains are fused multiply-adds (they were a multiply, then an add); Delta is
// sum_i P_i dP_i (it was the 8-part dot of the recomputed exact O and dO: equal in exact
// arithmetic, different in the last bits), so `out` is no longer an output; p and ds may be left out.
#pragma once

#include <cstdint>
#include <vector>

#include "ref/attention.h"
#include "ref/tensor.h"

namespace indexshare::ref {

struct AttentionBackwardOut {
  Tensor<float> out;        // [0] from sparse_attention_backward (it does not form O); the lowp
                            // emulation's out; read by attention_backward_bounds and
                            // hypothesis_delta_from_bf16_out, whose callers set it to the forward's out
  Tensor<float> lse;        // [s_q, h_q]       the forward's lse (natural log, without the sink)
  Tensor<float> delta;      // [s_q, h_q]       sum_i P_i dP_i (= O . dO from the exact O)
  Tensor<float> p;          // [s_q, h_q, topk] P of each slot (sink folded in); 0 on ignored slots ([s_q, h_q, 0] without slots)
  Tensor<float> ds;         // [s_q, h_q, topk] dS of each slot (w.r.t. the scaled logit); 0 on ignored slots (likewise)
  Tensor<float> dq;         // [s_q, h_q, d_qk]
  Tensor<bf16_t> dq_bf16;   // [s_q, h_q, d_qk] = bf16(dq)
  Tensor<float> dkv;        // [s_kv, 1, d_qk]
  Tensor<bf16_t> dkv_bf16;  // [s_kv, 1, d_qk] = bf16(dkv)
  Tensor<float> d_sink;     // [h_q] with attn_sink, else [0]
};

// The forward's checks (check_attention_inputs, indices, topk_length) and dO [s_q, h_q, d_v];
// throws Error naming the tensor. simd/ calls it too.
void check_attention_backward_inputs(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                     const Tensor<int32_t>& indices, int64_t d_v, const Tensor<bf16_t>& d_out,
                                     const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink);

AttentionBackwardOut sparse_attention_backward(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                               const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                               const Tensor<bf16_t>& d_out,
                                               const Tensor<int32_t>* topk_length = nullptr,
                                               const Tensor<float>* attn_sink = nullptr);
// The same with the per-slot outputs p and ds only when `slots` (else [s_q, h_q, 0]; every other
// output the same bits).
AttentionBackwardOut sparse_attention_backward(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                               const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                               const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                               const Tensor<float>* attn_sink, bool slots);
// The backward's outputs, allocated (out [0]; p and ds [s_q, h_q, slots ? topk : 0]); simd/ uses it too.
AttentionBackwardOut make_attention_backward_out(int64_t s_q, int64_t h_q, int64_t d_qk, int64_t topk, int64_t s_kv,
                                                 bool sink, bool slots);

}  // namespace indexshare::ref

namespace indexshare::cmp {

// The backward at a TileLang-like kernel's precision (its sparse_mla_bwd), naive and in a fixed
// order, so that its distance from the exact gradients says how far a correct low-precision kernel
// lands (the tolerances a judge derives for `diff` on gradients):
//   forward   the budget's emulation (ref/bounds.h emulate_attention_lowp): f32 logits (d
//             ascending), f32 softmax (std::exp), lse = m + log(l) in f32; its out rounded to bf16
//             is the O the kernel saved
//   P_i       f32: exp(s_i - lse) * f, f = 1 / (1 + exp(sink - lse)) in f32
//   Delta     f32 sum_c bf16(O)_c * dO_c, c ascending: from the bf16 O (the kernel's)
//   dP_i      f32 sum_c dO_c V_ic, c ascending
//   dS_i      f32 P_i * (dP_i - Delta), then bf16(sm_scale * dS_i); P_i rounded to bf16 too, both
//             before each GEMM (TileLang)
//   dq        f32 sum_i bf16(sm_scale dS_i) kv[i,d], i ascending
//   dkv       per query row t and valid list position i, the tile sum_h (bf16(sm_scale dS) q[t,h,d]
//             + bf16(P) dO[t,h,d]) in f32 (heads ascending, the GEMM over heads), added in f32 to
//             dkv[i] over t ascending (the kernel's f32 atomics add in any order)
//   d_sink    f32 acc -= (1 - f) * Delta, t ascending
// ds holds bf16(sm_scale dS) / sm_scale (in f32), so that it compares with the truth's dS; p holds
// bf16(P). out and lse are the emulated forward's. Same inputs, checks and outputs as
// ref::sparse_attention_backward. bf16_acc: a coarser kernel (the judge's precision class
// "bf16-acc"): every partial sum of dq, of the dkv tile and of dkv rounded to bf16 after each add.
ref::AttentionBackwardOut emulate_attention_backward_lowp(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                          const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                          const Tensor<bf16_t>& d_out,
                                                          const Tensor<int32_t>* topk_length = nullptr,
                                                          const Tensor<float>* attn_sink = nullptr, bool bf16_acc = false);

// Per-element bounds on |candidate - truth| for dq and dkv from a kernel of the emulation's class
// (bf16 q, kv, dO; f32 logits, softmax and GEMM accumulation in any order; P and dS rounded to bf16
// before the GEMMs; the output possibly bf16). Unit roundoffs u = 2^-8 (bf16), e = 2^-24 (f32). For
// query row t, head h, its n valid list positions i, with the truth's P_i, dS_i, O and
//   G      = sm_scale max_i sum_d |q_d k_id|          the logit magnitude (as the forward's bounds)
//   a_i    = sum_c |dO_c V_ic|,  b = sum_c |O_c dO_c|  the magnitudes under dP_i and Delta
//   epsP   = u + 2 (d_qk + 2) e G + (n + 8) e        P's relative error: its bf16 rounding, the f32
//            logits' error moving exp(s_i - lse) (twice: s_i and lse), the f32 exp, sum and log
//   eDelta = (d_v + 2) e b  (+ u b when delta_from_bf16_out: Delta formed from the bf16 out, as
//            TileLang's kernel does)                  Delta's absolute error
//   E_i    = (u + epsP + e) |dS_i| + P_i ((d_v + 2) e a_i + eDelta)
//            dS_i's absolute error: its bf16 rounding, P's error, the f32 dP and Delta, the product
// then (the GEMMs' f32 accumulation over m terms, any order: (m + 2) e times the sum of |terms|)
//   dq[t,h,d] <= sm_scale (sum_i E_i |k_id| + (n + 2) e sum_i |dS_i k_id|) + u |dq|
//   dkv[j,c]  <= sum over j's contributions (t, h, i) of (sm_scale E_i |q_c| + epsP P_i |dO_c| [c < d_v])
//                + (N_j + 2) e sum (sm_scale |dS_i q_c| + P_i |dO_c| [c < d_v]) + u |dkv|
// (N_j = j's contributions; u |x|: the candidate's bf16 output rounding), each first-order in u and
// e and multiplied by kBackwardMultiple = 3 (an error source can reach its bound in more than one
// rounding step, as in the forward's bounds, ref/bounds.h). Evaluated in double from the truth's f32
// outputs (P, dS, out: relative 2^-24, inside the multiple), rounded up to f32 (cmp::bound_f32).
constexpr double kBackwardMultiple = 3.0;
struct AttentionBackwardBounds {
  std::vector<float> dq, dkv;  // per element of dq [s_q, h_q, d_qk] and dkv [s_kv, 1, d_qk]
};
AttentionBackwardBounds attention_backward_bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                  const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                  const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                  const ref::AttentionBackwardOut& exact, bool delta_from_bf16_out);
// Its input checks (the backward's inputs, and exact's p, ds, out, dq and dkv shapes); Error naming
// the field. simd's mirror runs the same.
void check_attention_backward_bounds_inputs(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                            int64_t d_v, const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                            const ref::AttentionBackwardOut& exact);

// The named hypothesis "Delta formed from the bf16 out" (TileLang's kernel computes Delta = sum
// bf16(O) dO): the exact gradients such a kernel would produce with every other step exact, from the
// truth. With d = sum_c (bf16(out_c) - out_c) dO_c (double; out the truth's f32 out, whose own
// rounding is 2^-24 relative), the kernel's Delta is Delta + d, so dS_i becomes dS_i - P_i d and
//   dq[t,h]  += -sm_scale d sum_i P_i kv_i       (on the first d_v columns: -sm_scale d out)
//   dkv[j]   += -sm_scale d P_i q[t,h]           per contribution (t, h, i) of row j
//   delta    += d;   d_sink[h] += -(1 - sum_i P_i) d
// (sum_i P_i = f). A judge names the bug when a candidate's error lies along this direction: it is
// correlated across all of a row's keys, and sized like a bf16 rounding of out, where the bounds of
// attention_backward_bounds (without delta_from_bf16_out) are mostly larger. Returns the full output
// set (out, lse, p as the truth's; ds shifted; bf16 copies of the shifted dq and dkv).
ref::AttentionBackwardOut hypothesis_delta_from_bf16_out(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                         const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                         const Tensor<bf16_t>& d_out,
                                                         const Tensor<int32_t>* topk_length,
                                                         const ref::AttentionBackwardOut& exact);

// TileLang's similarity of two gradients (its sparse_mla_bwd test, which passes at <= 1e-4):
// 1 - 2 sum(x y) / sum(x^2 + y^2) over all elements, in double (0 for two zero tensors).
double gradient_similarity(const Tensor<float>& x, const Tensor<float>& y);

}  // namespace indexshare::cmp
