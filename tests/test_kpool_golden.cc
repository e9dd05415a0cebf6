// GLM-5.3 KPool-DSA golden sets (golden --kind kpool, tools/lib/golden_kpool.h) and diff on them
// (judge/kpool.cc): the set against ref::kpool::run_kpool_stack (the specification, run here), ref and
// simd giving the same bytes, the checked-in kpool-tiny regenerated bit for bit, the manifest checks,
// the descriptor's refusals (also through the CLI: exit 2, nothing written), and the judge: the
// golden's own outputs and legitimate variations pass (tie-free permutations of the lists, pooled
// keys in f32 of another order), planted faults fail and are named.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>

#include <nlohmann/json.hpp>

#include "ref/kpool/layer.h"
#include "ref/numerics.h"
#include "tests/candidate_util.h"
#include "tests/cli_util.h"
#include "tests/simd_targets.h"
#include "tools/judge/diff.h"
#include "tools/judge/emulate.h"
#include "tools/judge/precision.h"
#include "tools/lib/golden_kpool.h"
#include "tools/lib/run_report.h"

using namespace indexshare;
namespace fs = std::filesystem;

namespace {

using indexshare::testing::file_bytes;
using indexshare::testing::verdict;
using indexshare::testing::diagnosed;
using indexshare::testing::error_of;
std::string tmp(const std::string& tag) { return indexshare::testing::temp_path("kpg", tag); }

const char* kSpec = "sq=30 skv=30 h=4 d=16 pool=4 k=16 tail=yes rounding=f32 hq=2 dqk=64 dv=32 nl=12 dsa=glm53 sched=FSF fp8=amax seed=71";

const testing::WrittenSet& tiny_set() {
  static const testing::WrittenSet s = testing::written(tmp("set"), golden::build_kpool(golden::parse_kpool_spec(kSpec), "replay"));
  return s;
}

using Cand = indexshare::testing::Candidate;

// The golden's own outputs on every DSA layer.
Cand faithful(const golden::Loaded& g) {
  Cand c;
  for (int l : {3, 7, 11}) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const char* n : {"indexer.pool_logits", "indexer.pool_keys", "indexer.scores", "attn.out", "attn.lse", "attn.max_logits"})
      if (g.find(p + n)) c.set(p + n, g.tensor<float>(p + n));
    for (const char* n : {"indexer.pools", "indexer.history", "indexer.tail", "indexer.indices", "attn.indices"})
      if (g.find(p + n)) c.set(p + n, g.tensor<int32_t>(p + n));
    if (g.find(p + "indexer.pool_keys_fp8")) c.set(p + "indexer.pool_keys_fp8", g.tensor<uint8_t>(p + "indexer.pool_keys_fp8"));
  }
  return c;
}

// SGLang's page layout written out by hand: pooled key p in page p / 64, slot p % 64; the page is
// [64 x D codes][64 f32 scales]. From codes [n, D] and scales [n].
Tensor<uint8_t> pages_of(const Tensor<e4m3_t>& codes, const Tensor<float>& scale) {
  const int64_t n = codes.dim(0), D = codes.dim(1);
  Tensor<uint8_t> out({(n + 63) / 64, 64 * (D + 4)}, 0);
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t d = 0; d < D; ++d) out[(p / 64) * 64 * (D + 4) + (p % 64) * D + d] = codes.at(p, d).bits;
    uint32_t bits;
    std::memcpy(&bits, &scale[p], 4);
    for (int b = 0; b < 4; ++b) out[(p / 64) * 64 * (D + 4) + 64 * D + 4 * (p % 64) + b] = uint8_t(bits >> (8 * b));
  }
  return out;
}

diff::Result judge(const Cand& c) { return diff::judge(tiny_set().g, c.file(), {}); }
std::string report(const diff::Result& r) { return r.text("replay"); }

// Row t's tail, written out by hand: (pos + 1) mod 4 tokens ending at pos = t (s_q = s_kv).
std::vector<int32_t> tail_of(int64_t t) {
  std::vector<int32_t> out;
  for (int64_t i = t - (t + 1) % 4 + 1; i <= t; ++i) out.push_back(int32_t(i));
  return out;
}

}  // namespace

