// Tests of judge/compare (and the bounds of ref/bounds.h): the comparison module judges faults as the issue states. Candidates are
// built by injecting faults into the golden outputs, or by independent low-precision emulations
// written here (a kernel-like computation must PASS, a wrong one must FAIL).
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "tools/judge/compare.h"
#include "ref/layer.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "ref/topk.h"

using namespace indexshare;

namespace {
const float kInf = std::numeric_limits<float>::infinity();

struct Golden {
  Problem p;
  ref::LayerInputs in;
  ref::LayerOutputs out;
};
Golden golden(const std::string& desc) {
  Golden g{parse_problem(desc), {}, {}};
  g.in = ref::make_layer_inputs(g.p);
  g.out = ref::run_layer(g.p, g.in);
  return g;
}
cmp::FloatRule out_rule(const Golden& g, const Tensor<int32_t>& indices) {
  cmp::AttentionBounds b = cmp::attention_bounds(g.in.q, g.in.kv, indices, g.p.sm_scale(), g.p.d_v, nullptr, g.out.attn);
  cmp::FloatRule r;
  r.bound = b.out;
  const ref::AttentionOut emu = cmp::emulate_attention_lowp(g.in.q, g.in.kv, indices, g.p.sm_scale(), g.p.d_v, nullptr, nullptr);
  r.budget_max_abs = cmp::attention_budget(g.out.attn.out, emu.out);
  return r;
}
Tensor<float> bf16_values(const Tensor<bf16_t>& t) {
  Tensor<float> f(t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) f[i] = bf16_to_f32(t[i]);
  return f;
}
// x moved by n bf16 ulps (n may be negative), x a bf16 value.
float bf16_ulps(float x, int n) {
  uint16_t b = f32_to_bf16(x).bits;
  const bool neg = b & 0x8000;
  int mag = b & 0x7FFF;
  mag += neg ? -n : n;
  if (mag < 0) return x;
  return bf16_to_f32(bf16_t{uint16_t((b & 0x8000) | mag)});
}
}  // namespace

TEST_CASE("compare: calc_diff is DeepGEMM's metric") {
  const float x[3] = {1, 2, 3}, y[3] = {1, 2, 3}, z[3] = {-1, -2, -3}, w[3] = {0, 0, 0};
  CHECK(cmp::calc_diff(x, y, 3) == 0.0);
  CHECK(cmp::calc_diff(x, z, 3) == 2.0);
  CHECK(cmp::calc_diff(w, w, 3) == 0.0);
  const float a[2] = {3, 4}, b[2] = {3, 5};  // |x-y|^2 / (|x|^2 + |y|^2) = 1 / 59
  CHECK(std::fabs(cmp::calc_diff(a, b, 2) - 1.0 / 59.0) < 1e-15);
}

