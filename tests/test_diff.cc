// The fault-injection suite of `indexshare diff`: candidates are built from the checked-in golden
// sets with one injected fault each, and each fault is judged as the contract states.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "ref/attention.h"
#include "ref/indexer.h"
#include "ref/model.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "ref/topk.h"
#include "tests/xml_check.h"
#include "tests/candidate_util.h"
#include "tools/judge/diff.h"
#include "tests/cli_util.h"
#include "tests/ties_util.h"

using namespace indexshare;

namespace {

using indexshare::testing::verdict;
using indexshare::testing::diagnosed;

std::string golden_dir(const std::string& name) { return std::string(INDEXSHARE_SOURCE_DIR) + "/golden/" + name; }

using Candidate = indexshare::testing::Candidate;

// A candidate that reproduces the golden exactly as a correct kernel would report it: bf16
// attention output, the golden lse / max_logits, indices and top-k.
Candidate faithful(const golden::Loaded& g, bool with_logits = true) {
  Candidate c;
  for (size_t l = 0; l < g.manifest["layers"].size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const Tensor<bf16_t> ob = g.tensor<bf16_t>(p + "attn.out_bf16");
    Tensor<float> o(ob.shape);
    for (int64_t i = 0; i < ob.numel(); ++i) o[i] = bf16_to_f32(ob[i]);
    c.set(p + "attn.out", o);
    c.set(p + "attn.lse", g.tensor<float>(p + "attn.lse"));
    c.set(p + "attn.max_logits", g.tensor<float>(p + "attn.max_logits"));
    c.set(p + "attn.indices", g.tensor<int32_t>(p + "attn.indices"));
    if (g.manifest["layers"][l]["kind"] == "full" && g.find(p + "indexer.topk")) {
      c.set(p + "indexer.topk", g.tensor<int32_t>(p + "indexer.topk"));
      if (with_logits && g.find(p + "indexer.logits")) c.set(p + "indexer.logits", g.tensor<float>(p + "indexer.logits"));
    }
  }
  return c;
}

diff::Result judge(const golden::Loaded& g, const Candidate& c) { return diff::judge(g, c.file(), {}); }

float bf16_ulps(float x, int n) {
  const uint16_t b = f32_to_bf16(x).bits;
  int mag = (b & 0x7FFF) + ((b & 0x8000) ? -n : n);
  if (mag < 0) return x;
  return bf16_to_f32(bf16_t{uint16_t((b & 0x8000) | mag)});
}

}  // namespace

TEST_CASE("diff: a faithful candidate passes, and the report says what was checked") {
  const golden::Loaded g = golden::read(golden_dir("glm-5.2"));
  const diff::Result r = judge(g, faithful(g));
  CHECK(!r.failed());
  CHECK(r.exit_code() == 0);
  CHECK(r.checked.size() == r.tensors.size());
  const std::string text = r.text("replay");
  CHECK(text.find("tests:") != std::string::npos);
  CHECK(text.find("__REPRO: replay") != std::string::npos);
  CHECK(r.json()["verdict"] == "PASS");
  // A subset is fine: only the named tensors are judged.
  Candidate only;
  only.set("layers.3.attn.lse", g.tensor<float>("layers.3.attn.lse"));
  const diff::Result s = judge(g, only);
  CHECK(s.tensors.size() == 1);
  CHECK(!s.failed());
}

TEST_CASE("diff: a tie permutation of indices passes, with the attention judged on the candidate's own indices") {
  const golden::Loaded g = golden::read(golden_dir("ties"));
  Candidate c = faithful(g);
  const Tensor<int32_t> ks = g.tensor<int32_t>("layers.0.indexer.ks");
  // Swap the k-th winner of every row for an unselected position with the same score.
  int swapped = 0;
  Tensor<int32_t> topk = testing::tie_permuted_topk(g, swapped);
  for (int64_t t = 0; t < topk.dim(0); ++t) std::swap(topk.at(t, 0), topk.at(t, 1));  // slot order never matters
  REQUIRE(swapped > 0);
  const Tensor<int32_t> rows = ref::local_to_kv_rows(topk, ks);
  const Tensor<bf16_t> q = g.tensor<bf16_t>("layers.0.attn.q"), kv = g.tensor<bf16_t>("layers.0.attn.kv");
  const ref::AttentionOut a = ref::sparse_attention(q, kv, rows, g.manifest["config"]["sm_scale"].get<float>(), 512);
  Tensor<float> out(a.out.shape);
  for (int64_t i = 0; i < out.numel(); ++i) out[i] = bf16_to_f32(a.out_bf16[i]);
  c.set("layers.0.indexer.topk", topk);
  c.set("layers.0.attn.indices", rows);
  c.set("layers.0.attn.out", out);
  c.set("layers.0.attn.lse", a.lse);
  c.set("layers.0.attn.max_logits", a.max_logits);
  const diff::Result r = judge(g, c);
  if (r.failed()) MESSAGE(r.text("x"));
  CHECK(!r.failed());
  bool conditional = false;
  for (const auto& t : r.tensors) conditional |= t.note.find("candidate's indices") != std::string::npos;
  CHECK(conditional);
  // The same outputs judged against the golden's own indices would have failed.
  c.set("layers.0.attn.indices", g.tensor<int32_t>("layers.0.attn.indices"));
  CHECK(judge(g, c).failed());
}