TEST_CASE("kpool golden: the descriptor parses, prints canonically and refuses a bad field by name") {
  const golden::KpoolSpec s = golden::parse_kpool_spec("nl=8 sq=8 skv=32 h=2 d=8 pool=4 k=8");
  CHECK(golden::to_string(s) == "sq=8 skv=32 h=2 d=8 pool=4 k=8 tail=yes rounding=f32 hq=2 dqk=512 dv=512 nl=8 dsa=glm53 sched=FF seed=1");
  CHECK(s.dsa_layers() == std::vector<int>{3, 7});
  CHECK(golden::to_string(golden::parse_kpool_spec(kSpec)) == kSpec);
  CHECK(golden::parse_kpool_spec("sq=4 skv=8 h=1 d=4 pool=2 k=4 nl=3 dsa=all sched=FSS").dsa_layers() == std::vector<int>{0, 1, 2});
  const std::pair<const char*, const char*> bad[] = {
      {"sq=8 skv=32 h=2 d=8 pool=4 k=10 nl=8", "field 'k': must be a multiple of pool = 4"},
      {"sq=8 skv=32 h=2 d=8 pool=0 k=8 nl=8", "field 'pool': must be >= 1"},
      {"sq=8 skv=32 h=2 d=8 pool=4 k=8 nl=8 sched=SF", "field 'sched': the first DSA layer (model layer 3) is Shared"},
      {"sq=8 skv=32 h=2 d=8 pool=4 k=8 nl=8 sched=FSF", "field 'sched': 'FSF' has 3 entries for the 2 DSA layers"},
      {"sq=8 skv=32 h=2 d=8 pool=4 k=8 nl=3", "field 'nl': nl=3 with dsa=glm53 holds no DSA layer"},
      {"sq=8 skv=32 h=2 d=8 pool=4 k=8 nl=8 rounding=bf16", "field 'rounding': must be f32"},
      {"sq=8 skv=32 h=2 d=8 pool=4 k=8 nl=8 tail=maybe", "field 'tail'"},
      {"sq=40 skv=32 h=2 d=8 pool=4 k=8 nl=8", "field 'sq': must be <= skv"},
      {"sq=8 skv=32 h=2 d=8 pool=4 nl=8", "field 'k': is missing"},
      {"sq=8 skv=32 h=2 d=8 pool=4 k=8 nl=8 P=4", "field 'P': unknown key"},
      {"sq=8 skv=32 h=2 d=8 pool=4 k=8 nl=8 dv=600", "field 'dv': must be <= dqk"},
      {"sq=8 skv=32 h=2 d=12 pool=4 k=8 nl=8 fp8=amax", "field 'fp8': SGLang's FP8 pages rotate the pooled keys by a Hadamard"},
      {"sq=8 skv=32 h=2 d=8 pool=4 k=8 nl=8 fp8=e5m2", "field 'fp8': must be none, amax or pow2"},
      {"sq=8 skv=36 h=2 d=8 pool=6 k=12 nl=8 fp8=amax", "field 'pool': SGLang's pooled-key pages sit in its token pages of 64"},
  };
  for (const auto& [text, want] : bad) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(golden::parse_kpool_spec(text), doctest::Contains(want), Error);
  }
}

TEST_CASE("kpool golden: the set holds ref::kpool::run_kpool_stack's tensors, and ref and simd write the same bytes") {
  const golden::Loaded& g = tiny_set().g;
  const golden::KpoolSpec s = golden::parse_kpool_spec(kSpec);
  const std::vector<ref::kpool::KpoolLayerOutputs> stack =
      ref::kpool::run_kpool_stack(s.cfg, {s.dsa(), schedule_from_pattern("FSF")});
  REQUIRE(stack.size() == 3);
  for (const ref::kpool::KpoolLayerOutputs& o : stack) {
    const std::string p = "layers." + std::to_string(o.model_layer) + ".";
    CAPTURE(p);
    CHECK(g.tensor<float>(p + "attn.out").data == o.attn.out.data);
    CHECK(g.tensor<float>(p + "attn.lse").data == o.attn.lse.data);
    CHECK(g.tensor<int32_t>(p + "attn.indices").data == o.indices.data);
    CHECK(g.tensor<int32_t>(p + "attn.indices").shape == Shape{30, 1, 19});
    if (!o.indexer) continue;
    CHECK(g.tensor<float>(p + "indexer.pool_keys").data == o.indexer->kbar.data);
    CHECK(g.tensor<float>(p + "indexer.scores").data == o.indexer->scores.data);
    CHECK(g.tensor<int32_t>(p + "indexer.pools").data == o.indexer->sel.pools.data);
    CHECK(g.tensor<int32_t>(p + "indexer.indices").data == o.indexer->sel.indices.data);
  }
  // The Shared layer 7 attends over layer 3's list; layer 7 holds no indexer tensors.
  CHECK(g.tensor<int32_t>("layers.7.attn.indices").data == g.tensor<int32_t>("layers.3.indexer.indices").data);
  CHECK(g.find("layers.7.indexer.pools") == nullptr);
  CHECK(g.manifest["layers"][1] == nlohmann::json{{"index", 7}, {"dsa_rank", 1}, {"kind", "shared"}, {"source", 3}});
  // The rows the preset is for: rows 0-14 see fewer than select_k = 4 complete pools (-1 padded),
  // later rows choose 4 of 4-7; every 4th row's tail is empty.
  const Tensor<int32_t> pools = g.tensor<int32_t>("layers.3.indexer.pools"), tail = g.tensor<int32_t>("layers.3.indexer.tail");
  CHECK(pools.shape == Shape{30, 4});
  CHECK(pools.at(14, 3) == -1);
  CHECK(pools.at(14, 2) >= 0);
  CHECK(pools.at(15, 3) >= 0);
  for (int64_t t = 0; t < 30; ++t) {
    const std::vector<int32_t> want = tail_of(t);
    for (int64_t i = 0; i < 3; ++i) CHECK(tail.at(t, i) == (i < int64_t(want.size()) ? want[size_t(i)] : -1));
  }
  // SGLang's FP8 pages of the pooled keys: ref::kpool::sglang_pooled_fp8's codes and scales in its layout.
  for (int l : {3, 11}) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const ref::kpool::PooledFp8 f = ref::kpool::sglang_pooled_fp8(g.tensor<float>(p + "indexer.pool_keys"), false);
    const Tensor<uint8_t> pages = g.tensor<uint8_t>(p + "indexer.pool_keys_fp8");
    CHECK(pages.shape == Shape{1, 64 * 20});
    CHECK(pages.data == pages_of(f.codes, f.scale).data);
    for (int64_t q = 0; q < 7; ++q) {  // the scale rule: max(amax, 1e-4) / 448 of the rotated key
      float amax = 0;
      for (int64_t d = 0; d < 16; ++d) amax = std::max(amax, std::fabs(f.rotated.at(q, d)));
      CHECK(f.scale[q] == std::max(amax, 1e-4f) / 448.0f);
    }
  }
  // ref and simd: the same bytes, on every target with 1 and 2 threads.
  const golden::GoldenSet a = golden::build_kpool(s, "r", Impl::ref);
  simd_test::for_each_target([&](const std::string&, int) {
    const golden::GoldenSet b = golden::build_kpool(s, "r", Impl::simd);
    REQUIRE(a.tensors.size() == b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      CAPTURE(a.tensors[i].name);
      CHECK(a.tensors[i].bytes == b.tensors[i].bytes);
    }
  });
}

