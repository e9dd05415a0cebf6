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
//   in a fixed order documented in judge/compare.cc: the report is the same for any thread count,
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
#include "ref/bounds.h"
#include "ref/tensor.h"

namespace indexshare::cmp {

using ref::AttentionOut;

enum class Verdict { pass, fail, mistrusted };
std::string verdict_name(Verdict v);  // "PASS", "FAIL", "MISTRUSTED"
// The multi-dimensional index of row-major element `flat` of a tensor of `shape`.
using indexshare::unflatten;  // ref/tensor.h

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
  int64_t wide_ties = 0;  // top-k only: rows whose near ties the contract's arithmetic does not explain
  int64_t near_ties = 0;  // top-k only: rows accepted as near ties (the candidate's own scores explain them)
};

// A flagged structure test (judge/structure.h), as the report carries it.
struct StructureNote {
  std::string stat, kind, label;  // "scale" / "offset" / "sm"; "head"; "head 3"
  double b = 0, se = 0, t = 0, t_crit = 0, floor = 0;
  int64_t clusters = 0;
  bool fits = true;  // "sm": false when the direction explains too little of the error to be its cause
};

struct Report {
  std::string tensor;
  Verdict verdict = Verdict::pass;
  std::vector<std::string> reasons;    // why FAIL / MISTRUSTED, or notes
  Stats stats;
  std::vector<Mismatch> mismatches;    // the first kMaxMismatches
  // Structure tests (judge/structure.h), when they ran: how many, the closest any came to flagging
  // (>= 1: flagged), the flagged ones and one sentence per diagnosed systematic error.
  int64_t structure_tests = 0;
  double structure_max_ratio = 0;
  double structure_max_b_over_floor = 0;  // the largest systematic estimate over its floor
  std::vector<StructureNote> structure_flagged;
  std::vector<std::string> findings;
  // The precision test (judge/precision.h), when it ran: the candidate's RMS error relative to
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

Report compare_floats(const std::string& tensor, const Tensor<float>& expected,
                      const Tensor<float>& got, const FloatRule& rule);
// Exact comparison of integer tensors (shapes and every element).
Report compare_exact(const std::string& tensor, const Tensor<int32_t>& expected, const Tensor<int32_t>& got);

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
  // The contract's arithmetic (judge/precision.h), when >= 0: a near tie is accepted only when
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
