// DeepSeek-V4 golden sets (golden --kind v4, tools/lib/golden_v4.h) and diff on them (judge/v4.cc):
// the set against ref::v4::run_stack (the specification, run independently here), the manifest
// checks (a bad field is refused by name), the descriptor, the CLI, and the judge: the golden's own
// outputs and legitimate variations pass (another f32 order, a tie-free slot permutation, the
// Hadamard-rotated indexer), planted faults fail on the tensor they break.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <span>

#include "ref/attention.h"
#include "ref/rng.h"
#include "tools/judge/emulate.h"
#include "tools/judge/precision.h"
#include "ref/module_ops.h"
#include "ref/numerics.h"
#include "ref/v4/stack.h"
#include "tests/cli_util.h"
#include "tests/candidate_util.h"
#include "tools/judge/diff.h"
#include "tools/lib/golden_v4.h"
#include "tools/lib/run_report.h"

using namespace indexshare;
namespace fs = std::filesystem;
using ref::v4::LayerType;

namespace {

using indexshare::testing::verdict;
using indexshare::testing::diagnosed;
using indexshare::testing::error_of;
std::string tmp(const std::string& tag) { return indexshare::testing::temp_path("v4g", tag); }

const char* kSpec = "t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 ctx=32 types=SCHCC sched=FSF rot=hf seed=31";

const testing::WrittenSet& tiny_set() {
  static const testing::WrittenSet s = testing::written(tmp("set"), golden::build_v4(golden::parse_v4_spec(kSpec), "replay"));
  return s;
}

using Cand = indexshare::testing::Candidate;

const char* kFloatOut[] = {"compressor.entries", "indexer.entries", "indexer.scores", "attn.out", "attn.out_rotated",
                           "attn.lse", "attn.max_logits"};

// The golden's own outputs on every layer.
Cand faithful(const golden::Loaded& g) {
  Cand c;
  for (size_t l = 0; l < g.manifest["layers"].size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const char* n : kFloatOut)
      if (g.find(p + n)) c.set(p + n, g.tensor<float>(p + n));
    for (const char* n : {"indexer.blocks", "attn.indices"})
      if (g.find(p + n)) c.set(p + n, g.tensor<int32_t>(p + n));
  }
  return c;
}

diff::Result judge(const Cand& c) { return diff::judge(tiny_set().g, c.file(), {}); }

std::string report(const diff::Result& r) { return r.text("replay"); }

