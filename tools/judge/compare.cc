#include "tools/judge/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>

#include "ref/numerics.h"

namespace indexshare::cmp {


namespace {

const char* fclass(float v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+inf" : "-inf";
  return "finite";
}

void add_mismatch(Report& r, Mismatch m) {
  if (r.mismatches.size() < kMaxMismatches) r.mismatches.push_back(std::move(m));
}

}  // namespace

std::string verdict_name(Verdict v) {
  switch (v) {
    case Verdict::pass: return "PASS";
    case Verdict::fail: return "FAIL";
    case Verdict::mistrusted: return "MISTRUSTED";
  }
  return "?";
}

std::string Report::stats_line() const {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "[COMPARE_STATS] n=%lld checked=%lld failed=%lld max_abs=%.4g max_rel=%.4g metric=%.4g "
                "mean_signed=%.4g max_err/bound=%.4g",
                (long long)stats.n, (long long)stats.n_checked, (long long)stats.n_fail, stats.max_abs,
                stats.max_rel, stats.metric, stats.mean_signed, stats.max_ratio);
  return buf;
}

double rms_finite(const Tensor<float>& x) {
  double s = 0;
  int64_t n = 0;
  for (const float v : x.data)
    if (std::isfinite(v)) { s += double(v) * double(v); ++n; }
  return n ? std::sqrt(s / double(n)) : 0.0;
}

