// Hunyuan HY V4 golden sets (golden --kind hyv4, tools/lib/golden_hyv4.h) and diff on them
// (judge/hyv4.cc): the set against ref::hyv4::run_stack (the specification, run independently here),
// ref = simd byte for byte, the descriptor, the manifest checks (a bad field refused by name), the CLI
// (bad input exits 2 and writes nothing; the checked-in hy-v4-tiny regenerates bit for bit), and the
// judge: the golden's own outputs and legitimate variations pass (another f32 order, slot
// permutations), planted faults fail on the tensor they break and are named.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ref/attention.h"
#include "ref/hyv4/layer.h"
#include "ref/numerics.h"
#include "ref/topk.h"
#include "tests/candidate_util.h"
#include "tests/cli_util.h"
#include "tools/judge/diff.h"
#include "tools/judge/emulate.h"
#include "tools/judge/precision.h"
#include "tools/lib/golden_hyv4.h"

using namespace indexshare;
namespace fs = std::filesystem;
namespace hy = ref::hyv4;

namespace {

using indexshare::testing::file_bytes;
using indexshare::testing::verdict;
using indexshare::testing::diagnosed;
using indexshare::testing::error_of;
std::string tmp(const std::string& tag) { return indexshare::testing::temp_path("hyg", tag); }

const char* kSpec = "sq16 skv16 hq2 dqk40 dv32 ih4 id16 k8 seed71 sm=0.0625 sink=random nl6 sched=hy-v4 rope=8 vd=16";

using HySet = testing::WrittenSet;

HySet write_set(const std::string& spec, Impl impl, const std::string& tag) {
  return testing::written(tmp(tag), golden::build_hyv4(golden::parse_hyv4_spec(spec), "replay", impl));
}

const HySet& tiny_set() {
  static const HySet s = write_set(kSpec, Impl::ref, "set");
  return s;
}

using Cand = indexshare::testing::Candidate;

Tensor<float> widen(const Tensor<bf16_t>& x) {
  Tensor<float> y(x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}

Tensor<int32_t> reshaped(Tensor<int32_t> t, Shape shape) {
  t.shape = std::move(shape);
  return t;
}

std::string L(int l) { return "layers." + std::to_string(l) + "."; }

const char* kFloatOut[] = {"indexer.k_norm", "indexer.q_rope", "indexer.k_rope", "indexer.weights", "indexer.scores",
                           "attn.out",       "attn.lse",       "attn.max_logits", "attn.o_v",       "attn.gated"};

// The golden's own outputs on every layer.
Cand faithful(const golden::Loaded& g) {
  Cand c;
  for (int l = 0; l < 6; ++l) {
    for (const char* n : kFloatOut)
      if (g.find(L(l) + n)) c.set(L(l) + n, g.tensor<float>(L(l) + n));
    for (const char* n : {"indexer.topk", "attn.indices"})
      if (g.find(L(l) + n)) c.set(L(l) + n, g.tensor<int32_t>(L(l) + n));
  }
  return c;
}

diff::Result judge(const Cand& c) { return diff::judge(tiny_set().g, c.file(), {}); }

// The layer's attention recomputed from the set's inputs on `indices` [s_q, k] with `sink`.
hy::AttentionOutputs attention_of(const golden::Loaded& g, int l, const Tensor<int32_t>& indices, const Tensor<float>& sink) {
  const Tensor<float> w_uv = widen(g.tensor<bf16_t>(L(l) + "attn.w_uv"));
  return hy::gated_attention(g.tensor<bf16_t>(L(l) + "attn.q"), g.tensor<bf16_t>(L(l) + "attn.kv"), indices, sink, 0.0625f, 32, &w_uv,
                             widen(g.tensor<bf16_t>(L(l) + "attn.gate")));
}

}  // namespace

TEST_CASE("hyv4 golden: the descriptor parses, prints canonically, defaults to hy-v4 and refuses a bad field by name") {
  const golden::Hyv4Spec s = golden::parse_hyv4_spec(kSpec);
  CHECK(golden::to_string(s) == kSpec);
  CHECK(golden::to_string(golden::parse_hyv4_spec(golden::to_string(s))) == kSpec);
  CHECK(s.cfg.heads == 4);
  CHECK(s.cfg.attn_rope == 8);
  CHECK(s.cfg.kv_lora == 32);
  CHECK(s.cfg.sink);
  // Defaults: sched hy-v4, rope id / 2, vd dv / 2, no sink; all-full stays all-full when printed.
  const golden::Hyv4Spec d = golden::parse_hyv4_spec("sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 nl5");
  CHECK(d.problem.schedule().pattern() == "FFSSS");
  CHECK(d.cfg.rope == 16);
  CHECK(d.cfg.v_dim == 16);
  CHECK(!d.cfg.sink);
  const golden::Hyv4Spec f = golden::parse_hyv4_spec("sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 nl3 sched=all-full");
  CHECK(golden::parse_hyv4_spec(golden::to_string(f)).problem.schedule().pattern() == "FFF");
  const std::pair<const char*, const char*> bad[] = {
      {"sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 rope=15", "hyv4 field 'rope': must be even"},
      {"sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 rope=64", "hyv4 field 'rope': must be even with 2 <= rope <= id = 32"},
      {"sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 rope=8 rope=8", "hyv4 field 'rope': given twice"},
      {"sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 vd=x", "hyv4 field 'vd': 'x' is not a non-negative integer"},
      {"sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 vd=0", "hyv4 field 'vd': must be >= 1"},
      {"sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 nseq2", "hyv4 field 'nseq'"},
      {"sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 indexer=bf16", "hyv4 field 'indexer'"},
      {"sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 sink=pinf", "hyv4 field 'sink': must be none or random"},
      {"sq8 skv8 hq2 dqk48 dv64 ih4 id32 k4", "dv"},
  };
  for (const auto& [text, want] : bad) {
    CAPTURE(text);
    CHECK_MESSAGE(error_of([&] { (void)golden::parse_hyv4_spec(text); }).find(want) != std::string::npos,
                  error_of([&] { (void)golden::parse_hyv4_spec(text); }));
  }
  // A Shared layer before every Full layer has no source.
  CHECK(!error_of([] { (void)golden::parse_hyv4_spec("sq8 skv8 hq2 dqk48 dv32 ih4 id32 k4 nl3 sched=SFF"); }).empty());
}

TEST_CASE("hyv4 golden: the set holds ref::hyv4::run_stack's tensors, Shared layers its source's indices, ref = simd byte for byte") {
  const golden::Loaded& g = tiny_set().g;
  CHECK(g.manifest["kind"] == "hyv4");
  CHECK(g.manifest["schedule"]["pattern"] == "FFSSSF");
  const golden::Hyv4Spec s = golden::parse_hyv4_spec(kSpec);
  const std::vector<hy::LayerOutputs> st = hy::run_stack(s.cfg, schedule_preset("hy-v4", 6));
  for (int l = 0; l < 6; ++l) {
    CAPTURE(l);
    const bool full = l < 2 || l == 5;
    CHECK(g.manifest["layers"][size_t(l)]["kind"] == (full ? "full" : "shared"));
    CHECK((g.find(L(l) + "indexer.scores") != nullptr) == full);
    CHECK(g.tensor<int32_t>(L(l) + "attn.indices").data == st[size_t(l)].indices.data);
    CHECK(g.tensor<float>(L(l) + "attn.gated").data == st[size_t(l)].attn.gated.data);
    if (full) {
      CHECK(g.tensor<float>(L(l) + "indexer.q_rope").data == st[size_t(l)].indexer->q_rope.data);
      CHECK(g.tensor<float>(L(l) + "indexer.scores").data == st[size_t(l)].indexer->scores.data);
      CHECK(g.tensor<int32_t>(L(l) + "indexer.topk").data == st[size_t(l)].indexer->indices.data);
    }
  }
  for (int l : {2, 3, 4}) CHECK(g.tensor<int32_t>(L(l) + "attn.indices").data == g.tensor<int32_t>(L(1) + "attn.indices").data);
  // Early rows see fewer than k keys: -1 padded.
  CHECK(g.tensor<int32_t>(L(0) + "indexer.topk").at(0, 1) == -1);
  // simd writes the same bytes; a second build too.
  const HySet simd = write_set(kSpec, Impl::simd, "simd");
  const HySet again = write_set(kSpec, Impl::ref, "again");
  CHECK(file_bytes(tiny_set().dir + "/tensors.safetensors") == file_bytes(simd.dir + "/tensors.safetensors"));
  CHECK(file_bytes(tiny_set().dir + "/tensors.safetensors") == file_bytes(again.dir + "/tensors.safetensors"));
  // sink=none: no attn.sink, and the attention is the kernel's without one.
  const std::string nosink = std::string(kSpec).replace(std::string(kSpec).find("sink=random"), 11, "sink=none");
  const HySet n = write_set(nosink, Impl::ref, "nosink");
  CHECK(n.g.find(L(0) + "attn.sink") == nullptr);
  Tensor<int32_t> idx = n.g.tensor<int32_t>(L(3) + "attn.indices");
  const ref::AttentionOut a = ref::sparse_attention(n.g.tensor<bf16_t>(L(3) + "attn.q"), n.g.tensor<bf16_t>(L(3) + "attn.kv"), idx, 0.0625f, 32);
  CHECK(n.g.tensor<float>(L(3) + "attn.out").data == a.out.data);
  for (const HySet* h : {&simd, &again, &n}) fs::remove_all(h->dir);
}

TEST_CASE("hyv4 golden: golden::read refuses a bad manifest naming the field") {
  const std::string dir = tmp("bad");
  fs::copy(tiny_set().dir, dir);
  const std::string mpath = dir + "/manifest.json";
  const nlohmann::json original = nlohmann::json::parse(file_bytes(mpath));
  const std::pair<std::function<void(nlohmann::json&)>, std::string> edits[] = {
      {[](nlohmann::json& m) { m["config"]["index_rope"] = 4; }, "field 'config.index_rope' is 4, but the problem gives 8"},
      {[](nlohmann::json& m) { m["config"]["sink"] = false; }, "field 'config.sink'"},
      {[](nlohmann::json& m) { m["problem"] = "sq16 rope=3"; }, "field 'problem' is not a hyv4 descriptor"},
      {[](nlohmann::json& m) { m["layers"][2]["source"] = 0; }, "field 'layers[2].source' is not 1"},
      {[](nlohmann::json& m) { m["layers"][2]["kind"] = "full"; }, "field 'layers[2].kind'"},
      {[](nlohmann::json& m) { m["tensors"][0]["role"] = "output"; }, "has role output, not input"},
      {[](nlohmann::json& m) { m["kind"] = "hyv5"; }, "field 'kind' is 'hyv5', not a known kind"},
  };
  for (const auto& [edit, want] : edits) {
    CAPTURE(want);
    nlohmann::json m = original;
    edit(m);
    std::ofstream(mpath) << m.dump(2);
    CHECK_MESSAGE(error_of([&] { (void)golden::read(dir); }).find(want) != std::string::npos, error_of([&] { (void)golden::read(dir); }));
  }
  fs::remove_all(dir);
}

TEST_CASE("hyv4 diff: the golden's own outputs and legitimate variations pass") {
  const golden::Loaded& g = tiny_set().g;
  Cand c = faithful(g);
  diff::Result r = judge(c);
  CHECK_MESSAGE(!r.failed(), r.text("replay"));
  CHECK(r.tensors.size() >= 50);
  // Slots permuted within each row (sets, not orders); -1 padding stays trailing.
  for (int l = 0; l < 6; ++l) {
    Tensor<int32_t> ix = g.tensor<int32_t>(L(l) + "attn.indices");
    for (int64_t t = 0; t < ix.dim(0); ++t) std::reverse(&ix[t * 8], std::find(&ix[t * 8], &ix[t * 8] + 8, -1));
    c.set(L(l) + "attn.indices", ix);
    if (g.find(L(l) + "indexer.topk")) c.set(L(l) + "indexer.topk", reshaped(ix, {16, 8}));
  }
  // k_norm in plain f32 (E[x^2] - mean^2, keys summed last to first), scores summed in f32 heads last to first.
  bool differs = false;
  for (int l : {0, 1, 5}) {
    const Tensor<float> k = widen(g.tensor<bf16_t>(L(l) + "indexer.k")), w = g.tensor<float>(L(l) + "indexer.k_norm_w"),
                        b = g.tensor<float>(L(l) + "indexer.k_norm_b");
    Tensor<float> kn(k.shape);
    for (int64_t s = 0; s < 16; ++s) {
      float sum = 0, sq = 0;
      for (int64_t d = 15; d >= 0; --d) sum += k.at(s, d), sq += k.at(s, d) * k.at(s, d);
      const float mu = sum / 16.0f, r = 1.0f / std::sqrt(sq / 16.0f - mu * mu + 1e-5f);
      for (int64_t d = 0; d < 16; ++d) kn.at(s, d) = (k.at(s, d) - mu) * r * w[d] + b[d];
    }
    differs = differs || kn.data != g.tensor<float>(L(l) + "indexer.k_norm").data;
    c.set(L(l) + "indexer.k_norm", kn);
    const Tensor<float> q = g.tensor<float>(L(l) + "indexer.q_rope"), kr = g.tensor<float>(L(l) + "indexer.k_rope"),
                        hw = g.tensor<float>(L(l) + "indexer.weights");
    Tensor<float> sc = g.tensor<float>(L(l) + "indexer.scores");
    for (int64_t t = 0; t < 16; ++t)
      for (int64_t s = 0; s <= t; ++s) {
        float acc = 0;
        for (int64_t h = 3; h >= 0; --h) {
          float dot = 0;
          for (int64_t d = 0; d < 16; ++d) dot += q.at(t, h, d) * kr.at(s, d);
          acc += hw.at(t, h) * std::max(dot, 0.0f);
        }
        sc.at(t, s) = acc;
      }
    c.set(L(l) + "indexer.scores", sc);
  }
  CHECK(differs);
  r = judge(c);
  CHECK_MESSAGE(!r.failed(), r.text("replay"));
  double worst = 0;
  for (const auto& t : r.tensors) worst = std::max(worst, t.report.stats.max_ratio);
  MESSAGE("largest err/bound of the f32 variants: " << worst);
  CHECK(worst > 0);
}

TEST_CASE("hyv4 diff: planted faults fail on the tensor they break, each named") {
  const golden::Loaded& g = tiny_set().g;
  const golden::Hyv4Spec s = golden::parse_hyv4_spec(kSpec);
  SUBCASE("the indexer's RoPE on the leading dims") {
    hy::IndexerParams p = hy::indexer_params(s.cfg);
    p.slice = hy::RopeSlice::leading;
    const hy::IndexerOutputs o = hy::run_indexer(widen(g.tensor<bf16_t>(L(0) + "indexer.q")), widen(g.tensor<bf16_t>(L(0) + "indexer.k")),
                                                 g.tensor<float>(L(0) + "indexer.k_norm_w"), g.tensor<float>(L(0) + "indexer.k_norm_b"),
                                                 g.tensor<float>(L(0) + "indexer.weights_raw"), p);
    for (const char* n : {"indexer.q_rope", "indexer.k_rope", "indexer.scores", "indexer.topk"}) {
      CAPTURE(n);
      Cand c;
      const std::string name = L(0) + n;
      if (std::string(n) == "indexer.q_rope") c.set(name, o.q_rope);
      if (std::string(n) == "indexer.k_rope") c.set(name, o.k_rope);
      if (std::string(n) == "indexer.scores") c.set(name, o.scores);
      if (std::string(n) == "indexer.topk") c.set(name, o.indices);
      const diff::Result r = judge(c);
      CHECK(verdict(r, 0, n) == cmp::Verdict::fail);
      CHECK_MESSAGE(diagnosed(r, "layer 0: " + std::string(n) + " match the indexer with its RoPE on the leading 8 dims"), r.text("x"));
    }
  }
  SUBCASE("q.k logits rounded to bf16: named by the precision test; a correct f32 kernel passes, o_v and gated too") {
    const Tensor<bf16_t> q = g.tensor<bf16_t>(L(0) + "attn.q"), kv = g.tensor<bf16_t>(L(0) + "attn.kv");
    Tensor<int32_t> ix = g.tensor<int32_t>(L(0) + "attn.indices");
    ix.shape = {16, 1, ix.numel() / 16};
    const Tensor<float> sink = g.tensor<float>(L(0) + "attn.sink");
    auto cand = [&](const emul::AttentionVariant& v) {
      const ref::AttentionOut o = emul::attention(v, q, kv, ix, 0.0625f, 32, nullptr, &sink);
      Cand c;
      c.set(L(0) + "attn.lse", o.lse);
      c.set(L(0) + "attn.max_logits", o.max_logits);
      // o_v and gated from the kernel's own out: W_uv summed in f32 from the top dim down.
      const Tensor<float> w_uv = widen(g.tensor<bf16_t>(L(0) + "attn.w_uv")), gate = widen(g.tensor<bf16_t>(L(0) + "attn.gate"));
      Tensor<float> o_v(gate.shape), gated(gate.shape);
      for (int64_t t = 0; t < gate.dim(0); ++t)
        for (int64_t h = 0; h < gate.dim(1); ++h)
          for (int64_t i = 0; i < gate.dim(2); ++i) {
            float acc = 0;
            for (int64_t d = 31; d >= 0; --d) acc += w_uv.at(h, i, d) * o.out.at(t, h, d);
            o_v.at(t, h, i) = acc;
            gated.at(t, h, i) = acc / (1.0f + std::exp(-gate.at(t, h, i)));
          }
      c.set(L(0) + "attn.o_v", o_v);
      c.set(L(0) + "attn.gated", gated);
      return c;
    };
    for (const emul::AttentionVariant& v : emul::attention_family()) {
      CAPTURE(v.name());
      const diff::Result r = judge(cand(v));
      CHECK_MESSAGE(!r.failed(), r.text("x"));
      int tested = 0;  // o_v and gated get the precision test too (the classes carried through W_uv)
      for (const auto& t : r.tensors) tested += t.layer == 0 && (t.name == "attn.o_v" || t.name == "attn.gated") && t.report.precision_ran;
      CHECK(tested == 2);
    }
    emul::AttentionVariant x;
    x.logits_bf16 = true;
    const diff::Result r = judge(cand(x));
    CHECK(verdict(r, 0, "attn.lse") == cmp::Verdict::fail);
    CHECK_MESSAGE(diagnosed(r, "layer 0: attn.lse carries bf16-logits-level error"), r.text("x"));
  }
  SUBCASE("the sink scaled by sm_scale") {
    Cand c;
    for (int l : {1, 3}) {
      Tensor<float> sink = g.tensor<float>(L(l) + "attn.sink");
      for (float& x : sink.data) x *= 0.0625f;
      const hy::AttentionOutputs a = attention_of(g, l, reshaped(g.tensor<int32_t>(L(l) + "attn.indices"), {16, 8}), sink);
      c.set(L(l) + (l == 1 ? "attn.out" : "attn.gated"), l == 1 ? a.attn.out : a.gated);
    }
    const diff::Result r = judge(c);
    CHECK(verdict(r, 1, "attn.out") == cmp::Verdict::fail);
    CHECK(verdict(r, 3, "attn.gated") == cmp::Verdict::fail);
    CHECK_MESSAGE(diagnosed(r, "layer 1: the attention matches the sink scaled by sm_scale"), r.text("x"));
    CHECK_MESSAGE(diagnosed(r, "layer 3 (Shared from 1): the attention matches the sink scaled by sm_scale"), r.text("x"));
  }
  SUBCASE("the sink left out") {
    Cand c;
    const hy::AttentionOutputs a = attention_of(g, 5, reshaped(g.tensor<int32_t>(L(5) + "attn.indices"), {16, 8}), Tensor<float>());
    c.set(L(5) + "attn.o_v", a.o_v);
    const diff::Result r = judge(c);
    CHECK(verdict(r, 5, "attn.o_v") == cmp::Verdict::fail);
    CHECK_MESSAGE(diagnosed(r, "layer 5: the attention matches the sink left out"), r.text("x"));
  }
  SUBCASE("the gate left out") {
    Cand c;
    c.set(L(2) + "attn.gated", g.tensor<float>(L(2) + "attn.o_v"));
    const diff::Result r = judge(c);
    CHECK(verdict(r, 2, "attn.gated") == cmp::Verdict::fail);
    CHECK_MESSAGE(diagnosed(r, "layer 2 (Shared from 1): attn.gated is attn.o_v without the output gate"), r.text("x"));
  }
  SUBCASE("a Shared layer off its source: layer 0's top-k in place of layer 1's") {
    const Tensor<int32_t> own0 = g.tensor<int32_t>(L(0) + "indexer.topk");
    REQUIRE(own0.data != g.tensor<int32_t>(L(1) + "indexer.topk").data);
    Cand c;
    c.set(L(3) + "attn.indices", reshaped(own0, {16, 1, 8}));
    c.set(L(4) + "attn.gated", attention_of(g, 4, own0, g.tensor<float>(L(4) + "attn.sink")).gated);
    const diff::Result r = judge(c);
    CHECK(verdict(r, 3, "attn.indices") == cmp::Verdict::fail);
    CHECK(verdict(r, 4, "attn.gated") == cmp::Verdict::fail);
    CHECK_MESSAGE(diagnosed(r, "layer 3 (Shared from 1): attn.indices are layer 0's top-k, not its source layer 1's"), r.text("x"));
    CHECK_MESSAGE(diagnosed(r, "layer 4 (Shared from 1): the attention matches layer 0's top-k, not its source layer 1's"), r.text("x"));
  }
  SUBCASE("a candidate name the set does not hold is bad input") {
    Cand c;
    c.set(L(2) + "indexer.scores", g.tensor<float>(L(1) + "indexer.scores"));
    CHECK(error_of([&] { (void)judge(c); }).find("is a Shared layer (no indexer of its own)") != std::string::npos);
  }
}

TEST_CASE("hyv4 golden: the CLI writes, verifies and judges a set, bad input exits 2 and writes nothing") {
  const std::string dir = tmp("cli");
  auto r = testing::run_cli("golden --kind hyv4 --problem \"" + std::string(kSpec) + "\" --out " + dir);
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK(r.out.find("__REPRO: indexshare golden --kind hyv4 --problem \"" + std::string(kSpec) + "\" --out " + dir) != std::string::npos);
  CHECK(testing::run_cli("verify --golden " + dir).status == 0);
  CHECK(golden::read(dir).manifest["tensors"] == tiny_set().g.manifest["tensors"]);
  const std::string cand = tmp("clicand") + ".safetensors";
  faithful(tiny_set().g).write(cand);
  r = testing::run_cli("diff --golden " + dir + " --candidate " + cand);
  CHECK_MESSAGE(r.status == 0, r.out);
  // explain reads stack sets: a hyv4 set is refused by name, not misread. search needs every
  // layer's indexer: the hy-v4 schedule's Shared layer 2 has none.
  r = testing::run_cli("explain --golden " + dir + " --layer 0 --row 3");
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.out.find("of kind 'hyv4'") != std::string::npos, r.out);
  r = testing::run_cli("search --golden " + dir + " --full-layers 2");
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.out.find("layer 2 has no indexer inputs") != std::string::npos, r.out);
  const std::pair<std::string, std::string> bad[] = {
      {"sq16 skv16 hq2 dqk48 dv32 ih4 id32 k8 nl6 rope=17", "hyv4 field 'rope'"},
      {"sq16 skv16 hq2 dqk48 dv32 ih4 id32 k8 nl3 sched=SFF", "sched"},
      {"sq16 skv16 hq2 dqk48 dv32 ih4 id32 k8 nl3 drift=0.5", "hyv4 field 'drift'"},
  };
  const std::string out = tmp("clibad");
  for (const auto& [spec, want] : bad) {
    CAPTURE(spec);
    r = testing::run_cli("golden --kind hyv4 --problem \"" + spec + "\" --out " + out);
    CHECK(r.status == 2);
    CHECK_MESSAGE(r.out.find(want) != std::string::npos, r.out);
    CHECK(!fs::exists(out));
  }
  r = testing::run_cli("golden --kind hyv4 --problem \"" + std::string(kSpec) + "\" --rows 0-3 --out " + out);
  CHECK(r.status == 2);
  CHECK(!fs::exists(out));
  // The checked-in preset regenerates bit for bit.
  r = testing::run_cli("golden --preset hy-v4-tiny --out " + dir + "-preset");
  REQUIRE_MESSAGE(r.status == 0, r.out);
  const std::string src = std::string(INDEXSHARE_SOURCE_DIR) + "/golden/hy-v4-tiny";
  CHECK(file_bytes(dir + "-preset/tensors.safetensors") == file_bytes(src + "/tensors.safetensors"));
  nlohmann::json want = nlohmann::json::parse(file_bytes(src + "/manifest.json"));
  nlohmann::json got = golden::read(dir + "-preset").manifest;
  CHECK(want["replay"] == "indexshare golden --kind hyv4 --problem \"" + std::string(kSpec) + "\" --out golden/hy-v4-tiny");
  want.erase("replay");
  got.erase("replay");
  CHECK(want == got);
  CHECK(fs::file_size(src + "/tensors.safetensors") < 200 * 1024);
  fs::remove_all(dir);
  fs::remove_all(dir + "-preset");
  fs::remove(cand);
}