// A compressor in plain f32 arithmetic in another order than ref's (softmax and sums in float,
// slots summed last to first, the norm's sum of squares from the top channel down, cos / sin from
// a double angle): what a GPU kernel may compute; the judge's bound must hold it.
Tensor<float> f32_compress(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& bias,
                           const Tensor<float>& norm, const ref::v4::CompressorParams& p) {
  const int64_t T = kv.dim(0), D = norm.dim(0), m = p.ratio, n = T / m;
  const std::vector<float> freq = ref::v4::inv_freq(p.rope);
  Tensor<float> out({n, D});
  std::vector<float> y(static_cast<size_t>(D));
  for (int64_t w = 0; w < n; ++w) {
    for (int64_t c = 0; c < D; ++c) {
      std::vector<float> z, v;
      for (int64_t j = (p.overlap ? 2 * m : m) - 1; j >= 0; --j) {
        const bool prev = p.overlap && j < m;
        const int64_t tok = prev ? (w - 1) * m + j : w * m + (p.overlap ? j - m : j);
        if (tok < 0) continue;
        const int64_t col = p.overlap && !prev ? D + c : c, row = p.overlap && !prev ? j - m : j;
        z.push_back(gate.at(tok, col) + bias.at(row, col));
        v.push_back(kv.at(tok, col));
      }
      const float mx = *std::max_element(z.begin(), z.end());
      float sum = 0, pooled = 0;
      for (float x : z) sum += std::exp(x - mx);
      for (size_t j = 0; j < z.size(); ++j) pooled += std::exp(z[j] - mx) / sum * v[j];
      y[size_t(c)] = pooled;
    }
    float ss = 0;
    for (int64_t c = D - 1; c >= 0; --c) ss += y[size_t(c)] * y[size_t(c)];
    const float r = 1.0f / std::sqrt(ss / float(D) + p.eps);
    for (int64_t c = 0; c < D; ++c) out.at(w, c) = y[size_t(c)] * r * norm[c];
    const int rd = p.rope.rope_dim;
    for (int i = 0; i < rd / 2; ++i) {
      const double angle = double(w * m) * double(freq[size_t(i)]);
      const float cs = float(std::cos(angle)), sn = float(std::sin(angle));
      float& a = out.at(w, D - rd + 2 * i);
      float& b = out.at(w, D - rd + 2 * i + 1);
      const float a0 = a, b0 = b;
      a = a0 * cs - b0 * sn;
      b = b0 * cs + a0 * sn;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("v4 golden: the descriptor parses, prints canonically and refuses a bad field by name") {
  const golden::V4Spec s = golden::parse_v4_spec(kSpec);
  CHECK(golden::to_string(s) == kSpec);
  CHECK(golden::to_string(golden::parse_v4_spec("types=SCHCC  t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 ctx=32 "
                                                "sched=FSF seed=31")) == kSpec);
  const golden::V4Spec f = golden::parse_v4_spec(golden::preset("deepseek-v4-flash").problem);
  CHECK(f.cfg.n_heads == 64);
  CHECK(f.cfg.head_dim == 512);
  CHECK(f.cfg.window == 128);
  CHECK(f.cfg.index_topk == 512);
  CHECK(f.cfg.hca_ratio == 128);
  CHECK(f.cfg.index_n_heads == 64);
  CHECK(f.cfg.index_head_dim == 128);
  CHECK(f.schedule().pattern() == ".F.sF");  // freq 2, j%f==0 over the C4A layers 1, 3, 4
  CHECK(golden::to_string(golden::parse_v4_spec(golden::to_string(f))) == golden::to_string(f));
  const std::pair<std::string, std::string> bad[] = {
      {"t=48 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SC", "'h'"},
      {"t=48 h=x d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SC", "'h'"},
      {"t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SXC", "'types'"},
      {"t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SCC sched=SF", "'sched'"},
      {"t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SCC freq=2", "'rule'"},
      {"t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SCC freq=2 rule=j%3", "'rule'"},
      {"t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=15 types=SC", "'rope'"},
      {"t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SC rot=abc", "'rot'"},
      {"t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SC bogus=1", "'bogus'"},
      {"t=0 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SC", "'t'"},
  };
  for (const auto& [text, field] : bad) {
    CAPTURE(text);
    const std::string e = error_of([&] { (void)golden::parse_v4_spec(text); });
    CHECK(e.find(field) != std::string::npos);
  }
}

TEST_CASE("v4 golden: the set holds ref::v4::run_stack's tensors, the kernel output before the inverse RoPE") {
  const golden::Loaded& g = tiny_set().g;
  const golden::V4Spec s = golden::parse_v4_spec(kSpec);
  const ref::v4::StackOutputs st = ref::v4::run_stack(s.cfg, s.schedule());
  const int64_t T = 48, D = 64, H = 2;
  CHECK(g.manifest["kind"] == "v4");
  CHECK(g.manifest["problem"] == kSpec);
  CHECK(g.manifest["schedule"]["pattern"] == ".F.sF");
  CHECK(g.manifest["layers"][3]["kind"] == "shared");
  CHECK(g.manifest["layers"][3]["source"] == 1);
  CHECK(g.manifest["layers"][2]["kind"] == "none");
  for (size_t l = 0; l < 5; ++l) {
    CAPTURE(l);
    const std::string p = "layers." + std::to_string(l) + ".";
    const ref::v4::LayerOutputs& o = st.layers[l];
    const ref::v4::LayerInputs& in = st.inputs[l];
    CHECK(g.tensor<bf16_t>(p + "attn.q").data == in.q.data);
    CHECK(g.tensor<float>(p + "attn.sink").data == in.sink.data);
    CHECK(g.tensor<int32_t>(p + "attn.indices").data == o.indices.data);
    CHECK(g.tensor<bf16_t>(p + "attn.kv").data == o.kv_full.data);  // kv_full: tokens, then bf16(entries)
    CHECK(g.tensor<float>(p + "attn.out_rotated").data == o.attn.out.data);
    CHECK(g.tensor<float>(p + "attn.lse").data == o.attn.lse.data);
    CHECK(g.tensor<float>(p + "attn.max_logits").data == o.attn.max_logits.data);
    if (st.schedule.types[l] != LayerType::sliding) CHECK(g.tensor<float>(p + "compressor.entries").data == o.entries.data);
    if (st.schedule.types[l] == LayerType::csa) CHECK(g.tensor<int32_t>(p + "indexer.blocks").data == o.blocks.data);
    CHECK((g.find(p + "indexer.scores") != nullptr) == (l == 1 || l == 4));
    if (l == 1 || l == 4) CHECK(g.tensor<float>(p + "indexer.scores").data == o.index_scores.data);
    // attn.out: before the inverse RoPE: the NoPE channels equal the rotated ones, the RoPE
    // channels of row 0 (angle 0) too, and rotating attn.out gives attn.out_rotated.
    const Tensor<float> out = g.tensor<float>(p + "attn.out"), rot = g.tensor<float>(p + "attn.out_rotated");
    const int rd = 16;
    bool nope_same = true, rope_differs = false;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < D; ++c) {
          const bool same = out.at(t, h, c) == rot.at(t, h, c);
          if (c < D - rd || t == 0) nope_same = nope_same && same;
          else rope_differs = rope_differs || !same;
        }
    CHECK(nope_same);
    CHECK(rope_differs);
    const Tensor<bf16_t> ob = g.tensor<bf16_t>(p + "attn.out_bf16");
    for (int64_t i = 0; i < out.numel(); i += 37) CHECK(ob[i].bits == f32_to_bf16(out[i]).bits);
  }
  // The Shared layer's blocks are its source's.
  CHECK(g.tensor<int32_t>("layers.3.indexer.blocks").data == g.tensor<int32_t>("layers.1.indexer.blocks").data);
}

TEST_CASE("v4 golden: golden::read refuses a bad manifest naming the field") {
  const std::string src = tiny_set().dir;
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    const std::string dir = tmp("bad");
    fs::create_directories(dir);
    fs::copy(src + "/tensors.safetensors", dir + "/tensors.safetensors");
    std::ifstream in(src + "/manifest.json");
    nlohmann::json m = nlohmann::json::parse(in);
    edit(m);
    std::ofstream(dir + "/manifest.json") << m.dump(1);
    const std::string e = error_of([&] { (void)golden::read(dir); });
    fs::remove_all(dir);
    return e;
  };
  CHECK(with([](nlohmann::json&) {}).empty());
  CHECK(with([](nlohmann::json& m) { m["config"]["n_heads"] = 3; }).find("'tensors'") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["config"]["head_dim"] = "64"; }).find("config.head_dim") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["config"]["sm_scale"] = 0.5; }).find("config.sm_scale") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["config"]["compress_rope"].erase("theta"); }).find("config.compress_rope.theta") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["layers"][3]["kind"] = "full"; }).find("layers[3].kind") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["layers"][3]["source"] = 2; }).find("layers[3].source") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["layers"][2]["type"] = "S"; }).find("layers[2]") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["layers"][1]["n_c"] = 11; }).find("layers[1].n_c") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["schedule"]["types"] = "SCHCS"; }).find("schedule.types") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["schedule"]["pattern"] = ".F.FF"; }).find("schedule.pattern") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["conventions"].erase("softmax"); }).find("conventions.softmax") != std::string::npos);
  CHECK(with([](nlohmann::json& m) { m["kind"] = "v5"; }).find("'kind'") != std::string::npos);
  CHECK(with([](nlohmann::json& m) {
          for (auto& t : m["tensors"]) if (t["name"] == "layers.1.indexer.scores") t["role"] = "input";
        }).find("layers.1.indexer.scores") != std::string::npos);
}

