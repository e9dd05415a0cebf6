// Tests of ref/layer: the single-layer pipeline on generated inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ref/attention.h"
#include "ref/error.h"
#include "ref/layer.h"
#include "ref/numerics.h"
#include "ref/topk.h"

using namespace indexshare;

TEST_CASE("layer: generated inputs follow the documented construction") {
  const Problem p = parse_problem("sq6 skv10 hq2 dqk16 dv8 ih3 id32 k4 seed5");
  const ref::LayerInputs in = ref::make_layer_inputs(p);
  REQUIRE(in.index_q8.shape == Shape{6, 3, 32});
  REQUIRE(in.index_k8.shape == Shape{10, 32});
  REQUIRE(in.index_q_scale.shape == Shape{6, 3});
  // Re-derive q's codes and the weights from the named random streams: a cross-layer mix
  // a * base + b * own with a = sim = 0.8 (the default), b = sqrt(1 - a^2).
  const float a = 0.8f, b = float(std::sqrt(1.0 - double(a) * double(a)));
  Tensor<float> q = ref::generate(p, "stack.indexer.q", {6, 3, 32});
  Tensor<float> qo = ref::generate(p, "layers.0.indexer.q", {6, 3, 32});
  Tensor<float> w = ref::generate(p, "stack.indexer.weights", {6, 3});
  Tensor<float> wo = ref::generate(p, "layers.0.indexer.weights", {6, 3});
  for (int64_t i = 0; i < q.numel(); ++i) q[i] = a * q[i] + b * qo[i];
  for (int64_t i = 0; i < w.numel(); ++i) w[i] = a * w[i] + b * wo[i];
  for (int64_t t = 0; t < 6; ++t) {
    for (int64_t h = 0; h < 3; ++h) {
      float amax = 0;
      for (int64_t d = 0; d < 32; ++d) amax = std::max(amax, std::fabs(round_bf16(q.at(t, h, d))));
      const float s = block_scale(amax, ScaleRule::deepseek_ue8m0);
      REQUIRE(in.index_q_scale.at(t, h) == s);
      for (int64_t d = 0; d < 32; ++d)
        REQUIRE(in.index_q8.at(t, h, d) == f32_to_e4m3(round_bf16(q.at(t, h, d)) / s));
      const float expect_w = w.at(t, h) * float(1.0 / std::sqrt(3.0)) * s * float(1.0 / std::sqrt(32.0));
      REQUIRE(in.index_weights.at(t, h) == expect_w);
    }
    CHECK(in.ks[t] == 0);
    CHECK(in.ke[t] == 10 - 6 + t + 1);  // query row t is position 4 + t and sees itself
  }
  // Without the indexer (a Shared layer without its own inputs) only attention inputs exist.
  const ref::LayerInputs bare = ref::make_layer_inputs(p, 0, false);
  CHECK(!bare.has_indexer);
  CHECK(bare.index_q8.numel() == 0);
  CHECK(bare.q.data == in.q.data);
  CHECK(bare.ke.data == in.ke.data);
}

TEST_CASE("layer: recency and sink dims follow the documented construction") {
  const Problem p = parse_problem("sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4 seed5 recency=0.5 sinks=3 indexer=bf16");
  const ref::LayerInputs in = ref::make_layer_inputs(p);
  const float g = float(2.0 * std::pow(16.0, 0.25));  // 4
  for (int64_t s = 0; s < 12; ++s) {
    CHECK(in.index_k.at(s, 15) == round_bf16(0.5f * g * float(s + 1) / 12.0f));
    CHECK(in.index_k.at(s, 14) == (s < 3 ? g : 0.0f));
  }
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t h = 0; h < 2; ++h) {
      const float sg = in.index_weights.at(t, h) < 0 ? -g : g;  // bf16 mode: weights keep their sign
      CHECK(in.index_q.at(t, h, 15) == sg);
      CHECK(in.index_q.at(t, h, 14) == sg);
    }
  // The biases work: sinks (+4 sqrt(D) = 32 on dots of standard deviation 8) are selected by
  // every row; strong recency makes the last row select its most recent keys.
  const Problem sinks = parse_problem("sq8 skv64 hq2 dqk16 dv8 ih4 id64 k8 seed2 sinks=2");
  const ref::LayerOutputs o = ref::run_layer(sinks, ref::make_layer_inputs(sinks));
  for (int64_t t = 0; t < 8; ++t) {
    std::set<int32_t> sel(o.topk.data.begin() + t * 8, o.topk.data.begin() + t * 8 + 8);
    CHECK(sel.count(0));
    CHECK(sel.count(1));
  }
  const Problem recent = parse_problem("sq1 skv64 hq2 dqk16 dv8 ih4 id64 k8 seed2 recency=4");
  const ref::LayerOutputs r = ref::run_layer(recent, ref::make_layer_inputs(recent));
  std::set<int32_t> sel(r.topk.data.begin(), r.topk.data.end());
  CHECK(sel.count(63));
  CHECK(*sel.begin() >= 48);
}