TEST_CASE("compare: attention out — kernel-precision results pass, injected faults fail") {
  const Golden g = golden("sq16 skv64 hq4 dqk64 dv32 ih4 id32 k16 seed11");
  const cmp::FloatRule rule = out_rule(g, g.out.indices);
  SUBCASE("the bf16 output and a bf16-P / f32-accumulation emulation pass") {
    CHECK(cmp::compare_floats("out", g.out.attn.out, bf16_values(g.out.attn.out_bf16), rule).verdict == cmp::Verdict::pass);
    const ref::AttentionOut emu = cmp::emulate_attention_lowp(g.in.q, g.in.kv, g.out.indices, g.p.sm_scale(), g.p.d_v, nullptr, nullptr);
    const cmp::Report r = cmp::compare_floats("out", g.out.attn.out, emu.out, rule);
    CHECK(r.verdict == cmp::Verdict::pass);
    MESSAGE("emulation: " << r.stats_line());
  }
  SUBCASE("1-2 bf16 ulp noise passes") {
    Tensor<float> c = bf16_values(g.out.attn.out_bf16);
    Xoshiro256 rng(5);
    for (float& v : c.data) v = bf16_ulps(v, int(rng.below(5)) - 2);
    const cmp::Report r = cmp::compare_floats("out", g.out.attn.out, c, rule);
    CHECK(r.verdict == cmp::Verdict::pass);
    MESSAGE("2-ulp noise: " << r.stats_line());
  }
  SUBCASE("a few bf16 ulps beyond the bound fail, naming the element") {
    Tensor<float> c = bf16_values(g.out.attn.out_bf16);
    const int64_t e = 5 * 32 + 7;  // row 1, head 1, column 7
    float v = c[e];
    while (std::fabs(double(v) - double(g.out.attn.out[e])) <= rule.bound[size_t(e)]) v = bf16_ulps(v, 1);
    c[e] = bf16_ulps(v, 3);
    const cmp::Report r = cmp::compare_floats("out", g.out.attn.out, c, rule);
    CHECK(r.verdict == cmp::Verdict::fail);
    REQUIRE(!r.mismatches.empty());
    CHECK(r.mismatches[0].index == std::vector<int64_t>{1, 1, 7});
  }
  SUBCASE("NaN in one element fails") {
    Tensor<float> c = g.out.attn.out;
    c[40] = std::nanf("");
    const cmp::Report r = cmp::compare_floats("out", g.out.attn.out, c, rule);
    CHECK(r.verdict == cmp::Verdict::fail);
    CHECK(r.mismatches[0].what.find("NaN") != std::string::npos);
  }
  SUBCASE("attention over a different key set fails") {
    Tensor<int32_t> other = g.out.indices;
    for (int32_t& v : other.data) if (v > 0) v -= 1;
    const ref::AttentionOut wrong = ref::sparse_attention(g.in.q, g.in.kv, other, g.p.sm_scale(), g.p.d_v);
    CHECK(cmp::compare_floats("out", g.out.attn.out, wrong.out, rule).verdict == cmp::Verdict::fail);
  }
}

TEST_CASE("compare: lse — emulation passes, base 2 fails, +inf positions must match") {
  const Golden g = golden("sq8 skv48 hq2 dqk64 dv32 ih4 id32 k8 seed3");
  cmp::AttentionBounds b = cmp::attention_bounds(g.in.q, g.in.kv, g.out.indices, g.p.sm_scale(), g.p.d_v, nullptr, g.out.attn);
  cmp::FloatRule rule;
  rule.bound = b.lse;
  const ref::AttentionOut emu = cmp::emulate_attention_lowp(g.in.q, g.in.kv, g.out.indices, g.p.sm_scale(), g.p.d_v, nullptr, nullptr);
  CHECK(cmp::compare_floats("lse", g.out.attn.lse, emu.lse, rule).verdict == cmp::Verdict::pass);
  Tensor<float> base2 = g.out.attn.lse;
  for (float& v : base2.data) v = float(double(v) / std::log(2.0));
  CHECK(cmp::compare_floats("lse", g.out.attn.lse, base2, rule).verdict == cmp::Verdict::fail);
  Tensor<float> golden_inf = g.out.attn.lse, cand = g.out.attn.lse;
  golden_inf[0] = kInf;  // an empty row in the golden ...
  CHECK(cmp::compare_floats("lse", golden_inf, cand, rule).verdict == cmp::Verdict::fail);
  cand[0] = -kInf;       // ... answered with the Sept-2025 convention (-inf)
  CHECK(cmp::compare_floats("lse", golden_inf, cand, rule).verdict == cmp::Verdict::fail);
  cand[0] = kInf;
  CHECK(cmp::compare_floats("lse", golden_inf, cand, rule).verdict == cmp::Verdict::pass);
  Tensor<float> wrong_shape({8, 3});
  CHECK(cmp::compare_floats("lse", g.out.attn.lse, wrong_shape, rule).verdict == cmp::Verdict::fail);
}