TEST_CASE("hyv4: overlap compares the layers' own top-k, search costs a Shared layer its gated output, as computed here") {
  // Every layer Full, so that every layer has its own top-k.
  const std::string spec = "sq16 skv16 hq2 dqk40 dv32 ih4 id16 k8 seed5 sm=0.0625 sink=random nl4 sched=FFFF rope=8 vd=16";
  const HySet set = write_set(spec, Impl::simd, "allfull");
  const golden::Hyv4Spec s = golden::parse_hyv4_spec(spec);
  std::vector<ref::hyv4::LayerInputs> in;
  std::vector<Tensor<int32_t>> own;
  for (int l = 0; l < 4; ++l) {
    in.push_back(ref::hyv4::make_layer_inputs(s.cfg, l, true));
    own.push_back(set.g.tensor<int32_t>(L(l) + "indexer.topk"));
  }
  const std::string json = tmp("ov") + ".json";
  testing::CliResult r = testing::run_cli("overlap --golden " + set.dir + " --json " + json);
  REQUIRE(r.status == 0);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(json));
  // Layers 0 and 1: the mean |A n B| / k over the rows that see more than k = 8 keys.
  double sum = 0;
  int n = 0;
  for (int64_t t = 8; t < 16; ++t, ++n) {
    int common = 0;
    for (int64_t a = 0; a < 8; ++a)
      for (int64_t b = 0; b < 8; ++b) common += own[0].at(t, a) == own[1].at(t, b);
    sum += common / 8.0;
  }
  const auto& p01 = j["adjacent"]["pairs"][0];
  CHECK(p01["a"] == 0);
  CHECK(p01["b"] == 1);
  CHECK(p01["overlap"]["count"].get<int>() == n);
  CHECK(p01["overlap"]["mean"].get<double>() == doctest::Approx(sum / n).epsilon(1e-12));
  // search: step 1's candidate "layer 1 Shared" costs c(1, 0) / 4, layer 1's gated output over
  // layer 0's top-k against its own, ||a - b|| / ||b|| in double.
  r = testing::run_cli("search --golden " + set.dir + " --full-layers 2 --json " + json);
  REQUIRE(r.status == 0);
  j = nlohmann::json::parse(std::ifstream(json));
  auto gated = [&](const Tensor<int32_t>& topk) {
    const ref::hyv4::LayerInputs& x = in[1];
    return ref::hyv4::gated_attention(x.attn_q, x.attn_kv, topk, x.sink, s.cfg.sm_scale, s.cfg.kv_lora, &x.w_uv, x.gate).gated;
  };
  const Tensor<float> a = gated(own[0]), b = gated(own[1]);
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), den += double(b[i]) * b[i];
  bool found = false;
  for (const auto& c : j["steps"][0]["candidates"])
    if (c["layer"] == 1) {
      found = true;
      CHECK(c["loss"].get<double>() * 4 == doctest::Approx(std::sqrt(num / den)).epsilon(1e-9));
    }
  CHECK(found);
  CHECK(j["pattern"].get<std::string>().substr(0, 1) == "F");
}