TEST_CASE("kpool golden: a prefill chunk without the tail, hf-bf16 pooled keys and every layer DSA: read back, judged") {
  const golden::KpoolSpec s = golden::parse_kpool_spec("sq=8 skv=37 h=2 d=8 pool=4 k=8 tail=no rounding=hf-bf16 hq=2 dqk=32 dv=16 "
                                                       "nl=3 dsa=all sched=FSF seed=5");
  const std::string dir = tmp("chunk");
  golden::write(dir, golden::build_kpool(s, "r", Impl::simd), false);
  const golden::Loaded g = golden::read(dir);
  CHECK(g.find("layers.0.indexer.tail") == nullptr);
  CHECK(g.tensor<int32_t>("layers.2.attn.indices").shape == Shape{8, 1, 8});  // width k without the tail
  const Tensor<float> kbar = g.tensor<float>("layers.0.indexer.pool_keys");
  CHECK(kbar.shape == Shape{9, 8});
  for (float x : kbar.data) CHECK(x == float(round_bf16(x)));  // hf-bf16: bf16 values
  const Tensor<int32_t> ke = g.tensor<int32_t>("layers.0.indexer.ke");
  for (int64_t t = 0; t < 8; ++t) CHECK(ke[t] == std::min<int64_t>((37 - 8 + t + 1) / 4, 9));  // row t at position 29 + t
  Cand c;
  for (int l : {0, 1, 2}) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const char* n : {"indexer.pool_keys", "indexer.scores", "attn.out", "attn.lse"})
      if (g.find(p + n)) c.set(p + n, g.tensor<float>(p + n));
    for (const char* n : {"indexer.pools", "indexer.indices", "attn.indices"})
      if (g.find(p + n)) c.set(p + n, g.tensor<int32_t>(p + n));
  }
  const diff::Result r = diff::judge(g, c.file(), {});
  CHECK_MESSAGE(!r.failed(), report(r));
  CHECK(r.tensors.size() == 2 * 7 + 3);
  fs::remove_all(dir);
}

TEST_CASE("kpool golden: golden::read refuses a bad manifest naming the field") {
  const std::string src = tiny_set().dir;
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    const std::string dir = tmp("bad");
    fs::create_directories(dir);
    fs::copy(src + "/tensors.safetensors", dir + "/tensors.safetensors");
    nlohmann::json m = nlohmann::json::parse(file_bytes(src + "/manifest.json"));
    edit(m);
    std::ofstream(dir + "/manifest.json") << m.dump(1);
    const std::string e = error_of([&] { (void)golden::read(dir); });
    fs::remove_all(dir);
    return e;
  };
  CHECK(with([](nlohmann::json&) {}).empty());
  CHECK(with([](nlohmann::json& m) { m["config"]["heads"] = 3; }).find("'tensors'") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["config"]["pool"] = "4"; }).find("config.pool") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["config"]["index_topk"] = 18; }).find("config.index_topk") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["config"]["select_k"] = 7; }).find("config.select_k") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["config"]["rounding"] = "bf16"; }).find("config.rounding") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["layers"][1]["source"] = 11; }).find("layers[1].source") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["layers"][0]["kind"] = "shared"; }).find("layers[0].kind") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["layers"][2]["index"] = 10; }).find("layers[2].index") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["layers"][2]["dsa_rank"] = 1; }).find("layers[2].dsa_rank") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["config"]["fp8"] = "e5m2"; }).find("config.fp8") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["config"]["fp8"] = "none"; }).find("indexer.pool_keys_fp8', which a kpool set of this config does not hold") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["schedule"]["pattern"] = "FFF"; }).find("'schedule'") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["conventions"].erase("tail"); }).find("conventions.tail") != std::string::npos);
  CHECK(with([](nlohmann::json& m) {
          for (auto& t : m["tensors"]) if (t["name"] == "layers.3.indexer.scores") t["role"] = "input";
        }).find("layers.3.indexer.scores") != std::string::npos);
}