TEST_CASE("compare: indexer logits — f32 accumulation passes, a 1% error and -inf mismatches fail") {
  const Golden g = golden("sq12 skv40 hq2 dqk16 dv8 ih8 id64 k8 seed5");
  const cmp::FloatRule rule = cmp::indexer_logits_rule(g.in.index_q8, g.in.index_k8, g.in.index_k_scale, g.in.index_weights, g.out.logits);
  // A GPU-like evaluation: f32 dot accumulation in descending d, f32 head sum, k_scale first.
  Tensor<float> c(g.out.logits.shape, -kInf);
  const int64_t H = 8, D = 64;
  for (int64_t t = 0; t < 12; ++t)
    for (int64_t s = g.in.ks[t]; s < g.in.ke[t]; ++s) {
      float acc = 0;
      for (int64_t h = H - 1; h >= 0; --h) {
        float dot = 0;
        for (int64_t d = D - 1; d >= 0; --d) dot += e4m3_to_f32(g.in.index_q8.at(t, h, d)) * e4m3_to_f32(g.in.index_k8.at(s, d));
        acc += std::max(dot * g.in.index_k_scale[s], 0.0f) * g.in.index_weights.at(t, h);
      }
      c.at(t, s) = acc;
    }
  const cmp::Report ok = cmp::compare_floats("logits", g.out.logits, c, rule);
  CHECK(ok.verdict == cmp::Verdict::pass);
  MESSAGE("f32 kernel emulation: " << ok.stats_line());
  // A 10% error on the largest logit is beyond the 14-bit-accumulator bound, 4 sqrt(D + H + 2)
  // 2^-14 = 0.2% of the magnitude sum sum_h |w| sum_d |q k| (about 20x the logit here).
  int64_t big = 0;
  for (int64_t i = 0; i < c.numel(); ++i) if (std::isfinite(c[i]) && std::fabs(c[i]) > std::fabs(c[big])) big = i;
  Tensor<float> bad = c;
  bad[big] *= 1.1f;
  CHECK(cmp::compare_floats("logits", g.out.logits, bad, rule).verdict == cmp::Verdict::fail);
  bad = c;
  bad.at(3, 30) = 0.0f;  // outside the causal window the golden holds -inf
  CHECK(cmp::compare_floats("logits", g.out.logits, bad, rule).verdict == cmp::Verdict::fail);
}

TEST_CASE("compare: top-k positions — ties pass, wrong selections and malformed rows fail") {
  // Tie-heavy logits: many equal scores, so several selections are correct.
  const Golden g = golden("sq16 skv64 hq2 dqk16 dv8 ih2 id16 k8 seed9 dist=ties");
  const Tensor<float>& L = g.out.logits;
  const Tensor<int32_t>& G = g.out.topk;
  auto judge = [&](const Tensor<int32_t>& c, const cmp::TopkOptions& o = {}) {
    return cmp::compare_topk("topk", L, g.in.ks, g.in.ke, G, c, o);
  };
  CHECK(judge(G).verdict == cmp::Verdict::pass);
  // Find a row where the k-th score ties with an unselected position, and swap them.
  Tensor<int32_t> tie = G;
  int64_t row = -1;
  for (int64_t t = 0; t < 16 && row < 0; ++t) {
    const float kth = L.at(t, G.at(t, 7));
    std::set<int32_t> sel(G.data.begin() + t * 8, G.data.begin() + t * 8 + 8);
    for (int32_t s = 0; s < g.in.ke[t] && row < 0; ++s)
      if (!sel.count(s) && L.at(t, s) == kth) { tie.at(t, 7) = s; row = t; }
  }
  REQUIRE(row >= 0);
  // Slot order never matters either.
  std::swap(tie.at(row, 0), tie.at(row, 5));
  const cmp::Report tr = judge(tie);
  CHECK(tr.verdict == cmp::Verdict::pass);
  CHECK(tr.stats.recall_min < 1.0);
  // A non-tie replacement fails.
  Tensor<int32_t> wrong = G;
  for (int32_t s = 0; s < g.in.ke[0]; ++s) {
    std::set<int32_t> sel(G.data.begin(), G.data.begin() + 8);
    if (!sel.count(s) && L.at(0, s) < L.at(0, G.at(0, 7))) { wrong.at(0, 0) = s; break; }
  }
  CHECK(judge(wrong).verdict == cmp::Verdict::fail);
  // A dropped winner replaced by -1 fails (valid count).
  Tensor<int32_t> dropped = G;
  dropped.at(15, 0) = -1;
  std::swap(dropped.at(15, 0), dropped.at(15, 7));
  CHECK(judge(dropped).verdict == cmp::Verdict::fail);
  // Duplicates, out-of-range values and -1 before a valid slot fail.
  Tensor<int32_t> dup = G;
  dup.at(2, 1) = dup.at(2, 0);
  CHECK(judge(dup).verdict == cmp::Verdict::fail);
  Tensor<int32_t> oob = G;
  oob.at(2, 1) = 1000;
  CHECK(judge(oob).verdict == cmp::Verdict::fail);
  // -1 before a valid slot: refused when the producer promises trailing padding.
  const Golden sh = golden("sq8 skv8 hq2 dqk16 dv8 ih2 id16 k4 seed9");  // row 0 has one key
  Tensor<int32_t> pad = sh.out.topk;
  std::swap(pad.at(0, 0), pad.at(0, 1));              // [-1, 0, -1, -1]
  auto judge_short = [&](const Tensor<int32_t>& c, const cmp::TopkOptions& o) {
    return cmp::compare_topk("topk", sh.out.logits, sh.in.ks, sh.in.ke, sh.out.topk, c, o);
  };
  CHECK(judge_short(pad, {}).verdict == cmp::Verdict::fail);
  cmp::TopkOptions loose;
  loose.trailing_padding = false;
  CHECK(judge_short(pad, loose).verdict == cmp::Verdict::pass);
}