TEST_CASE("hyv4 diff: the precision test passes f32 scores in other orders and fails f16 / bf16 scores and intermediates, by name") {
  const golden::Loaded& g = tiny_set().g;
  const Tensor<float> q = g.tensor<float>(L(0) + "indexer.q_rope"), k = g.tensor<float>(L(0) + "indexer.k_rope");
  const Tensor<float> w = g.tensor<float>(L(0) + "indexer.weights"), gold = g.tensor<float>(L(0) + "indexer.scores");
  const Tensor<int32_t> ks = g.tensor<int32_t>(L(0) + "indexer.ks"), ke = g.tensor<int32_t>(L(0) + "indexer.ke");
  const int64_t topk = g.tensor<int32_t>(L(0) + "indexer.topk").dim(1);
  // Correct f32 kernels in other orders (judge/emulate.h: heads either way, the dot in blocks), each
  // with the top-k of its own scores: scores [16, 16] = sum_h w[t, h] ReLU(q_rope[t, h] . k_rope[s]).
  bool differs = false;
  for (const emul::LogitsVariant& v : emul::scores_family()) {
    CAPTURE(v.name());
    const Tensor<float> other = emul::scores_f32(v, q, k, w, 1.0f, ks, ke);
    differs = differs || other.data != gold.data;
    Cand c = faithful(g);
    c.set(L(0) + "indexer.scores", other);
    c.set(L(0) + "indexer.topk", ref::topk(other, ks, ke, topk));
    const diff::Result r = judge(c);
    CHECK_MESSAGE(!r.failed(), r.text("replay"));
  }
  CHECK(differs);  // some order changed some bits
  // The scores and every step before them (LayerNorm, RoPE, head weights) rounded to f16 / bf16.
  for (const char* n : {"indexer.scores", "indexer.k_norm", "indexer.q_rope", "indexer.k_rope", "indexer.weights"})
    for (const int bits : {11, 8}) {
      const std::string cls = bits == 11 ? "f16" : "bf16";
      CAPTURE(n);
      CAPTURE(cls);
      Tensor<float> low = g.tensor<float>(L(0) + n);
      for (float& v : low.data) v = float(prec::round_bits(v, bits));
      Cand s = faithful(g);
      s.set(L(0) + n, low);
      diff::Result r = judge(s);
      CHECK_MESSAGE(testing::verdict(r, 0, n) == cmp::Verdict::fail, r.text("replay"));
      CHECK_MESSAGE(testing::diagnosed(r, std::string(n) + " carries " + cls + "-level error"), r.text("replay"));
    }
}