TEST_CASE("kpool diff: the golden's own outputs and legitimate variations pass") {
  const golden::Loaded& g = tiny_set().g;
  Cand c = faithful(g);
  diff::Result r = judge(c);
  CHECK_MESSAGE(!r.failed(), report(r));
  CHECK(r.tensors.size() == 2 * 12 + 4);
  // Every list's valid slots reversed (sets, not orders), the tail moved to the front (SGLang's
  // placement differs from transformers'), the pools reversed (a top-k as a set).
  for (int l : {3, 7, 11}) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const char* n : {"indexer.indices", "attn.indices", "indexer.history", "indexer.pools"}) {
      if (!g.find(p + n)) continue;
      Tensor<int32_t> x = g.tensor<int32_t>(p + n);
      const int64_t w = x.numel() / 30;
      for (int64_t t = 0; t < 30; ++t) std::reverse(&x[t * w], std::find(&x[t * w], &x[t * w] + w, -1));
      c.set(p + n, x);
    }
  }
  // Pooled keys in plain f32 arithmetic of another order (floats, slots last to first).
  const Tensor<float> k = g.tensor<float>("layers.11.indexer.k"), z = g.tensor<float>("layers.11.indexer.pool_logits");
  Tensor<float> kbar({7, 16});
  for (int64_t p = 0; p < 7; ++p)
    for (int64_t d = 0; d < 16; ++d) {
      float m = -INFINITY, den = 0, acc = 0;
      for (int64_t j = 3; j >= 0; --j) m = std::max(m, z.at(p, j, d));
      for (int64_t j = 3; j >= 0; --j) den += std::exp(z.at(p, j, d) - m);
      for (int64_t j = 3; j >= 0; --j) acc += std::exp(z.at(p, j, d) - m) / den * k.at(p * 4 + j, d);
      kbar.at(p, d) = acc;
    }
  CHECK(kbar.data != g.tensor<float>("layers.11.indexer.pool_keys").data);
  c.set("layers.11.indexer.pool_keys", kbar);
  // SGLang's cache of keys half a bf16 ulp off (a bf16 rounding may flip in any channel): other bytes, a pass.
  Tensor<float> nudged = kbar;
  for (float& x : nudged.data) x *= 1.0f + 0x1p-9f;
  const ref::kpool::PooledFp8 f = ref::kpool::sglang_pooled_fp8(nudged, false);
  CHECK(pages_of(f.codes, f.scale).data != g.tensor<uint8_t>("layers.11.indexer.pool_keys_fp8").data);
  c.set("layers.11.indexer.pool_keys_fp8", pages_of(f.codes, f.scale));
  r = judge(c);
  CHECK_MESSAGE(!r.failed(), report(r));
  double worst = 0, fp8 = 0;
  for (const auto& t : r.tensors) {
    if (t.layer == 11 && t.name == "indexer.pool_keys") worst = t.report.stats.max_ratio;
    if (t.layer == 11 && t.name == "indexer.pool_keys_fp8") fp8 = t.report.stats.max_ratio;
  }
  MESSAGE("largest err/bound of the f32 pooled keys in another order: " << worst << "; of the nudged keys' FP8 pages: " << fp8);
  CHECK(fp8 > 0);
  CHECK(worst > 0);
}

TEST_CASE("kpool diff: a selection that differs by exact ties passes in the pools, the lists and the attention") {
  // One indexer head: a pool scores exactly 0 (ReLU) half the time, so rows tie at the select_k-th score.
  const golden::KpoolSpec s = golden::parse_kpool_spec("sq=32 skv=32 h=1 d=8 pool=4 k=8 hq=2 dqk=32 dv=16 nl=4 seed=3");
  const std::string dir = tmp("ties");
  golden::write(dir, golden::build_kpool(s, "r"), false);
  const golden::Loaded g = golden::read(dir);
  const Tensor<float> sc = g.tensor<float>("layers.3.indexer.scores");
  Tensor<int32_t> pools = g.tensor<int32_t>("layers.3.indexer.pools"), list = g.tensor<int32_t>("layers.3.indexer.indices");
  const Tensor<int32_t> ke = g.tensor<int32_t>("layers.3.indexer.ke");
  int swapped = 0;
  for (int64_t t = 0; t < 32; ++t) {
    if (pools.at(t, 1) < 0) continue;
    for (int32_t q = 0; q < ke[t]; ++q)  // an unselected visible pool tied with the second one: take it instead
      if (q != pools.at(t, 0) && q != pools.at(t, 1) && sc.at(t, q) == sc.at(t, pools.at(t, 1))) {
        pools.at(t, 1) = q;
        for (int64_t j = 0; j < 4; ++j) list.at(t, 4 + j) = q * 4 + int32_t(j);
        ++swapped;
        break;
      }
  }
  REQUIRE(swapped >= 3);
  Tensor<int32_t> attn = list;
  attn.shape = {32, 1, 11};
  Cand c;
  c.set("layers.3.indexer.pools", pools);
  c.set("layers.3.indexer.indices", list);
  c.set("layers.3.attn.indices", attn);
  c.set("layers.3.attn.out", ref::sparse_attention(g.tensor<bf16_t>("layers.3.attn.q"), g.tensor<bf16_t>("layers.3.attn.kv"), attn,
                                                   s.cfg.sm_scale, 16, nullptr, nullptr).out);
  CHECK(c.t.at("layers.3.attn.out").bytes != g.get("layers.3.attn.out").bytes);
  diff::Result r = diff::judge(g, c.file(), {});
  CHECK_MESSAGE(!r.failed(), report(r));
  c.t.erase("layers.3.indexer.pools");  // the lists alone: their pools are judged by the tie rule too
  r = diff::judge(g, c.file(), {});
  CHECK_MESSAGE(!r.failed(), report(r));
  fs::remove_all(dir);
}