TEST_CASE("compare: top-k near ties explained by the candidate's own logits pass") {
  // Find a row whose k-th winner a and best loser b are within the near-tie room (the sum of
  // their logit bounds), and swap them (the first seed that has one).
  Golden g;
  cmp::FloatRule rule;
  int64_t t = -1;
  int32_t a = 0, b = 0;
  double gap = 0;
  for (int seed = 2; seed < 200 && t < 0; ++seed) {
    g = golden("sq32 skv40 hq2 dqk16 dv8 ih4 id32 k8 seed" + std::to_string(seed));
    const Tensor<float>& L = g.out.logits;
    rule = cmp::indexer_logits_rule(g.in.index_q8, g.in.index_k8, g.in.index_k_scale, g.in.index_weights, L);
    Tensor<int32_t> full = ref::topk(L, g.in.ks, g.in.ke, 40);
    for (int64_t r = 0; r < 32 && t < 0; ++r) {
      if (g.in.ke[r] <= 8) continue;
      const int32_t ra = full.at(r, 7), rb = full.at(r, 8);
      const double gr = double(L.at(r, ra)) - double(L.at(r, rb));
      if (gr > 0 && gr < 0.9 * (rule.bound[size_t(r * 40 + ra)] + rule.bound[size_t(r * 40 + rb)])) { t = r; a = ra; b = rb; gap = gr; }
    }
  }
  REQUIRE(t >= 0);
  const Tensor<float>& L = g.out.logits;
  Tensor<float> cl = L;
  Tensor<int32_t> cand = g.out.topk;
  for (int64_t j = 0; j < 8; ++j) if (cand.at(t, j) == a) cand.at(t, j) = b;
  cmp::TopkOptions o;
  o.candidate_logits = &cl;
  o.logits_rule = &rule;
  // Without a deviation in the candidate's own logits, the swap drops a true winner.
  CHECK(cmp::compare_topk("topk", L, g.in.ks, g.in.ke, g.out.topk, cand, o).verdict == cmp::Verdict::fail);
  // With the candidate's logits moved within their bounds so that b outranks a, it is a near tie.
  cl.at(t, a) = float(L.at(t, a) - 0.55 * gap);
  cl.at(t, b) = float(L.at(t, b) + 0.55 * gap);
  CHECK(cmp::compare_topk("topk", L, g.in.ks, g.in.ke, g.out.topk, cand, o).verdict == cmp::Verdict::pass);
  // Moved beyond their bounds, the same swap is refused.
  cl.at(t, a) = float(L.at(t, a) - 10 * rule.bound[size_t(t * 40 + a)] - gap);
  CHECK(cmp::compare_topk("topk", L, g.in.ks, g.in.ke, g.out.topk, cand, o).verdict == cmp::Verdict::fail);
  // Rows shorter than k everywhere: nothing is selected, MISTRUSTED.
  const Golden s = golden("sq4 skv4 hq2 dqk16 dv8 ih4 id32 k8 seed2");
  CHECK(cmp::compare_topk("topk", s.out.logits, s.in.ks, s.in.ke, s.out.topk, s.out.topk).verdict == cmp::Verdict::mistrusted);
}