// ---- compare_floats' pass ---------------------------------------------------------------------
// compare_floats and calc_diff run over fixed blocks of kCompareBlock elements (OpenMP over the
// blocks; the partition depends only on n), and within a block over kCompareLanes interleaved
// lanes (element i0 + j goes to lane j mod kCompareLanes: independent chains of additions). Every
// sum is accumulated per lane in element order, the lanes are added in lane order, then the blocks
// in block order; counts and maxima do not depend on the order. So a report's every bit is the same for any thread count. A
// non-finite pair enters every sum as 0 (which leaves a sum that starts at +0 unchanged) and every
// count through its mask; the special values and the mismatch list come from a second,
// element-by-element pass over the blocks that hold any (block_events).
namespace {

constexpr int64_t kCompareBlock = int64_t(1) << 16;
constexpr int kCompareLanes = 4;

// One block's counts, sums and maxima over its finite pairs (counts in double: exact below 2^53).
struct FloatBlock {
  double n_checked = 0, nonzero = 0, n_fail = 0, anchor_fail = 0;
  double sum_signed = 0, sxy = 0, sxx_yy = 0;
  double max_abs = 0, max_rel = 0, max_ratio = 0;
};

// max(a, b) of doubles that are not NaN.
inline double max_of(double a, double b) { return a < b ? b : a; }

// Divisions only where they decide something. For doubles a >= 0, d > 0 and m, r >= 0, with
// u = 2^-53, rounding to nearest, and t = fl(m d) (or fl(r d)) normal (so t is within (1 +- u) of m d):
//   a <= fl(t (1 - 8u))  =>  a / d <= m (1 + u)^2 (1 - 8u), so fl(a / d) <= (a / d)(1 + u) < m
//   a >= fl(t (1 + 8u))  =>  a / d >= r (1 - u)^2 (1 + 8u), so fl(a / d) >= (a / d)(1 - u) > r
// so max(m, fl(a / d)) and fl(a / d) < r are decided exactly without the division there, and by
// the division elsewhere (a running maximum rarely sits within 8u of a new quotient).
constexpr double kBelow = 1 - 0x1p-50, kAbove = 1 + 0x1p-50;
inline double max_quotient(double m, double a, double d) {
  if (a == 0) return m;  // fl(0 / d) = 0 <= m
  const double t = m * d;
  if (t >= std::numeric_limits<double>::min() && a <= t * kBelow) return m;
  return max_of(m, a / d);
}
inline bool quotient_below(double a, double d, double r) {
  const double t = r * d;
  if (t >= std::numeric_limits<double>::min()) {
    if (a <= t * kBelow) return true;
    if (a >= t * kAbove) return false;
  }
  return a / d < r;
}

// Elements [i0, i1) of golden e and candidate g against bound b (nullptr: 0) and, with kAnchor,
// the anchor's check (rule.anchor_abs, anchor_rel). The per-element tests are compare_floats':
//   finite pair      |e| and |g| <= FLT_MAX;   diff = g - e (double), ad = |diff|
//   fails its bound  ad > b;   ratio = ad / b (b > 0), inf (b = 0 < ad), 0 (b = ad = 0)
//   relative         ad / |e| where e != 0
//   fails the anchor !(ad < anchor_abs || ad / (|e| + 1e-6) < anchor_rel)
template <bool kBound, bool kAnchor>
FloatBlock float_block(const float* e, const float* g, const float* b, int64_t i0, int64_t i1, double aa, double ar) {
  constexpr int L = kCompareLanes;
  double sum_signed[L] = {}, sxy[L] = {}, sxx_yy[L] = {};
  int64_t n_checked = 0, nonzero = 0, n_fail = 0, anchor_fail = 0;
  double max_abs = 0, max_rel = 0, max_ratio = 0;
  const double inf = std::numeric_limits<double>::infinity();
  auto element = [&](int64_t i, int j) {
    const float ef = e[i], gf = g[i];
    const bool fin = finite_f32(ef) & finite_f32(gf);
    const double ev = fin ? double(ef) : 0.0, gv = fin ? double(gf) : 0.0;
    const double bv = kBound ? double(b[i]) : 0.0;
    const double diff = gv - ev, ad = std::fabs(diff), ae = std::fabs(ev);
    n_checked += fin;
    nonzero += ev != 0.0;
    n_fail += ad > bv;  // 0 > b never holds for a masked pair
    sum_signed[j] += diff;
    sxy[j] += ev * gv;
    sxx_yy[j] += ev * ev + gv * gv;
    max_abs = max_of(max_abs, ad);
    if (ev != 0.0) max_rel = max_quotient(max_rel, ad, ae);
    if (bv > 0) max_ratio = max_quotient(max_ratio, ad, bv);
    else if (ad > 0) max_ratio = inf;
    if constexpr (kAnchor) anchor_fail += fin && !(ad < aa || quotient_below(ad, ae + 1e-6, ar));
  };
  int64_t i = i0;
  for (; i + L <= i1; i += L)
    for (int j = 0; j < L; ++j) element(i + j, j);
  for (int j = 0; i + j < i1; ++j) element(i + j, j);
  FloatBlock r;
  r.n_checked = double(n_checked);
  r.nonzero = double(nonzero);
  r.n_fail = double(n_fail);
  r.anchor_fail = double(anchor_fail);
  for (int j = 0; j < L; ++j) {
    r.sum_signed += sum_signed[j];
    r.sxy += sxy[j];
    r.sxx_yy += sxx_yy[j];
  }
  r.max_abs = max_abs;
  r.max_rel = max_rel;
  r.max_ratio = max_ratio;
  return r;
}

// The blocks of elements [0, n), in parallel; parts[k] is block k's.
std::vector<FloatBlock> float_blocks(const float* e, const float* g, const float* b, int64_t n, double aa, double ar) {
  const int64_t blocks = (n + kCompareBlock - 1) / kCompareBlock;
  std::vector<FloatBlock> parts(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t i0 = k * kCompareBlock, i1 = std::min(n, i0 + kCompareBlock);
    FloatBlock& p = parts[size_t(k)];
    if (b) p = ar >= 0 ? float_block<true, true>(e, g, b, i0, i1, aa, ar) : float_block<true, false>(e, g, b, i0, i1, aa, ar);
    else p = ar >= 0 ? float_block<false, true>(e, g, b, i0, i1, aa, ar) : float_block<false, false>(e, g, b, i0, i1, aa, ar);
  }
  return parts;
}

double calc_diff_of(const std::vector<FloatBlock>& parts) {
  double sxy = 0, sxx_yy = 0;
  for (const FloatBlock& p : parts) { sxy += p.sxy; sxx_yy += p.sxx_yy; }
  return sxx_yy == 0 ? 0.0 : 1.0 - 2.0 * sxy / sxx_yy;
}

// The mismatches of a block that has any (a non-finite pair, an element beyond its bound, an
// anchor failure), element by element as compare_floats states them: the special-value failures,
// the first kMaxMismatches mismatches in element order, and the block's first anchor failure
// (`anchor`: its mismatch when it is within its bound, which only the tensor's first is listed).
struct BlockEvents {
  int64_t special_fail = 0, first_anchor = -1;
  std::vector<std::pair<int64_t, Mismatch>> list;
  std::optional<Mismatch> anchor;
};

BlockEvents block_events(const Tensor<float>& expected, const Tensor<float>& got, const FloatRule& rule, int64_t i0, int64_t i1) {
  BlockEvents v;
  for (int64_t i = i0; i < i1; ++i) {
    const float e = expected[i], g = got[i];
    if (!std::isfinite(e) || !std::isfinite(g)) {
      const bool same = (std::isnan(e) && std::isnan(g)) || (std::isinf(e) && e == g);
      if (!same) {
        ++v.special_fail;
        if (v.list.size() < kMaxMismatches)
          v.list.push_back({i, {unflatten(i, expected.shape), e, g, std::numeric_limits<double>::quiet_NaN(), 0,
                                std::string("golden is ") + fclass(e) + ", candidate is " + fclass(g)}});
      }
      continue;
    }
    const double diff = double(g) - double(e), ad = std::fabs(diff);
    const double bound = rule.bound.empty() ? 0.0 : rule.bound[size_t(i)];
    if (v.first_anchor < 0 && rule.anchor_rel >= 0 && !(ad < rule.anchor_abs || ad / (std::fabs(double(e)) + 1e-6) < rule.anchor_rel)) {
      v.first_anchor = i;
      if (ad <= bound) v.anchor = Mismatch{unflatten(i, expected.shape), e, g, diff, bound, "fails " + rule.anchor_name};
    }
    if (ad > bound && v.list.size() < kMaxMismatches) v.list.push_back({i, {unflatten(i, expected.shape), e, g, diff, bound, ""}});
  }
  return v;
}

}  // namespace