TEST_CASE("diff: bf16 ulp noise on out — 1-2 ulps pass, a few ulps beyond the bound fail, NaN fails") {
  const golden::Loaded g = golden::read(golden_dir("deepseek-v3.2"));
  Candidate c = faithful(g);
  const Tensor<float> out0 = io::as_tensor<float>(c.t["layers.1.attn.out"], "c");
  // 1-2 ulps on one element in ten: within every per-element bound and FlashMLA's cos_diff.
  Tensor<float> out = out0;
  Xoshiro256 rng(3);
  for (float& v : out.data)
    if (rng.below(10) == 0) v = bf16_ulps(v, rng.below(2) ? int(1 + rng.below(2)) : -int(1 + rng.below(2)));
  c.set("layers.1.attn.out", out);
  CHECK(verdict(judge(g, c), 1, "attn.out") == cmp::Verdict::pass);
  // Up to 2 ulps on every element is within every per-element bound, but 3x the error a correct
  // bf16 kernel makes: FlashMLA's own cos_diff_tol (7e-6) rejects it, and so does the judge, twice:
  // by that anchor and by the precision test (an error beyond what f32 arithmetic gives).
  Tensor<float> dense = out0;
  for (float& v : dense.data) v = bf16_ulps(v, int(rng.below(5)) - 2);
  c.set("layers.1.attn.out", dense);
  const diff::Result rd = judge(g, c);
  CHECK(verdict(rd, 1, "attn.out") == cmp::Verdict::fail);
  for (const auto& t : rd.tensors)
    if (t.layer == 1 && t.name == "attn.out") {
      CHECK(t.report.stats.n_fail == 0);  // no element beyond its bound
      REQUIRE(t.report.reasons.size() == 2);
      CHECK(t.report.reasons[0].find("cos_diff_tol") != std::string::npos);
      CHECK(t.report.reasons[1].find("precision: ") == 0);
    }
  // Move one element until it leaves its bound, then 3 ulps further.
  const diff::Result base = judge(g, faithful(g));
  Tensor<float> far = io::as_tensor<float>(faithful(g).t["layers.1.attn.out"], "c");
  const Tensor<float> exact = g.tensor<float>("layers.1.attn.out");
  const int64_t e = 777;
  float v = far[e];
  for (int i = 0; i < 64; ++i) v = bf16_ulps(v, 1);  // 64 ulps: far beyond any per-element bound
  far[e] = v;
  c.set("layers.1.attn.out", far);
  diff::Result r = judge(g, c);
  CHECK(verdict(r, 1, "attn.out") == cmp::Verdict::fail);
  CHECK(r.exit_code() == 1);
  Tensor<float> nan = exact;
  nan[5] = std::nanf("");
  c.set("layers.1.attn.out", nan);
  CHECK(verdict(judge(g, c), 1, "attn.out") == cmp::Verdict::fail);
  (void)base;
}

TEST_CASE("diff: wrong selections fail: a non-tie replacement, a dropped winner") {
  const golden::Loaded g = golden::read(golden_dir("deepseek-v3.2"));
  const Tensor<float> L = g.tensor<float>("layers.0.indexer.logits");
  Tensor<int32_t> topk = g.tensor<int32_t>("layers.0.indexer.topk");
  const int64_t k = topk.dim(1), t = 5;
  const std::set<int32_t> sel(topk.data.begin() + t * k, topk.data.begin() + (t + 1) * k);
  Candidate c = faithful(g);
  Tensor<int32_t> bad = topk;
  for (int32_t s = 0; s < int32_t(L.dim(1)); ++s)
    if (!sel.count(s) && std::isfinite(L.at(t, s)) && L.at(t, s) < L.at(t, topk.at(t, k - 1))) { bad.at(t, 0) = s; break; }
  c.set("layers.0.indexer.topk", bad);
  CHECK(verdict(judge(g, c), 0, "indexer.topk") == cmp::Verdict::fail);
  Tensor<int32_t> dropped = topk;
  dropped.at(t, 3) = -1;
  std::swap(dropped.at(t, 3), dropped.at(t, k - 1));
  c.set("layers.0.indexer.topk", dropped);
  CHECK(verdict(judge(g, c), 0, "indexer.topk") == cmp::Verdict::fail);
}

namespace {
// The kernel table's FP8 logits, counted: how often the judge computed a layer's golden logits.
int g_logits_calls = 0;
Tensor<float> counted_logits_fp8(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k, const Tensor<float>& k_scale,
                                 const Tensor<float>& w, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke) {
  ++g_logits_calls;
  return ref::indexer_logits_fp8(q, k, k_scale, w, ks, ke);
}
// The set as `golden --no-logits` writes it: no indexer.logits (the judge recomputes them).
golden::Loaded without_logits(golden::Loaded g) {
  auto& v = g.data.tensors;
  v.erase(std::remove_if(v.begin(), v.end(), [](const io::TensorView& t) { return t.name.find("indexer.logits") != std::string::npos; }), v.end());
  return g;
}
}  // namespace