// The report printed recall_mean 0.77 below recall_min 1.0: malformed rows added 0 to the mean
// and were skipped for the min. Both are now over every row.
TEST_CASE("compare: top-k recall_mean and recall_min are over the same rows (never mean < min)") {
  const Golden g = golden("sq16 skv64 hq2 dqk16 dv8 ih2 id16 k8 seed9");
  const Tensor<int32_t>& G = g.out.topk;
  Tensor<int32_t> bad = G;
  bad.at(12, 3) = bad.at(12, 2);  // a duplicate: a malformed row, 7 of its 8 positions right
  const cmp::Report r = cmp::compare_topk("topk", g.out.logits, g.in.ks, g.in.ke, G, bad);
  CHECK(r.verdict == cmp::Verdict::fail);
  CHECK(r.stats.recall_min <= r.stats.recall_mean);
  CHECK(r.stats.recall_min == doctest::Approx(7.0 / 8));
  CHECK(r.stats.recall_mean == doctest::Approx((15 + 7.0 / 8) / 16));
}

namespace {
// Every field of a top-k report, recall exactly, as one string.
std::string topk_dump(const cmp::Report& r) {
  std::string d = cmp::verdict_name(r.verdict) + "|" + std::to_string(r.stats.n) + "|" + std::to_string(r.stats.n_checked) + "|" +
                  std::to_string(r.stats.n_fail) + "|";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a|%a|", r.stats.recall_mean, r.stats.recall_min);
  d += buf;
  for (const std::string& x : r.reasons) d += x + "|";
  for (const cmp::Mismatch& m : r.mismatches) d += std::to_string(m.index.at(0)) + ":" + m.what + "|";
  return d;
}
}  // namespace

// compare_topk judges rows in parallel over blocks of 64 and folds them in row order: every field
// of the report (counts, recall sums, reasons, the mismatch list) is the same with 1 and 2 threads,
// on a candidate with structural, selection and near-tie rows spread over several blocks, and the
// mismatch list holds the first failing rows in row order.
TEST_CASE("compare: top-k reports are the same with 1 and 2 threads (rows judged in parallel)") {
  const Golden g = golden("sq300 skv320 hq2 dqk16 dv8 ih4 id32 k8 seed4");
  const Tensor<float>& L = g.out.logits;
  const Tensor<int32_t>& G = g.out.topk;
  const cmp::FloatRule rule = cmp::indexer_logits_rule(g.in.index_q8, g.in.index_k8, g.in.index_k_scale, g.in.index_weights, L);
  Tensor<int32_t> c = G;
  Tensor<float> cl = L;
  std::vector<int64_t> failing;  // rows made to fail, ascending
  for (int64_t t = 20; t < 300; t += 7) {
    if (g.in.ke[t] - g.in.ks[t] <= 8) continue;
    if (t % 3 == 0) {  // a duplicate: structural
      c.at(t, 1) = c.at(t, 0);
      failing.push_back(t);
    } else if (t % 3 == 1) {  // a true winner replaced by a clear loser: selection
      std::set<int32_t> sel(G.data.begin() + t * 8, G.data.begin() + t * 8 + 8);
      int32_t lo = -1;
      for (int32_t s = 0; s < g.in.ke[t] - g.in.ks[t]; ++s)
        if (!sel.count(s) && (lo < 0 || L.at(t, g.in.ks[t] + s) < L.at(t, g.in.ks[t] + lo))) lo = s;
      if (lo < 0 || L.at(t, g.in.ks[t] + lo) >= L.at(t, g.in.ks[t] + G.at(t, 0))) continue;
      c.at(t, 0) = lo;
      failing.push_back(t);
    }
  }
  REQUIRE(failing.size() > 20);
  cmp::TopkOptions o;
  o.candidate_logits = &cl;
  o.logits_rule = &rule;
  const auto dump = topk_dump;
  const int before = omp_get_max_threads();
  std::string dumps[2];
  cmp::Report reports[2];
  for (int t = 1; t <= 2; ++t) {
    omp_set_num_threads(t);
    reports[t - 1] = cmp::compare_topk("topk", L, g.in.ks, g.in.ke, G, c, o);
    dumps[t - 1] = dump(reports[t - 1]);
  }
  omp_set_num_threads(before);
  CHECK(dumps[0] == dumps[1]);
  const cmp::Report& r = reports[0];
  CHECK(r.verdict == cmp::Verdict::fail);
  CHECK(r.stats.n_fail == int64_t(failing.size()));
  REQUIRE(!r.mismatches.empty());
  for (size_t i = 0; i < r.mismatches.size(); ++i) CHECK(r.mismatches[i].index.at(0) == failing[i]);
}

