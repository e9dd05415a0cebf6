// The precision test (judge/precision.h): a candidate whose error is the size of a coarser
// arithmetic than its contract's fails and is named, however far inside its bounds; correct kernels
// of the contract's class pass; a declared lower contract passes its own class.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>

#include "ref/error.h"
#include "ref/numerics.h"
#include "ref/problem.h"
#include "ref/topk.h"
#include "simd/simd.h"
#include "tools/judge/diff.h"
#include "tools/judge/emulate.h"
#include "tools/lib/golden.h"
#include "tools/judge/precision.h"

using namespace indexshare;

namespace {

// A set at the indexer shape of DeepGEMM's and FlashMLA's tests (indexer 64 heads x 128, FP8;
// top-k 512 over 2,048 keys), with a small attention (16 heads) to keep the emulations quick.
struct Set {
  std::string dir;
  golden::Loaded g;
  float sm = 0;
  int64_t d_v = 0;
  explicit Set(const std::string& problem) {
    dir = (std::filesystem::temp_directory_path() / ("indexshare-precision-" + std::to_string(::getpid()))).string();
    golden::write(dir, golden::build(parse_problem(problem), "stack", true, "test", Impl::simd), true);
    g = golden::read(dir);
    sm = g.manifest["config"]["sm_scale"].get<float>();
    d_v = g.manifest["config"]["d_v"];
  }
  ~Set() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  template <class T>
  Tensor<T> t(const std::string& n) const { return g.tensor<T>("layers.0." + n); }
  Tensor<float> logits(const emul::LogitsVariant& v) const {
    return emul::logits(v, t<e4m3_t>("indexer.q"), t<e4m3_t>("indexer.k"), t<float>("indexer.k_scale"), t<float>("indexer.weights"),
                        t<int32_t>("indexer.ks"), t<int32_t>("indexer.ke"));
  }
  Tensor<int32_t> topk_of(const Tensor<float>& lg) const {
    return ref::topk(lg, t<int32_t>("indexer.ks"), t<int32_t>("indexer.ke"), g.manifest["config"]["topk"].get<int64_t>());
  }
  ref::AttentionOut attention(const emul::AttentionVariant& v) const {
    return emul::attention(v, t<bf16_t>("attn.q"), t<bf16_t>("attn.kv"), t<int32_t>("attn.indices"), sm, d_v);
  }
  diff::Result judge(const std::map<std::string, io::TensorView>& c, const std::string& contract = "") const {
    std::vector<io::TensorView> v;
    for (const auto& [n, x] : c) v.push_back(x);
    const std::string path = dir + ".candidate.safetensors";
    io::write_safetensors(path, v);
    const io::SafetensorsFile f = io::read_safetensors(path);
    std::filesystem::remove(path);
    return diff::judge(g, f, {}, simd::kernels(), false, prec::parse_contract(contract));
  }
};

const cmp::Report* report(const diff::Result& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.layer == 0 && t.name == name) return &t.report;
  return nullptr;
}
cmp::Verdict verdict(const diff::Result& r, const std::string& name) {
  const cmp::Report* p = report(r, name);
  REQUIRE(p);
  return p->verdict;
}
bool diagnosed(const diff::Result& r, const std::string& needle) {
  for (const std::string& d : r.diagnoses)
    if (d.find(needle) != std::string::npos) return true;
  return false;
}
Tensor<float> rounded_bf16(Tensor<float> x) {
  for (float& v : x.data) v = round_bf16(v);
  return x;
}

}  // namespace

TEST_CASE("precision: indexer logits — f32 and Hopper FP8 accumulation pass in any order, bf16 logits fail by name") {
  const Set s("sq96 skv2048 hq16 dqk576 dv512 ih64 id128 k512 seed7");
  for (const emul::LogitsVariant& v : emul::logits_family()) {
    CAPTURE(v.name());
    const diff::Result r = s.judge({{"layers.0.indexer.logits", io::make_view("layers.0.indexer.logits", s.logits(v))}});
    CHECK(verdict(r, "indexer.logits") == cmp::Verdict::pass);
    const cmp::Report* p = report(r, "indexer.logits");
    CHECK(p->precision_ran);
    CHECK(p->precision_rms <= prec::kPrecisionRatio * p->precision_contract);
  }
  const Tensor<float> bf = rounded_bf16(s.logits(emul::logits_family()[0]));
  const diff::Result r = s.judge({{"layers.0.indexer.logits", io::make_view("layers.0.indexer.logits", bf)}});
  CHECK(verdict(r, "indexer.logits") == cmp::Verdict::fail);
  CHECK(diagnosed(r, "indexer.logits carries bf16-level error"));
  // Within every per-element bound: only the precision test sees it.
  CHECK(report(r, "indexer.logits")->stats.n_fail == 0);
  // Declared: a bf16 indexer passes its own contract, and the report says so.
  const diff::Result d = s.judge({{"layers.0.indexer.logits", io::make_view("layers.0.indexer.logits", bf)}}, "logits=bf16");
  CHECK(verdict(d, "indexer.logits") == cmp::Verdict::pass);
  CHECK(d.text("").find("precision contract: logits=bf16 (declared)") != std::string::npos);
  CHECK(d.json()["precision_contract"]["logits"] == "bf16");
  // A stricter declared contract: Hopper's 14-bit accumulation is not f32 arithmetic.
  const Tensor<float> mma = s.logits({true, false, 0});
  const diff::Result strict = s.judge({{"layers.0.indexer.logits", io::make_view("layers.0.indexer.logits", mma)}}, "logits=f32");
  CHECK(verdict(strict, "indexer.logits") == cmp::Verdict::fail);
  CHECK(diagnosed(strict, "fp8mma-level error"));
}