TEST_CASE("kpool diff: planted faults fail on the tensor they break and are named") {
  const golden::Loaded& g = tiny_set().g;
  const golden::KpoolSpec s = golden::parse_kpool_spec(kSpec);
  auto fails = [&](const Cand& c, int layer, const std::string& name, const std::string& diagnosis, const std::string& not_this = "") {
    const diff::Result r = judge(c);
    CHECK(r.failed());
    CHECK_MESSAGE(verdict(r, layer, name) == cmp::Verdict::fail, report(r));
    CHECK_MESSAGE(diagnosed(r, diagnosis), report(r));
    if (!not_this.empty()) CHECK_MESSAGE(!diagnosed(r, not_this), report(r));
  };
  // Pooling by max / mean, written out here; the scores and pools from them by ref::kpool.
  const Tensor<float> k = g.tensor<float>("layers.3.indexer.k");
  for (const bool max : {true, false}) {
    CAPTURE(max);
    Tensor<float> kbar({7, 16});
    for (int64_t p = 0; p < 7; ++p)
      for (int64_t d = 0; d < 16; ++d) {
        const float a = k.at(4 * p, d), b = k.at(4 * p + 1, d), c = k.at(4 * p + 2, d), e = k.at(4 * p + 3, d);
        kbar.at(p, d) = max ? std::max(std::max(a, b), std::max(c, e)) : float((double(a) + b + c + e) / 4);
      }
    const Tensor<float> scores = ref::kpool::pool_scores(g.tensor<float>("layers.3.indexer.q"), kbar,
                                                         g.tensor<float>("layers.3.indexer.weights"), 30, 4);
    const ref::kpool::Selection sel = ref::kpool::select_tokens(scores, 30, 4, 16, true);
    REQUIRE(sel.pools.data != g.tensor<int32_t>("layers.3.indexer.pools").data);
    const std::string name = max ? "pools scored with max" : "pools scored with mean";
    const std::string other = max ? "pools scored with mean" : "pools scored with max";
    Cand a, b, c;
    a.set("layers.3.indexer.pool_keys", kbar);
    fails(a, 3, "indexer.pool_keys", name, other);
    b.set("layers.3.indexer.scores", scores);
    fails(b, 3, "indexer.scores", name, other);
    c.set("layers.3.indexer.pools", sel.pools);
    fails(c, 3, "indexer.pools", name);
  }
  SUBCASE("the attention's q.k logits rounded to bf16: named by the precision test; correct f32 kernels pass") {
    const Tensor<bf16_t> q = g.tensor<bf16_t>("layers.3.attn.q"), kv = g.tensor<bf16_t>("layers.3.attn.kv");
    const Tensor<int32_t> ix = g.tensor<int32_t>("layers.3.attn.indices");
    auto cand = [&](const emul::AttentionVariant& v) {
      const ref::AttentionOut o = emul::attention(v, q, kv, ix, s.cfg.sm_scale, 32);
      Cand c;
      c.set("layers.3.attn.out", o.out);
      c.set("layers.3.attn.lse", o.lse);
      c.set("layers.3.attn.max_logits", o.max_logits);
      return c;
    };
    for (const emul::AttentionVariant& v : emul::attention_family()) {
      CAPTURE(v.name());
      const diff::Result r = judge(cand(v));
      CHECK_MESSAGE(!r.failed(), report(r));
    }
    emul::AttentionVariant x;
    x.logits_bf16 = true;
    fails(cand(x), 3, "attn.max_logits", "attn.max_logits carries bf16-logits-level error");
  }
  SUBCASE("the tail left out / doubled") {
    for (const int tails : {0, 2}) {
      CAPTURE(tails);
      Tensor<int32_t> list = g.tensor<int32_t>("layers.11.indexer.indices");
      for (int64_t t = 0; t < 30; ++t) {
        int32_t* row = &list[t * 19];
        const std::vector<int32_t> tail = tail_of(t);
        int32_t* end = std::find(row, row + 19, -1);
        if (tails == 0) {
          for (int32_t v : tail) *std::find(row, row + 19, v) = -1;
        } else if (end + tail.size() <= row + 19) {
          std::copy(tail.begin(), tail.end(), end);
        }
      }
      Tensor<int32_t> attn = list;
      attn.shape = {30, 1, 19};
      const ref::AttentionOut o = ref::sparse_attention(g.tensor<bf16_t>("layers.11.attn.q"), g.tensor<bf16_t>("layers.11.attn.kv"),
                                                        attn, s.cfg.sm_scale, 32, nullptr, nullptr);
      Cand c;
      c.set("layers.11.indexer.indices", list);
      c.set("layers.11.attn.out", o.out);
      const std::string name = tails ? "the tail doubled" : "the tail left out";
      fails(c, 11, "indexer.indices", name);
      fails(c, 11, "attn.out", tails ? "the attention with the tail doubled" : "the attention without the tail");
    }
  }
  SUBCASE("a Shared layer off its source's list") {
    Cand c;
    const Tensor<int32_t> wrong = g.tensor<int32_t>("layers.11.attn.indices");
    c.set("layers.7.attn.indices", wrong);
    c.set("layers.7.attn.out", ref::sparse_attention(g.tensor<bf16_t>("layers.7.attn.q"), g.tensor<bf16_t>("layers.7.attn.kv"), wrong,
                                                     s.cfg.sm_scale, 32, nullptr, nullptr).out);
    fails(c, 7, "attn.indices", "a Shared layer off its source's list: it holds layer 11's list");
    fails(c, 7, "attn.out", "attn.out is the attention over layer 11's list");
  }
  SUBCASE("FP8 pages without the Hadamard rotation, and two keys' scales swapped") {
    const Tensor<float> kbar = g.tensor<float>("layers.3.indexer.pool_keys");
    Tensor<e4m3_t> codes({7, 16});
    Tensor<float> scale({7});
    for (int64_t p = 0; p < 7; ++p) {
      float amax = 0;
      for (int64_t d = 0; d < 16; ++d) amax = std::max(amax, std::fabs(round_bf16(kbar.at(p, d))));
      scale[p] = std::max(amax, 1e-4f) / 448.0f;
      for (int64_t d = 0; d < 16; ++d) codes.at(p, d) = f32_to_e4m3(round_bf16(kbar.at(p, d)) / scale[p]);
    }
    Cand a;
    a.set("layers.3.indexer.pool_keys_fp8", pages_of(codes, scale));
    CHECK(verdict(judge(a), 3, "indexer.pool_keys_fp8") == cmp::Verdict::fail);
    Tensor<uint8_t> pages = g.tensor<uint8_t>("layers.3.indexer.pool_keys_fp8");
    for (int b = 0; b < 4; ++b) std::swap(pages[64 * 16 + b], pages[64 * 16 + 4 + b]);
    Cand b;
    b.set("layers.3.indexer.pool_keys_fp8", pages);
    CHECK(verdict(judge(b), 3, "indexer.pool_keys_fp8") == cmp::Verdict::fail);
  }
  SUBCASE("a tail in the wrong columns' order and a pool's token missing") {
    Cand c;
    Tensor<int32_t> tail = g.tensor<int32_t>("layers.3.indexer.tail");
    std::swap(tail.at(29, 0), tail.at(29, 1));  // row 29: tokens 28, 29 -> 29, 28
    c.set("layers.3.indexer.tail", tail);
    Tensor<int32_t> hist = g.tensor<int32_t>("layers.3.indexer.history");
    hist.at(20, 1) = -1;
    c.set("layers.3.indexer.history", hist);
    const diff::Result r = judge(c);
    CHECK(verdict(r, 3, "indexer.tail") == cmp::Verdict::fail);
    CHECK(verdict(r, 3, "indexer.history") == cmp::Verdict::fail);
  }
}