// The golden's logits on demand (diff of a set stored without them computes them only then): a
// candidate whose rows hold the golden's positions, in any slot order, reads no score; one with a
// tie swap, a dropped winner or a malformed row asks once; every report is the eager one. A row
// equal to the golden's slot for slot skips its sets only when well formed: a malformed golden row
// copied by the candidate still fails, with its recall over the sets.
TEST_CASE("compare: top-k with the golden's logits on demand reads them only where a row's positions differ") {
  const Golden g = golden("sq300 skv320 hq2 dqk16 dv8 ih4 id32 k8 seed4 dist=ties");
  const Tensor<float>& L = g.out.logits;
  const Tensor<int32_t>& G = g.out.topk;
  int calls = 0;
  auto judge = [&](const Tensor<int32_t>& gold, const Tensor<int32_t>& c) {
    calls = 0;
    const cmp::Report lazy = cmp::compare_topk("topk", [&]() -> const Tensor<float>& { ++calls; return L; }, g.in.ks, g.in.ke, gold, c);
    CHECK(topk_dump(lazy) == topk_dump(cmp::compare_topk("topk", L, g.in.ks, g.in.ke, gold, c)));
    return lazy;
  };
  CHECK(judge(G, G).verdict == cmp::Verdict::pass);
  CHECK(calls == 0);
  Tensor<int32_t> order = G;  // slot order reversed in every row: the same positions
  for (int64_t t = 0; t < G.dim(0); ++t) std::reverse(&order.at(t, 0), &order.at(t, 0) + 8);
  CHECK(judge(G, order).verdict == cmp::Verdict::pass);
  CHECK(calls == 0);
  // A tie swap: other positions with the same scores, which only the scores can tell.
  Tensor<int32_t> tie = G;
  int64_t row = -1;
  for (int64_t t = 0; t < G.dim(0) && row < 0; ++t) {
    const float kth = L.at(t, g.in.ks[t] + G.at(t, 7));
    std::set<int32_t> sel(G.data.begin() + t * 8, G.data.begin() + t * 8 + 8);
    for (int32_t s = 0; s < g.in.ke[t] - g.in.ks[t] && row < 0; ++s)
      if (!sel.count(s) && L.at(t, g.in.ks[t] + s) == kth) { tie.at(t, 7) = s; row = t; }
  }
  REQUIRE(row >= 0);
  CHECK(judge(G, tie).verdict == cmp::Verdict::pass);
  CHECK(calls == 1);
  Tensor<int32_t> wrong = tie;  // and a true winner replaced by the row's worst position elsewhere
  for (int64_t t = G.dim(0) - 1; t > row; --t) {
    if (g.in.ke[t] - g.in.ks[t] <= 8) continue;
    std::set<int32_t> sel(G.data.begin() + t * 8, G.data.begin() + t * 8 + 8);
    int32_t lo = -1;
    for (int32_t s = 0; s < g.in.ke[t] - g.in.ks[t]; ++s)
      if (!sel.count(s) && (lo < 0 || L.at(t, g.in.ks[t] + s) < L.at(t, g.in.ks[t] + lo))) lo = s;
    if (lo >= 0 && L.at(t, g.in.ks[t] + lo) < L.at(t, g.in.ks[t] + G.at(t, 0))) { wrong.at(t, 0) = lo; break; }
  }
  CHECK(judge(G, wrong).verdict == cmp::Verdict::fail);
  CHECK(calls == 1);
  // Malformed rows need no score: a duplicate fails on its own.
  Tensor<int32_t> dup = G;
  dup.at(40, 1) = dup.at(40, 0);
  CHECK(judge(G, dup).verdict == cmp::Verdict::fail);
  CHECK(calls == 0);
  // The candidate equal slot for slot to a malformed golden row: still a structural failure, recall
  // 7/8 in that row (7 distinct positions of the golden's 7).
  const cmp::Report same = judge(dup, dup);
  CHECK(same.verdict == cmp::Verdict::fail);
  CHECK(same.stats.recall_min == doctest::Approx(7.0 / 8));
  REQUIRE(!same.mismatches.empty());
  CHECK(same.mismatches[0].index.at(0) == 40);
  CHECK(same.mismatches[0].what.find("appears twice") != std::string::npos);
}

