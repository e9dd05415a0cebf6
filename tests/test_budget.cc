// Tests of the FlashAttention-style budget on a row subset (ref/bounds.h budget_rows,
// attention_budget_parts_rows): which rows a large set emulates, that the subset's maxima are the
// whole emulation's maxima over those rows (ref's and simd's emulation), the floor, and that a set
// of at most kBudgetAllRows rows keeps the budget of every row.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "tools/judge/compare.h"
#include "ref/layer.h"
#include "ref/numerics.h"
#include "simd/simd.h"

using namespace indexshare;

namespace {
// max |emu - exact| over the finite exact elements of `rows` (all rows when empty), written out
// here from a whole-tensor emulation.
double max_err(const Tensor<float>& exact, const Tensor<float>& emu, const std::set<int64_t>& rows) {
  const int64_t per_row = exact.numel() / exact.dim(0);
  double m = 0;
  for (int64_t i = 0; i < exact.numel(); ++i)
    if ((rows.empty() || rows.count(i / per_row)) && std::isfinite(exact[i]))
      m = std::max(m, std::fabs(double(emu[i]) - double(exact[i])));
  return m;
}
}  // namespace

TEST_CASE("budget: small sets emulate every row, large ones the largest rows and a stride") {
  for (int64_t n : {1, 8, 255, 256}) {
    const std::vector<int64_t> r = cmp::budget_rows(std::vector<double>(size_t(n), 1.0));
    REQUIRE(int64_t(r.size()) == n);
    for (int64_t t = 0; t < n; ++t) CHECK(r[size_t(t)] == t);
  }
  // 1000 rows: magnitudes with ties (t % 97), so the tie rule decides part of the top 64.
  const int64_t n = 1000;
  std::vector<double> m(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) m[size_t(t)] = double(t % 97);
  const std::vector<int64_t> r = cmp::budget_rows(m);
  const std::set<int64_t> got(r.begin(), r.end());
  CHECK(got.size() == r.size());
  CHECK(std::is_sorted(r.begin(), r.end()));
  // Expected, written out: value 96 at rows 96, 193, ..., then 95, ... (lower rows first) until 64.
  std::set<int64_t> want;
  for (int v = 96; int64_t(want.size()) < cmp::kBudgetTopRows; --v)
    for (int64_t t = v; t < n && int64_t(want.size()) < cmp::kBudgetTopRows; t += 97) want.insert(t);
  const int64_t stride = (n + cmp::kBudgetStrideRows - 1) / cmp::kBudgetStrideRows;  // 16
  CHECK(stride == 16);
  for (int64_t t = 0; t < n; t += stride) want.insert(t);
  CHECK(got == want);
  // Values 96..91 fill 60 places (10 rows each), value 90 the last 4 by row: 381 is in, 478 not
  // (and 478 is no stride row).
  CHECK(got.count(381));
  CHECK(!got.count(478));
}

TEST_CASE("budget: a subset's maxima are the whole emulation's over those rows, floored, every row unchanged") {
  // 300 rows (a subset is taken), sinks and two sequences; top-k 24 of a short window.
  const Problem p = parse_problem("sq300 skv400 hq4 dqk64 dv32 ih4 id32 k24 seed13 nseq2 sinks=2");
  const ref::LayerInputs in = ref::make_layer_inputs(p);
  const ref::LayerOutputs out = ref::run_layer(p, in);
  const Tensor<float>* sink = in.sink ? &*in.sink : nullptr;
  const Tensor<int32_t>& ix = out.indices;
  const ref::AttentionOut emu = cmp::emulate_attention_lowp(in.q, in.kv, ix, p.sm_scale(), p.d_v, nullptr, sink);
  double rr_pass = -1;
  const std::vector<int64_t> rows = cmp::budget_rows(cmp::budget_row_max(out.attn.out, &rr_pass));
  REQUIRE(rows.size() < size_t(p.s_q));
  REQUIRE(rows.size() >= size_t(cmp::kBudgetTopRows));
  const std::set<int64_t> row_set(rows.begin(), rows.end());
  const cmp::EmulateFn fns[2] = {cmp::emulate_attention_lowp, simd::emulate_attention_lowp};
  for (cmp::EmulateFn fn : fns) {
    double raw = -1;
    const cmp::BudgetParts sub = cmp::attention_budget_parts_rows(fn, in.q, in.kv, ix, p.sm_scale(), p.d_v, nullptr, sink,
                                                                  out.attn.out, rows, true, &raw);
    CHECK(raw == max_err(out.attn.out, emu.out, row_set));
    double rr = 0;
    for (int64_t i = 0; i < out.attn.out.numel(); ++i)
      rr = std::max(rr, std::fabs(double(round_bf16(out.attn.out[i])) - double(out.attn.out[i])));
    CHECK(sub.ref_round == rr);
    CHECK(rr_pass == rr);  // budget_row_max's, from its one pass
    CHECK(sub.emul == std::max(raw, rr));
    // Every row, no floor: attention_budget_parts over the whole tensors, bit for bit.
    std::vector<int64_t> all(size_t(p.s_q));
    for (int64_t t = 0; t < p.s_q; ++t) all[size_t(t)] = t;
    const cmp::BudgetParts whole = cmp::attention_budget_parts_rows(fn, in.q, in.kv, ix, p.sm_scale(), p.d_v, nullptr, sink,
                                                                    out.attn.out, all, false);
    const cmp::BudgetParts direct = cmp::attention_budget_parts(out.attn.out, emu.out);
    CHECK(whole.emul == direct.emul);
    CHECK(whole.ref_round == direct.ref_round);
    // The claim the subset rests on, on this problem: its budget is the whole emulation's.
    CHECK(cmp::attention_budget(sub) == cmp::attention_budget(direct));
  }
  // A fault the floor guards against: rows whose emulation is dropped entirely still leave a
  // budget of at least 6 output roundings.
  const cmp::BudgetParts none = cmp::attention_budget_parts_rows(cmp::emulate_attention_lowp, in.q, in.kv, ix, p.sm_scale(),
                                                                 p.d_v, nullptr, sink, out.attn.out, {}, true);
  CHECK(none.emul == none.ref_round);
  CHECK(cmp::attention_budget(none) == 6 * none.ref_round);
}
