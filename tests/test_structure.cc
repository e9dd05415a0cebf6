// The judge's structure tests (judge/structure.h): the statistics on synthetic data, fault
// injection through `diff` on top of a correct kernel emulation, and the correct-kernel family
// (judge/emulate.h) passing.
#include <doctest/doctest.h>

#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "ref/numerics.h"
#include "ref/problem.h"
#include "ref/rng.h"
#include "tools/judge/structure.h"
#include "ref/topk.h"
#include "simd/simd.h"
#include "tools/judge/calibrate.h"
#include "tools/judge/diff.h"
#include "tools/judge/emulate.h"
#include "tools/lib/golden.h"
#include "tests/cli_util.h"
#include "tests/ties_util.h"

using namespace indexshare;

namespace {

std::string tmp_dir(const std::string& what) {
  return (std::filesystem::temp_directory_path() / ("indexshare-structure-" + what + "-" + std::to_string(::getpid()))).string();
}

bool has_finding(const std::vector<std::string>& f, const std::string& needle) {
  for (const std::string& s : f)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}

// attn.out's layout as diff judges it: clusters (row, head), column lanes.
cmp::StructureSpec out_spec(int64_t R, int64_t H, int64_t C) {
  cmp::StructureSpec s;
  s.tensor = "attn.out";
  s.rows = R;
  s.heads = H;
  s.cols = C;
  s.cluster_cols = C;
  s.lanes = true;
  return s;
}

// One value per (row, head), each its own cluster (Delta, lse).
cmp::StructureSpec per_row_head(const std::string& tensor, int64_t R, int64_t H) {
  cmp::StructureSpec s;
  s.tensor = tensor;
  s.rows = R;
  s.heads = H;
  s.cols = 1;
  s.cluster_cols = 1;
  return s;
}

// Synthetic [rows, heads, cols] data: golden x ~ U(-1, 1), a correct candidate x (1 + noise),
// noise per element plus a per-(row, head) common factor (as P rounded to bf16 gives).
struct Synthetic {
  int64_t R = 256, H = 8, C = 64;
  std::vector<float> x, y;
  explicit Synthetic(uint64_t seed) {
    Xoshiro256 g(seed);
    auto u = [&] { return double(int64_t(g.below(1u << 24)) - (1 << 23)) / double(1 << 23); };
    x.resize(size_t(R * H * C));
    y.resize(x.size());
    for (int64_t r = 0; r < R; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const double common = 2e-3 * u();  // per-(row, head): a correct kernel's P rounding
        for (int64_t c = 0; c < C; ++c) {
          const size_t i = size_t((r * H + h) * C + c);
          x[i] = float(u());
          y[i] = float(double(x[i]) * (1 + common + 4e-3 * u()));
        }
      }
  }
  cmp::StructureSpec spec() const { return out_spec(R, H, C); }
  template <class F>
  void apply(F f) {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < C; ++c) {
          const size_t i = size_t((r * H + h) * C + c);
          y[i] = float(f(r, h, c, double(x[i]), double(y[i])));
        }
  }
};

// A golden set at a kernel-like shape (two sequences of 64 query rows, two 64-row tiles) and the
// outputs of a correct kernel emulation (the naive member) on its inputs.
struct Fixture {
  std::string dir;
  golden::Loaded g;
  ref::AttentionOut base;
  Tensor<float> logits;
  float sm = 0;
  int64_t h_q = 0, d_v = 0, s_q = 0, s_kv = 0;
  Fixture() {
    dir = tmp_dir("golden");
    const Problem p = parse_problem("sq128 skv512 hq16 dqk576 dv512 ih32 id128 k128 seed11 nseq2 sink=random");
    golden::write(dir, golden::build(p, "stack", true, "test", Impl::simd), true);
    g = golden::read(dir);
    sm = g.manifest["config"]["sm_scale"].get<float>();
    h_q = g.manifest["config"]["h_q"];
    d_v = g.manifest["config"]["d_v"];
    s_q = g.manifest["config"]["s_q"];
    s_kv = g.manifest["config"]["s_kv"];
    base = attention(emul::attention_family()[0], sm);
    logits = emul::logits(emul::logits_family()[0], g.tensor<e4m3_t>("layers.0.indexer.q"), g.tensor<e4m3_t>("layers.0.indexer.k"),
                          g.tensor<float>("layers.0.indexer.k_scale"), g.tensor<float>("layers.0.indexer.weights"),
                          g.tensor<int32_t>("layers.0.indexer.ks"), g.tensor<int32_t>("layers.0.indexer.ke"));
  }
  ~Fixture() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  ref::AttentionOut attention(const emul::AttentionVariant& v, float scale) const {
    const Tensor<float> sink = g.tensor<float>("layers.0.attn.sink");
    return emul::attention(v, g.tensor<bf16_t>("layers.0.attn.q"), g.tensor<bf16_t>("layers.0.attn.kv"),
                           g.tensor<int32_t>("layers.0.attn.indices"), scale, d_v, nullptr, &sink);
  }
  diff::Result judge(const std::map<std::string, Tensor<float>>& t) const {
    std::vector<io::TensorView> v;
    for (const auto& [n, x] : t) v.push_back(io::make_view(n, x));
    const std::string path = dir + ".candidate.safetensors";
    io::write_safetensors(path, v);
    const io::SafetensorsFile f = io::read_safetensors(path);
    std::filesystem::remove(path);
    return diff::judge(g, f, {}, simd::kernels());
  }
  // The candidate: every output of the correct emulation, with `name` replaced.
  diff::Result judge_with(const std::string& name, const Tensor<float>& x) const {
    std::map<std::string, Tensor<float>> t = {{"layers.0.attn.out", base.out}, {"layers.0.attn.lse", base.lse},
                                              {"layers.0.attn.max_logits", base.max_logits}, {"layers.0.indexer.logits", logits}};
    t[name] = x;
    return judge(t);
  }
};