TEST_CASE("v4 diff: the golden's own outputs and legitimate variations pass") {
  const golden::Loaded& g = tiny_set().g;
  Cand c = faithful(g);
  diff::Result r = judge(c);
  CHECK_MESSAGE(!r.failed(), report(r));
  CHECK(r.tensors.size() >= 30);
  // Each C4A row's slots permuted (sets, not orders): blocks and the compressed part of the indices.
  for (int l : {1, 3, 4}) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Tensor<int32_t> b = g.tensor<int32_t>(p + "indexer.blocks"), ix = g.tensor<int32_t>(p + "attn.indices");
    for (int64_t t = 0; t < b.dim(0); ++t) {
      int32_t* row = &b[t * b.dim(1)];
      std::reverse(row, std::find(row, row + b.dim(1), -1));  // the valid slots; -1 padding stays trailing
      std::reverse(&ix[t * ix.dim(2)] + 8, &ix[t * ix.dim(2)] + ix.dim(2));
    }
    c.set(p + "indexer.blocks", b);
    c.set(p + "attn.indices", ix);
  }
  // Entries perturbed by a few f32 ulps, and the indexer scored with the Hadamard rotation (another
  // f32 evaluation of the same scores).
  Tensor<float> e = g.tensor<float>("layers.2.compressor.entries");
  for (float& x : e.data) x = x * (1.0f + 0x1p-22f);
  c.set("layers.2.compressor.entries", e);
  c.set("layers.1.indexer.scores", ref::v4::index_scores(g.tensor<float>("layers.1.indexer.q"), g.tensor<float>("layers.1.indexer.entries"),
                                                         g.tensor<float>("layers.1.indexer.weights"), 4, ref::v4::IndexerRotation::hadamard));
  r = judge(c);
  CHECK_MESSAGE(!r.failed(), report(r));
}

TEST_CASE("v4 diff: a compressor in f32 arithmetic of another order passes, within its bound") {
  const golden::Loaded& g = tiny_set().g;
  const golden::V4Spec s = golden::parse_v4_spec(kSpec);
  Cand c;
  bool differs = false;
  for (const auto& [l, part] : std::vector<std::pair<int, std::string>>{{1, "compressor"}, {2, "compressor"}, {4, "compressor"},
                                                                      {1, "indexer"}, {4, "indexer"}}) {
    const std::string p = "layers." + std::to_string(l) + "." + part + ".";
    const LayerType t = part == "indexer" ? LayerType::csa : s.schedule().types[size_t(l)];
    ref::v4::CompressorParams cp = part == "indexer" ? ref::v4::indexer_compressor_params(s.cfg) : ref::v4::compressor_params(s.cfg, t);
    const Tensor<float> e = f32_compress(g.tensor<float>(p + "kv"), g.tensor<float>(p + "gate"), g.tensor<float>(p + "position_bias"),
                                         g.tensor<float>(p + "norm_weight"), cp);
    differs = differs || e.data != g.tensor<float>(p + "entries").data;
    c.set(p + "entries", e);
  }
  CHECK(differs);
  const diff::Result r = judge(c);
  CHECK_MESSAGE(!r.failed(), report(r));
  double worst = 0;
  for (const auto& t : r.tensors) worst = std::max(worst, t.report.stats.max_ratio);
  MESSAGE("largest err/bound of the f32 compressor: " << worst);
  CHECK(worst > 0);
}

