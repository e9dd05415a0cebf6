// indexshare: the one comparison module, shared by the tests and `indexshare diff`.
//
// A comparison takes the golden (exact) tensor, the candidate's tensor and a rule, and returns
// a Report: PASS, FAIL or MISTRUSTED (the data are too degenerate to prove anything), a stats
// line, and the first mismatches with their multi-dimensional index.
//
// Float tensors (compare_floats)
//   1. Special values first: where the golden value is +inf, -inf or NaN the candidate must hold
//      the same class and sign; a non-finite candidate value where the golden is finite fails.
//   2. Each finite element passes iff |got - exp| <= bound[e], a per-element bound derived from
//      the inputs (see the *_bounds functions: unit roundoffs, reduction lengths, magnitudes).
//   3. Global metric: DeepGEMM's calc_diff = 1 - 2 sum(xy) / sum(x^2 + y^2) over the finite
//      pairs, in double (0 when both are all zero). It equals |x - y|^2 / (|x|^2 + |y|^2); the
//      rule's metric_max, when set, must not be exceeded.
//   The pass runs in parallel over fixed blocks of elements, its sums (the metric's, the mean's)
//   in a fixed order documented in ref/compare.cc: the report is the same for any thread count,
//   and its mismatches are the first kMaxMismatches in element order.
//   4. Global budget (FlashAttention style), when set: max |got - exp| <= budget_max_abs.
//   MISTRUSTED when no element is finite and non-zero in the golden (nothing to measure).
// Top-k positions (compare_topk): see below.
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

enum class Verdict { pass, fail, mistrusted };
std::string verdict_name(Verdict v);  // "PASS", "FAIL", "MISTRUSTED"
// The multi-dimensional index of row-major element `flat` of a tensor of `shape`.
std::vector<int64_t> unflatten(int64_t flat, const Shape& shape);

struct Mismatch {
  std::vector<int64_t> index;  // multi-dimensional index into the tensor
  double expected = 0, got = 0, diff = 0, bound = 0;
  std::string what;            // for non-numeric mismatches (indices): a sentence
};

struct Stats {
  int64_t n = 0;          // elements (or rows, for top-k)
  int64_t n_checked = 0;  // finite golden elements compared numerically (rows: non-empty rows)
  int64_t n_fail = 0;     // failing elements or rows
  double max_abs = 0, max_rel = 0, metric = 0, mean_signed = 0;
  double max_ratio = 0;   // max |got - exp| / bound over elements (how close to the bound)
  double recall_mean = 1, recall_min = 1;  // top-k only
};

// A flagged structure test (ref/structure.h), as the report carries it.
struct StructureNote {
  std::string stat, kind, label;  // "scale" / "offset" / "sm"; "head"; "head 3"
  double b = 0, se = 0, t = 0, t_crit = 0, floor = 0;
  int64_t clusters = 0;
};

struct Report {
  std::string tensor;
  Verdict verdict = Verdict::pass;
  std::vector<std::string> reasons;    // why FAIL / MISTRUSTED, or notes
  Stats stats;
  std::vector<Mismatch> mismatches;    // the first kMaxMismatches
  // Structure tests (ref/structure.h), when they ran: how many, the closest any came to flagging
  // (>= 1: flagged), the flagged ones and one sentence per diagnosed systematic error.
  int64_t structure_tests = 0;
  double structure_max_ratio = 0;
  double structure_max_b_over_floor = 0;  // the largest systematic estimate over its floor
  std::vector<StructureNote> structure_flagged;
  std::vector<std::string> findings;
  // The precision test (tools/lib/precision.h), when it ran: the candidate's RMS error relative to
  // the golden's RMS over the sample, and what the contract's arithmetic gives there.
  bool precision_ran = false;
  double precision_rms = 0, precision_contract = 0;
  std::string stats_line() const;      // "[COMPARE_STATS] max_abs=... max_rel=... metric=..."
};
constexpr size_t kMaxMismatches = 10;

// Root mean square of the finite elements, in double (0 when there are none).
double rms_finite(const Tensor<float>& x);

// DeepGEMM's metric over the pairs where both values are finite, in double.
double calc_diff(const float* x, const float* y, int64_t n);

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

Report compare_floats(const std::string& tensor, const Tensor<float>& expected,
                      const Tensor<float>& got, const FloatRule& rule);
// Exact comparison of integer tensors (shapes and every element).
Report compare_exact(const std::string& tensor, const Tensor<int32_t>& expected, const Tensor<int32_t>& got);