Tensor<float> scaled(Tensor<float> t, double eps, const std::function<bool(int64_t)>& where) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (where(i) && std::isfinite(t[i])) t[i] = float(double(t[i]) * (1 + eps));
  return t;
}

void expect_fail(const diff::Result& r, const std::string& tensor, const std::string& finding) {
  bool failed = false;
  for (const auto& t : r.tensors) failed |= t.name == tensor && t.report.verdict == cmp::Verdict::fail;
  CHECK_MESSAGE(failed, tensor << " did not fail");
  CHECK_MESSAGE(has_finding(r.diagnoses, finding), "no diagnosis containing '" << finding << "' in:\n" << r.text("x"));
}

}  // namespace

TEST_CASE("structure: Student's t tail and quantile match closed forms") {
  // nu = 1 (Cauchy): P(T > q) = 1/2 - atan(q) / pi; nu = 2: (1 - q / sqrt(q^2 + 2)) / 2.
  for (double q : {0.5, 1.0, 3.0, 100.0}) {
    CHECK(cmp::t_upper_tail(q, 1) == doctest::Approx(0.5 - std::atan(q) / M_PI).epsilon(1e-12));
    CHECK(cmp::t_upper_tail(q, 2) == doctest::Approx(0.5 * (1 - q / std::sqrt(q * q + 2))).epsilon(1e-12));
  }
  // Large nu approaches the normal: P(Z > 1.959964) = 0.025.
  CHECK(cmp::t_upper_tail(1.959964, 1000) == doctest::Approx(0.025).epsilon(2e-3));
  // Table values: t_{0.975, 10} = 2.228139, t_{0.995, 30} = 2.749996.
  CHECK(cmp::t_upper_quantile(0.025, 10) == doctest::Approx(2.228139).epsilon(1e-6));
  CHECK(cmp::t_upper_quantile(0.005, 30) == doctest::Approx(2.749996).epsilon(1e-6));
  CHECK(cmp::t_upper_quantile(1e-9, 9) > cmp::t_upper_quantile(1e-9, 100));
}

