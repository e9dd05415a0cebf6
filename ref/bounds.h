// indexshare: the judge's derived tolerances, which simd/ mirrors bit for bit (simd/compare.cc):
// the per-element bounds of the sparse attention's outputs and of the indexer logits, the
// FlashAttention-style budget and the low-precision emulation behind it. The comparison that uses
// them (Report, compare_floats, compare_topk) is judge/compare.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ref/attention.h"
#include "ref/tensor.h"

namespace indexshare::cmp {

using ref::AttentionOut;

struct FloatRule {
  std::vector<float> bound;        // per element, >= 0 (size = numel); empty: exact (bound 0); f32 rounded up
  double metric_max = -1;          // calc_diff threshold; < 0: reported only
  std::string metric_name;         // where the threshold comes from, printed with a failure
  double budget_max_abs = -1;      // FlashAttention-style global max |error|; < 0: off
  // An anchor's elementwise check (FlashMLA's check_is_allclose): each finite element must have
  // |err| < anchor_abs OR |err| / (|golden| + 1e-6) < anchor_rel. Off when anchor_rel < 0.
  double anchor_abs = -1, anchor_rel = -1;
  std::string anchor_name;
  std::string derivation;          // one sentence, printed with a failure
};

// ---- Derived bounds --------------------------------------------------------------------------
// A float that is neither inf nor NaN, as a comparison the compiler vectorizes (the comparison
// passes' masks, judge/compare.cc and judge/structure.cc).
inline bool finite_f32(float v) { return std::fabs(v) <= std::numeric_limits<float>::max(); }

// Every bound is derived in double and stored as the f32 at or above it (bound_f32: round to
// nearest, then one step up where that fell below): never below the derivation, at most one f32
// ulp (relative 2^-23) wider, and half the memory of a double per element (attn.out's bound is
// the size of the output itself).
inline float bound_f32(double b) {
  float f = float(b);
  if (double(f) < b) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}
// Unit roundoffs: bf16 u = 2^-8, f32 e = 2^-24.
// Attention (FlashMLA-like kernels: bf16 q and kv, f32 logits and softmax, P rounded to bf16
// before the PV product, f32 accumulation, bf16 output). For query row t, head h, with valid kv
// rows i (k of them), exact probabilities p_i and values V:
//   A_c = sum_i p_i |V_ic|                  (|out_c| <= A_c)
//   G   = sm_scale * max_i sum_d |q_d k_id|  (logit magnitude)
//   out bound_c = u |out_c|                  bf16 output rounding
//               + u A_c                      P rounded to bf16 (relative error <= u per p_i)
//               + ((k + 8) e + 2 (d_qk + 2) e G) A_c
//                                            f32 accumulation of k terms, f32 exp/lse, and the
//                                            f32 logits' error moving every p_i
//   lse bound   = (d_qk + 2) e G + (k + 8) e + 2 e |lse|      f32 logits, sum and log
//   max bound   = (d_qk + 2) e G + e |max|
// Every bound is multiplied by kAttentionMultiple = 3: an error source can reach its bound in
// more than one rounding step, and FlashMLA's own acceptance (3 bf16 ulps relative) sits there.
// How G, p_i and A_c are evaluated (a fixed order, which simd/ mirrors bit for bit): the sums run
// in f32 and are inflated to sound upper bounds, with e = 2^-24 and infl(m) = 1 + 2 m e (a
// sequential f32 sum of nonnegative terms with m roundings in all is at least (1 - gamma_m) times
// the exact one, gamma_m = m e / (1 - m e), and 1 / (1 - gamma_m) <= 1 + 2 m e while m e <= 1/4):
//   dot_i = f32 sum_d q_d k_id, mag_i = f32 sum_d |q_d| |k_id|   (d ascending, a multiply then an
//                                   add: d_qk + 1 roundings with the products')
//   s'_i  = double(dot_i) * sm_scale (the logits), G = sm_scale * max_i mag_i * infl(d_qk + 1)
//   delta = 2 (d_qk + 1) e G       >= |s'_i - s_i| (the f32 dot's error, gamma_(d_qk+1) sum |q k|)
//   w'_i  = f32(exp(s'_i - m') / l') (double softmax of s', exp = exp_portable of ref/numerics.h,
//           which simd/ evaluates in lanes; rounded to f32 once), then rounded UP
//           to 16 significant bits (w'_i only grows, relative 2^-15 at most)
//   A_c   = f32 sum_i w'_i |V_ic| (i ascending) * exp(2 delta) * infl(k + 2)
// Every true weight is within exp(2 delta) of its computed one (the logits move by at most delta,
// the normaliser by at most exp(delta)), and the f32 sum has k + 2 roundings per term at most (the
// weight's, the product's, the adds'; the product of a 16-bit weight and a bf16 value has at most
// 24 significant bits, so it is exact unless it leaves f32's range, and one rounding is spare). The double steps (exp, division; relative ~1e-16) and f32
// weights that underflow (absolute 2^-149 each) are far inside kAttentionMultiple. At d_qk 576 and
// G ~ 15 the inflation is ~0.2%; sums in f32 lanes hold twice double's, and both products of
// pass 1 are exact in f32 for bf16 inputs of ordinary exponents (one fused multiply-add each).
constexpr double kAttentionMultiple = 3.0;
struct AttentionBounds {
  std::vector<float> out, lse, max_logits;   // per element, already multiplied, rounded up to f32 (bound_f32)
  std::vector<float> sm_out, sm_lse;         // attention_bounds_sm only: d out / d ln sm_scale, d lse / d ln sm_scale
};
AttentionBounds attention_bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                 const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                 const Tensor<int32_t>* topk_length, const AttentionOut& exact);
// attention_bounds, and in the same pass over the exact logits the softmax-scale direction the
// structure tests regress on (judge/structure.h, "sm"): the derivative of the exact attention with
// respect to ln(sm_scale). With logits s_i = sm_scale q.k_i, m = max s_i, z_i = s_i - m,
// w_i = exp(z_i) / l (l = sum exp(z_j)), zbar = sum w_i z_i (i ascending, double) and the sink
// factor f = 1 / (1 + exp(sink_h - lse)) (1 without a sink):
//   d lse / d ln sm  = m + zbar                                  (= sum w_i s_i)
//   d out_c / d ln sm = f D_c + (1 - f) (m + zbar) out_c,  D_c = sum_i w_i (z_i - zbar) V_ic
// (out = f sum w_i V_i, d w_i = w_i (s_i - sbar), d f = f (1 - f) d lse). D_c is summed in f32
// (i ascending, the weights w_i (z_i - zbar) rounded to f32, then to nearest 16 significant bits:
// ~1e-5 relative where a regression direction needs ~1e-3, and every product u_i V_ic is exact,
// so simd/ sums them with fused multiply-adds); the results are rounded
// once to f32; 0 on rows without keys. It replaces a forward difference of a second exact evaluation.
// Work on kv that an implementation of the bounds' pass shares across its calls over one kv (diff
// runs attention_bounds_sm over blocks of query rows): Kernels::prepare_bounds_kv makes it once per
// layer, each call takes it. ref has none (its calls ignore it); simd's holds kv in f32 and |kv|
// and kv's exponent range, which every block would otherwise redo. It changes no bit of a bound.
struct BoundsKv {
  virtual ~BoundsKv() = default;
};
AttentionBounds attention_bounds_sm(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                    const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                    const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink,
                                    const AttentionOut& exact, const BoundsKv* shared = nullptr);