// calc_diff's sums run in compare_floats' blocks and lanes (above), so compare_floats' metric is
// this function's value.
double calc_diff(const float* x, const float* y, int64_t n) { return calc_diff_of(float_blocks(x, y, nullptr, n, -1, -1)); }

// One pass over the elements (float_blocks: counts, sums and maxima, blocks in parallel), then an
// element-by-element pass over the blocks that have a mismatch (block_events), merged in block
// order: the mismatch list is the first kMaxMismatches in element order.
Report compare_floats(const std::string& tensor, const Tensor<float>& expected, const Tensor<float>& got,
                      const FloatRule& rule) {
  Report r;
  r.tensor = tensor;
  if (expected.shape != got.shape) {
    r.verdict = Verdict::fail;
    r.reasons.push_back("shape " + shape_str(got.shape) + " differs from the golden " + shape_str(expected.shape));
    return r;
  }
  require(rule.bound.empty() || int64_t(rule.bound.size()) == expected.numel(),
          "compare " + tensor + ": bound has the wrong size");
  const int64_t n = expected.numel();
  r.stats.n = n;
  const std::vector<FloatBlock> parts = float_blocks(expected.ptr(), got.ptr(), rule.bound.empty() ? nullptr : rule.bound.data(), n,
                                                     rule.anchor_abs, rule.anchor_rel);
  // 1. Special values (class and sign), 2. the finite pairs' bounds and the anchor: mismatches.
  std::vector<BlockEvents> events(parts.size());
#pragma omp parallel for schedule(static) if (parts.size() > 1)
  for (size_t k = 0; k < parts.size(); ++k) {
    const int64_t i0 = int64_t(k) * kCompareBlock, i1 = std::min(n, i0 + kCompareBlock);
    const FloatBlock& p = parts[k];
    if (p.n_checked < double(i1 - i0) || p.n_fail > 0 || p.anchor_fail > 0) events[k] = block_events(expected, got, rule, i0, i1);
  }
  int64_t special_fail = 0, nonzero = 0, anchor_fail = 0;
  double sum_signed = 0;
  bool anchor_seen = false;
  for (size_t k = 0; k < parts.size(); ++k) {
    const FloatBlock& p = parts[k];
    r.stats.n_checked += int64_t(p.n_checked);
    r.stats.n_fail += int64_t(p.n_fail);
    nonzero += int64_t(p.nonzero);
    anchor_fail += int64_t(p.anchor_fail);
    sum_signed += p.sum_signed;
    r.stats.max_abs = std::max(r.stats.max_abs, p.max_abs);
    r.stats.max_rel = std::max(r.stats.max_rel, p.max_rel);
    r.stats.max_ratio = std::max(r.stats.max_ratio, p.max_ratio);
    BlockEvents& v = events[k];
    special_fail += v.special_fail;
    if (!anchor_seen && v.first_anchor >= 0) {  // the tensor's first anchor failure
      anchor_seen = true;
      if (v.anchor) {
        auto at = std::find_if(v.list.begin(), v.list.end(), [&](const auto& m) { return m.first > v.first_anchor; });
        v.list.insert(at, {v.first_anchor, *v.anchor});
      }
    }
    for (auto& m : v.list) add_mismatch(r, std::move(m.second));
  }
  const double max_err = r.stats.max_abs;
  r.stats.n_fail += special_fail;
  r.stats.mean_signed = r.stats.n_checked ? sum_signed / double(r.stats.n_checked) : 0.0;
  r.stats.metric = calc_diff_of(parts);
  // Verdict.
  if (special_fail)
    r.reasons.push_back(std::to_string(special_fail) + " element(s) where inf/NaN positions differ");
  if (r.stats.n_fail > special_fail)
    r.reasons.push_back(std::to_string(r.stats.n_fail - special_fail) + " element(s) beyond their bound" +
                        (rule.derivation.empty() ? "" : " (" + rule.derivation + ")"));
  if (anchor_fail) {
    char buf[240];
    std::snprintf(buf, sizeof buf, "%lld element(s) fail %s (|err| < %.3g or rel < %.3g)", (long long)anchor_fail,
                  rule.anchor_name.c_str(), rule.anchor_abs, rule.anchor_rel);
    r.reasons.push_back(buf);
  }
  if (rule.metric_max >= 0 && r.stats.metric > rule.metric_max) {
    char buf[240];
    std::snprintf(buf, sizeof buf, "calc_diff %.4g exceeds its threshold %.4g%s%s", r.stats.metric, rule.metric_max,
                  rule.metric_name.empty() ? "" : " ", rule.metric_name.c_str());
    r.reasons.push_back(buf);
  }
  if (rule.budget_max_abs >= 0 && max_err > rule.budget_max_abs) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "max |error| %.4g exceeds the error budget %.4g (FlashAttention-style, see manifest)",
                  max_err, rule.budget_max_abs);
    r.reasons.push_back(buf);
  }
  if (!r.reasons.empty()) r.verdict = Verdict::fail;
  else if (nonzero == 0) {
    r.verdict = Verdict::mistrusted;
    r.reasons.push_back("the golden has no finite non-zero element: nothing to measure");
  }
  return r;
}