TEST_CASE("structure: rounding noise flags nothing, each planted error is found and named") {
  for (uint64_t seed : {1, 2, 3}) {
    const Synthetic s(seed);
    const cmp::StructureReport r = cmp::structure_tests(s.spec(), s.x.data(), s.y.data());
    CHECK(!r.flagged);
    CHECK(r.findings.empty());
    CHECK(r.max_ratio < 1);
    CHECK(r.m > 100);
  }
  struct Plant {
    std::string name, finding;
    std::function<double(int64_t, int64_t, int64_t, double, double)> f;
  };
  const std::vector<Plant> plants = {
      {"uniform scale", "scale error 1.00", [](int64_t, int64_t, int64_t, double x, double y) { return y + 5e-3 * x; }},
      {"one head", "head 3 only", [](int64_t, int64_t h, int64_t, double x, double y) { return h == 3 ? y + 2e-2 * x : y; }},
      {"one lane class", "columns = 5 mod 8 only", [](int64_t, int64_t, int64_t c, double x, double y) { return c % 8 == 5 ? y + 2e-2 * x : y; }},
      {"a finer lane class", "columns = 3 mod 16 only", [](int64_t, int64_t, int64_t c, double x, double y) { return c % 16 == 3 ? y + 3e-2 * x : y; }},
      {"one 64-row tile", "rows 64-127 (one 64-row tile) only", [](int64_t r, int64_t, int64_t, double x, double y) { return r >= 64 && r < 128 ? y + 1e-2 * x : y; }},
      {"one 128-row tile", "rows 128-255 (one 128-row tile) only", [](int64_t r, int64_t, int64_t, double x, double y) { return r >= 128 ? y + 1e-2 * x : y; }},
      {"an offset", "offset", [](int64_t, int64_t, int64_t, double, double y) { return y + 3e-3; }},
  };
  for (const Plant& p : plants) {
    CAPTURE(p.name);
    Synthetic s(7);
    s.apply(p.f);
    const cmp::StructureReport r = cmp::structure_tests(s.spec(), s.x.data(), s.y.data());
    CHECK(r.flagged);
    REQUIRE(r.findings.size() == 1);
    CHECK_MESSAGE(r.findings[0].find(p.finding) != std::string::npos, r.findings[0]);
  }
  // A systematic error below the floor is never flagged, however significant: a correct kernel's
  // truncating accumulator may bias by that much.
  Synthetic s(8);
  s.apply([](int64_t, int64_t, int64_t, double x, double y) { return y + 0.5 * cmp::kFloorOut * x; });
  CHECK(!cmp::structure_tests(s.spec(), s.x.data(), s.y.data()).flagged);
  // Too few clusters: nothing is tested.
  Synthetic tiny(9);
  tiny.R = 1;
  tiny.H = 4;
  tiny.x.resize(size_t(4 * 64));
  tiny.y = tiny.x;
  for (float& v : tiny.y) v *= 1.5f;
  const cmp::StructureReport r = cmp::structure_tests(tiny.spec(), tiny.x.data(), tiny.y.data());
  CHECK(r.m == 0);
  CHECK(!r.flagged);
}

// Three ways a finding could be a false lead, each with the fault that must still be found:
// - a group that two large values carry (a [rows, heads] tensor such as Delta, one value per
//   cluster): their noise agreeing by chance is no scale; the t test has the effective clusters'
//   degrees of freedom. A real scale on that group is still flagged.
// - an error on 15 of 16 column classes is no confinement: it is named over every element.
// - a softmax-scale direction flagged by a small bias under a much larger random error is not
//   named a softmax scale; the same direction as the whole error is.
TEST_CASE("structure: no finding from two large values, from 15 of 16 classes, or from a softmax bias under noise") {
  const cmp::StructureSpec d = per_row_head("attn_bwd.delta", 16, 4);
  std::vector<float> x(64), y(64);
  Xoshiro256 g(21);
  auto u = [&] { return double(int64_t(g.below(1u << 24)) - (1 << 23)) / double(1 << 23); };
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = float(2 * u());
    y[i] = float(double(x[i]) + 2e-4 * u());  // noise independent of x, as Delta's from a bf16 out
  }
  for (const size_t big : {size_t(4 * 4 + 2), size_t(9 * 4 + 2)}) {  // head 2, rows 4 and 9: large, their errors agreeing
    x[big] = big == 18 ? -8.66f : 8.51f;
    y[big] = float(double(x[big]) * (1 + 2.5e-3));
  }
  const cmp::StructureReport quiet = cmp::structure_tests(d, x.data(), y.data());
  MESSAGE("two large values: largest ratio " << quiet.max_ratio);
  CHECK_MESSAGE(!quiet.flagged, (quiet.findings.empty() ? std::string() : quiet.findings[0]));
  std::vector<float> scaled = y;
  for (int64_t r = 0; r < 16; ++r) scaled[size_t(r * 4 + 2)] = float(double(x[size_t(r * 4 + 2)]) * 1.05);
  const cmp::StructureReport found = cmp::structure_tests(d, x.data(), scaled.data());
  REQUIRE(found.findings.size() == 1);
  CHECK_MESSAGE(found.findings[0].find("head 2 only") != std::string::npos, found.findings[0]);

  Synthetic most(7);
  most.apply([](int64_t, int64_t, int64_t c, double x, double y) { return c % 16 != 3 ? y + 2e-2 * x : y; });
  const cmp::StructureReport r15 = cmp::structure_tests(most.spec(), most.x.data(), most.y.data());
  REQUIRE(r15.findings.size() == 1);
  CHECK_MESSAGE(r15.findings[0].find("every element") != std::string::npos, r15.findings[0]);
  Synthetic one(7);
  one.apply([](int64_t, int64_t, int64_t c, double x, double y) { return c % 16 == 3 ? y + 2e-2 * x : y; });
  const cmp::StructureReport r1 = cmp::structure_tests(one.spec(), one.x.data(), one.y.data());
  REQUIRE(r1.findings.size() == 1);
  CHECK_MESSAGE(r1.findings[0].find("columns = 3 mod 16 only") != std::string::npos, r1.findings[0]);

  // lse-like: one value per (row, head), a direction g; the error a bias along g (t about 10) under
  // a random error that holds 95% of its sum of squares, then the direction alone.
  cmp::StructureSpec l = per_row_head("attn.lse", 256, 8);
  l.floor = cmp::kFloorLse;
  std::vector<float> lx(256 * 8), ly(lx.size()), lg(lx.size());
  for (size_t i = 0; i < lx.size(); ++i) {
    lx[i] = float(7 + u());
    lg[i] = float(u());  // independent of the values: neither a scale nor an offset fits it
  }
  l.sm_dir = lg.data();
  for (const double noise : {2e-4, 0.0}) {
    CAPTURE(noise);
    for (size_t i = 0; i < lx.size(); ++i) ly[i] = float(double(lx[i]) + 5e-5 * double(lg[i]) + noise * u());
    const cmp::StructureReport r = cmp::structure_tests(l, lx.data(), ly.data());
    CHECK(r.flagged);
    CHECK(has_finding(r.findings, "softmax scale") == (noise == 0));
  }
}