TEST_CASE("precision: top-k from bf16 scores fails as low-precision scores, from f32 or 14-bit scores it passes") {
  const Set s("sq96 skv2048 hq16 dqk576 dv512 ih64 id128 k512 seed7");
  auto cand = [&](const Tensor<float>& lg) {
    return std::map<std::string, io::TensorView>{{"layers.0.indexer.logits", io::make_view("layers.0.indexer.logits", lg)},
                                                 {"layers.0.indexer.topk", io::make_view("layers.0.indexer.topk", s.topk_of(lg))}};
  };
  for (const emul::LogitsVariant& v : emul::logits_family()) {
    CAPTURE(v.name());
    CHECK(verdict(s.judge(cand(s.logits(v))), "indexer.topk") == cmp::Verdict::pass);
  }
  const Tensor<float> bf = rounded_bf16(s.logits(emul::logits_family()[0]));
  const diff::Result r = s.judge(cand(bf));
  const cmp::Report* p = report(r, "indexer.topk");
  REQUIRE(p);
  CHECK(p->verdict == cmp::Verdict::fail);
  bool named = false;
  for (const std::string& why : p->reasons) named = named || why.find("top-k from low-precision scores") != std::string::npos;
  CHECK(named);
  // The same rows pass under the declared bf16 contract (the near ties are what bf16 moves).
  CHECK(verdict(s.judge(cand(bf), "logits=bf16"), "indexer.topk") == cmp::Verdict::pass);
  // Without the contract's margin (the pre-precision rule) these rows were accepted as near ties:
  // the candidate's own logits explain them, so only the contract tells them apart.
  cmp::TopkOptions o;
  const Tensor<float> gl = s.t<float>("indexer.logits");
  cmp::FloatRule rule;  // no bound: every deviation is "within"
  o.candidate_logits = &bf;
  o.logits_rule = &rule;
  const cmp::Report loose = cmp::compare_topk("", gl, s.t<int32_t>("indexer.ks"), s.t<int32_t>("indexer.ke"), s.t<int32_t>("indexer.topk"),
                                              s.topk_of(bf), o);
  CHECK(loose.verdict == cmp::Verdict::pass);
}

TEST_CASE("precision: attention — correct kernels pass, bf16 logits, bf16 products and bf16 P.V accumulation fail by name") {
  const Set s("sq64 skv512 hq16 dqk576 dv512 ih32 id128 k128 seed5");
  auto cand = [&](const ref::AttentionOut& o) {
    return std::map<std::string, io::TensorView>{{"layers.0.attn.out", io::make_view("layers.0.attn.out", o.out)},
                                                 {"layers.0.attn.lse", io::make_view("layers.0.attn.lse", o.lse)},
                                                 {"layers.0.attn.max_logits", io::make_view("layers.0.attn.max_logits", o.max_logits)}};
  };
  for (const emul::AttentionVariant& v : emul::attention_family()) {
    CAPTURE(v.name());
    const diff::Result r = s.judge(cand(s.attention(v)));
    CHECK(!r.failed());
    CHECK(report(r, "attn.out")->precision_ran);
  }
  struct Fault {
    const char* cls;
    void (*set)(emul::AttentionVariant&);
    const char* tensor;  // the tensor the class shows in first
  };
  const Fault faults[] = {
      {"bf16-acc", [](emul::AttentionVariant& v) { v.acc_bf16 = true; }, "attn.out"},
      {"bf16-logits", [](emul::AttentionVariant& v) { v.logits_bf16 = true; }, "attn.max_logits"},
      {"bf16-products", [](emul::AttentionVariant& v) { v.products_bf16 = true; }, "attn.max_logits"},
  };
  for (const Fault& f : faults) {
    CAPTURE(f.cls);
    emul::AttentionVariant v = emul::attention_family()[0];
    f.set(v);
    const diff::Result r = s.judge(cand(s.attention(v)));
    CHECK(verdict(r, f.tensor) == cmp::Verdict::fail);
    CHECK(diagnosed(r, std::string(f.tensor) + " carries " + f.cls + "-level error"));
    // No lower attention contract: the bounds and anchors are f32 arithmetic's.
    CHECK_THROWS_WITH_AS(prec::parse_contract(std::string("attn=") + f.cls), doctest::Contains("attn takes f32 alone"), Error);
  }
}