// A set stored without logits: the judge computes a layer's logits only when a candidate's
// positions differ from the golden's somewhere they are read (a top-k or attn.indices row, a
// failure's hypotheses), and every report is word for word the one against the set with them.
TEST_CASE("diff: a set without logits judges as one with them, computing them only where positions differ") {
  ref::Kernels k;
  k.logits_fp8 = counted_logits_fp8;
  auto both = [&](const golden::Loaded& with, const Candidate& c) {
    const io::SafetensorsFile f = c.file();
    const diff::Result stored = diff::judge(with, f, {}, k);
    g_logits_calls = 0;
    const diff::Result r = diff::judge(without_logits(with), f, {}, k);
    CHECK(r.text("r") == stored.text("r"));
    CHECK(r.json() == stored.json());
    return r;
  };
  for (const std::string name : {"glm-5.2", "deepseek-v3.2"}) {
    CAPTURE(name);
    const golden::Loaded g = golden::read(golden_dir(name));
    // An exact copy (no candidate logits): the golden's positions everywhere, no logits computed.
    Candidate c = faithful(g, false);
    CHECK(!both(g, c).failed());
    CHECK(g_logits_calls == 0);
    // Top-k rows in another slot order: the same positions (the verdict reads no score), but the
    // note on score order reads layer 0's: computed once.
    const std::string t0 = "layers.0.indexer.topk";
    Tensor<int32_t> rev = g.tensor<int32_t>(t0);
    for (int64_t t = 0; t < rev.dim(0); ++t) std::reverse(&rev.at(t, 0), &rev.at(t, 0) + rev.dim(1));
    c.set(t0, rev);
    const diff::Result r = both(g, c);
    CHECK(!r.failed());
    CHECK(r.text("r").find("not in score order") != std::string::npos);
    CHECK(g_logits_calls == 1);
  }
  {  // A tie permutation of layer 0's top-k and indices: its scores are read, once.
    const golden::Loaded g = golden::read(golden_dir("ties"));
    Candidate c = faithful(g, false);
    int swapped = 0;
    const Tensor<int32_t> topk = testing::tie_permuted_topk(g, swapped);
    REQUIRE(swapped > 0);
    c.set("layers.0.indexer.topk", topk);
    CHECK(!both(g, c).failed());
    CHECK(g_logits_calls == 1);
  }
  {  // A Shared layer (4, source 2) using its own fresh top-k: fails; the hypotheses read layer 2's and 4's logits.
    const golden::Loaded g = golden::read(golden_dir("glm-5.2"));
    Candidate c = faithful(g, false);
    c.set("layers.4.attn.indices", ref::local_to_kv_rows(g.tensor<int32_t>("layers.4.indexer.topk"), g.tensor<int32_t>("layers.4.indexer.ks")));
    const diff::Result r = both(g, c);
    CHECK(verdict(r, 4, "attn.indices") == cmp::Verdict::fail);
    CHECK(diagnosed(r, "own fresh top-k"));
    CHECK(g_logits_calls >= 1);
  }
}

TEST_CASE("diff: lse in base 2 fails and is diagnosed") {
  const golden::Loaded g = golden::read(golden_dir("glm-5.2"));
  Candidate c = faithful(g);
  Tensor<float> lse = g.tensor<float>("layers.2.attn.lse");
  for (float& v : lse.data) v = float(double(v) / std::log(2.0));
  c.set("layers.2.attn.lse", lse);
  const diff::Result r = judge(g, c);
  CHECK(verdict(r, 2, "attn.lse") == cmp::Verdict::fail);
  CHECK(diagnosed(r, "base 2"));
}

TEST_CASE("diff: a Shared layer with its own fresh indices or another layer's positions fails and is diagnosed") {
  const golden::Loaded g = golden::read(golden_dir("glm-5.2"));  // FFFSSSFS: layer 4 shares layer 2's positions
  const float sm = g.manifest["config"]["sm_scale"].get<float>();
  const Tensor<bf16_t> q = g.tensor<bf16_t>("layers.4.attn.q"), kv = g.tensor<bf16_t>("layers.4.attn.kv");
  auto candidate_using = [&](const Tensor<int32_t>& rows) {
    Candidate c = faithful(g);
    const ref::AttentionOut a = ref::sparse_attention(q, kv, rows, sm, 512);
    Tensor<float> out(a.out.shape);
    for (int64_t i = 0; i < out.numel(); ++i) out[i] = bf16_to_f32(a.out_bf16[i]);
    c.set("layers.4.attn.indices", rows);
    c.set("layers.4.attn.out", out);
    return c;
  };
  SUBCASE("its own fresh top-k") {
    const Tensor<int32_t> own = ref::local_to_kv_rows(g.tensor<int32_t>("layers.4.indexer.topk"), g.tensor<int32_t>("layers.4.indexer.ks"));
    const diff::Result r = judge(g, candidate_using(own));
    CHECK(verdict(r, 4, "attn.indices") == cmp::Verdict::fail);
    CHECK(r.failed());
    CHECK(diagnosed(r, "own fresh top-k"));
  }
  SUBCASE("the previous Full layer's positions (schedule off by one)") {
    const diff::Result r = judge(g, candidate_using(g.tensor<int32_t>("layers.1.attn.indices")));
    CHECK(verdict(r, 4, "attn.indices") == cmp::Verdict::fail);
    CHECK(diagnosed(r, "Full layer 1's positions"));
  }
  SUBCASE("only the output is given: the attention over another layer's positions is still diagnosed") {
    Candidate c = candidate_using(g.tensor<int32_t>("layers.1.attn.indices"));
    c.t.erase("layers.4.attn.indices");
    const diff::Result r = judge(g, c);
    CHECK(verdict(r, 4, "attn.out") == cmp::Verdict::fail);
    CHECK(diagnosed(r, "Full layer 1's positions"));
  }
}