// The naive emulation at kernel precision: f32 dot products, f32 softmax, P rounded to bf16,
// f32 accumulation, out rounded to bf16 (out holds the bf16 values as f32). Its error against
// the exact reference sets the FlashAttention-style budget:
//   max |cand - exact| <= kBudgetMultiple * max |emul - exact| + 2 * max |bf16(exact) - exact|
// (FlashAttention's "2x the naive low-precision error" rule plus FA3's reference-rounding atol).
// The multiple is 4 rather than 2: the emulation's largest error is about half a bf16 ulp of the
// largest outputs (its own output rounding), while a correct kernel that splits the reduction
// and rounds P per tile lands 1-2 ulps away, which FlashMLA's own tests accept (3 ulps); 4 x 0.5
// + 1 = 3 ulps. Gross errors are what this global budget is for; the per-element bounds above
// catch local ones.
constexpr double kBudgetMultiple = 4.0;
AttentionOut emulate_attention_lowp(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                    const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                    const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink);
double attention_budget(const Tensor<float>& exact_out, const Tensor<float>& emulated_out);
// The budget's two maxima over the finite elements of exact_out: |emulated - exact| and
// |bf16(exact) - exact|. Maxima over disjoint row blocks combine exactly by max (the sharded
// golden sets reduce them across MPI ranks); attention_budget(parts) = kBudgetMultiple * emul +
// 2 * ref_round, the same double as attention_budget over the whole tensors.
struct BudgetParts {
  double emul = 0, ref_round = 0;
};
BudgetParts attention_budget_parts(const Tensor<float>& exact_out, const Tensor<float>& emulated_out);
double attention_budget(const BudgetParts& parts);
// The budget's emulation on a subset of rows. The budget is a maximum over every element, and the
// emulation costs as much as the attention itself, so large sets emulate a deterministic subset:
//   sets of at most kBudgetAllRows query rows: every row (the maxima above, unchanged);
//   larger sets: the kBudgetTopRows rows with the largest max |exact out[t, :, :]| (ties: the lower
//   row), and every stride-th row (t % stride == 0, stride = ceil(rows / kBudgetStrideRows)).
// Why those rows: the emulation's error is its own output rounding plus P's bf16 rounding, both
// relative to the row's magnitudes, so the maximum sits in the rows holding the largest outputs
// (measured: judge/README.md "The budget on a row subset"); the stride rows cover the rest of the
// sequence. The subset's maximum can only be smaller than the whole tensor's, so the emulation term
// is floored at ref_round, the output rounding's maximum over EVERY row (the emulation rounds its
// output to bf16 too): the budget never drops below 6 half-ulps of the largest outputs, which is
// FlashMLA's own 3-ulp acceptance. ref_round is always over every row.
constexpr int64_t kBudgetAllRows = 256, kBudgetTopRows = 64, kBudgetStrideRows = 64;
// max |exact_out[t, ...]| over each row's finite elements (0 for a row without any), in double;
// ref_round, when given, receives BudgetParts::ref_round (the output rounding's maximum over every
// row), from the same pass.
std::vector<double> budget_row_max(const Tensor<float>& exact_out, double* ref_round = nullptr);
// The rows to emulate, ascending, from every row's budget_row_max (the whole set's rows).
std::vector<int64_t> budget_rows(const std::vector<double>& row_max);
// Emulates `rows` (ascending row numbers of q, indices and topk_length; all of q's rows when it
// holds them all) and returns the budget's maxima: emul over those rows (floored at ref_round when
// `floor`, i.e. when the rows are a subset of the set's), ref_round over every row of exact_out.
// emulated_max, when given, receives the raw maximum |emulated - exact| over the emulated rows.
// ref_round >= 0: that value (budget_row_max's, of the same exact_out) instead of another pass.
using EmulateFn = AttentionOut (*)(const Tensor<bf16_t>&, const Tensor<bf16_t>&, const Tensor<int32_t>&, float, int64_t,
                                   const Tensor<int32_t>*, const Tensor<float>*);