TEST_CASE("structure: the softmax-scale direction given whole or as its cluster sums gives the same test") {
  // diff folds the direction block by block into sm_cluster_sums and never holds it whole: the
  // "sm" test must read the same from either. A candidate off along the direction is flagged and
  // estimated the same way; a correct one is flagged by neither.
  for (const double off : {0.0, 3e-2}) {
    CAPTURE(off);
    Synthetic s(11);
    std::vector<float> g(s.x.size());
    Xoshiro256 r(12);
    for (size_t i = 0; i < g.size(); ++i) g[i] = float(double(int64_t(r.below(1u << 20)) - (1 << 19)) / double(1 << 19));
    for (size_t i = 0; i < g.size(); ++i) s.y[i] = float(double(s.y[i]) + off * double(g[i]));
    cmp::StructureSpec whole = s.spec();
    whole.sm_dir = g.data();
    std::vector<double> sums(size_t(2 * s.R * s.H));
    cmp::sm_cluster_sums(s.x.data(), s.y.data(), g.data(), s.R * s.H, s.C, sums.data());
    cmp::StructureSpec folded = s.spec();
    folded.sm_sums = sums.data();
    const cmp::StructureReport a = cmp::structure_tests(whole, s.x.data(), s.y.data());
    const cmp::StructureReport b = cmp::structure_tests(folded, s.x.data(), s.y.data());
    REQUIRE(a.tests.size() == b.tests.size());
    for (size_t i = 0; i < a.tests.size(); ++i) {
      CAPTURE(a.tests[i].stat);
      CHECK(a.tests[i].flagged == b.tests[i].flagged);
      CHECK(b.tests[i].b == doctest::Approx(a.tests[i].b).epsilon(1e-9));
      CHECK(b.tests[i].se == doctest::Approx(a.tests[i].se).epsilon(1e-9));
    }
    CHECK(a.tests.back().stat == "sm");
    CHECK(a.tests.back().flagged == (off != 0));
    CHECK(a.findings == b.findings);
  }
}

TEST_CASE("structure: sm_cluster_sums equals the plain loop that skips non-finite pairs, with 1 and 2 threads") {
  // Its loop has no branch (a pair left out adds +0); this is the definition it must equal bit for
  // bit: per cluster, in double, columns ascending, over the pairs with x and y finite. The data
  // hold NaN and inf in x, y and the direction, and a cluster with every pair left out.
  const int64_t clusters = 300, cols = 257;
  std::vector<float> x(size_t(clusters * cols)), y(x.size()), g(x.size());
  Xoshiro256 r(31);
  auto val = [&] { return float(double(int64_t(r.below(1u << 20)) - (1 << 19)) / double(1 << 19)); };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = val();
    y[i] = x[i] + 1e-3f * val();
    g[i] = val();
    const uint64_t k = r.below(64);
    if (k == 0) x[i] = nan;
    if (k == 1) y[i] = inf;
    if (k == 2) g[i] = nan;  // a pair kept: its NaN reaches the sums
    if (k == 3) { x[i] = -inf; g[i] = inf; }  // left out: the direction's inf must not leak
  }
  for (int64_t j = 0; j < cols; ++j) y[size_t(7 * cols + j)] = nan;  // cluster 7: nothing kept
  std::vector<double> plain(size_t(2 * clusters));
  for (int64_t c = 0; c < clusters; ++c) {
    double sgg = 0, sge = 0;
    for (int64_t j = c * cols; j < (c + 1) * cols; ++j) {
      if (!std::isfinite(x[size_t(j)]) || !std::isfinite(y[size_t(j)])) continue;
      sgg += double(g[size_t(j)]) * double(g[size_t(j)]);
      sge += double(g[size_t(j)]) * (double(y[size_t(j)]) - double(x[size_t(j)]));
    }
    plain[size_t(2 * c)] = sgg;
    plain[size_t(2 * c + 1)] = sge;
  }
  const int before = omp_get_max_threads();
  for (int t : {1, 2}) {
    CAPTURE(t);
    omp_set_num_threads(t);
    std::vector<double> got(plain.size(), -1.0);
    cmp::sm_cluster_sums(x.data(), y.data(), g.data(), clusters, cols, got.data());
    CHECK(std::memcmp(got.data(), plain.data(), plain.size() * sizeof(double)) == 0);
  }
  omp_set_num_threads(before);
  CHECK(plain[14] == 0.0);
  CHECK(!std::signbit(plain[15]));
}