TEST_CASE("precision: --precision is parsed strictly, and an exact copy emulates nothing") {
  CHECK(prec::parse_contract("").text() == "logits=fp8mma (default), attn=f32 (default)");
  const prec::Contract c = prec::parse_contract("logits=bf16,attn=f32");
  CHECK(c.logits == "bf16");
  CHECK(c.attention == "f32");
  CHECK(c.text() == "logits=bf16 (declared), attn=f32 (declared)");
  CHECK_THROWS_WITH_AS(prec::parse_contract("logits=bf8"), doctest::Contains("logits has the classes f32, fp8mma, f16, bf16"), Error);
  CHECK_THROWS_WITH_AS(prec::parse_contract("out=bf16"), doctest::Contains("unknown item 'out=bf16'"), Error);
  // At the f32 floor no class is asked for.
  int asked = 0;
  const prec::ClassValues values = [&](const std::string&) {
    ++asked;
    return std::vector<std::vector<double>>{};
  };
  const std::vector<double> golden = {1.0, -2.0, 3.5, 0.25};
  const prec::Finding f = prec::test("t", golden, golden, prec::Kind::logits, {}, values);
  CHECK(f.ran);
  CHECK(!f.failed);
  CHECK(asked == 0);
  // An error far above the floor asks for the contract's classes and, failing, the coarser ones.
  const std::vector<double> off = {1.01, -2.02, 3.535, 0.2525};
  const prec::Finding g = prec::test("t", golden, off, prec::Kind::logits, {}, values);
  CHECK(g.failed);
  CHECK(asked == 4);  // f32, fp8mma (the contract and finer), then f16, bf16 to name one
  CHECK(g.named.empty());
}

TEST_CASE("precision: a bf16-indexer set (indexer=bf16): f32 kernels in any order pass, bf16 logits fail by name") {
  const Set s("sq64 skv1024 hq16 dqk576 dv512 ih32 id128 k128 seed9 indexer=bf16");
  const Tensor<int32_t> ks = s.t<int32_t>("indexer.ks"), ke = s.t<int32_t>("indexer.ke");
  const int64_t s_q = ks.numel(), s_kv = 1024;
  std::vector<emul::RowCol> elems;
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t k = ks[t]; k < ke[t]; ++k) elems.push_back({t, k});
  const auto logits = [&](const emul::LogitsVariant& v) {
    const std::vector<float> at = emul::logits_at(v, s.t<bf16_t>("indexer.q"), s.t<bf16_t>("indexer.k"), s.t<float>("indexer.k_scale"),
                                                  s.t<float>("indexer.weights"), elems);
    Tensor<float> lg({s_q, s_kv}, -std::numeric_limits<float>::infinity());
    for (size_t i = 0; i < elems.size(); ++i) lg.at(elems[i].first, elems[i].second) = at[i];
    return lg;
  };
  // Every member of the correct-kernel family (f32 in any head order and D blocking, and the 14-bit
  // accumulator of the default contract) within every bound and the precision test: the bound is
  // the FP8 sets' magnitude rule on the bf16 inputs (an error relative to |logit| was not sound
  // where heads cancel).
  for (const emul::LogitsVariant& v : emul::logits_family()) {
    CAPTURE(v.name());
    const diff::Result r = s.judge({{"layers.0.indexer.logits", io::make_view("layers.0.indexer.logits", logits(v))}});
    CHECK(verdict(r, "indexer.logits") == cmp::Verdict::pass);
    CHECK(report(r, "indexer.logits")->stats.n_fail == 0);
    CHECK(report(r, "indexer.logits")->precision_ran);
  }
  const diff::Result r = s.judge(
      {{"layers.0.indexer.logits", io::make_view("layers.0.indexer.logits", rounded_bf16(logits(emul::logits_family()[0])))}});
  CHECK(verdict(r, "indexer.logits") == cmp::Verdict::fail);
  CHECK(diagnosed(r, "indexer.logits carries bf16-level error"));
}