TEST_CASE("v4 diff: planted faults fail on the tensor they break") {
  const golden::Loaded& g = tiny_set().g;
  const golden::V4Spec s = golden::parse_v4_spec(kSpec);
  const int64_t T = 48, D = 64;
  auto fails = [&](const Cand& c, int layer, const std::string& name, const std::string& diagnosis = "") {
    const diff::Result r = judge(c);
    CHECK(r.failed());
    CHECK_MESSAGE(verdict(r, layer, name) == cmp::Verdict::fail, report(r));
    if (!diagnosis.empty()) CHECK_MESSAGE(diagnosed(r, diagnosis), report(r));
  };
  SUBCASE("blocks off by one block") {
    Cand c;
    Tensor<int32_t> b = g.tensor<int32_t>("layers.1.indexer.blocks");
    for (int32_t& x : b.data) x = x >= 0 ? x + 1 : x;
    c.set("layers.1.indexer.blocks", b);
    fails(c, 1, "indexer.blocks", "shifted by 1 block");
  }
  SUBCASE("a missing window slot") {
    Cand c;
    Tensor<int32_t> ix = g.tensor<int32_t>("layers.0.attn.indices");
    ix.at(20, 0, 7) = -1;  // row 20's own position
    c.set("layers.0.attn.indices", ix);
    fails(c, 0, "attn.indices");
  }
  SUBCASE("the sink ignored") {
    Cand c;
    for (int l : {0, 1}) {
      const std::string p = "layers." + std::to_string(l) + ".";
      const ref::AttentionOut a = ref::sparse_attention(g.tensor<bf16_t>(p + "attn.q"), g.tensor<bf16_t>(p + "attn.kv"),
                                                        g.tensor<int32_t>(p + "attn.indices"), s.cfg.sm_scale(), D);
      c.set(p + "attn.out", a.out);
    }
    const diff::Result r = judge(c);
    CHECK(verdict(r, 0, "attn.out") == cmp::Verdict::fail);
    CHECK(verdict(r, 1, "attn.out") == cmp::Verdict::fail);
    CHECK_MESSAGE(diagnosed(r, "layer 1: attn.out is the attention without the sink"), report(r));
  }
  SUBCASE("the inverse RoPE skipped") {
    Cand c;
    c.set("layers.2.attn.out_rotated", g.tensor<float>("layers.2.attn.out"));
    fails(c, 2, "attn.out_rotated", "without the inverse RoPE");
  }
  SUBCASE("the compressor's RMSNorm weight ignored") {
    Cand c;
    const std::string p = "layers.2.compressor.";
    const Tensor<float> ones({D}, 1.0f);
    c.set(p + "entries", ref::v4::compress(g.tensor<float>(p + "kv"), g.tensor<float>(p + "gate"), g.tensor<float>(p + "position_bias"),
                                           ones, ref::v4::compressor_params(s.cfg, LayerType::hca)));
    fails(c, 2, "compressor.entries", "norm_weight ignored");
  }
  SUBCASE("the compressor in bf16 (transformers' bf16 rounding points) is not f32 arithmetic") {
    Cand c;
    const std::string p = "layers.1.compressor.";
    ref::v4::CompressorParams cp = ref::v4::compressor_params(s.cfg, LayerType::csa);
    cp.rounding = ref::v4::CompressorRounding::hf_bf16;
    c.set(p + "entries", ref::v4::compress(g.tensor<float>(p + "kv"), g.tensor<float>(p + "gate"), g.tensor<float>(p + "position_bias"),
                                           g.tensor<float>(p + "norm_weight"), cp));
    fails(c, 1, "compressor.entries", "bf16 precision");
  }
  SUBCASE("CSA's overlapping windows taken wrong: halves swapped, or the previous window left out") {
    const std::string p = "layers.1.compressor.";
    const ref::v4::CompressorParams cp = ref::v4::compressor_params(s.cfg, LayerType::csa);
    Tensor<float> kv = g.tensor<float>(p + "kv"), gate = g.tensor<float>(p + "gate"), bias = g.tensor<float>(p + "position_bias");
    const Tensor<float> w = g.tensor<float>(p + "norm_weight");
    // A kernel that reads Cb from the previous window and Ca from its own (the column halves exchanged).
    Tensor<float> skv = kv, sgate = gate, sbias = bias;
    for (Tensor<float>* x : {&skv, &sgate, &sbias})
      for (int64_t r = 0; r < x->dim(0); ++r)
        for (int64_t c = 0; c < D; ++c) std::swap(x->at(r, c), x->at(r, D + c));
    Cand c;
    c.set(p + "entries", ref::v4::compress(skv, sgate, sbias, w, cp));
    fails(c, 1, "compressor.entries", "layer 1: compressor.entries pool the overlapping windows' halves swapped");
    // A kernel that pools each window's own m tokens only (an HCA-like compressor on CSA's Cb half).
    ref::v4::CompressorParams hca = cp;
    hca.overlap = false;
    Tensor<float> cb({kv.dim(0), D}), cgate({kv.dim(0), D}), cbias({bias.dim(0), D});
    for (int64_t r = 0; r < kv.dim(0); ++r)
      for (int64_t ch = 0; ch < D; ++ch) cb.at(r, ch) = kv.at(r, D + ch), cgate.at(r, ch) = gate.at(r, D + ch);
    for (int64_t r = 0; r < bias.dim(0); ++r)
      for (int64_t ch = 0; ch < D; ++ch) cbias.at(r, ch) = bias.at(r, D + ch);
    Cand n;
    n.set(p + "entries", ref::v4::compress(cb, cgate, cbias, w, hca));
    fails(n, 1, "compressor.entries", "layer 1: compressor.entries leave out the previous window");
    const diff::Result r = judge(n);
    CHECK_MESSAGE(!diagnosed(r, "halves swapped"), report(r));
  }
  SUBCASE("noise inside every element's bound but beyond FlashMLA's MODEL1 prefill cos_diff_tol") {
    // 1% relative noise of random sign: each element within its derived bound (f32 attention with
    // the sink, ~5% at these shapes), calc_diff ~ 5e-5 > 7e-6: FlashMLA's own test fails it, and so must diff.
    Tensor<float> out = g.tensor<float>("layers.1.attn.out");
    Xoshiro256 rng(11);
    for (float& v : out.data) v *= rng.below(2) ? 1.01f : 0.99f;
    Cand c;
    c.set("layers.1.attn.out", out);
    const diff::Result r = judge(c);
    CHECK(verdict(r, 1, "attn.out") == cmp::Verdict::fail);
    for (const auto& t : r.tensors)
      if (t.layer == 1 && t.name == "attn.out") {
        CHECK(t.report.stats.n_fail == 0);
        REQUIRE(!t.report.reasons.empty());
        CHECK_MESSAGE(t.report.reasons[0].find("cos_diff_tol") != std::string::npos, t.report.reasons[0]);
      }
  }
  SUBCASE("the precision test: correct f32 attention kernels pass, bf16 logits or products fail by name") {
    const std::string p = "layers.1.attn.";
    const Tensor<bf16_t> q = g.tensor<bf16_t>(p + "q"), kv = g.tensor<bf16_t>(p + "kv");
    const Tensor<int32_t> ix = g.tensor<int32_t>(p + "indices");
    const Tensor<float> sink = g.tensor<float>(p + "sink");
    auto cand = [&](const emul::AttentionVariant& v) {
      const ref::AttentionOut o = emul::attention(v, q, kv, ix, s.cfg.sm_scale(), D, nullptr, &sink);
      Cand c;
      c.set(p + "out", o.out);
      c.set(p + "lse", o.lse);
      c.set(p + "max_logits", o.max_logits);
      return c;
    };
    for (const emul::AttentionVariant& v : emul::attention_family()) {
      CAPTURE(v.name());
      const diff::Result r = judge(cand(v));
      CHECK_MESSAGE(!r.failed(), report(r));
    }
    // q.k logits or products rounded to bf16: named by the precision test on lse and max_logits.
    for (const char* cls : {"bf16-logits", "bf16-products"}) {
      CAPTURE(cls);
      emul::AttentionVariant x;
      x.out_bf16 = false;
      (std::string(cls) == "bf16-logits" ? x.logits_bf16 : x.products_bf16) = true;
      const diff::Result r = judge(cand(x));
      CHECK(verdict(r, 1, "attn.lse") == cmp::Verdict::fail);
      CHECK_MESSAGE(diagnosed(r, std::string("layer 1: attn.lse carries ") + cls + "-level error"), report(r));
      CHECK_MESSAGE(diagnosed(r, std::string("layer 1: attn.max_logits carries ") + cls + "-level error"), report(r));
    }
    // P.V accumulated in bf16 over this set's 12 keys a row errs only 2x a bf16 output's rounding
    // (too close to name; the 192-key test below names it): FlashMLA's cos_diff_tol fails it.
    emul::AttentionVariant acc;
    acc.out_bf16 = false;
    acc.acc_bf16 = true;
    CHECK(verdict(judge(cand(acc)), 1, "attn.out") == cmp::Verdict::fail);
  }
  SUBCASE("a Shared layer using its own blocks") {
    // Layer 3 runs an indexer of its own (inputs drawn as a Full layer's would be).
    const ref::v4::LayerInputs in = ref::v4::make_layer_inputs(s.cfg, 3, LayerType::csa, true);
    const ref::v4::LayerOutputs own = ref::v4::run_layer(s.cfg, in);
    REQUIRE(own.blocks.data != g.tensor<int32_t>("layers.3.indexer.blocks").data);
    Cand c;
    c.set("layers.1.indexer.blocks", g.tensor<int32_t>("layers.1.indexer.blocks"));
    c.set("layers.3.indexer.blocks", own.blocks);
    const diff::Result r = judge(c);
    CHECK(verdict(r, 1, "indexer.blocks") == cmp::Verdict::pass);
    CHECK(verdict(r, 3, "indexer.blocks") == cmp::Verdict::fail);
    CHECK(verdict(r, 3, "indexer.blocks [= source's]") == cmp::Verdict::fail);
    CHECK(diagnosed(r, "layer 3: a Shared C4A layer whose blocks are not its source layer 1's"));
  }
  SUBCASE("the sink inside the lse, the forward RoPE in place of its inverse") {
    Cand c;
    Tensor<float> lse = g.tensor<float>("layers.1.attn.lse");
    const Tensor<float> sink = g.tensor<float>("layers.1.attn.sink");
    for (int64_t i = 0; i < lse.numel(); ++i) lse[i] = float(std::log(std::exp(double(lse[i])) + std::exp(double(sink[i % 2]))));
    c.set("layers.1.attn.lse", lse);
    Tensor<float> fwd = g.tensor<float>("layers.4.attn.out");
    const std::vector<float> freq = ref::v4::inv_freq(s.cfg.compress_rope);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < 2; ++h) ref::apply_rope(&fwd.at(t, h, D - 16), 16, t, freq, ref::RopeLayout::interleaved);
    c.set("layers.4.attn.out_rotated", fwd);
    const diff::Result r = judge(c);
    CHECK(verdict(r, 1, "attn.lse") == cmp::Verdict::fail);
    CHECK(verdict(r, 4, "attn.out_rotated") == cmp::Verdict::fail);
    CHECK_MESSAGE(diagnosed(r, "layer 1: attn.lse includes the sink"), report(r));
    CHECK_MESSAGE(diagnosed(r, "layer 4: attn.out_rotated is rotated by +angle"), report(r));
  }
  SUBCASE("attention on the wrong HCA entries") {
    Cand c;
    Tensor<int32_t> ix = g.tensor<int32_t>("layers.2.attn.indices");
    ix.at(T - 1, 0, 8) = -1;  // the last row drops its first compressed entry
    c.set("layers.2.attn.indices", ix);
    fails(c, 2, "attn.indices");
  }
}