TEST_CASE("structure: pooled tests see an error spread over layers") {
  Synthetic s(5);
  s.apply([](int64_t, int64_t, int64_t, double x, double y) { return y + 2e-3 * x; });
  const cmp::StructureReport one = cmp::structure_tests(s.spec(), s.x.data(), s.y.data());
  std::vector<cmp::ClusterSums> all = one.clusters;
  all.insert(all.end(), one.clusters.begin(), one.clusters.end());
  const cmp::StructureReport p = cmp::pooled_tests(s.spec(), all);
  CHECK(p.flagged);
  REQUIRE(p.findings.size() == 1);
  CHECK(p.findings[0].find("scale error 1.002") != std::string::npos);
  const Synthetic clean(6);
  CHECK(!cmp::pooled_tests(clean.spec(), cmp::structure_tests(clean.spec(), clean.x.data(), clean.y.data()).clusters).flagged);
}

TEST_CASE("structure: a correct kernel passes, systematic faults on it fail diff with their diagnosis") {
  const Fixture f;
  {
    const diff::Result r = f.judge_with("layers.0.attn.out", f.base.out);
    if (r.failed()) MESSAGE(r.text("x"));
    CHECK(!r.failed());
  }
  auto all = [](int64_t) { return true; };
  const int64_t hq = f.h_q, dv = f.d_v;
  // attn.out: a uniform 0.5% scale (the example) and 0.2%.
  expect_fail(f.judge_with("layers.0.attn.out", scaled(f.base.out, 5e-3, all)), "attn.out", "attn.out scale error 1.005");
  expect_fail(f.judge_with("layers.0.attn.out", scaled(f.base.out, 2e-3, all)), "attn.out", "over every element");
  // One head, one lane class, one 64-row tile, one sequence.
  expect_fail(f.judge_with("layers.0.attn.out", scaled(f.base.out, 1e-2, [&](int64_t i) { return (i / dv) % hq == 3; })), "attn.out",
              "head 3 only");
  expect_fail(f.judge_with("layers.0.attn.out", scaled(f.base.out, 1e-2, [&](int64_t i) { return i % dv % 8 == 0; })), "attn.out",
              "columns = 0 mod 8 only");
  expect_fail(f.judge_with("layers.0.attn.out", scaled(f.base.out, 1e-2, [&](int64_t i) { return i / (hq * dv) >= 64; })), "attn.out",
              "rows 64-127 (one 64-row tile) only");
  // An additive offset of 1% of the rms.
  {
    Tensor<float> o = f.base.out;
    double s2 = 0;
    for (float v : o.data) s2 += double(v) * v;
    const double rms = std::sqrt(s2 / double(o.numel()));
    for (float& v : o.data) v = float(double(v) + 1e-2 * rms);
    expect_fail(f.judge_with("layers.0.attn.out", o), "attn.out", "attn.out offset");
  }
  // A softmax scale 0.3% off: the kernel's outputs all move.
  {
    const ref::AttentionOut o = f.attention(emul::attention_family()[0], float(double(f.sm) * 1.003));
    std::map<std::string, Tensor<float>> t = {{"layers.0.attn.out", o.out}, {"layers.0.attn.lse", o.lse}, {"layers.0.attn.max_logits", o.max_logits}};
    const diff::Result r = f.judge(t);
    expect_fail(r, "attn.out", "attn.out matches a softmax scale off by +0.30");
    expect_fail(r, "attn.lse", "attn.lse matches a softmax scale off by +0.30");
    expect_fail(r, "attn.max_logits", "attn.max_logits scale error 1.0030");
  }
  // lse: a uniform scale of 1e-4; logits: 0.5%, and one key lane class.
  expect_fail(f.judge_with("layers.0.attn.lse", scaled(f.base.lse, 1e-4, all)), "attn.lse", "attn.lse");
  expect_fail(f.judge_with("layers.0.indexer.logits", scaled(f.logits, 5e-3, all)), "indexer.logits", "indexer.logits scale error 1.005");
  expect_fail(f.judge_with("layers.0.indexer.logits", scaled(f.logits, 2e-2, [&](int64_t i) { return i % f.s_kv % 8 == 3; })),
              "indexer.logits", "columns = 3 mod 8 only");
}

