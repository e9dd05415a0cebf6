// indexshare: the DSA indexer's distillation loss (Megatron-LM's indexer KL loss) and its exact
// gradients with respect to the indexer's q, k and head weights.
//
// Inputs. Indexer: q [s_q, H, D] (f32, or bf16 widened), k [s_kv, D] (the same element type),
// w' [s_q, H] f32 (the head weights with H^-1/2 D^-1/2 folded in), ks / ke [s_q] int32 (row t's
// valid keys are [ks[t], ke[t]), 0 <= ks <= ke <= s_kv). Optional top-k [s_q, K] int32 in the
// positions ref::topk returns (local to the row: key ks[t] + j; -1 padding). Teacher: for each
// layer the main attention's q [s_q, h_q, d_qk] bf16, kv [s_kv, 1, d_qk] bf16 and softmax scale,
// optionally with a non_compressed_lse [s_q, h_q] f32.
//
// The loss, per query row t (all math in double; every output rounded to f32 once at the end):
//   support  R(t): dense, the valid keys [ks[t], ke[t]); sparse, {ks[t] + j : j a top-k entry,
//            0 <= j < ke[t] - ks[t]} (-1 and other out-of-window entries ignored, a duplicate
//            counted once: Megatron scatters the top-k into a mask), always ascending.
//   scores   S[h, s] = q[t,h,:] . k[s,:] (d ascending);  I[t, s] = sum_h w'[t,h] * ReLU(S[h, s])
//            (h ascending, multiply then add), over the whole window [ks, ke). ReLU off (GLM-5,
//            Megatron's dsa_indexer_scoring_relu = False): I = sum_h w'[t,h] * S[h, s].
//            With ReLU on, float(I) equals ref::indexer_logits_f32 with k_scale = 1 bit for bit.
//   teacher  per head: P_s = scale * (q_attn[t,h,:] . kv[s,0,:]) (the 8-part order of
//            ref/attention.h), m = max P, e_s = exp_portable(P_s - m), l = sum e_s (s ascending),
//            A_h[s] = e_s / l. p = sum_h A_h (h ascending), then p /= max(sum_s p, 1e-10).
//            non_compressed_lse L (the mass of keys not in R, per head; Megatron CSA):
//            A_h[s] = (e_s / l) * exp_portable(lse_R - logaddexp(L, lse_R)), lse_R = m + log(l);
//            p /= sum_s p when that sum is > 0, else p stays 0 (no 1e-10 floor). Megatron shifts
//            every head's log mass by a common per-row amount when it would underflow f32 (the
//            shift cancels in the normalization); in double that happens only when L exceeds lse_R
//            by about 708, where this gives p = 0 for the row instead.
//   target   own-layer: p of the one teacher layer. served-layers: p-bar = (sum_j p^(j)) / (m+1)
//            over the layers j = 0..m the Full layer serves (its own first), j ascending.
//   student  over R: m' = max I, l' = sum exp_portable(I_s - m'), lse = m' + log(l'),
//            log q[s] = I_s - lse, q[s] = exp_portable(I_s - m') / l'.
//   KL       kl[t] = sum_{s in R} p_s * (log(max(p_s, 1e-10)) - log q_s), s ascending.
//   loss     loss_coeff * (sum_t kl[t], t ascending) / N, N = max(number of valid rows, 1), a row
//            being valid when ke[t] > ks[t] (all_rows: N = s_q, Megatron without query_valid_rows);
//            per_token (calculate_per_token_loss): loss_coeff * sum_t kl[t], no division.
// Rows with no support: p = 0, kl = 0, no gradient; they still count in N when valid.
//
// Gradients (grad is the upstream gradient of the loss, 1 by default):
//   g = (grad * loss_coeff) / N (per_token: grad * loss_coeff)
//   dI[t,s] = g * (q_s * sum_R p - p_s) on R, 0 elsewhere (sum_R p is 1 up to rounding, 0 for an
//            empty teacher: the exact derivative of kl[t], as autograd computes it)
//   dw'[t,h] = sum_{s in R} dI[t,s] * ReLU(S[h,s])                      s ascending
//   dS[t,h,s] = dI[t,s] * w'[t,h] * 1[S[h,s] > 0]   (no ReLU: dI * w')
//   dq[t,h,d] = sum_{s in R} dS[t,h,s] * k[s,d]                         s ascending
//   dk[s,d]   = sum_t sum_h dS[t,h,s] * q[t,h,d]                        t ascending, then h
// served-layers: two loss conventions, by name (kl_form); their gradients are the same, since every
// p^(j) sums to 1 and dL/dI = q - p-bar for both:
//   kl-of-mean  kl[t] = KL(p-bar || q), the KL step above on the averaged target (the default)
//   mean-of-kl  kl[t] = 1/(m+1) sum_j KL(p^(j) || q), the IndexCache paper's definition, computed
//               as KL(p-bar || q) + gap, gap = (sum_j sum_{s in R} p^(j)_s log(max(p^(j)_s, 1e-10)))
//               / (m+1) - sum_{s in R} p-bar_s log(max(p-bar_s, 1e-10)) (j, then s ascending): the
//               constant H(p-bar) - mean_j H(p^(j)) >= 0 (Jensen), which has no gradient.
// With one teacher (own-layer) the two are the same number. The third-party IndexCache code clamps
// log q at -100 (and floors a sparse p at 1e-9): that is its own rule, not this one, and changes the
// loss only where q < e^-100.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ref/tensor.h"