Report compare_exact(const std::string& tensor, const Tensor<int32_t>& expected, const Tensor<int32_t>& got) {
  Report r;
  r.tensor = tensor;
  r.stats.n = expected.numel();
  if (expected.shape != got.shape) {
    r.verdict = Verdict::fail;
    r.reasons.push_back("shape " + shape_str(got.shape) + " differs from the golden " + shape_str(expected.shape));
    return r;
  }
  for (int64_t i = 0; i < expected.numel(); ++i) {
    ++r.stats.n_checked;
    if (expected[i] != got[i]) {
      ++r.stats.n_fail;
      add_mismatch(r, {unflatten(i, expected.shape), double(expected[i]), double(got[i]),
                       double(got[i]) - double(expected[i]), 0, ""});
    }
  }
  if (r.stats.n_fail) {
    r.verdict = Verdict::fail;
    r.reasons.push_back(std::to_string(r.stats.n_fail) + " element(s) differ (exact comparison)");
  }
  return r;
}

// ---- Top-k -------------------------------------------------------------------------------------

Report compare_topk(const std::string& tensor, const Tensor<float>& golden_logits, const Tensor<int32_t>& ks,
                    const Tensor<int32_t>& ke, const Tensor<int32_t>& golden_topk, const Tensor<int32_t>& cand,
                    const TopkOptions& opt) {
  return compare_topk(tensor, [&]() -> const Tensor<float>& { return golden_logits; }, ks, ke, golden_topk, cand, opt);
}