TEST_CASE("structure: every member of the correct-kernel family passes diff (small shapes)") {
  const std::string tmp = tmp_dir("calibrate");
  // 16 runs cover the 8 attention members and the 4 logits members twice each, with sinks,
  // several sequences, h_q 16-128, top-k 64-2048 and a stack with Shared layers (run 4, 9, 14).
  const std::vector<calib::Run> runs = calib::calibrate(0, 16, 1, simd::kernels(), tmp, {}, int64_t(1) << 15);
  std::filesystem::remove_all(tmp);
  std::set<std::string> attn, logit;
  for (const calib::Run& r : runs) {
    CAPTURE(r.problem);
    CAPTURE(r.attention_variant);
    CHECK_MESSAGE(r.passed, (r.reasons.empty() ? std::string() : r.reasons[0]));
    attn.insert(r.attention_variant);
    logit.insert(r.logits_variant);
  }
  CHECK(attn.size() == emul::attention_family().size());
  CHECK(logit.size() == emul::logits_family().size());
}

TEST_CASE("structure: a legitimate tie permutation with a correct kernel over the candidate's indices passes") {
  const golden::Loaded g = golden::read(std::string(INDEXSHARE_SOURCE_DIR) + "/golden/ties");
  const Tensor<int32_t> ks = g.tensor<int32_t>("layers.0.indexer.ks");
  int swapped = 0;
  const Tensor<int32_t> topk = testing::tie_permuted_topk(g, swapped);
  REQUIRE(swapped > 0);
  const Tensor<int32_t> rows = ref::local_to_kv_rows(topk, ks);
  for (const emul::AttentionVariant& v : emul::attention_family()) {
    CAPTURE(v.name());
    const ref::AttentionOut a = emul::attention(v, g.tensor<bf16_t>("layers.0.attn.q"), g.tensor<bf16_t>("layers.0.attn.kv"), rows,
                                                g.manifest["config"]["sm_scale"].get<float>(), 512);
    std::vector<io::TensorView> c = {io::make_view("layers.0.indexer.topk", topk), io::make_view("layers.0.attn.indices", rows),
                                     io::make_view("layers.0.attn.out", a.out), io::make_view("layers.0.attn.lse", a.lse),
                                     io::make_view("layers.0.attn.max_logits", a.max_logits)};
    const std::string path = tmp_dir("ties") + ".safetensors";
    io::write_safetensors(path, c);
    const diff::Result r = diff::judge(g, io::read_safetensors(path), {});
    std::filesystem::remove(path);
    if (r.failed()) MESSAGE(r.text("x"));
    CHECK(!r.failed());
  }
}

TEST_CASE("structure: an error on every Shared layer and no Full layer is named as the Shared-layer path") {
  const golden::Loaded g = golden::read(std::string(INDEXSHARE_SOURCE_DIR) + "/golden/glm-5.2");
  std::vector<io::TensorView> c;
  for (size_t l = 0; l < g.manifest["layers"].size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const bool shared = g.manifest["layers"][l]["kind"] == "shared";
    Tensor<float> o = g.tensor<float>(p + "attn.out");
    for (float& v : o.data) v = round_bf16(float(double(v) * (shared ? 1.001 : 1.0)));  // a bf16 kernel, 0.1% high on Shared layers
    c.push_back(io::make_view(p + "attn.out", o));
  }
  const std::string path = tmp_dir("roles") + ".safetensors";
  io::write_safetensors(path, c);
  const diff::Result r = diff::judge(g, io::read_safetensors(path), {});
  std::filesystem::remove(path);
  CHECK(r.failed());
  for (const auto& t : r.tensors)
    CHECK((t.report.verdict == cmp::Verdict::fail) == (g.manifest["layers"][size_t(t.layer)]["kind"] == "shared"));
  CHECK(has_finding(r.diagnoses, "attn.out: a systematic error on every Shared layer (3, 4, 5, 7) and on none of the 4 Full layer(s)"));
  CHECK(has_finding(r.diagnoses, "layer 4 (Shared, source 2): attn.out scale error 1.00"));
}