namespace indexshare::ref::train {

// Whose attention teaches the Full layer's indexer: "own-layer" (Megatron) or "served-layers"
// (IndexCache training-aware: the mean of the normalized teachers of the layers it serves).
enum class Target { own_layer, served_layers };
Target parse_target(const std::string& name);  // throws Error for another name
std::string target_name(Target t);

// Which number kl and loss hold with served-layers (above): KL(p-bar || q) or mean_j KL(p^(j) || q).
enum class KlForm { kl_of_mean, mean_of_kl };
KlForm parse_kl_form(const std::string& name);  // "kl-of-mean" or "mean-of-kl"; throws Error otherwise
std::string kl_form_name(KlForm f);

struct IndexerLossOptions {
  bool relu = true;          // ReLU on the head scores: DeepSeek V3.2 on, GLM-5 off
  bool sparse = false;       // support = top-k intersected with valid keys (dsa_indexer_use_sparse_loss)
  double loss_coeff = 1.0;
  bool per_token = false;    // calculate_per_token_loss: no division by N
  bool all_rows = false;     // N = s_q instead of the valid rows
  double grad = 1.0;         // upstream gradient of the loss
  Target target = Target::own_layer;
  KlForm kl_form = KlForm::kl_of_mean;
};

// One layer's main attention, the teacher. Pointers: the caller keeps the tensors alive.
struct TeacherLayer {
  const Tensor<bf16_t>* q = nullptr;                   // [s_q, h_q, d_qk]
  const Tensor<bf16_t>* kv = nullptr;                  // [s_kv, 1, d_qk]
  float scale = 0.0f;                                  // softmax scale
  const Tensor<float>* non_compressed_lse = nullptr;   // optional [s_q, h_q], natural log
};

struct IndexerLossOut {
  Tensor<float> scores;    // I [s_q, s_kv]: -inf outside [ks, ke)
  Tensor<float> p;         // the target [s_q, s_kv]: 0 outside R
  Tensor<float> log_q;     // [s_q, s_kv]: 0 outside R (Megatron's masked_log_softmax)
  Tensor<float> kl;        // [s_q]
  double loss = 0.0;       // the loss in double (float(loss) is its f32 output)
  int64_t n_rows = 0;      // N
  Tensor<float> d_scores;  // dI [s_q, s_kv]: 0 outside R
  Tensor<float> dq;        // [s_q, H, D]
  Tensor<float> dk;        // [s_kv, D]
  Tensor<float> dw;        // [s_q, H]
};

// The loss and its gradients. `topk` is required when o.sparse (ignored otherwise); `teachers`
// holds exactly one layer for own-layer, one or more (the Full layer's own first) for
// served-layers. Throws Error naming the tensor for bad shapes, bounds or non-finite inputs.
IndexerLossOut indexer_loss(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w,
                            const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, const Tensor<int32_t>* topk,
                            const std::vector<TeacherLayer>& teachers, const IndexerLossOptions& o);
// The same with bf16 q and k (widened to f32 exactly).
IndexerLossOut indexer_loss_bf16(const Tensor<bf16_t>& q, const Tensor<bf16_t>& k, const Tensor<float>& w,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, const Tensor<int32_t>* topk,
                                 const std::vector<TeacherLayer>& teachers, const IndexerLossOptions& o);

// ---- the steps, which simd/ runs over rows and keys in parallel (same calls, same bits) ----
namespace detail {

// Everything indexer_loss needs across rows: the checked inputs decoded to double, the supports,
// the scaling g and the double dI the dk pass reads.
struct LossContext {
  int64_t s_q = 0, H = 0, D = 0, s_kv = 0;
  std::vector<double> q, k, w;             // [s_q*H*D], [s_kv*D], [s_q*H]
  std::vector<std::vector<int64_t>> rows;  // R(t), ascending
  const Tensor<int32_t>* ks = nullptr;
  const Tensor<int32_t>* ke = nullptr;
  const std::vector<TeacherLayer>* teachers = nullptr;
  IndexerLossOptions o;
  double g = 0.0;                          // grad * coeff / N
  std::vector<double> kl;                  // [s_q], kl[t] in double
  std::vector<double> dI;                  // [s_q * s_kv], 0 outside R
};

// Checks every input and fills the context (supports, N, g); allocates the outputs.
LossContext prepare(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w, const Tensor<int32_t>& ks,
                    const Tensor<int32_t>& ke, const Tensor<int32_t>* topk, const std::vector<TeacherLayer>& teachers,
                    const IndexerLossOptions& o, IndexerLossOut& out);
// Row t: I over the window, the target, log q, kl[t], dI (into c.dI), dw'[t,:] and dq[t,:,:].
void loss_row(LossContext& c, int64_t t, IndexerLossOut& out);
// log(exp(a) + exp(b)): max + log1p(exp_portable(-|a - b|)), -inf and +inf handled exactly.
double logaddexp(double a, double b);
// mean-of-kl with more than one teacher: kl[t] (context and output) plus the header's gap, from
// each teacher's row p_each[j] (over R(t), j ascending) and their mean p; otherwise nothing.
void apply_kl_form(LossContext& c, int64_t t, const std::vector<std::vector<double>>& p_each, const std::vector<double>& p,
                   IndexerLossOut& out);
// Step 3 of loss_row: p, log q = I - lse and kl[t] over R(t), s ascending, then dI = g (q sum p - p)
// into c.dI and out, from the target p, the student's e = exp(I - max) with their sum l, and lse.
// I[s - lo] holds the score of key s (ref: lo = 0; simd: the row's window from ks[t]).
void kl_and_d_scores(LossContext& c, int64_t t, const double* I, int64_t lo, const std::vector<double>& p,
                     const std::vector<double>& e, double l, double lse, IndexerLossOut& out);
// S[t, h, s] = q[t,h,:] . k[s,:], d ascending (the head score before the ReLU).
double head_score(const LossContext& c, int64_t t, int64_t h, int64_t s);
// dk for the key rows [s_begin, s_end): each element sums t ascending, then h, as the header says.
void dk_keys(const LossContext& c, int64_t s_begin, int64_t s_end, IndexerLossOut& out);
// The loss from kl (t ascending) and N.
void finish(const LossContext& c, IndexerLossOut& out);

}  // namespace detail

}  // namespace indexshare::ref::train