TEST_CASE("diff: an off-by-one causal bound fails and is diagnosed") {
  const golden::Loaded g = golden::read(golden_dir("deepseek-v3.2"));
  const Tensor<int32_t> ks = g.tensor<int32_t>("layers.0.indexer.ks");
  Tensor<int32_t> ke = g.tensor<int32_t>("layers.0.indexer.ke");
  for (int64_t t = 0; t < ke.numel(); ++t) ke[t] -= 1;  // the row misses its own key
  const Tensor<float> L = ref::indexer_logits_fp8(g.tensor<e4m3_t>("layers.0.indexer.q"), g.tensor<e4m3_t>("layers.0.indexer.k"),
                                                  g.tensor<float>("layers.0.indexer.k_scale"), g.tensor<float>("layers.0.indexer.weights"), ks, ke);
  Candidate c = faithful(g);
  c.set("layers.0.indexer.topk", ref::topk(L, ks, ke, g.manifest["config"]["topk"].get<int64_t>()));
  c.t.erase("layers.0.indexer.logits");
  const diff::Result r = judge(g, c);
  CHECK(verdict(r, 0, "indexer.topk") == cmp::Verdict::fail);
  CHECK(diagnosed(r, "causal bound off by one"));
}

TEST_CASE("diff: missing, unknown or mis-shaped candidate tensors are bad input (exit 2)") {
  const golden::Loaded g = golden::read(golden_dir("glm-5.2"));
  Candidate c;
  c.set("layers.0.attn.out", Tensor<float>({16, 2, 511}));
  CHECK_THROWS_WITH_AS(judge(g, c), doctest::Contains("layers.0.attn.out"), Error);
  Candidate u;
  u.set("layers.0.attn.output", Tensor<float>({1}));
  CHECK_THROWS_WITH_AS(judge(g, u), doctest::Contains("'layers.0.attn.output' is not a golden output name"), Error);
  Candidate w;
  w.set("layers.9.attn.lse", Tensor<float>({16, 2}));
  CHECK_THROWS_WITH_AS(judge(g, w), doctest::Contains("outside the golden set's 8 layers"), Error);
  Candidate d;
  d.set("layers.0.attn.lse", Tensor<int32_t>({16, 2}));
  CHECK_THROWS_WITH_AS(judge(g, d), doctest::Contains("dtype is I32"), Error);
  Candidate e;
  e.set("layers.3.indexer.logits", Tensor<float>({16, 96}));
  const golden::Loaded k = golden::read(golden_dir("deepseek-v3.2"));
  CHECK_THROWS_WITH_AS(diff::judge(g, faithful(g).file(), {9}), doctest::Contains("layer 9"), Error);
  CHECK(diff::parse_layers("0,3-5") == std::set<int>{0, 3, 4, 5});
  CHECK_THROWS_WITH_AS(diff::parse_layers("1,x"), doctest::Contains("'x'"), Error);
  CHECK_THROWS_AS(diff::parse_layers("5-3"), Error);
  (void)k;
}

TEST_CASE("diff: module-level sets diagnose an indexer with its RoPE layout swapped") {
  const golden::Loaded g = golden::read(golden_dir("module-tiny-glm"));
  CHECK(g.manifest["kind"] == "module");
  // The same toy model with the half-split layout: layer 0 sees the same hidden state, so its
  // top-k differs only through the RoPE layout.
  ModelConfig cfg = model_preset("tiny-glm");
  cfg.indexer_rope = ref::RopeLayout::half_split;
  const ref::ToyModel m = ref::make_toy_model(cfg, cfg.resolve_schedule(), 1, 0.8f, ref::IndexerVariant::deepseek_fp8, true);
  ref::ToyCache cache;
  const ref::ToyForward f = ref::forward(m, cache, ref::toy_hidden(cfg, 1, 0, cfg.seq));
  Candidate c;
  c.set("layers.0.indexer.topk", f.layers[0].own_topk);
  const diff::Result r = judge(g, c);
  CHECK(verdict(r, 0, "indexer.topk") == cmp::Verdict::fail);
  CHECK(diagnosed(r, "RoPE layout swapped (half_split"));
  // The golden's own top-k passes.
  Candidate ok;
  ok.set("layers.0.indexer.topk", g.tensor<int32_t>("layers.0.indexer.topk"));
  CHECK(!judge(g, ok).failed());
}

TEST_CASE("diff: decode sets — physical indices where logical were expected, and the reverse, are diagnosed") {
  const golden::Loaded g = golden::read(golden_dir("decode"));
  const Tensor<int32_t> phys = g.tensor<int32_t>("layers.0.attn.indices_physical");
  const Tensor<int32_t> logical = g.tensor<int32_t>("layers.0.attn.indices");
  Candidate ok;
  ok.set("layers.0.attn.indices", logical);
  ok.set("layers.0.attn.indices_physical", phys);
  CHECK(!judge(g, ok).failed());
  Candidate a;
  Tensor<int32_t> as_rows = phys;
  as_rows.shape = logical.shape;
  a.set("layers.0.attn.indices", as_rows);
  const diff::Result ra = judge(g, a);
  CHECK(ra.failed());
  CHECK(diagnosed(ra, "physical (paged) slots; logical kv rows were expected"));
  Candidate b;
  Tensor<int32_t> as_phys = logical;
  as_phys.shape = phys.shape;
  b.set("layers.0.attn.indices_physical", as_phys);
  const diff::Result rb = judge(g, b);
  CHECK(rb.failed());
  CHECK(diagnosed(rb, "are logical kv rows; physical (paged) slots were expected"));
}