TEST_CASE("hyv4 diff: a top-k from f32 scores in other orders passes, one from f16 / bf16 scores fails by name") {
  // 256 rows of up to 256 keys, top-k 16: rows with near ties that the rounding moves.
  const testing::WrittenSet m = testing::written(
      tmp("topk"), golden::build_hyv4(golden::parse_hyv4_spec("sq256 skv256 hq2 dqk40 dv32 ih4 id16 k16 seed71 sm=0.0625 sink=random "
                                                              "nl2 sched=hy-v4 rope=8 vd=16"), "replay"));
  const Tensor<float> q = m.g.tensor<float>(L(0) + "indexer.q_rope"), k = m.g.tensor<float>(L(0) + "indexer.k_rope");
  const Tensor<float> w = m.g.tensor<float>(L(0) + "indexer.weights");
  const Tensor<int32_t> ks = m.g.tensor<int32_t>(L(0) + "indexer.ks"), ke = m.g.tensor<int32_t>(L(0) + "indexer.ke");
  const auto [f32_moved, low_moved] = testing::check_values_topk(
      {m.g, 0, "indexer.scores", "indexer.topk", [&](const emul::LogitsVariant& v) { return emul::scores_f32(v, q, k, w, 1.0f, ks, ke); },
       [&](const Tensor<float>& s) { return ref::topk(s, ks, ke, 16); }});
  MESSAGE("f32 kernels whose top-k moved: " << f32_moved << "; rounded scores whose top-k moved: " << low_moved);
  CHECK(low_moved >= 1);  // bf16 at least
}