TEST_CASE("structure: calibrate refuses bad input with a clear message, exit 2 and no JSON written") {
  const std::string json = tmp_dir("calibrate-json") + ".json";
  const std::string glm = std::string(INDEXSHARE_SOURCE_DIR) + "/golden/glm-5.2";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"calibrate --runs 0", "--runs: expected 1..100000, got 0"},
      {"calibrate --first -3 --runs 1", "--first: expected 0..10^9, got -3"},
      {"calibrate --max-work 0", "--max-work"},
      {"calibrate --runs 1 --layer 2", "--layer requires --power"},
      {"calibrate --power " + glm + " --runs 3", "--runs excludes --power"},
      {"calibrate --catalogue --values", "--catalogue excludes --values"},
      {"calibrate --power /nonexistent-golden", "/nonexistent-golden: not a golden set folder"},
      {"calibrate --power " + glm + " --layer 9", "--layer 9 is outside " + glm + "'s 8 layers"},
      {"calibrate --preset glm-5.2 --runs 1", "--preset: 'glm-5.2' is not a kernel preset"},
      {"calibrate --preset no-such-preset --runs 1", "no-such-preset"},
      {"calibrate --preset deepgemm-fp8-mqa-logits-sm90 --families", "--preset excludes --families"},
  };
  for (const auto& [args, message] : cases) {
    CAPTURE(args);
    const auto r = testing::run_cli(args + " --json " + json);
    CHECK(r.status == 2);
    CHECK(r.out.find(message) != std::string::npos);
    CHECK(r.out.find("power of the judge") == std::string::npos);  // nothing printed before the refusal
    CHECK(r.out.find("calibration:") == std::string::npos);
    CHECK(!std::filesystem::exists(json));
  }
}

namespace {

// Every field of a comparison report and its structure report as text, doubles in hex (%a): two
// dumps are equal iff the reports are equal bit for bit.
std::string dump(const cmp::Report& r, const cmp::StructureReport& st) {
  std::string s;
  auto d = [&](double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%a ", v);
    s += b;
  };
  auto i = [&](int64_t v) { s += std::to_string(v) + " "; };
  s += r.tensor + " " + cmp::verdict_name(r.verdict) + "\n";
  for (const std::string& x : r.reasons) s += "reason " + x + "\n";
  i(r.stats.n), i(r.stats.n_checked), i(r.stats.n_fail);
  d(r.stats.max_abs), d(r.stats.max_rel), d(r.stats.metric), d(r.stats.mean_signed), d(r.stats.max_ratio);
  d(r.stats.recall_mean), d(r.stats.recall_min);
  s += "\n";
  for (const cmp::Mismatch& m : r.mismatches) {
    for (int64_t k : m.index) i(k);
    d(m.expected), d(m.got), d(m.diff), d(m.bound);
    s += m.what + "\n";
  }
  i(r.structure_tests), d(r.structure_max_ratio), d(r.structure_max_b_over_floor);
  for (const cmp::StructureNote& n : r.structure_flagged) {
    s += n.stat + " " + n.kind + " " + n.label + " ";
    d(n.b), d(n.se), d(n.t), d(n.t_crit), d(n.floor), i(n.clusters);
  }
  for (const std::string& f : r.findings) s += "finding " + f + "\n";
  i(st.m), d(st.max_ratio), d(st.max_b_over_floor), d(st.max_t_over_crit), i(st.flagged);
  for (const cmp::GroupTest& t : st.tests) {
    s += t.stat + " " + t.kind + " " + t.label + " ";
    i(t.index), i(t.n), i(t.clusters), d(t.b), d(t.se), d(t.t), d(t.t_crit), d(t.floor), d(t.explained), i(t.tested), i(t.flagged);
    s += "\n";
  }
  for (const cmp::ClusterSums& c : st.clusters) d(c.n), d(c.sxx), d(c.sxe), d(c.se);
  return s;
}

}  // namespace

