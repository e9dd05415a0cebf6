// indexshare: a family of *correct* kernel emulations, the judge's calibration set.
//
// Each member computes what a correct GPU kernel computes, at the kernel's precision and in one
// of the orders real kernels use, so its error against the exact golden is legitimate rounding
// noise. The structure tests (judge/structure.h) and the anchors must pass every member on every
// problem (indexshare calibrate measures it over hundreds of runs); fault injection on top of a
// member measures what the judge detects.
//
// Sparse attention (FlashMLA sparse prefill / decode semantics, ref/attention.h), for each row t
// and head h over the valid indices i:
//   logits   s_i = f32 dot(q[t,h], kv[i]) (8 partial sums over d mod 8, folded in pairs, as a
//            vector unit does), then times sm_scale in f32 (or, exp2 variants, times the f32
//            constant sm_scale * log2(e), FlashMLA's folding)
//   order    the valid indices ascending, in slot order, or descending
//   softmax  two-pass (global max first) or online over blocks of `block` keys (running max,
//            accumulator rescaled by exp(m_old - m_new)), optionally split into `splits`
//            contiguous parts merged by their LSE (split-KV decode, FlashMLA's combine)
//   P        p_i = exp(s_i - m) in f32, rounded to bf16 (round to nearest even) before the PV
//            product; the output's normaliser sums the f32 p_i (FlashAttention) or the rounded
//            ones (weights that sum to 1 exactly); the LSE always sums the f32 p_i (a kernel whose
//            LSE summed the rounded ones would err by ~2^-9 and fail FlashMLA's own lse test)
//   PV       f32 accumulation, round to nearest, or truncating toward zero after each term
//            (tensor-core f32 accumulation, Fasi et al. 2021)
//   outputs  out = acc / l (times the sink factor 1 / (1 + exp(sink - lse))), f32 or rounded to
//            bf16; lse = m + ln l (exp2 variants: (m2 + log2 l) ln 2); max_logits = m
// Indexer logits (DeepGEMM fp8_mqa_logits semantics, ref/indexer.h): sum_h w[t,h] relu(q.k) k_scale
//   f32      f32 dot over D in blocks of `d_block` (partial sums added in f32), heads ascending or
//            descending, all in f32
//   fp8_14   Hopper's FP8 tensor core: exact products summed per 32-element MMA step, the
//            accumulator truncated toward zero to 14 significant bits after each step
#pragma once

#include <cstdint>
#include <utility>
#include <string>
#include <vector>

#include "ref/attention.h"
#include "ref/tensor.h"

namespace indexshare::emul {

struct AttentionVariant {
  enum class Order { ascending, slots, descending };
  Order order = Order::ascending;
  int block = 0;              // 0: two-pass softmax; > 0: online softmax over blocks of this many keys
  int splits = 1;             // split-KV parts merged by LSE
  bool exp2 = false;          // base 2 with sm_scale * log2(e) folded
  bool l_from_bf16 = false;   // the output's normaliser sums the bf16-rounded probabilities
  bool truncate_acc = false;  // PV accumulation truncates toward zero
  bool out_bf16 = true;       // output rounded to bf16
  // Lower-precision arithmetic (not in the correct family: the precision classes and the faults
  // the judge must name, judge/precision.h):
  bool logits_bf16 = false;   // each q.k logit rounded to bf16 before the softmax
  bool products_bf16 = false; // each q_d k_d product rounded to bf16 before the f32 sum
  bool acc_bf16 = false;      // P.V accumulated in bf16 (every partial sum rounded to bf16)
  std::string name() const;
};
// A (row, key) element of the logits.
using RowCol = std::pair<int64_t, int64_t>;
// The members calibrate cycles through.
std::vector<AttentionVariant> attention_family();

ref::AttentionOut attention(const AttentionVariant& v, const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                            const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                            const Tensor<int32_t>* topk_length = nullptr, const Tensor<float>* attn_sink = nullptr);

// The indices with each row's last (last) or first valid slot (in [0, s_kv), within topk_length)
// set to -1: a kernel whose loop over the top-k slots is off by one. `dropped`, when given,
// receives how many rows lost a key.
Tensor<int32_t> drop_one_key(const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length, int64_t s_kv, bool last,
                             int64_t* dropped = nullptr);

struct LogitsVariant {
  bool fp8_14 = false;         // Hopper 14-bit truncating accumulation
  bool heads_descending = false;
  int d_block = 0;             // f32 partial sums over blocks of this many dims (0: one sum)
  std::string name() const;
};
std::vector<LogitsVariant> logits_family();

// [s_q, s_kv] logits, -inf outside [ks, ke).
Tensor<float> logits(const LogitsVariant& v, const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                     const Tensor<float>& k_scale, const Tensor<float>& weights, const Tensor<int32_t>& ks,
                     const Tensor<int32_t>& ke);
// The same values at the given (row, key) elements only (each inside its row's window).
std::vector<float> logits_at(const LogitsVariant& v, const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                             const Tensor<float>& k_scale, const Tensor<float>& weights, const std::vector<RowCol>& elems);
// The same on a bf16 set's indexer inputs (indexer=bf16: bf16 q and k, whose products are exact in f32).
std::vector<float> logits_at(const LogitsVariant& v, const Tensor<bf16_t>& q, const Tensor<bf16_t>& k,
                             const Tensor<float>& k_scale, const Tensor<float>& weights, const std::vector<RowCol>& elems);

// f32 indexer scores (the V4, HY V4 and KPool indexers: f32 q [T, H, D], keys [S, D], weights [T, H]):
//   I[t, s] = f32(sum_h w[t, h] ReLU(q[t, h] . k[s])) * scale     for s in [ks[t], ke[t]), -inf elsewhere
// every operation in f32, in the variant's order (heads ascending or descending, the dot over D in
// blocks of d_block), the scale one f32 multiply after the head sum. The family: f32 variants only
// (fp8_14 is refused), the orders a GPU kernel or torch's reductions use. The judge's values class
// (judge/precision.h) is emulated differently (the golden's own computation on moved inputs), so
// calibrate measures it on kernels it did not emulate.
std::vector<LogitsVariant> scores_family();
Tensor<float> scores_f32(const LogitsVariant& v, const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& weights,
                         float scale, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke);

}  // namespace indexshare::emul