TEST_CASE("v4 diff: blocks shared as the freq rule counted over every layer are named so") {
  // C4A layers 0, 1, 3, 4 (ranks 0-3); freq=2 j%f==0 over ranks: F S F S (layer 1 from 0, layer 4
  // from 3). Counted over layer indices: layer 0 F, 1 S, 3 S (from 0), 4 F.
  const golden::V4Spec s = golden::parse_v4_spec(
      "t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 ctx=32 types=CCHCC freq=2 rule=j%f==0 seed=7");
  const testing::WrittenSet set = testing::written(tmp("freq"), golden::build_v4(s, "replay"));
  const golden::Loaded& g = set.g;
  REQUIRE(g.manifest["schedule"]["pattern"] == "Fs.Fs");
  const ref::v4::LayerInputs in4 = ref::v4::make_layer_inputs(s.cfg, 4, LayerType::csa, true);
  const Tensor<int32_t> own4 = ref::v4::run_layer(s.cfg, in4).blocks;
  Cand c;
  for (int l : {0, 1}) c.set("layers." + std::to_string(l) + ".indexer.blocks", g.tensor<int32_t>("layers.0.indexer.blocks"));
  c.set("layers.3.indexer.blocks", g.tensor<int32_t>("layers.0.indexer.blocks"));
  c.set("layers.4.indexer.blocks", own4);
  const diff::Result r = diff::judge(g, c.file(), {});
  CHECK(verdict(r, 3, "indexer.blocks") == cmp::Verdict::fail);
  CHECK(verdict(r, 4, "indexer.blocks") == cmp::Verdict::fail);
  CHECK_MESSAGE(diagnosed(r, "shared as the C4A schedule Fs.sF"), r.text("replay"));
  CHECK_MESSAGE(diagnosed(r, "counted over every layer index"), r.text("replay"));
  // The other rule (max(j-1,0)%2 over ranks: F F S F) groups layers 1 and 3 with nothing else.
  Cand o;
  o.set("layers.0.indexer.blocks", g.tensor<int32_t>("layers.0.indexer.blocks"));
  const ref::v4::LayerInputs in1 = ref::v4::make_layer_inputs(s.cfg, 1, LayerType::csa, true);
  const Tensor<int32_t> own1 = ref::v4::run_layer(s.cfg, in1).blocks;
  o.set("layers.1.indexer.blocks", own1);
  o.set("layers.3.indexer.blocks", own1);
  o.set("layers.4.indexer.blocks", own4);
  const diff::Result ro = diff::judge(g, o.file(), {});
  CHECK_MESSAGE(diagnosed(ro, "max(j-1,0)%f in place of the set's j%f==0"), ro.text("replay"));
  // The golden's own blocks: no schedule diagnosis.
  Cand ok;
  for (int l : {0, 1, 3, 4}) ok.set("layers." + std::to_string(l) + ".indexer.blocks", g.tensor<int32_t>("layers." + std::to_string(l) + ".indexer.blocks"));
  const diff::Result rk = diff::judge(g, ok.file(), {});
  CHECK_FALSE(rk.failed());
  CHECK(rk.diagnoses.empty());
}