// The comparison passes run in fixed blocks (judge/compare.cc: 2^16 elements; judge/structure.cc: rows
// of 2^18 elements or more) combined in block order, so the thread count changes no bit. A tensor
// of 2^21 elements spans 32 and 8 of them; each injected fault must still be flagged, the report
// the same with 1 and 2 threads, and the mismatch list the first kMaxMismatches in element order.
TEST_CASE("structure: compare_structured's report is the same bit for bit with 1 and 2 threads") {
  const int64_t R = 256, H = 16, C = 512, n = R * H * C;
  Xoshiro256 rng(21);
  auto u = [&] { return double(int64_t(rng.below(1u << 24)) - (1 << 23)) / double(1 << 23); };
  Tensor<float> x({R, H, C}), y0({R, H, C});
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const double common = 2e-3 * u();
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = (r * H + h) * C + c;
        x[i] = float(u());
        y0[i] = float(double(x[i]) * (1 + common + 4e-3 * u()));
        g[size_t(i)] = float(0.5 * u());
      }
    }
  cmp::FloatRule rule;
  rule.bound.assign(size_t(n), 2e-2f);
  rule.anchor_abs = 1e-3;
  rule.anchor_rel = 8e-3;
  rule.anchor_name = "the anchor";
  rule.metric_max = 1;
  cmp::StructureSpec spec = out_spec(R, H, C);
  spec.sm_dir = g.data();
  struct Fault {
    std::string name, finding;  // finding: "" = a clean candidate
    std::function<void(Tensor<float>&)> f;
  };
  auto each = [&](Tensor<float>& y, const std::function<double(int64_t, int64_t, int64_t, double, double)>& f) {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = (r * H + h) * C + c;
          y[i] = float(f(r, h, c, double(x[i]), double(y[i])));
        }
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Fault> faults = {
      {"clean", "", [](Tensor<float>&) {}},
      {"scale", "scale error 1.00", [&](Tensor<float>& y) { each(y, [](int64_t, int64_t, int64_t, double x, double y) { return y + 5e-3 * x; }); }},
      {"offset", "offset", [&](Tensor<float>& y) { each(y, [](int64_t, int64_t, int64_t, double, double y) { return y + 3e-3; }); }},
      {"one lane", "columns = 5 mod 8 only", [&](Tensor<float>& y) {
         each(y, [](int64_t, int64_t, int64_t c, double x, double y) { return c % 8 == 5 ? y + 2e-2 * x : y; });
       }},
      {"one row tile", "rows 64-127 (one 64-row tile) only", [&](Tensor<float>& y) {
         each(y, [](int64_t r, int64_t, int64_t, double x, double y) { return r >= 64 && r < 128 ? y + 1e-2 * x : y; });
       }},
      // Mismatches spread over several blocks, non-finite values among them, and anchor failures.
      {"scattered mismatches", "", [&](Tensor<float>& y) {
         for (int64_t i = 70000; i < n; i += 99991) y[i] = y[i] + (i % 3 ? 0.5f : 0.01f);
         y[200001] = nan;
         x[300007] = nan;
         y[300007] = nan;  // the same class: no failure
         y[1500000] = std::numeric_limits<float>::infinity();
       }},
  };
  const Tensor<float> x0 = x;
  for (const Fault& fault : faults) {
    CAPTURE(fault.name);
    x = x0;
    Tensor<float> y = y0;
    fault.f(y);
    const int before = omp_get_max_threads();
    std::string dumps[2];
    cmp::Report reports[2];
    for (int t = 1; t <= 2; ++t) {
      omp_set_num_threads(t);
      cmp::StructureReport st;
      reports[t - 1] = cmp::compare_structured("attn.out", x, y, rule, spec, &st);
      dumps[t - 1] = dump(reports[t - 1], st);
    }
    omp_set_num_threads(before);
    CHECK(dumps[0] == dumps[1]);
    const cmp::Report& r = reports[0];
    if (!fault.finding.empty()) {
      CHECK(r.verdict == cmp::Verdict::fail);
      CHECK_MESSAGE(has_finding(r.findings, fault.finding), dumps[0].substr(0, 2000));
    } else if (fault.name == "clean") {
      CHECK(r.verdict == cmp::Verdict::pass);
      CHECK(r.structure_flagged.empty());
    }
    // compare_floats' metric is calc_diff's, and its mismatches are the first in element order
    // (found here by a plain loop over the elements).
    CHECK(r.stats.metric == cmp::calc_diff(x.ptr(), y.ptr(), n));
    std::vector<int64_t> first;
    int64_t n_fail = 0, anchor_first = -1;
    for (int64_t i = 0; i < n; ++i) {
      const float e = x[i], v = y[i];
      if (!std::isfinite(e) || !std::isfinite(v)) {
        if (!((std::isnan(e) && std::isnan(v)) || (std::isinf(e) && e == v))) { ++n_fail; first.push_back(i); }
        continue;
      }
      const double ad = std::fabs(double(v) - double(e));
      if (anchor_first < 0 && !(ad < rule.anchor_abs || ad / (std::fabs(double(e)) + 1e-6) < rule.anchor_rel)) {
        anchor_first = i;
        if (ad <= 2e-2f) first.push_back(i);
      }
      if (ad > 2e-2f) { ++n_fail; first.push_back(i); }
    }
    CHECK(r.stats.n_fail == n_fail);
    first.resize(std::min(first.size(), cmp::kMaxMismatches));
    REQUIRE(r.mismatches.size() == first.size());
    for (size_t k = 0; k < first.size(); ++k) CHECK(r.mismatches[k].index == cmp::unflatten(first[k], x.shape));
    if (fault.name == "scattered mismatches") CHECK(first.size() == cmp::kMaxMismatches);
  }
}