BudgetParts attention_budget_parts_rows(EmulateFn emulate, const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                        const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                        const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink,
                                        const Tensor<float>& exact_out, const std::vector<int64_t>& rows, bool floor,
                                        double* emulated_max = nullptr, double ref_round = -1);
// The budget's maxima of a set held whole in one process: the rows budget_rows picks from
// exact_out, floored when they are a subset. emulated_rows, when given, receives their count.
BudgetParts attention_budget_parts_set(EmulateFn emulate, const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                       const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                       const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink,
                                       const Tensor<float>& exact_out, int64_t* emulated_rows = nullptr);
// The same as a manifest sentence: "every row" or "N of S rows: ...".
std::string budget_rows_text(int64_t emulated, int64_t total);

// Indexer logits from an FP8 kernel: FP8 products are exact, but Hopper's FP8 tensor cores keep
// about 14 bits while accumulating (DeepSeek-V3 report), and the head sum order is unspecified.
// With M[t,s] = k_scale[s] * sum_h |w[t,h]| * sum_d |q[t,h,d] k[s,d]| (the magnitude every partial
// sum is bounded by), a worst case, sound for any order of the heads and of the D sum:
//   the tensor core's accumulator, ceil(D / 32) MMA steps of 32 products each, keeps 14 bits and
//   truncates after each step: at most one 14-bit ulp, 2^-13 of the partial sum, per step and head
//   (a head's partial sums are at most its sum_d |q k|); an f32 accumulation of the D products in
//   any order instead errs by at most (D - 1) 2^-24 (smaller for D <= 2^11);
//   the head sum in f32, any order: H - 1 additions, and the weight product, the ReLU'd dot's f32
//   rounding and the k_scale product: at most H + 2 roundings of 2^-24 of M;
//   bound[t,s] = kLogitMargin * (ceil(D / 32) 2^-13 + (H + 2) 2^-24) * M[t,s],  kLogitMargin = 2
// (the margin covers an accumulator that keeps 13 bits, not 14: "about 14 bits"). At D 128, H 64
// that is 9.8e-4 M, 3.5x tighter than the earlier 4-sigma model (4 sqrt(D + H + 2) 2^-14 = 3.4e-3 M).
// The metric threshold is the calc_diff reached if every element were off by its full bound.
// Evaluation order (fixed, so simd/ gives the same bits): M is the same real number as
//   M[t,s] = k_scale[s] * sum_d |k[s,d]| * Qt[t,d],   Qt[t,d] = sum_h |w[t,h]| |q[t,h,d]|
// (nonnegative terms: the sums exchange), computed in double as Qt (h ascending; each product of
// an f32 and an e4m3 value is exact in double), then sum_d Qt[t,d] |k[s,d]| (d ascending, a multiply
// then an add), then the left-to-right product logits_bound_coefficient(D, H) * k_scale * that:
// O(s_q (H + s_kv) D) instead of O(s_q s_kv H D). The double roundings (relative 1e-16 per step)
// are negligible next to the 2^-13 being bounded.
constexpr double kLogitMargin = 2.0;
constexpr const char* kLogitsDerivation =
    "bound = 2 (ceil(D / 32) 2^-13 + (H + 2) 2^-24) k_scale sum_h |w| sum_d |q k|: a 14-bit truncating FP8 accumulator and an "
    "f32 head sum, worst case, twice";
inline double logits_bound_coefficient(int64_t D, int64_t H) {
  return kLogitMargin * (double((D + 31) / 32) * 0x1p-13 + (double(H) + 2) * 0x1p-24);
}
FloatRule indexer_logits_rule(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k, const Tensor<float>& k_scale,
                              const Tensor<float>& weights, const Tensor<float>& exact_logits);
// The same rule on a bf16 set's indexer (indexer=bf16: bf16 q and k, k_scale 1): the same
// magnitude M with the bf16 values (their products with |w| exact in double as well), the same
// coefficient (the default contract's accumulator; an f32 one errs less), the same order.
FloatRule indexer_logits_rule(const Tensor<bf16_t>& q, const Tensor<bf16_t>& k, const Tensor<float>& k_scale,
                              const Tensor<float>& weights, const Tensor<float>& exact_logits);

}  // namespace indexshare::cmp