// attention_bounds_sm's softmax-scale direction against a central difference of the exact
// attention at sm_scale e^(+-2^-7) (independent of the analytic formula), with and without a sink;
// the bounds themselves are attention_bounds'.
TEST_CASE("compare: the softmax-scale direction equals the derivative of the exact attention") {
  const Golden g = golden("sq8 skv48 hq3 dqk64 dv32 ih4 id32 k8 seed5");
  const float sm = g.p.sm_scale();
  const float up = float(double(sm) * std::exp(0x1p-7)), dn = float(double(sm) * std::exp(-0x1p-7));
  const double h = std::log(double(up)) - std::log(double(dn));
  Tensor<float> sink({3});
  sink[0] = 0.5f, sink[1] = -1.0f, sink[2] = 2.0f;
  for (const Tensor<float>* s : std::initializer_list<const Tensor<float>*>{nullptr, &sink}) {
    CAPTURE(s != nullptr);
    const ref::AttentionOut exact = ref::sparse_attention(g.in.q, g.in.kv, g.out.indices, sm, g.p.d_v, nullptr, s);
    const ref::AttentionOut a = ref::sparse_attention(g.in.q, g.in.kv, g.out.indices, up, g.p.d_v, nullptr, s);
    const ref::AttentionOut b = ref::sparse_attention(g.in.q, g.in.kv, g.out.indices, dn, g.p.d_v, nullptr, s);
    const cmp::AttentionBounds d = cmp::attention_bounds_sm(g.in.q, g.in.kv, g.out.indices, sm, g.p.d_v, nullptr, s, exact);
    const cmp::AttentionBounds plain = cmp::attention_bounds(g.in.q, g.in.kv, g.out.indices, sm, g.p.d_v, nullptr, exact);
    CHECK(d.out == plain.out);
    CHECK(d.lse == plain.lse);
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < exact.out.numel(); ++i) {
      const double fd = (double(a.out[i]) - double(b.out[i])) / h;
      scale = std::max(scale, std::fabs(fd));
      worst = std::max(worst, std::fabs(fd - double(d.sm_out[size_t(i)])));
    }
    CHECK(scale > 0);
    CHECK(worst <= 1e-3 * scale);
    for (int64_t i = 0; i < exact.lse.numel(); ++i) {
      if (!std::isfinite(exact.lse[i])) continue;
      const double fd = (double(a.lse[i]) - double(b.lse[i])) / h;
      CHECK(std::fabs(fd - double(d.sm_lse[size_t(i)])) <= 1e-3 * std::max(1.0, std::fabs(fd)));
    }
  }
}