TEST_CASE("diff: I64 positions are read, a value outside int32 fails and the diagnosis shows its real value") {
  const golden::Loaded g = golden::read(golden_dir("deepseek-v3.2"));
  const Tensor<int32_t> topk = g.tensor<int32_t>("layers.0.indexer.topk");
  Tensor<int64_t> wide(topk.shape);
  for (int64_t i = 0; i < topk.numel(); ++i) wide[i] = topk[i];
  Candidate c = faithful(g);
  c.set("layers.0.indexer.topk", wide);
  const diff::Result ok = judge(g, c);
  CHECK(verdict(ok, 0, "indexer.topk") != cmp::Verdict::fail);
  CHECK(!diagnosed(ok, "outside the int32 range"));
  // 2^40 + a valid position: a plain int32 cast would wrap it to the valid position.
  wide.at(3, 1) = (int64_t{1} << 40) + topk.at(3, 1);
  wide.at(4, 0) = -(int64_t{1} << 33);
  c.set("layers.0.indexer.topk", wide);
  const diff::Result bad = judge(g, c);
  CHECK(verdict(bad, 0, "indexer.topk") == cmp::Verdict::fail);
  CHECK(diagnosed(bad, "2 I64 value(s) outside the int32 range, the first at [3, 1] = " +
                           std::to_string((int64_t{1} << 40) + topk.at(3, 1))));
}

// The report named a placeholder ("holds 1000001") for an attn.indices position outside the
// row's window instead of the kv row the candidate wrote.
TEST_CASE("diff: an attn.indices row outside the window is reported with the candidate's own value") {
  const golden::Loaded g = golden::read(golden_dir("deepseek-v3.2"));
  Candidate c = faithful(g);
  Tensor<int32_t> ind = g.tensor<int32_t>("layers.0.attn.indices");
  const Tensor<int32_t> ks = g.tensor<int32_t>("layers.0.indexer.ks"), ke = g.tensor<int32_t>("layers.0.indexer.ke");
  const int64_t t = 2, k = ind.dim(2);
  REQUIRE(ke[t] + 7 < g.manifest["config"]["s_kv"].get<int64_t>());
  ind[t * k + 0] = ke[t] + 7;  // a future key of the row
  c.set("layers.0.attn.indices", ind);
  const diff::Result r = judge(g, c);
  CHECK(verdict(r, 0, "attn.indices") == cmp::Verdict::fail);
  const std::string text = r.text("x");
  const std::string want = "slot 0 holds kv row " + std::to_string(ke[t] + 7) + ", outside the row's window [" +
                           std::to_string(ks[t]) + ", " + std::to_string(ke[t]) + ")";
  CHECK_MESSAGE(text.find(want) != std::string::npos, text);
  CHECK(text.find("100000") == std::string::npos);
}

// transformers' raw top-k keeps masked future positions in rows shorter than k; the judge rejects
// them (correctly) and now names the hypothesis instead of "no named hypothesis".
TEST_CASE("diff: future positions in rows shorter than top-k fail and are diagnosed as missing -1 padding") {
  const golden::Loaded g = golden::read(golden_dir("short-rows"));
  const Tensor<int32_t> ks = g.tensor<int32_t>("layers.0.indexer.ks"), ke = g.tensor<int32_t>("layers.0.indexer.ke");
  const int64_t s_kv = g.manifest["config"]["s_kv"].get<int64_t>();
  for (const char* name : {"indexer.topk", "attn.indices"}) {
    CAPTURE(name);
    const bool rows = std::string(name) == "attn.indices";
    Tensor<int32_t> x = g.tensor<int32_t>(std::string("layers.0.") + name);
    const int64_t s_q = x.dim(0), k = x.numel() / s_q;
    int64_t filled = 0;
    for (int64_t t = 0; t < s_q; ++t) {
      const int64_t len = ke[t] - ks[t];
      REQUIRE(len < k);
      for (int64_t j = len; j < k && ks[t] + j < s_kv; ++j, ++filled) x[t * k + j] = int32_t(rows ? ks[t] + j : j);  // masked future keys
    }
    REQUIRE(filled > 0);
    Candidate c;
    c.set(std::string("layers.0.") + name, x);
    const diff::Result r = judge(g, c);
    CHECK(r.failed());
    CHECK(diagnosed(r, "positions beyond the causal window in rows shorter than top-k: pad with -1"));
    CHECK(r.text("x").find("no named hypothesis") == std::string::npos);
  }
}

// ---- diff --svg ----