TEST_CASE("v4 golden: the CLI writes, verifies and judges a set, a bad spec exits 2 and writes nothing") {
  const std::string dir = tmp("cli");
  auto r = testing::run_cli("golden --kind v4 --problem \"" + std::string(kSpec) + "\" --out " + dir);
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK(r.out.find("__REPRO: indexshare golden --kind v4 --problem \"" + std::string(kSpec) + "\"") != std::string::npos);
  CHECK(testing::run_cli("verify --golden " + dir).status == 0);
  // The same bytes as the builder's set (the CLI replays the descriptor).
  CHECK(golden::read(dir).manifest["tensors"] == tiny_set().g.manifest["tensors"]);
  const std::string cand = tmp("clicand") + ".safetensors";
  faithful(tiny_set().g).write(cand);
  r = testing::run_cli("diff --golden " + dir + " --candidate " + cand);
  CHECK_MESSAGE(r.status == 0, r.out);
  r = testing::run_cli("golden --preset v4-tiny --out " + dir + "-preset");
  CHECK_MESSAGE(r.status == 0, r.out);
  const std::string bad = tmp("clibad");
  r = testing::run_cli("golden --kind v4 --problem \"t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SCZ\" --out " + bad);
  CHECK(r.status == 2);
  CHECK(r.out.find("'types'") != std::string::npos);
  CHECK(!fs::exists(bad));
  r = testing::run_cli("golden --kind v4 --problem \"" + std::string(kSpec) + "\" --rows 0-3 --out " + bad);
  CHECK(r.status == 2);
  CHECK(!fs::exists(bad));
  fs::remove_all(dir);
  fs::remove_all(dir + "-preset");
  fs::remove(cand);
}

TEST_CASE("v4: run on a V4 descriptor prints golden's attn.out_rotated fingerprints, ref and simd alike") {
  const std::string spec = "t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 ctx=32 types=SCHCC sched=FSF seed=5";
  const indexshare::testing::CliResult simd = indexshare::testing::run_cli("run --problem '" + spec + "'");
  const indexshare::testing::CliResult ref = indexshare::testing::run_cli("run --impl ref --problem '" + spec + "'");
  REQUIRE(simd.status == 0);
  REQUIRE(ref.status == 0);
  CHECK(simd.out.find("schedule  .F.sF (2 indexers over 5 layers)") != std::string::npos);
  CHECK(simd.out.find("layer   3 C4A s source   1") != std::string::npos);
  // The fingerprint of every layer: golden's attn.out_rotated, folded as run folds it.
  const golden::GoldenSet g = golden::build_v4(golden::parse_v4_spec(spec), "test", Impl::ref);
  for (int l = 0; l < 5; ++l) {
    const std::string fp = testing::fingerprint_text(g, "layers." + std::to_string(l) + ".attn.out_rotated");
    REQUIRE(!fp.empty());
    CAPTURE(l);
    CHECK(simd.out.find(fp) != std::string::npos);
    CHECK(ref.out.find(fp) != std::string::npos);
  }
  // A schedule starting with S, and options a V4 descriptor sets itself: exit 2, by name.
  indexshare::testing::CliResult bad = indexshare::testing::run_cli("run --problem '" + spec.substr(0, spec.find("sched")) + "sched=SSF'");
  CHECK(bad.status == 2);
  CHECK(bad.out.find("must start with F") != std::string::npos);
  bad = indexshare::testing::run_cli("run --layers 3 --problem '" + spec + "'");
  CHECK(bad.status == 2);
  CHECK(bad.out.find("--layers applies to kernel-level (DSA) stacks only") != std::string::npos);
}

TEST_CASE("v4 diff: the precision test passes f32 scores in other orders and fails f16 / bf16 scores and entries, by name") {
  const golden::Loaded& g = tiny_set().g;
  const golden::V4Spec s = golden::parse_v4_spec(kSpec);
  const Tensor<float> gold = g.tensor<float>("layers.1.indexer.scores");  // layer 1: the first Full C4A layer
  const Tensor<float> q = g.tensor<float>("layers.1.indexer.q"), e = g.tensor<float>("layers.1.indexer.entries");
  const Tensor<float> w = g.tensor<float>("layers.1.indexer.weights");
  const int64_t T = q.dim(0), D = q.dim(2), n_b = e.dim(0);
  const Tensor<int32_t> ks({T}, 0), ke = ref::v4::causal_block_end(T, s.cfg.csa_ratio, n_b);
  // Correct f32 kernels in other orders (judge/emulate.h; the set is rot=hf: no rotation), times the
  // f32 D^-1/2 after the head sum, each with the blocks of its own scores.
  bool differs = false;
  for (const emul::LogitsVariant& v : emul::scores_family()) {
    CAPTURE(v.name());
    const Tensor<float> other = emul::scores_f32(v, q, e, w, float(1.0 / std::sqrt(double(D))), ks, ke);
    differs = differs || other.data != gold.data;
    Cand c = faithful(g);
    c.set("layers.1.indexer.scores", other);
    const diff::Result r = judge(c);
    CHECK_MESSAGE(!r.failed(), r.text("replay"));
  }
  CHECK(differs);
  for (const int bits : {11, 8}) {
    CAPTURE(bits);
    const std::string cls = bits == 11 ? "f16" : "bf16";
    Tensor<float> low = gold;
    for (float& v : low.data) v = float(prec::round_bits(v, bits));
    CHECK(low.data != gold.data);
    Cand c = faithful(g);
    c.set("layers.1.indexer.scores", low);
    diff::Result r = judge(c);
    CHECK_MESSAGE(verdict(r, 1, "indexer.scores") == cmp::Verdict::fail, r.text("replay"));
    CHECK_MESSAGE(diagnosed(r, "indexer.scores carries " + cls + "-level error"), r.text("replay"));
    // The compressors' entries rounded likewise.
    Cand en = faithful(g);
    for (const char* part : {"compressor", "indexer"}) {
      Tensor<float> x = g.tensor<float>(std::string("layers.1.") + part + ".entries");
      for (float& v : x.data) v = float(prec::round_bits(v, bits));
      en.set(std::string("layers.1.") + part + ".entries", x);
    }
    r = judge(en);
    for (const char* part : {"compressor", "indexer"}) {
      CHECK_MESSAGE(verdict(r, 1, std::string(part) + ".entries") == cmp::Verdict::fail, r.text("replay"));
      CHECK_MESSAGE(diagnosed(r, std::string(part) + ".entries carries " + cls + "-level error"), r.text("replay"));
    }
  }
}