// The attention bounds sum in f32 and inflate (ref/bounds.h). They must never fall below the
// same formulas evaluated with double sums and exact-in-double weights (written out here, as the
// bounds were evaluated before), on ordinary and on peaked logits (large G: the e^(2 delta) term).
TEST_CASE("compare: the f32-evaluated attention bounds are at least their double evaluation") {
  const Golden g = golden("sq6 skv64 hq4 dqk96 dv64 ih4 id32 k16 seed9");
  for (const float mult : {1.0f, 12.0f}) {  // sm_scale times 12: logits of magnitude ~100
    CAPTURE(mult);
    const float sm = g.p.sm_scale() * mult;
    const int64_t s_q = 6, h_q = 4, d_qk = 96, d_v = 64, topk = 16;
    const ref::AttentionOut exact = ref::sparse_attention(g.in.q, g.in.kv, g.out.indices, sm, d_v, nullptr, nullptr);
    const cmp::AttentionBounds b = cmp::attention_bounds(g.in.q, g.in.kv, g.out.indices, sm, d_v, nullptr, exact);
    const double u = 0x1p-8, e = 0x1p-24;
    int64_t checked = 0;
    double slack = 1e300;
    for (int64_t t = 0; t < s_q; ++t) {
      std::vector<int64_t> rows;
      for (int64_t j = 0; j < topk; ++j)
        if (g.out.indices[t * topk + j] >= 0) rows.push_back(g.out.indices[t * topk + j]);
      std::sort(rows.begin(), rows.end());
      if (rows.empty()) continue;
      const double k = double(rows.size());
      for (int64_t h = 0; h < h_q; ++h) {
        std::vector<double> s(rows.size());
        double G = 0, m = -1e300, l = 0;
        for (size_t i = 0; i < rows.size(); ++i) {
          double dot = 0, mag = 0;
          for (int64_t d = 0; d < d_qk; ++d) {
            const double a = bf16_to_f32(g.in.q.at(t, h, d)), c = bf16_to_f32(g.in.kv[rows[i] * d_qk + d]);
            dot += a * c;
            mag += std::fabs(a * c);
          }
          s[i] = dot * double(sm);
          G = std::max(G, std::fabs(double(sm)) * mag);
          m = std::max(m, s[i]);
        }
        for (double& v : s) l += (v = std::exp(v - m));
        const double logit_err = (double(d_qk) + 2) * e * G;
        for (int64_t c = 0; c < d_v; ++c) {
          double A = 0;
          for (size_t i = 0; i < rows.size(); ++i) A += s[i] / l * std::fabs(double(bf16_to_f32(g.in.kv[rows[i] * d_qk + c])));
          const int64_t el = (t * h_q + h) * d_v + c;
          const double o = std::fabs(double(exact.out[el]));
          const double want = 3 * (u * o + u * A + ((k + 8) * e + 2 * logit_err) * A);
          CHECK(b.out[size_t(el)] >= want);
          slack = std::min(slack, b.out[size_t(el)] / want);
          ++checked;
        }
        CHECK(b.lse[size_t(t * h_q + h)] >= 3 * (logit_err + (k + 8) * e + 2 * e * std::fabs(double(exact.lse[t * h_q + h]))));
        CHECK(b.max_logits[size_t(t * h_q + h)] >= 3 * (logit_err + e * std::fabs(double(exact.max_logits[t * h_q + h]))));
      }
    }
    CHECK(checked > 0);
    CHECK(slack < 1.05);  // and sharp: the inflation costs a few percent at most
    MESSAGE("smallest f32 bound / double bound: " << slack);
  }
}

// Bounds are stored as the f32 at or above the derived double: never below it, one ulp at most.
TEST_CASE("compare: bound_f32 rounds a derived bound up to the next f32") {
  for (const double b : {0.0, 1.0 / 3, 0.1, 0.7, 0.9, 1e-30, 0x1p-140, 3.0, 1e30}) {
    CAPTURE(b);
    const float f = cmp::bound_f32(b);
    CHECK(double(f) >= b);
    CHECK(double(std::nextafter(f, 0.0f)) < b + (b == 0 ? 1 : 0));  // the least such f32 (0 stays 0)
  }
  CHECK(cmp::bound_f32(0.7) == std::nextafter(float(0.7), 1.0f));  // float(0.7) rounds down: one step up
  CHECK(cmp::bound_f32(0.5) == 0.5f);                                          // exact values stay
  CHECK(std::isinf(cmp::bound_f32(1e39)));                                     // past FLT_MAX: +inf
}