TEST_CASE("kpool golden: the CLI writes kpool-tiny as checked in, judges it, and refuses bad input (exit 2, nothing written)") {
  const std::string dir = tmp("cli");
  auto r = testing::run_cli("golden --preset kpool-tiny --out " + dir);
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK(testing::run_cli("verify --golden " + dir).status == 0);
  const std::string src = std::string(INDEXSHARE_SOURCE_DIR) + "/golden/kpool-tiny";
  CHECK(file_bytes(dir + "/tensors.safetensors") == file_bytes(src + "/tensors.safetensors"));
  nlohmann::json want = nlohmann::json::parse(file_bytes(src + "/manifest.json")), got = golden::read(dir).manifest;
  CHECK(want["replay"] == "indexshare golden --kind kpool --problem \"" + std::string(kSpec) + "\" --out golden/kpool-tiny");
  want.erase("replay");
  got.erase("replay");
  CHECK(want == got);
  CHECK(got["tensors"] == tiny_set().g.manifest["tensors"]);  // the builder's bytes
  // --impl simd replays the same bytes.
  r = testing::run_cli("golden --kind kpool --problem \"" + std::string(kSpec) + "\" --impl simd --out " + dir + "-simd");
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK(file_bytes(dir + "-simd/tensors.safetensors") == file_bytes(src + "/tensors.safetensors"));
  const std::string cand = tmp("cand") + ".safetensors";
  faithful(tiny_set().g).write(cand);
  r = testing::run_cli("diff --golden " + dir + " --candidate " + cand);
  CHECK_MESSAGE(r.status == 0, r.out);
  const std::string bad = tmp("clibad");
  const std::pair<const char*, const char*> cases[] = {
      {"sq=8 skv=32 h=2 d=8 pool=4 k=10 nl=8", "kpool spec field 'k': must be a multiple of pool = 4"},
      {"sq=8 skv=32 h=2 d=8 pool=4 k=8 nl=8 sched=SF", "kpool spec field 'sched': the first DSA layer (model layer 3) is Shared"},
      {"sq=8 skv=32 h=2 d=8 pool=0 k=8 nl=8", "kpool spec field 'pool': must be >= 1, got 0"}};
  for (const auto& [spec, msg] : cases) {
    r = testing::run_cli("golden --kind kpool --problem \"" + std::string(spec) + "\" --out " + bad);
    CHECK(r.status == 2);
    CHECK_MESSAGE(r.out.find(msg) != std::string::npos, r.out);
    CHECK(!fs::exists(bad));
  }
  // explain reads token indexers, search does not search pools yet: a kpool set is refused by name.
  r = testing::run_cli("explain --golden " + src + " --layer 3 --row 5");
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.out.find("is a kpool set") != std::string::npos, r.out);
  // search needs every DSA layer's own indexer: kpool-tiny's Shared layer 7 has none.
  r = testing::run_cli("search --golden " + src + " --full-layers 1");
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.out.find("DSA layer 7 has no indexer inputs") != std::string::npos, r.out);
  r = testing::run_cli("golden --kind kpool --problem \"" + std::string(kSpec) + "\" --rows 0-3 --out " + bad);
  CHECK(r.status == 2);
  CHECK(!fs::exists(bad));
  fs::remove_all(dir);
  fs::remove_all(dir + "-simd");
  fs::remove(cand);
}