TEST_CASE("layer: run_layer is deterministic and selects min(k, causal length) keys") {
  const Problem p = parse_problem("sq12 skv20 hq2 dqk24 dv16 ih4 id16 k5 seed3");
  const ref::LayerInputs in = ref::make_layer_inputs(p);
  const ref::LayerOutputs a = ref::run_layer(p, in), b = ref::run_layer(p, ref::make_layer_inputs(p));
  CHECK(a.logits.data == b.logits.data);
  CHECK(a.topk.data == b.topk.data);
  CHECK(a.attn.out.data == b.attn.out.data);
  for (int64_t t = 0; t < p.s_q; ++t) {
    std::set<int32_t> sel;
    for (int64_t j = 0; j < p.index_topk; ++j) {
      const int32_t v = a.topk.at(t, j);
      if (v >= 0) { REQUIRE(v < in.ke[t]); sel.insert(v); }
      REQUIRE(a.indices[t * p.index_topk + j] == v);  // ks = 0: kv rows equal local positions
    }
    CHECK(int64_t(sel.size()) == std::min<int64_t>(p.index_topk, in.ke[t]));
  }
  Problem p2 = p;
  p2.seed = 4;
  CHECK(ref::run_layer(p2, ref::make_layer_inputs(p2)).attn.out.data != a.attn.out.data);
}

TEST_CASE("layer: with k >= every causal length, the sparse layer equals dense causal attention") {
  for (const char* desc : {"sq8 skv8 hq2 dqk32 dv16 ih2 id16 k8 seed1",
                           "sq5 skv9 hq3 dqk20 dv20 ih2 id8 k64 seed2 indexer=bf16 sink=random"}) {
    CAPTURE(desc);
    const Problem p = parse_problem(desc);
    const ref::LayerInputs in = ref::make_layer_inputs(p);
    const ref::LayerOutputs o = ref::run_layer(p, in);
    const ref::AttentionOut dense =
        ref::dense_attention(in.q, in.kv, p.sm_scale(), p.d_v, in.ks, in.ke, in.sink ? &*in.sink : nullptr);
    CHECK(o.attn.out.data == dense.out.data);
    CHECK(o.attn.lse.data == dense.lse.data);
  }
}

TEST_CASE("layer: fp8 and bf16 indexers mostly agree on the selection") {
  // Same generated q/k values; FP8 quantization perturbs logits by a few percent, so the top-k
  // sets overlap strongly but need not be equal (a sanity check of the two modes' plumbing).
  Problem p = parse_problem("sq16 skv64 hq2 dqk16 dv8 ih8 id64 k16 seed9");
  const ref::LayerOutputs f = ref::run_layer(p, ref::make_layer_inputs(p));
  p.indexer = IndexerMode::bf16;
  const ref::LayerOutputs b = ref::run_layer(p, ref::make_layer_inputs(p));
  int64_t common = 0, total = 0;
  for (int64_t t = 0; t < p.s_q; ++t) {
    std::set<int32_t> sf, sb;
    for (int64_t j = 0; j < p.index_topk; ++j) { sf.insert(f.topk.at(t, j)); sb.insert(b.topk.at(t, j)); }
    for (int32_t v : sf) common += v >= 0 && sb.count(v);
    total += std::count_if(sf.begin(), sf.end(), [](int32_t v) { return v >= 0; });
  }
  CHECK(double(common) / double(total) > 0.8);
}