TEST_CASE("v4 diff: blocks from f32 scores in other orders pass, blocks from f16 / bf16 scores fail by name") {
  // 512 rows over up to 128 blocks, 16 a row: rows with near ties that the rounding moves.
  const golden::V4Spec s = golden::parse_v4_spec("t=512 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=16 rope=16 ctx=32 types=SC sched=F rot=hf seed=31");
  const testing::WrittenSet m = testing::written(tmp("topk"), golden::build_v4(s, "replay"));
  const Tensor<float> q = m.g.tensor<float>("layers.1.indexer.q"), e = m.g.tensor<float>("layers.1.indexer.entries");
  const Tensor<float> w = m.g.tensor<float>("layers.1.indexer.weights");
  const Tensor<int32_t> ks({512}, 0), ke = ref::v4::causal_block_end(512, 4, e.dim(0));
  const auto [f32_moved, low_moved] = testing::check_values_topk(
      {m.g, 1, "indexer.scores", "indexer.blocks",
       [&](const emul::LogitsVariant& v) { return emul::scores_f32(v, q, e, w, float(1.0 / std::sqrt(32.0)), ks, ke); },
       [&](const Tensor<float>& x) { return ref::v4::select_blocks(x, 4, 16); }});
  MESSAGE("f32 kernels whose blocks moved: " << f32_moved << "; rounded scores whose blocks moved: " << low_moved);
  CHECK(low_moved >= 1);  // bf16 at least
}

TEST_CASE("v4 diff: attention accumulating P.V in bf16 is named on out and out_rotated, with up to 192 keys a row") {
  // An HCA layer over 128 compressed entries plus a 64-token window: long enough rows for bf16
  // accumulation to stand far above a bf16 output's rounding (the tiny set's 12 keys a row do not).
  const golden::V4Spec s = golden::parse_v4_spec("t=512 h=4 d=64 w=64 csa=4 hca=4 ih=4 id=32 k=16 rope=16 ctx=32 types=SH rot=hf seed=37");
  const testing::WrittenSet m = testing::written(tmp("pv"), golden::build_v4(s, "replay"));
  const std::string p = "layers.1.attn.";
  const Tensor<bf16_t> q = m.g.tensor<bf16_t>(p + "q"), kv = m.g.tensor<bf16_t>(p + "kv");
  const Tensor<int32_t> ix = m.g.tensor<int32_t>(p + "indices");
  const Tensor<float> sink = m.g.tensor<float>(p + "sink");
  auto judged = [&](const emul::AttentionVariant& v) {
    const ref::AttentionOut o = emul::attention(v, q, kv, ix, s.cfg.sm_scale(), 64, nullptr, &sink);
    testing::Candidate c;
    c.set(p + "out", o.out);
    c.set(p + "lse", o.lse);
    c.set(p + "max_logits", o.max_logits);
    Tensor<float> rot = o.out;  // out_rotated: the kernel's own out through the inverse RoPE
    const std::vector<float> freq = ref::v4::inv_freq(s.cfg.compress_rope);
    for (int64_t t = 0; t < 512; ++t)
      for (int64_t h = 0; h < 4; ++h) ref::v4::apply_rope_inverse(&rot.at(t, h, 64 - 16), 16, t, freq);
    c.set(p + "out_rotated", rot);
    return diff::judge(m.g, c.file(), {});
  };
  for (const emul::AttentionVariant& v : emul::attention_family()) {
    CAPTURE(v.name());
    const diff::Result r = judged(v);
    CHECK_MESSAGE(!r.failed(), report(r));
  }
  emul::AttentionVariant acc;
  acc.out_bf16 = false;
  acc.acc_bf16 = true;
  const diff::Result r = judged(acc);
  for (const char* n : {"attn.out", "attn.out_rotated"}) {
    CAPTURE(n);
    CHECK(verdict(r, 1, n) == cmp::Verdict::fail);
    CHECK_MESSAGE(diagnosed(r, "layer 1: " + std::string(n) + " carries bf16-acc-level error"), report(r));
  }
}

TEST_CASE("v4 golden: the streamed writer (write_v4) writes build_v4's set byte for byte, and nothing when a layer fails") {
  for (const char* spec : {kSpec, "t=64 h=2 d=64 w=8 csa=4 hca=16 ih=4 id=32 k=8 rope=16 ctx=32 types=CHSC sched=FS seed=3"}) {
    CAPTURE(spec);
    const golden::V4Spec s = golden::parse_v4_spec(spec);
    const golden::GoldenSet whole = golden::build_v4(s, "replay", Impl::simd);
    testing::check_plan(golden::v4_plan(s), whole);  // the plan is the built set's tensor list, in file order
    const std::string a = tmp("whole"), b = tmp("streamed");
    golden::write(a, golden::GoldenSet(whole), true);
    golden::write_v4(b, true, s, "replay", Impl::simd);
    testing::check_same_set(a, b);
  }
  // A layer that fails after earlier layers were handed over (here layer 3's inputs, cut short):
  // the error reaches the caller and neither the set nor its temporary folder stays.
  const golden::V4Spec s = golden::parse_v4_spec(kSpec);
  const ref::v4::Schedule sch = s.schedule();
  const ref::Kernels kern = kernels_for(Impl::simd);
  std::vector<ref::v4::LayerInputs> in;
  for (size_t l = 0; l < sch.types.size(); ++l)
    in.push_back(ref::v4::make_layer_inputs(s.cfg, int(l), sch.types[l], sch.types[l] == LayerType::csa && sch.full(l), kern));
  in[3].comp_kv = Tensor<float>({3, in[3].comp_kv.dim(1)}, 0.f);
  const std::string dir = tmp("failed");
  const fs::path parent = fs::path(dir).parent_path();
  const std::string msg = error_of([&] { golden::write_v4(dir, true, s, "replay", Impl::simd, &in); });
  CHECK(!msg.empty());
  CHECK(!fs::exists(dir));
  for (const fs::directory_entry& e : fs::directory_iterator(parent))
    CHECK(e.path().filename().string().rfind(fs::path(dir).filename().string() + ".tmp.", 0) != 0);
}

