// indexshare: per-element bounds for the gradients of a training set (tools/lib/golden_train.h),
// derived from epsilon, reduction lengths and magnitudes, as ref/bounds.h derives the forward's.
//
// Notation: u = 2^-24 (f32 unit roundoff), b = 2^-8 (bf16), gamma(n) = n u / (1 - n u) (the
// worst case of an f32 sum of n terms in any order), |.| magnitudes of the exact values (the
// golden's own, in double). Every bound is the first-order worst case times kGradMargin (second
// order terms and the bounds' own rounding), and never below 2 u |x| (the kernel's final f32
// rounding); a candidate held in bf16 gets b |x| more (its cast).
//
// Sparse MLA backward: dq and dkv are bounded by the specification's cmp::attention_backward_bounds
// (ref/train/attention_bwd.h, with Delta formed from the kernel's bf16 out, as TileLang's kernel
// does: that is within the contract; Delta summed in bf16 is the bug). Delta and d_sink here, for a
// kernel with f32 logits and softmax, Delta in f32 from its saved bf16 out. Per (row t, head h), n
// valid slots:
//   logit error   ds_i <= gamma(d_qk) sm sum_d |q_d K_id| + u |s_i|;  E_s = max_i ds_i
//   lse error     dlse <= E_s + gamma(n) + 4u + u |lse|
//   P relative    eP = 2 E_s + gamma(n) + 8u + u |lse| (+ dlse + 4u with a sink: its factor f)
//   saved O       eO_c = b |O_c| + (eP + gamma(n) + b) sum_i P_i |V_ic|   (the forward's, then bf16)
//   delta         E_D = sum_c |dO_c| eO_c + gamma(d_v) sum_c |O_c dO_c|
//   d_sink[h]     sum_t ((1 - f) E_D + |Delta| f (1 - f) (dlse + 4u)) + gamma(s_q) sum_t |(1 - f) Delta|
//
// Indexer loss (ref/train/indexer_loss.h), for a kernel in f32 (Megatron's torch code), per row t
// over its support R:
//   scores        eI_s = gamma(D + H) sum_h |w_h| sum_d |q_hd k_sd|;  E_I = max_R eI_s
//   log q         dlq_s = eI_s + E_I + gamma(|R|) + 4u + u (|I_s| + |lse_I|);  q relative eq_s = dlq_s + 4u
//   teacher p     per teacher layer and head: E_T = gamma(d_qk) sm max_R sum |q kv|, relative
//                 2 E_T + gamma(|R|) + 8u; ep = 2 (max of those + gamma(h_q L)) + gamma(|R|) + 4u (L layers)
//   dI            D_s = |g| (q_s (eq_s + ep) + p_s ep + 2u (q_s + p_s)) + 2u |dI_s|
//   dw[t,h]       sum_R (D_s |S_hs| + |dI_s| eS_hs) + gamma(|R|) sum_R |dI_s S_hs|,  eS = gamma(D) sum_d |q k|
//   dq[t,h,d]     sum_R (D_s + [|S_hs| <= eS_hs] |dI_s|) |w_h k_sd| + gamma(|R| + 1) sum_R |dI_s w_h k_sd|
//   dk[s,d]       the same terms over (t, h) with s in R(t), gamma(number of terms)
//   kl[t]         sum_R (ep p_s |log p_s - log q_s + 1| + p_s dlq_s) + gamma(|R|) sum_R |p_s (log p_s - log q_s)|
//   loss          coeff / N (sum_t dkl_t + gamma(s_q) sum_t |kl_t|)
//   p, log_q, d_scores   ep p_s, dlq_s, D_s
// The structure tests (judge/structure.h) run beside these bounds: a systematic error far below
// them (a gradient 0.5% too large) is still flagged.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ref/tensor.h"

namespace indexshare::cmp {

constexpr double kGradMargin = 2.0;

struct AttentionBackwardTruth {
  const Tensor<bf16_t>* q = nullptr;       // [s_q, h_q, d_qk]
  const Tensor<bf16_t>* kv = nullptr;      // [s_kv, 1, d_qk]
  const Tensor<int32_t>* indices = nullptr;// [s_q, 1, topk]
  const Tensor<int32_t>* topk_length = nullptr;  // [s_q] or null (every slot)
  const Tensor<bf16_t>* d_out = nullptr;   // [s_q, h_q, d_v]
  const Tensor<float>* sink = nullptr;     // [h_q] or null
  const Tensor<float>* out = nullptr;      // exact O [s_q, h_q, d_v]
  const Tensor<float>* lse = nullptr;      // [s_q, h_q]
  const Tensor<float>* p = nullptr;        // [s_q, h_q, topk]
  const Tensor<float>* ds = nullptr;       // [s_q, h_q, topk]
  const Tensor<float>* delta = nullptr;    // [s_q, h_q]
  float sm = 0;
  int64_t d_v = 0;
};
// Bounds per element of "delta" and "d_sink" (when a sink is given).
std::map<std::string, std::vector<float>> delta_sink_bounds(const AttentionBackwardTruth& t);

struct IndexerLossTruth {
  const Tensor<bf16_t>* q = nullptr;        // indexer q [s_q, H, D]
  const Tensor<bf16_t>* k = nullptr;        // indexer k [s_kv, D]
  const Tensor<float>* w = nullptr;         // [s_q, H]
  const Tensor<int32_t>* ks = nullptr;
  const Tensor<int32_t>* ke = nullptr;
  const Tensor<int32_t>* topk = nullptr;    // sparse support (null: dense)
  std::vector<const Tensor<bf16_t>*> teacher_q, teacher_kv;  // per teacher layer
  float sm = 0;
  bool relu = true;
  const Tensor<float>* scores = nullptr;    // I (indexer.logits)
  const Tensor<float>* p = nullptr;
  const Tensor<float>* log_q = nullptr;
  const Tensor<float>* kl = nullptr;
  const Tensor<float>* d_scores = nullptr;
  const Tensor<float>* dq = nullptr;
  const Tensor<float>* dk = nullptr;
  const Tensor<float>* dw = nullptr;
  double loss = 0, g = 0, coeff_over_n = 0;  // g = grad coeff / N; coeff / N for the loss
};
// Bounds per element of "p", "log_q", "kl", "loss", "d_scores", "dq", "dk", "dw".
std::map<std::string, std::vector<float>> indexer_loss_bounds(const IndexerLossTruth& t);

}  // namespace indexshare::cmp