TEST_CASE("kpool: run on a kpool descriptor prints golden's attn.out fingerprints, ref and simd alike") {
  const std::string spec = "sq=30 skv=30 h=4 d=16 pool=4 k=16 hq=2 dqk=64 dv=32 nl=12 dsa=glm53 sched=FSF seed=5";
  const testing::CliResult simd = testing::run_cli("run --problem '" + spec + "'");
  const testing::CliResult ref = testing::run_cli("run --impl ref --problem '" + spec + "'");
  REQUIRE(simd.status == 0);
  REQUIRE(ref.status == 0);
  CHECK(simd.out.find("layer   7 DSA S source   3") != std::string::npos);
  // The fingerprint of every DSA layer: golden's attn.out, folded as run folds it.
  const golden::GoldenSet g = golden::build_kpool(golden::parse_kpool_spec(spec), "test", Impl::ref);
  for (int l : {3, 7, 11}) {
    const std::string fp = testing::fingerprint_text(g, "layers." + std::to_string(l) + ".attn.out");
    REQUIRE(!fp.empty());
    CAPTURE(l);
    CHECK(simd.out.find(fp) != std::string::npos);
    CHECK(ref.out.find(fp) != std::string::npos);
  }
  // A schedule starting with S, and options the descriptor sets itself: exit 2, by name.
  testing::CliResult bad = testing::run_cli("run --problem '" + spec.substr(0, spec.find("sched")) + "sched=SFF'");
  CHECK(bad.status == 2);
  CHECK_MESSAGE(bad.out.find("sched") != std::string::npos, bad.out);
  bad = testing::run_cli("run --schedule FSF --problem '" + spec + "'");
  CHECK(bad.status == 2);
  CHECK(bad.out.find("--schedule applies to kernel-level (DSA) stacks only") != std::string::npos);
}

TEST_CASE("kpool: overlap compares the DSA layers' own pools (sets, descriptors), as counted here by hand") {
  const std::string spec = "sq=64 skv=256 h=4 d=32 pool=4 k=32 nl=12 sched=FSF seed=9";
  const std::string json = testing::temp_path("kpool-overlap", "json");
  const testing::CliResult r = testing::run_cli("overlap --problem '" + spec + "' --json " + json);
  REQUIRE(r.status == 0);
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  CHECK(j["dsa_layers"] == std::vector<int>{3, 7, 11});
  // Every DSA layer's own pools (a descriptor generates each layer's indexer inputs), the mean
  // |A n B| / select_k of layers 3 and 7 over the rows that see more than select_k pools.
  const golden::KpoolSpec s = golden::parse_kpool_spec(spec);
  auto pools = [&](int l) { return ref::kpool::run_kpool_indexer(s.cfg, ref::kpool::make_kpool_layer_inputs(s.cfg, l, true)).sel.pools; };
  const Tensor<int32_t> a = pools(3), b = pools(7), ke = ref::kpool::visible_pools(64, 256, 4);
  double sum = 0;
  int n = 0;
  for (int64_t t = 0; t < 64; ++t) {
    if (ke[t] <= 8) continue;
    int common = 0;
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t m = 0; m < 8; ++m) common += a.at(t, i) == b.at(t, m) && a.at(t, i) >= 0;
    sum += common / 8.0;
    ++n;
  }
  REQUIRE(n > 0);
  bool found = false;
  for (const auto& p : j["adjacent"]["pairs"])
    if (p["a"] == 0 && p["b"] == 1) {
      found = true;
      CHECK(p["overlap"]["count"].get<int>() == n);
      CHECK(p["overlap"]["mean"].get<double>() == doctest::Approx(sum / n).epsilon(1e-12));
    }
  CHECK_MESSAGE(found, j["adjacent"].dump());
  std::remove(json.c_str());
}

TEST_CASE("kpool: search's greedy steps cost each Shared layer its attention over the source's union list, as computed here") {
  const std::string spec = "sq=64 skv=256 h=4 d=32 pool=4 k=32 hq=2 dqk=64 dv=32 nl=16 sched=FFFF seed=3";
  const std::string json = testing::temp_path("kpool-search", "json");
  const testing::CliResult r = testing::run_cli("search --problem '" + spec + "' --full-layers 2 --json " + json);
  REQUIRE(r.status == 0);
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  CHECK(j["dsa_layers"] == std::vector<int>{3, 7, 11, 15});
  CHECK(j["pattern"].get<std::string>().size() == 4);
  CHECK(j["pattern"].get<std::string>()[0] == 'F');
  // Step 1's candidate "layer 1 Shared" costs c(1, 0) / 4: layer 7's attention over layer 3's union
  // list against its own, ||a - b|| / ||b|| in double.
  const golden::KpoolSpec s = golden::parse_kpool_spec(spec);
  const ref::kpool::KpoolLayerInputs in3 = ref::kpool::make_kpool_layer_inputs(s.cfg, 3, true),
                                     in7 = ref::kpool::make_kpool_layer_inputs(s.cfg, 7, true);
  const Tensor<int32_t> list3 = ref::kpool::run_kpool_indexer(s.cfg, in3).sel.indices, list7 = ref::kpool::run_kpool_indexer(s.cfg, in7).sel.indices;
  const Tensor<float> a = ref::kpool::kpool_attention(s.cfg, in7, list3).out, b = ref::kpool::kpool_attention(s.cfg, in7, list7).out;
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), den += double(b[i]) * b[i];
  const double c10 = std::sqrt(num / den);
  REQUIRE(c10 > 0);
  bool found = false;
  for (const auto& c : j["steps"][0]["candidates"])
    if (c["layer"] == 1) {
      found = true;
      CHECK(c["loss"].get<double>() * 4 == doctest::Approx(c10).epsilon(1e-9));
    }
  CHECK(found);
  std::remove(json.c_str());
}