// drift=: each layer's own indexer inputs are an AR(1) chain across layers (ref/layer.h).
TEST_CASE("layer: drift= chains the layers' own indexer inputs, jumps use jumprho, drift=0 is the independent draw") {
  const Shape qs{4, 2, 16};
  auto q_of = [&](const Problem& p, int l) { return ref::make_layer_inputs(p, l, true).index_q; };
  auto own = [&](const Problem& p, int l) { return ref::generate(p, "layers." + std::to_string(l) + ".indexer.q", qs); };
  // sim=0: the layer's input is its chain value alone, rounded to bf16 (indexer=bf16 keeps it).
  for (const char* extra : {"drift=0.9", "drift=0.9 jumps=1 jumprho=0.25"}) {
    CAPTURE(extra);
    const Problem p = parse_problem(std::string("sq4 skv8 hq2 dqk16 dv8 ih2 id16 k2 seed3 nl3 indexer=bf16 sim=0 ") + extra);
    const float r = p.jumps == 1.0f ? 0.25f : 0.9f, s = float(std::sqrt(1.0 - double(r) * double(r)));
    Tensor<float> c = own(p, 0);
    for (int l = 0; l < 3; ++l) {
      if (l > 0) {
        const Tensor<float> o = own(p, l);
        for (int64_t i = 0; i < c.numel(); ++i) c[i] = r * c[i] + s * o[i];
      }
      const Tensor<float> q = q_of(p, l);
      int64_t same = 0;
      for (int64_t i = 0; i < c.numel(); ++i) same += q[i] == round_bf16(c[i]);
      CHECK(same == c.numel());
    }
  }
  // drift=0 (the default) is the independent draw: layer 2's input is its own stream alone.
  const Problem p0 = parse_problem("sq4 skv8 hq2 dqk16 dv8 ih2 id16 k2 seed3 nl3 indexer=bf16 sim=0");
  const Tensor<float> q2 = q_of(p0, 2), o2 = own(p0, 2);
  for (int64_t i = 0; i < q2.numel(); ++i) CHECK(q2[i] == round_bf16(o2[i]));
}

TEST_CASE("problem: drift, jumps and jumprho parse, print canonically and are refused out of range or alone") {
  const Problem p = parse_problem("sq4 skv8 nl3 drift=0.98 jumps=0.15 jumprho=0.4");
  CHECK(p.drift == 0.98f);
  CHECK(p.jumps == 0.15f);
  CHECK(p.jump_rho == 0.4f);
  // The shortest form that reads back as the same float; an older problem string with 9 digits
  // (as checked-in manifests hold) parses to the same problem.
  CHECK(to_string(p).find(" drift=0.98 jumps=0.15 jumprho=0.4") != std::string::npos);
  CHECK(parse_problem(to_string(p)) == p);
  CHECK(parse_problem("sq4 skv8 nl3 drift=0.980000019 jumps=0.150000006 jumprho=0.400000006") == p);
  const Problem third = parse_problem("sq4 skv8 nl3 drift=0.333333343");  // a float with no short decimal
  CHECK(parse_problem(to_string(third)) == third);
  CHECK(to_string(parse_problem("sq4 skv8")).find("drift") == std::string::npos);
  for (const auto& [text, msg] : std::vector<std::pair<std::string, std::string>>{
           {"drift=1.5", "problem field drift must be in [0, 1]"},
           {"drift=nan", "expected a finite number"},
           {"drift=0.9 jumps=2", "problem field jumps must be in [0, 1]"},
           {"jumps=0.1", "problem field jumps applies with drift > 0 only"},
           {"drift=0.9 jumprho=0.3", "problem field jumprho applies with jumps > 0 only"},
           {"drift=0.9 jumps=0.1 jumprho=-1", "problem field jumprho must be in [0, 1]"}}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(parse_problem("sq4 skv8 nl3 " + text).validate(), doctest::Contains(msg.c_str()), Error);
  }
}