TEST_CASE("diff --svg: a heatmap per judged layer marks the failing (row, head) cells, the recall and the findings") {
  const golden::Loaded g = golden::read(golden_dir("glm-5.2"));
  Candidate c = faithful(g);
  // Layer 3 (Shared): late rows of head 1 off by 4% of each value (beyond the bound); layer 2's
  // lse in base 2 (diagnosed); layer 7's positions lose a winner in row 4.
  Tensor<float> out = g.tensor<float>("layers.3.attn.out");
  const int64_t s_q = out.dim(0), h_q = out.dim(1), d_v = out.dim(2);
  REQUIRE(h_q == 2);
  for (int64_t t = 12; t < s_q; ++t)
    for (int64_t e = 0; e < d_v; ++e) out.at(t, 1, e) *= 1.04f;
  c.set("layers.3.attn.out", out);
  Tensor<float> lse = g.tensor<float>("layers.2.attn.lse");
  for (float& v : lse.data) v = float(double(v) / std::log(2.0));
  c.set("layers.2.attn.lse", lse);
  const diff::Result r = judge(g, c);
  REQUIRE(r.failed());
  REQUIRE(r.panels.size() == 8);
  const io::DiffPanel& p3 = r.panels[3];
  CHECK(p3.layer == 3);
  CHECK(p3.label == "layer 3 (Shared, source 2)");
  CHECK(p3.verdict == "4 tensor(s) judged; failed: attn.out");
  for (int64_t t = 0; t < s_q; ++t) {
    CAPTURE(t);
    CHECK((p3.ratio[size_t(t * h_q + 1)] > 1) == (t >= 12));
    CHECK(p3.ratio[size_t(t * h_q + 0)] <= 1);
  }
  CHECK(p3.recall == std::vector<double>(size_t(s_q), 1.0));
  CHECK(p3.recall_of == "attn.indices");
  bool base2 = false;
  for (const std::string& f : r.panels[2].findings) base2 |= f.find("attn.lse is in base 2") != std::string::npos;
  CHECK(base2);
  // Without the picture (`diff` without --svg): the same verdicts, text and JSON, and no |err| /
  // bound per cell computed.
  const diff::Result np = diff::judge(g, c.file(), {}, {}, false);
  CHECK(np.text("r") == r.text("r"));
  CHECK(np.json() == r.json());
  REQUIRE(np.panels.size() == 8);
  CHECK(np.panels[3].ratio.empty());
  CHECK(np.panels[3].recall == p3.recall);
  const std::string svg = r.svg("diff <test> & co");
  CHECK(indexshare::testing::xml_problem(svg) == "");
  CHECK(svg.find("xmlns=\"http://www.w3.org/2000/svg\"") != std::string::npos);
  CHECK(svg.find("<title>diff &lt;test&gt; &amp; co</title>") != std::string::npos);
  // The failing cells are red with their ratio in the tooltip; a passing one is not red.
  const std::string red = "fill=\"#d7191c\"><title>row 13, head 1: |err| / bound = ";
  CHECK(svg.find(red) != std::string::npos);
  CHECK(svg.find("fill=\"#d7191c\"><title>row 13, head 0:") == std::string::npos);
  CHECK(svg.find("row 3: recall 1</title>") != std::string::npos);
  CHECK(svg.find("attn.lse is in base 2") != std::string::npos);
  CHECK(svg.find(">query row</text>") != std::string::npos);
  CHECK(svg.find(">head</text>") != std::string::npos);
  CHECK(svg.find("&gt; 1: outside the bound") != std::string::npos);
}