TEST_CASE("kpool diff: the precision test passes f32 scores in another order and fails f16 / bf16 scores and keys, by name") {
  const golden::Loaded& g = tiny_set().g;
  const Tensor<float> q = g.tensor<float>("layers.3.indexer.q"), w = g.tensor<float>("layers.3.indexer.weights");
  const Tensor<float> kbar = g.tensor<float>("layers.3.indexer.pool_keys"), gold = g.tensor<float>("layers.3.indexer.scores");
  const Tensor<int32_t> ks({30}, 0), ke = g.tensor<int32_t>("layers.3.indexer.ke");
  // Correct f32 kernels in other orders (judge/emulate.h: heads either way, the dot in blocks), times
  // D^-1/2 = 0.25, each with the pools of its own scores (scores [30, 7], q [30, 4, 16], kbar [7, 16]).
  bool differs = false;
  diff::Result r;
  for (const emul::LogitsVariant& v : emul::scores_family()) {
    CAPTURE(v.name());
    const Tensor<float> other = emul::scores_f32(v, q, kbar, w, 0.25f, ks, ke);
    differs = differs || other.data != gold.data;
    Cand c = faithful(g);
    c.set("layers.3.indexer.scores", other);
    r = judge(c);
    CHECK_MESSAGE(!r.failed(), report(r));
    bool ran = false;
    for (const auto& t : r.tensors)
      if (t.layer == 3 && t.name == "indexer.scores") ran = t.report.precision_ran;
    CHECK(ran);
  }
  CHECK(differs);  // some order changed some bits
  // Scores rounded to f16 / bf16 stay inside the per-element bound's reach less and less, but the
  // precision test names the class; pooled keys rounded to bf16 likewise.
  for (const int bits : {11, 8}) {
    CAPTURE(bits);
    const std::string cls = bits == 11 ? "f16" : "bf16";
    Tensor<float> low = gold;
    for (float& v : low.data) v = float(prec::round_bits(v, bits));
    Cand s = faithful(g);
    s.set("layers.3.indexer.scores", low);
    r = judge(s);
    CHECK_MESSAGE(verdict(r, 3, "indexer.scores") == cmp::Verdict::fail, report(r));
    CHECK_MESSAGE(diagnosed(r, "indexer.scores carries " + cls + "-level error"), report(r));
  }
  Tensor<float> low_keys = kbar;
  for (float& v : low_keys.data) v = float(prec::round_bits(v, 8));
  Cand k = faithful(g);
  k.set("layers.3.indexer.pool_keys", low_keys);
  r = judge(k);
  CHECK_MESSAGE(verdict(r, 3, "indexer.pool_keys") == cmp::Verdict::fail, report(r));
  CHECK_MESSAGE(diagnosed(r, "indexer.pool_keys carries bf16-level error"), report(r));
}

TEST_CASE("kpool diff: pools from f32 scores in other orders pass, pools from f16 / bf16 scores fail by name") {
  // 256 rows over 64 pools, 16 tokens (4 pools) a row: rows with near ties that the rounding moves.
  const testing::WrittenSet m = testing::written(
      tmp("topk"), golden::build_kpool(golden::parse_kpool_spec("sq=256 skv=256 h=4 d=16 pool=4 k=16 tail=yes rounding=f32 hq=2 dqk=64 "
                                                                "dv=32 nl=4 dsa=glm53 sched=F fp8=amax seed=71"), "replay"));
  const Tensor<float> q = m.g.tensor<float>("layers.3.indexer.q"), w = m.g.tensor<float>("layers.3.indexer.weights");
  const Tensor<float> kbar = m.g.tensor<float>("layers.3.indexer.pool_keys");
  const Tensor<int32_t> ks({256}, 0), ke = m.g.tensor<int32_t>("layers.3.indexer.ke");
  const auto [f32_moved, low_moved] = testing::check_values_topk(
      {m.g, 3, "indexer.scores", "indexer.pools", [&](const emul::LogitsVariant& v) { return emul::scores_f32(v, q, kbar, w, 0.25f, ks, ke); },
       [&](const Tensor<float>& s) { return ref::kpool::select_tokens(s, 256, 4, 16, true).pools; }});
  MESSAGE("f32 kernels whose pools moved: " << f32_moved << "; rounded scores whose pools moved: " << low_moved);
  CHECK(low_moved >= 1);  // bf16 at least
}

TEST_CASE("kpool golden: the streamed writer (write_kpool) writes build_kpool's set byte for byte") {
  for (const char* spec : {kSpec, "sq=24 skv=40 h=2 d=16 pool=4 k=8 tail=no rounding=hf-bf16 hq=2 dqk=64 dv=32 nl=4 dsa=all sched=FSSF seed=5"}) {
    CAPTURE(spec);
    const golden::KpoolSpec s = golden::parse_kpool_spec(spec);
    const golden::GoldenSet whole = golden::build_kpool(s, "replay", Impl::simd);
    testing::check_plan(golden::kpool_plan(s), whole);
    const std::string a = tmp("whole"), b = tmp("streamed");
    golden::write(a, golden::GoldenSet(whole), true);
    golden::write_kpool(b, true, s, "replay", Impl::simd);
    testing::check_same_set(a, b);
  }
}