TEST_CASE("golden: SetWriter refuses a tensor that is not its plan's next, and one never handed over, naming both") {
  const std::string dir = tmp("plan");
  const std::vector<golden::SetWriter::Planned> plan = {{{"a", io::DType::F32, {2}}, golden::Role::input},
                                                        {{"b", io::DType::F32, {3}}, golden::Role::output}};
  std::string msg = error_of([&] {
    golden::SetWriter w(dir, true, plan);
    w.add("a", Tensor<float>({2}, 1.f), golden::Role::input);
    w.add("b", Tensor<float>({4}, 1.f), golden::Role::output);
  });
  CHECK(msg.find("tensor 'b': F32 [4] output where the plan has 'b' F32 [3] output") != std::string::npos);
  msg = error_of([&] {
    golden::SetWriter w(dir, true, plan);
    w.add("a", Tensor<float>({2}, 1.f), golden::Role::input);
    (void)w.finish(nlohmann::json::object());
  });
  CHECK(msg.find("tensor 'b' was never handed over") != std::string::npos);
  CHECK(!fs::exists(dir));
  // In plan order, with a bound on the bytes in flight: the set, as write() would write it.
  {
    golden::SetWriter w(dir, true, plan, 8);
    w.add("a", Tensor<float>({2}, 1.f), golden::Role::input);
    w.add("b", Tensor<float>({3}, 2.f), golden::Role::output);
    (void)w.finish(nlohmann::json{{"format_version", golden::kFormatVersion}});
  }
  const io::SafetensorsFile f = io::read_safetensors(dir + "/tensors.safetensors");
  CHECK(io::as_tensor<float>(f.get("b"), dir).data == Tensor<float>({3}, 2.f).data);
  fs::remove_all(dir);

  // A tensor made by its fill, over more than one 8 MiB piece (300 rows of 32 KiB: 256 + 44 rows):
  // the bytes and the manifest's hash are those of the same tensor handed whole.
  Tensor<float> whole({300, 8192});
  for (int64_t i = 0; i < whole.numel(); ++i) whole[i] = float(i % 9973) * 0.5f;
  const std::vector<golden::SetWriter::Planned> made_plan = {{{"a", io::DType::F32, {2}}, golden::Role::input},
                                                             {{"m", io::DType::F32, {300, 8192}}, golden::Role::output}};
  int calls = 0;
  {
    golden::SetWriter w(dir, true, made_plan, 8);
    w.add("a", Tensor<float>({2}, 1.f), golden::Role::input);
    w.add(golden::Handed{io::TensorView{"m", io::DType::F32, {300, 8192}, {}}, golden::Role::output,
                         [&](int64_t first, int64_t n, uint8_t* dst) {
                           ++calls;
                           std::memcpy(dst, whole.ptr() + first * 8192, size_t(n) * 8192 * sizeof(float));
                         }});
    (void)w.finish(nlohmann::json{{"format_version", golden::kFormatVersion}});
  }
  CHECK(calls == 2);
  const std::string plain = tmp("plan-whole");
  {
    golden::SetWriter w(plain, true, made_plan);
    w.add("a", Tensor<float>({2}, 1.f), golden::Role::input);
    w.add("m", Tensor<float>(whole), golden::Role::output);
    (void)w.finish(nlohmann::json{{"format_version", golden::kFormatVersion}});
  }
  CHECK(testing::file_bytes(dir + "/tensors.safetensors") == testing::file_bytes(plain + "/tensors.safetensors"));
  CHECK(testing::file_bytes(dir + "/manifest.json") == testing::file_bytes(plain + "/manifest.json"));
  fs::remove_all(dir);
  fs::remove_all(plain);
}

TEST_CASE("v4 golden: verify streams tensors above 64 MiB through SHA-256 (a set larger than memory verifies), and finds a flipped byte in one") {
  const std::string dir = tmp("verify-large");
  // attn.out and attn.out_rotated: [640, 64, 512] f32 = 80 MiB each.
  const std::string spec = "t=640 h=64 d=512 w=8 csa=4 hca=128 ih=4 id=32 k=8 rope=16 types=HH seed=2";
  REQUIRE(testing::run_cli("golden --kind v4 --problem '" + spec + "' --out " + dir).status == 0);
  testing::CliResult r = testing::run_cli("verify --golden " + dir);
  REQUIRE(r.status == 0);
  const std::string file = dir + "/" + golden::kTensorFile;
  const io::SafetensorsIndex idx = io::read_safetensors_index(file, 0);
  uint64_t total = 0;
  size_t out = idx.offsets.size();
  for (size_t i = 0; i < idx.file.tensors.size(); ++i) {
    const io::TensorView& v = idx.file.tensors[i];
    total += uint64_t(shape_numel(v.shape)) * io::dtype_size(v.dtype);
    if (v.name == "layers.1.attn.out_rotated") out = i;
  }
  CHECK(r.out.find("bytes     " + std::to_string(total) + " in") != std::string::npos);  // counted, though not held
  REQUIRE(out < idx.offsets.size());
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(idx.offsets[out] + 40'000'000));
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 1);
    f.seekp(std::streamoff(idx.offsets[out] + 40'000'000));
    f.write(&c, 1);
  }
  r = testing::run_cli("verify --golden " + dir);
  CHECK(r.status == 2);
  CHECK(r.out.find("layers.1.attn.out_rotated") != std::string::npos);
  fs::remove_all(dir);
}