namespace {

// One row's judgement (compare_topk): its kind, and what a report needs of it.
enum class Row : uint8_t { ok, structural, selection, near_tie, wide_tie, scores };
struct RowResult {
  Row kind = Row::ok;
  bool nontrivial = false, checked = false;  // checked: well formed, with a nonempty window
  double recall = 1.0;
  std::string what;  // the mismatch of a structural or selection failure
};
// Position sets per row as sorted vectors of distinct values (what std::set would iterate).
void sorted_set(std::vector<int32_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}
bool member(const std::vector<int32_t>& v, int32_t x) { return std::binary_search(v.begin(), v.end(), x); }

// Row t, well formed, whose golden scores differ from the golden selection's: is every swap a near
// tie the candidate's own logits explain (near_tie), one the contract's arithmetic cannot explain
// (wide_tie, `what` says so), or neither (selection)? seen and gold: the row's positions, sorted.
Row near_ties(int64_t t, const std::vector<int32_t>& seen, const std::vector<int32_t>& gold, const Tensor<float>& golden_logits,
              const Tensor<int32_t>& ks, const TopkOptions& opt, double recall, std::string& what) {
  if (!opt.candidate_logits) return Row::selection;
  const int64_t s_kv = golden_logits.dim(1);
  std::vector<int32_t> taken, missed;
  for (int32_t v : seen) if (!member(gold, v)) taken.push_back(v);
  for (int32_t v : gold) if (!member(seen, v)) missed.push_back(v);
  auto dev = [&](int32_t v) {
    const int64_t c = ks[t] + v;
    return std::fabs(double(opt.candidate_logits->at(t, c)) - double(golden_logits.at(t, c)));
  };
  auto within = [&](int32_t v) {
    return !opt.logits_rule || opt.logits_rule->bound.empty() || dev(v) <= opt.logits_rule->bound[size_t(t * s_kv + ks[t] + v)];
  };
  // Pair the taken positions (ascending golden score) with the missed ones (descending).
  std::sort(taken.begin(), taken.end(), [&](int32_t a, int32_t b) { return golden_logits.at(t, ks[t] + a) < golden_logits.at(t, ks[t] + b); });
  std::sort(missed.begin(), missed.end(), [&](int32_t a, int32_t b) { return golden_logits.at(t, ks[t] + a) > golden_logits.at(t, ks[t] + b); });
  // The gap the contract's arithmetic can move two scores across.
  auto contract_gap = [&](int32_t a, int32_t b) {
    if (opt.contract_tie < 0 || !opt.logits_rule || opt.logits_rule->bound.empty()) return std::numeric_limits<double>::infinity();
    const size_t row = size_t(t * s_kv + ks[t]);
    return opt.contract_tie * (double(opt.logits_rule->bound[row + size_t(a)]) + double(opt.logits_rule->bound[row + size_t(b)]));
  };
  bool legit = taken.size() == missed.size(), wide = false;
  for (size_t i = 0; legit && i < taken.size(); ++i) {
    const double gap = double(golden_logits.at(t, ks[t] + missed[i])) - double(golden_logits.at(t, ks[t] + taken[i]));
    legit = within(taken[i]) && within(missed[i]) && gap <= dev(taken[i]) + dev(missed[i]);
    if (legit && gap > contract_gap(taken[i], missed[i])) wide = true;
  }
  if (legit && wide) {
    char buf[240];
    std::snprintf(buf, sizeof buf, "near ties wider than the contract's arithmetic moves a score (recall %.3f): top-k from "
                  "low-precision scores", recall);
    what = buf;
    return Row::wide_tie;
  }
  return legit ? Row::near_tie : Row::selection;
}

// The rows' results folded into the report in row order (counts, recall, mismatches, reasons, verdict).
void fold_rows(Report& r, std::vector<RowResult>& rows) {
  const int64_t s_q = int64_t(rows.size());
  int64_t structural = 0, selection = 0, nontrivial = 0, near_ties = 0, wide_ties = 0;
  double recall_sum = 0;
  r.stats.recall_min = 1;
  for (int64_t t = 0; t < s_q; ++t) {
    RowResult& x = rows[size_t(t)];
    nontrivial += x.nontrivial;
    recall_sum += x.recall;
    r.stats.recall_min = std::min(r.stats.recall_min, x.recall);
    if (x.kind == Row::structural) {
      add_mismatch(r, {{t}, 0, 0, 0, 0, std::move(x.what)});
      ++structural;
      ++r.stats.n_fail;
      continue;
    }
    if (x.checked) ++r.stats.n_checked;
    if (x.kind == Row::near_tie) ++near_ties;
    if (x.kind == Row::wide_tie) {
      ++wide_ties;
      ++r.stats.n_fail;
      add_mismatch(r, {{t}, 0, 0, 0, 0, std::move(x.what)});
    }
    if (x.kind == Row::selection) {
      ++selection;
      ++r.stats.n_fail;
      add_mismatch(r, {{t}, 0, 0, 0, 0, std::move(x.what)});
    }
  }
  r.stats.recall_mean = s_q ? recall_sum / double(s_q) : 1.0;
  r.stats.wide_ties = wide_ties;
  r.stats.near_ties = near_ties;
  if (structural) r.reasons.push_back(std::to_string(structural) + " row(s) with malformed positions");
  if (selection) r.reasons.push_back(std::to_string(selection) + " row(s) whose selected scores differ from the golden's");
  if (near_ties) r.reasons.push_back(std::to_string(near_ties) + " row(s) differ only by near ties explained by the candidate's logits (accepted)");
  if (wide_ties)
    r.reasons.push_back(std::to_string(wide_ties) + " row(s) differ by near ties wider than the contract's arithmetic explains, "
                        "however the candidate's logits moved: top-k from low-precision scores");
  if (structural || selection || wide_ties) r.verdict = Verdict::fail;
  else if (nontrivial == 0) {
    r.verdict = Verdict::mistrusted;
    r.reasons.push_back("every row has length <= topk: the selection is not exercised");
  }
}

// What compare_topk judges a row of: the windows, the golden's and the candidate's top-k, the options.
struct TopkInputs {
  const Tensor<int32_t>&ks, &ke, &golden_topk, &cand;  // windows [s_q]; top-k [s_q, topk]
  const TopkOptions& opt;
  int64_t topk;
};

// Row t; seen_in[v] == t marks position v taken in row t (a thread's own array); gold and
// in_window are the thread's scratch.
RowResult judge_topk_row(const TopkInputs& in, int64_t t, const Tensor<float>* lg, std::vector<int64_t>& seen_in,
                         std::vector<int32_t>& gold, std::vector<int32_t>& in_window) {
  const Tensor<int32_t>&ks = in.ks, &ke = in.ke, &golden_topk = in.golden_topk, &cand = in.cand;
  const TopkOptions& opt = in.opt;
  const int64_t topk = in.topk;
  RowResult x;
  const int64_t len = ke[t] - ks[t], k_eff = std::min(topk, len);
  x.nontrivial = len > topk;
  // A row that is the golden's slot for slot needs no sets when it is well formed: its positions
  // are the golden's (recall 1, the same scores). Any other row, or a malformed one, has them.
  const bool same = std::equal(cand.ptr() + t * topk, cand.ptr() + (t + 1) * topk, golden_topk.ptr() + t * topk);
  int64_t common = 0;
  auto sets = [&] {
    gold.clear();
    for (int64_t j = 0; j < topk; ++j) if (golden_topk.at(t, j) >= 0) gold.push_back(golden_topk.at(t, j));
    sorted_set(gold);
    // Recall over every row, malformed ones included: the distinct in-window positions it holds.
    in_window.clear();
    for (int64_t j = 0; j < topk; ++j)
      if (cand.at(t, j) >= 0 && cand.at(t, j) < len) in_window.push_back(cand.at(t, j));
    sorted_set(in_window);
    for (int32_t v : in_window) common += member(gold, v);
    x.recall = k_eff ? double(std::min(common, k_eff)) / double(k_eff) : 1.0;
  };
  if (!same) sets();
  // The value a slot holds as the candidate wrote it (a kv row when opt.kv_rows).
  auto shown = [&](int64_t j) {
    return opt.kv_rows ? "kv row " + std::to_string(opt.kv_rows->at(t, j)) : std::to_string(cand.at(t, j));
  };
  auto window = [&] {
    return opt.kv_rows ? "the row's window [" + std::to_string(ks[t]) + ", " + std::to_string(ke[t]) + ")"
                       : "[0, " + std::to_string(len) + ")";
  };
  // 1. Structure.
  int64_t valid = 0, first_pad = -1;
  for (int64_t j = 0; j < topk; ++j) {
    const int32_t v = cand.at(t, j);
    if (v == -1) { if (first_pad < 0) first_pad = j; continue; }
    if (v < 0 || v >= len) {
      x.what = "slot " + std::to_string(j) + " holds " + shown(j) + ", outside " + window() + " and not -1";
      break;
    }
    if (seen_in[size_t(v)] == t) {
      x.what = (opt.kv_rows ? shown(j) : "position " + shown(j)) + " appears twice";
      break;
    }
    seen_in[size_t(v)] = t;
    if (opt.trailing_padding && first_pad >= 0) { x.what = "valid position after a -1 slot (padding must be trailing)"; break; }
    ++valid;
  }
  if (x.what.empty() && valid != k_eff)
    x.what = std::to_string(valid) + " valid slots, expected min(topk, length) = " + std::to_string(k_eff);
  if (!x.what.empty()) {
    if (same) sets();
    x.kind = Row::structural;
    return x;
  }
  x.checked = len > 0;
  if (same) return x;
  // A well-formed row's positions are its distinct in-window values, ascending.
  const std::vector<int32_t>& seen = in_window;
  // 2. Selection: multisets of golden scores. The same positions as the golden's give the same
  // multiset: nothing to sort.
  if (size_t(common) == gold.size() && seen.size() == gold.size()) return x;
  if (!lg) { x.kind = Row::scores; return x; }
  const Tensor<float>& golden_logits = *lg;
  std::vector<float> sc, sg;
  for (int32_t v : seen) sc.push_back(golden_logits.at(t, ks[t] + v));
  for (int32_t v : gold) sg.push_back(golden_logits.at(t, ks[t] + v));
  std::sort(sc.begin(), sc.end());
  std::sort(sg.begin(), sg.end());
  if (sc == sg) return x;
  // Near ties explained by the candidate's own logits.
  x.kind = near_ties(t, seen, gold, golden_logits, ks, opt, x.recall, x.what);
  if (x.kind != Row::selection) return x;
  char buf[200];
  std::snprintf(buf, sizeof buf, "selected scores differ from the golden's (recall %.3f): a true winner is missing",
                x.recall);
  x.what = buf;
  return x;
}

}  // namespace