TEST_CASE("diff --svg: the CLI writes the picture with the JSON, and a parser reads it as XML") {
  const golden::Loaded g = golden::read(golden_dir("deepseek-v3.2"));
  Candidate c = faithful(g);
  Tensor<int32_t> topk = g.tensor<int32_t>("layers.0.indexer.topk");
  topk.at(5, 0) = -1;  // a dropped winner
  std::swap(topk.at(5, 0), topk.at(5, topk.dim(1) - 1));
  c.set("layers.0.indexer.topk", topk);
  c.t.erase("layers.0.attn.indices");  // the recall strip then shows indexer.topk's
  const auto dir = std::filesystem::temp_directory_path() / ("indexshare-diff-svg-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  c.write((dir / "cand.safetensors").string());
  const std::string cmd = std::string(INDEXSHARE_CLI) + " diff --golden " + golden_dir("deepseek-v3.2") + " --candidate " +
                          (dir / "cand.safetensors").string() + " --svg " + (dir / "d.svg").string() + " --json " +
                          (dir / "d.json").string() + " >/dev/null 2>&1";
  const int st = std::system(cmd.c_str());
  CHECK(WEXITSTATUS(st) == 1);
  std::ifstream in(dir / "d.svg");
  const std::string svg((std::istreambuf_iterator<char>(in)), {});
  CHECK(indexshare::testing::xml_problem(svg) == "");
  CHECK(svg.find("row 5: recall 0.9688</title>") != std::string::npos);  // 31 of 32
  CHECK(svg.find("recall (indexer.topk)") != std::string::npos);
  CHECK(std::filesystem::exists(dir / "d.json"));
  if (std::system("python3 -c 'import xml.dom.minidom' >/dev/null 2>&1") == 0)
    CHECK(std::system(("python3 -c 'import xml.dom.minidom,sys; assert xml.dom.minidom.parse(sys.argv[1]).documentElement.tagName == \"svg\"' " +
                       (dir / "d.svg").string()).c_str()) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("diff: tensors mapped from the files judge word for word as tensors read, and a changed attn.out is still refused") {
  // io::map_read_min 0: every lazily read attn.out of the set, and every F32 tensor of a candidate
  // left in its file, is mapped (the path diff takes from 4 MiB; the checked-in sets are smaller).
  struct MapAll {
    size_t was = io::map_read_min;
    MapAll() { io::map_read_min = 0; }
    ~MapAll() { io::map_read_min = was; }
  };
  const golden::Loaded whole = golden::read(golden_dir("deepseek-v3.2"));
  Candidate good = faithful(whole), bad = faithful(whole);
  Tensor<float> out = io::as_tensor<float>(bad.t["layers.1.attn.out"], "c");
  for (int64_t i = 0; i < out.numel(); i += 3) out[i] = bf16_ulps(out[i], 4);  // fails, as in the ulp test
  bad.set("layers.1.attn.out", out);
  const std::string path = std::filesystem::temp_directory_path() / ("indexshare-map-" + std::to_string(::getpid()) + ".safetensors");
  for (const Candidate* c : {&good, &bad}) {
    const io::SafetensorsFile in_memory = c->file();
    io::write_safetensors(path, in_memory.tensors);
    const std::string read = diff::judge(golden::read(golden_dir("deepseek-v3.2"), 0, true), io::read_safetensors_index(path, 0), path, {}).text("r");
    std::string mapped;
    {
      const MapAll all;
      const golden::Loaded lazy = golden::read(golden_dir("deepseek-v3.2"), 0, true);
      CHECK(diff::load_golden_layer(lazy, 1, {}, false).out.data.borrowed());  // mapped, not read
      mapped = diff::judge(lazy, io::read_safetensors_index(path, 0), path, {}).text("r");
    }
    CHECK(!diff::load_golden_layer(golden::read(golden_dir("deepseek-v3.2"), 0, true), 1, {}, false).out.data.borrowed());
    CHECK(mapped == read);
    CHECK(mapped == diff::judge(whole, in_memory, {}).text("r"));
    CHECK((mapped.find("FAIL") != std::string::npos) == (c == &bad));
  }
  std::filesystem::remove(path);
  // A byte of attn.out changed after the read: the hash of the mapped bytes refuses it.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("indexshare-map-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::copy(golden_dir("deepseek-v3.2"), dir, std::filesystem::copy_options::recursive);
  {
    const MapAll all;
    const golden::Loaded d = golden::read(dir.string(), 0, true);
    {
      std::fstream f(dir / golden::kTensorFile, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(d.lazy.at("layers.1.attn.out").offset + 7));
      f.put(char(0x55));
    }
    CHECK_THROWS_WITH_AS(diff::judge(d, good.file(), {}), doctest::Contains("'layers.1.attn.out': the tensor's bytes do not match field 'sha256'"), Error);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("diff: a golden set read lazily judges word for word as one read whole, a tensor changed after the read is refused") {
  // keep_bytes 0: every non-empty tensor stays in the file and is read (and hashed again) on demand.
  for (const std::string name : {"glm-5.2", "attention-edge", "decode"}) {
    CAPTURE(name);
    const golden::Loaded whole = golden::read(golden_dir(name));
    const golden::Loaded lazy = golden::read(golden_dir(name), 0);
    CHECK(whole.lazy.empty());
    CHECK(lazy.lazy.size() >= whole.data.tensors.size() - 1);
    CHECK(lazy.tensor<bf16_t>("layers.0.attn.q").data == whole.tensor<bf16_t>("layers.0.attn.q").data);
    const io::SafetensorsFile c = faithful(whole).file();
    CHECK(diff::judge(lazy, c, {}).text("r") == diff::judge(whole, c, {}).text("r"));
    // Streamed in pieces (the bounds' pass reads q a block of rows at a time): the same bytes,
    // every byte required before finish(), none past the end.
    for (const golden::Loaded* g : {&whole, &lazy}) {
      const Tensor<bf16_t> q = whole.tensor<bf16_t>("layers.0.attn.q");
      Tensor<bf16_t> got(q.shape);
      const size_t bytes = size_t(q.numel()) * 2, half = bytes / 2;
      golden::Loaded::Stream st(*g, "layers.0.attn.q");
      st.read(got.ptr(), half);
      CHECK_THROWS_WITH_AS(golden::Loaded::Stream(*g, "layers.0.attn.q").finish(), doctest::Contains("read 0 of its"), Error);
      st.read(reinterpret_cast<uint8_t*>(got.ptr()) + half, bytes - half);
      st.finish();
      CHECK(got.data == q.data);
      CHECK_THROWS_WITH_AS(st.read(got.ptr(), 1), doctest::Contains("read past its end"), Error);
    }
  }
  // A byte flipped in the file after the (verified) read: the lazy load refuses the tensor.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("indexshare-lazy-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::copy(golden_dir("glm-5.2"), dir, std::filesystem::copy_options::recursive);
  const golden::Loaded g = golden::read(dir.string(), 0);
  {
    std::fstream f(dir / golden::kTensorFile, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(g.lazy.at("layers.0.attn.q").offset + 5));
    f.put(char(0x55));
  }
  CHECK_THROWS_WITH_AS(g.tensor<bf16_t>("layers.0.attn.q"), doctest::Contains("'layers.0.attn.q': the tensor's bytes do not match field 'sha256'"), Error);
  // ... and so does the judge, which streams q through the bounds' pass without loading it whole.
  CHECK_THROWS_WITH_AS(diff::judge(g, faithful(golden::read(golden_dir("glm-5.2"))).file(), {}),
                       doctest::Contains("'layers.0.attn.q': the tensor's bytes do not match field 'sha256'"), Error);
  CHECK_THROWS_WITH_AS(golden::read(dir.string(), 0), doctest::Contains("do not match field 'sha256'"), Error);
  // Deferred hashes (diff reads so: each tensor hashed once): the read passes, the judge refuses q
  // when it reads it; a tampered tensor the judge never reads is refused by verify_rest.
  {
    const golden::Loaded d = golden::read(dir.string(), 0, true);
    CHECK(d.unverified.count("layers.0.attn.q") == 1);
    CHECK_THROWS_WITH_AS(diff::judge(d, faithful(golden::read(golden_dir("glm-5.2"))).file(), {}),
                         doctest::Contains("'layers.0.attn.q': the tensor's bytes do not match field 'sha256'"), Error);
  }
  // attn.out, read and hashed on a second thread while the layer's other tensors load: refused too.
  std::filesystem::remove_all(dir);
  std::filesystem::copy(golden_dir("glm-5.2"), dir, std::filesystem::copy_options::recursive);
  {
    const golden::Loaded d = golden::read(dir.string(), 0, true);
    REQUIRE(d.reads_lazily<float>("layers.1.attn.out"));
    {
      std::fstream f(dir / golden::kTensorFile, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(d.lazy.at("layers.1.attn.out").offset + 7));
      f.put(char(0x55));
    }
    CHECK_THROWS_WITH_AS(diff::judge(d, faithful(golden::read(golden_dir("glm-5.2"))).file(), {}),
                         doctest::Contains("'layers.1.attn.out': the tensor's bytes do not match field 'sha256'"), Error);
  }
  // attn.out_bf16, which the judge never reads, is checked while attn.out is read on the second
  // thread: refused by the judge itself.
  std::filesystem::remove_all(dir);
  std::filesystem::copy(golden_dir("glm-5.2"), dir, std::filesystem::copy_options::recursive);
  {
    const golden::Loaded d = golden::read(dir.string(), 0, true);
    {
      std::fstream f(dir / golden::kTensorFile, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(d.lazy.at("layers.2.attn.out_bf16").offset + 3));
      f.put(char(0x55));
    }
    CHECK_THROWS_WITH_AS(diff::judge(d, faithful(golden::read(golden_dir("glm-5.2"))).file(), {}),
                         doctest::Contains("'layers.2.attn.out_bf16': the tensor's bytes do not match field 'sha256'"), Error);
  }
  std::filesystem::remove_all(dir);
  std::filesystem::copy(golden_dir("glm-5.2"), dir, std::filesystem::copy_options::recursive);
  {
    const golden::Loaded d = golden::read(dir.string(), 0, true);
    std::fstream f(dir / golden::kTensorFile, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(d.lazy.at("layers.0.indexer.q_scale").offset + 3));
    f.put(char(0x55));
    f.close();
    const golden::Loaded whole = golden::read(golden_dir("glm-5.2"));
    const diff::Result r = diff::judge(d, faithful(whole).file(), {});
    CHECK(!r.failed());
    CHECK(d.unverified.count("layers.0.indexer.q_scale") == 1);
    CHECK(d.unverified.count("layers.0.attn.out") == 0);       // read by the judge, checked then
    CHECK(d.unverified.count("layers.0.attn.out_bf16") == 0);  // checked while attn.out was read
    CHECK_THROWS_WITH_AS(d.verify_rest(), doctest::Contains("'layers.0.indexer.q_scale': the tensor's bytes do not match field 'sha256'"), Error);
    // and through the command (its sets' small tensors are checked when read): exit 2 naming the
    // tensor, no verdict printed
    const std::string cand = dir.string() + ".c.safetensors";
    io::write_safetensors(cand, faithful(whole).file().tensors);
    const testing::CliResult run = testing::run_cli("diff --golden " + dir.string() + " --candidate " + cand);
    CHECK(run.status == 2);
    CHECK(run.out.find("'layers.0.indexer.q_scale')") != std::string::npos);
    CHECK(run.out.find("do not match field 'sha256'") != std::string::npos);
    CHECK(run.out.find("tests:") == std::string::npos);
    std::filesystem::remove(cand);
  }
  std::filesystem::remove_all(dir);
}

// --layer-list selects the layers to judge (--layers is a layer count elsewhere); --layers, its old
// name here, judges the same after a one-line notice on stderr, and the replay line names --layer-list.
TEST_CASE("diff --layer-list: the old name --layers works for this release, with a one-line notice") {
  const golden::Loaded g = golden::read(golden_dir("deepseek-v3.2"));
  const Candidate c = faithful(g);
  const auto dir = std::filesystem::temp_directory_path() / ("indexshare-diff-layer-list-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  c.write((dir / "cand.safetensors").string());
  const std::string args = "diff --golden " + golden_dir("deepseek-v3.2") + " --candidate " + (dir / "cand.safetensors").string();
  const testing::CliResult now = testing::run_cli(args + " --layer-list 1"), old = testing::run_cli(args + " --layers 1");
  CHECK_MESSAGE(now.status == 0, now.out);
  CHECK(old.status == 0);
  const std::string notice = "indexshare: --layers is now --layer-list; the old name works for this release\n";
  CHECK(now.out.find("is now") == std::string::npos);
  CHECK(old.out == notice + now.out);
  CHECK(now.out.find("--layer-list 1") != std::string::npos);
  CHECK(now.out.find("layer  1 ") != std::string::npos);
  CHECK(now.out.find("layer  0 ") == std::string::npos);
  const testing::CliResult bad = testing::run_cli(args + " --layers 1-x");
  CHECK(bad.status == 2);
  CHECK(bad.out.find(notice) == 0);
  CHECK(bad.out.find("--layer-list: bad item '1-x'") != std::string::npos);
  std::filesystem::remove_all(dir);
}