// ---- Derived bounds --------------------------------------------------------------------------
// A float that is neither inf nor NaN, as a comparison the compiler vectorizes (the comparison
// passes' masks, ref/compare.cc and ref/structure.cc).
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
// structure tests regress on (ref/structure.h, "sm"): the derivative of the exact attention with
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
// (measured: tools/lib/README.md "The budget on a row subset"); the stride rows cover the rest of the
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
// sum is bounded by), each of the D + H + 2 rounding steps (D accumulations, H head terms, two
// scalings) errs by at most 2^-14 M; treating them as independent, they add in quadrature:
//   bound[t,s] = kLogitSigmas * sqrt(D + H + 2) * 2^-14 * M[t,s],   kLogitSigmas = 4
// (4 standard deviations; the worst case (D + H + 2) 2^-14 M would let 10% errors through). The
// metric threshold is the calc_diff reached if every element were off by its full bound.
// Evaluation order (fixed, so simd/ gives the same bits): M is the same real number as
//   M[t,s] = k_scale[s] * sum_d |k[s,d]| * Qt[t,d],   Qt[t,d] = sum_h |w[t,h]| |q[t,h,d]|
// (nonnegative terms: the sums exchange), computed in double as Qt (h ascending; each product of
// an f32 and an e4m3 value is exact in double), then sum_d Qt[t,d] |k[s,d]| (d ascending, a multiply
// then an add), then the left-to-right product kLogitSigmas * sqrt(D + H + 2) * 2^-14 * k_scale * that:
// O(s_q (H + s_kv) D) instead of O(s_q s_kv H D). The double roundings (relative 1e-16 per step)
// are negligible next to the 2^-14 being bounded.
constexpr double kLogitSigmas = 4.0;
FloatRule indexer_logits_rule(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k, const Tensor<float>& k_scale,
                              const Tensor<float>& weights, const Tensor<float>& exact_logits);

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

// ---- Top-k positions -------------------------------------------------------------------------
// compare_topk judges a candidate's [s_q, topk] positions (sequence-local, -1 padded) against
// the golden exact logits [s_q, s_kv] with row windows [ks, ke). Per row, with len = ke - ks and
// k_eff = min(topk, len):
//   structure  every slot is -1 or in [0, len); no duplicate positions; exactly k_eff valid
//              slots; with trailing_padding, the -1 slots are exactly the last topk - k_eff.
//   selection  the multiset of golden scores at the candidate's positions equals the multiset
//              of golden scores at the golden selection (exact equality of sorted values): a
//              tie permutation passes, a dropped winner fails. When the candidate's own logits
//              are given, a swap of golden positions b (missed) for a (taken) is also legitimate
//              when golden(b) - golden(a) <= |cand(a) - golden(a)| + |cand(b) - golden(b)| and
//              both deviations are within the logits bound (a near-tie the candidate's own
//              rounding explains), and, with contract_tie, the gap is one the contract's
//              arithmetic explains (else the row fails as "top-k from low-precision scores").
//   recall     |A ∩ B| / k_eff with B the golden selection and A the distinct in-window positions
//              of the row (reported, mean and min, both over every row: a malformed row's recall
//              counts the positions it does hold in its window).
// Slot order never matters. MISTRUSTED when every row has len <= topk (nothing is selected).
struct TopkOptions {
  bool trailing_padding = true;
  const Tensor<float>* candidate_logits = nullptr;
  const FloatRule* logits_rule = nullptr;  // bounds for the near-tie margin
  // The candidate as written when it holds kv rows ([s_q, topk]; the caller converts them to the
  // sequence-local `candidate`, rows outside [ks, ke) to any value outside [0, len) other than -1):
  // the messages then name the kv row the candidate wrote and the row's window [ks, ke).
  const Tensor<int32_t>* kv_rows = nullptr;
  // The contract's arithmetic (tools/lib/precision.h), when >= 0: a near tie is accepted only when
  // the golden scores' gap is also within contract_tie * (bound(a) + bound(b)) (logits_rule's
  // bounds), i.e. within what the contract's arithmetic moves a score. A wider swap fails, however
  // the candidate's own logits moved: its scores were computed at a lower precision.
  double contract_tie = -1;
};
Report compare_topk(const std::string& tensor, const Tensor<float>& golden_logits,
                    const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                    const Tensor<int32_t>& golden_topk, const Tensor<int32_t>& candidate,
                    const TopkOptions& opt = {});
// The same report with the golden's logits on demand: a row whose positions are the golden's reads
// no score, so `golden_logits` is called (once) only when some well-formed row's positions differ
// from the golden's. The caller that has to compute the logits (a set stored without them) pays for
// them only then.
Report compare_topk(const std::string& tensor, const std::function<const Tensor<float>&()>& golden_logits,
                    const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                    const Tensor<int32_t>& golden_topk, const Tensor<int32_t>& candidate,
                    const TopkOptions& opt = {});

}  // namespace indexshare::cmp