Report compare_topk(const std::string& tensor, const std::function<const Tensor<float>&()>& logits_of, const Tensor<int32_t>& ks,
                    const Tensor<int32_t>& ke, const Tensor<int32_t>& golden_topk, const Tensor<int32_t>& cand,
                    const TopkOptions& opt) {
  Report r;
  r.tensor = tensor;
  if (cand.shape != golden_topk.shape) {
    r.verdict = Verdict::fail;
    r.reasons.push_back("shape " + shape_str(cand.shape) + " differs from the golden " + shape_str(golden_topk.shape));
    return r;
  }
  const int64_t s_q = golden_topk.dim(0), topk = golden_topk.dim(1);
  r.stats.n = s_q;
  // Each row is judged on its own (below), in parallel over fixed blocks of rows; the rows' results
  // are then folded in row order (fold_rows): the report is the same for any thread count. A row
  // that has to compare scores before the logits are at hand (`lg` null) waits for a second sweep.
  int64_t max_len = 0;
  for (int64_t t = 0; t < s_q; ++t) max_len = std::max<int64_t>(max_len, ke[t] - ks[t]);
  const TopkInputs in{ks, ke, golden_topk, cand, opt, topk};
  auto judge_row = [&](int64_t t, const Tensor<float>* lg, std::vector<int64_t>& seen_in, std::vector<int32_t>& gold,
                       std::vector<int32_t>& in_window) { return judge_topk_row(in, t, lg, seen_in, gold, in_window); };
  std::vector<RowResult> rows(static_cast<size_t>(s_q));
  constexpr int64_t kTopkBlock = 64;  // rows per block of the parallel loop
  const int64_t blocks = (s_q + kTopkBlock - 1) / kTopkBlock;
  // Sweep 1 without the scores; sweep 2 (only when some row needs them) judges those rows again
  // with them. A row's result does not depend on the sweep that judged it.
  const Tensor<float>* lg = nullptr;
  for (int sweep = 1; sweep <= 2; ++sweep) {
    if (sweep == 2) {
      if (std::none_of(rows.begin(), rows.end(), [](const RowResult& x) { return x.kind == Row::scores; })) break;
      lg = &logits_of();
    }
#pragma omp parallel
    {
      std::vector<int64_t> seen_in(size_t(max_len), -1);
      std::vector<int32_t> gold, in_window;
#pragma omp for schedule(dynamic, 1)
      for (int64_t b = 0; b < blocks; ++b)
        for (int64_t t = b * kTopkBlock; t < std::min(s_q, (b + 1) * kTopkBlock); ++t)
          if (sweep == 1 || rows[size_t(t)].kind == Row::scores) rows[size_t(t)] = judge_row(t, lg, seen_in, gold, in_window);
    }
  }
  fold_rows(r, rows);
  return r;
}

}  // namespace indexshare::cmp
