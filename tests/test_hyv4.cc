// Tests of Hunyuan HY V4's layer (ref/hyv4/): the indexer (LayerNorm'ed keys, RoPE on the trailing
// dims, the head weights' two scales, the causal mask before the top-k) and the gated attention with
// its unscaled sink, each against a brute-force formula written independently here (long double,
// std::cos / std::exp, sorting); planted faults (the leading RoPE slice, the sink scaled) that the
// brute-force checks catch; the hy-v4 schedule in a stack; errors; simd's bits on every target.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "ref/attention.h"
#include "ref/error.h"
#include "ref/hyv4/layer.h"
#include "ref/numerics.h"
#include "ref/schedule.h"
#include "simd/simd.h"
#include "tests/simd_targets.h"

using namespace indexshare;
using namespace indexshare::ref::hyv4;

namespace {

Config small(int64_t s_kv, int64_t topk) {
  Config c;
  c.s_q = c.s_kv = s_kv;
  c.index_topk = topk;
  c.seed = 11;
  return c;
}

using LD = long double;

// The k LayerNorm in long double (biased variance), then the interleaved rotation of the dims
// [off, off + rope) at position pos, angle pos * theta^(-2j / rope).
std::vector<LD> brute_roped(const float* x, int64_t D, int64_t rope, int64_t off, int64_t pos, double theta,
                            const float* w = nullptr, const float* b = nullptr, float eps = 0) {
  std::vector<LD> y(x, x + D);
  if (w) {
    LD mean = 0, var = 0;
    for (LD v : y) mean += v;
    mean /= D;
    for (LD v : y) var += (v - mean) * (v - mean);
    var /= D;
    for (int64_t d = 0; d < D; ++d) y[size_t(d)] = (y[size_t(d)] - mean) / std::sqrt(var + LD(eps)) * w[d] + b[d];
  }
  for (int64_t j = 0; j < rope / 2; ++j) {
    const LD angle = LD(pos) * std::pow(LD(theta), -LD(2 * j) / LD(rope));
    LD& a = y[size_t(off + 2 * j)];
    LD& bb = y[size_t(off + 2 * j + 1)];
    const LD a0 = a, b0 = bb;
    a = a0 * std::cos(angle) - b0 * std::sin(angle);
    bb = a0 * std::sin(angle) + b0 * std::cos(angle);
  }
  return y;
}

// I[t, s] = sum_h raw[t,h] / sqrt(H) / sqrt(D) * ReLU(q_rope[t,h] . k_rope[s]) for s <= p(t).
LD brute_score(const Config& c, const LayerInputs& in, int64_t t, int64_t s, RopeSlice slice) {
  const int64_t D = c.dim, off = slice == RopeSlice::trailing ? D - c.rope : 0, pos = c.s_kv - c.s_q + t;
  const std::vector<LD> k = brute_roped(in.k.ptr() + s * D, D, c.rope, off, s, c.rope_theta, in.k_norm_w.ptr(),
                                        in.k_norm_b.ptr(), c.norm_eps);
  LD acc = 0;
  for (int64_t h = 0; h < c.heads; ++h) {
    const std::vector<LD> q = brute_roped(in.q.ptr() + (t * c.heads + h) * D, D, c.rope, off, pos, c.rope_theta);
    LD dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += q[size_t(d)] * k[size_t(d)];
    acc += LD(in.weights.at(t, h)) / std::sqrt(LD(c.heads)) / std::sqrt(LD(D)) * std::max(dot, LD(0));
  }
  return acc;
}

// Largest |ours - brute| / max(1, |brute|) over the causal entries; also checks -inf elsewhere.
double score_error(const Config& c, const LayerInputs& in, const IndexerOutputs& o, RopeSlice brute_slice) {
  double worst = 0;
  for (int64_t t = 0; t < c.s_q; ++t)
    for (int64_t s = 0; s < c.s_kv; ++s) {
      if (s > c.s_kv - c.s_q + t) {
        CHECK(o.scores.at(t, s) == -std::numeric_limits<float>::infinity());
        continue;
      }
      const LD want = brute_score(c, in, t, s, brute_slice);
      worst = std::max(worst, double(std::fabs(LD(o.scores.at(t, s)) - want) / std::max(LD(1), std::fabs(want))));
    }
  return worst;
}

// The gated output by brute force: softmax over [q.k_i * scale for the selected causal i ; sink]
// (the sink an unscaled logit of a zero value), out = sum p_i V_i, o_v = W_uv out, times sigmoid.
LD brute_gated(const Config& c, const LayerInputs& in, const std::vector<int64_t>& rows, int64_t t, int64_t h,
               int64_t j) {
  std::vector<LD> logit;
  for (int64_t i : rows) {
    LD dot = 0;
    for (int64_t d = 0; d < c.d_qk(); ++d)
      dot += LD(bf16_to_f32(in.attn_q.at(t, h, d))) * LD(bf16_to_f32(in.attn_kv.at(i, 0, d)));
    logit.push_back(dot * LD(c.sm_scale));
  }
  LD m = LD(in.sink[h]);
  for (LD l : logit) m = std::max(m, l);
  LD den = std::exp(LD(in.sink[h]) - m);
  for (LD l : logit) den += std::exp(l - m);
  LD ov = 0;
  for (int64_t lat = 0; lat < c.kv_lora; ++lat) {
    LD out = 0;
    for (size_t r = 0; r < rows.size(); ++r)
      out += std::exp(logit[r] - m) / den * LD(bf16_to_f32(in.attn_kv.at(rows[r], 0, lat)));
    ov += LD(in.w_uv.at(h, j, lat)) * out;
  }
  return ov / (1 + std::exp(-LD(in.gate.at(t, h, j))));
}

double gated_error(const Config& c, const LayerInputs& in, const Tensor<int32_t>& indices, const AttentionOutputs& o) {
  double worst = 0;
  for (int64_t t = 0; t < c.s_q; ++t) {
    std::vector<int64_t> rows;
    for (int64_t j = 0; j < indices.dim(1); ++j)
      if (indices.at(t, j) >= 0) rows.push_back(indices.at(t, j));
    for (int64_t h = 0; h < c.h_q; ++h)
      for (int64_t j = 0; j < c.v_dim; ++j)
        worst = std::max(worst, double(std::fabs(LD(o.gated.at(t, h, j)) - brute_gated(c, in, rows, t, h, j))));
  }
  return worst;
}

}  // namespace

TEST_CASE("hyv4: indexer scores match the brute-force formula (trailing RoPE, LayerNorm, two scales)") {
  const Config c = small(24, 8);
  const LayerInputs in = make_layer_inputs(c, 0);
  const IndexerOutputs o = run_indexer(in.q, in.k, in.k_norm_w, in.k_norm_b, in.weights, indexer_params(c));
  // f32 RoPE angles (f32(pos) * f32 inv_freq) against exact angles: a few 1e-6 at positions < 24.
  CHECK(score_error(c, in, o, RopeSlice::trailing) < 2e-5);
  // Planted fault: the leading slice (DeepSeek-V3.2's layout) is far from HY's formula.
  Config lead = c;
  lead.slice = RopeSlice::leading;
  const IndexerOutputs wrong = run_indexer(in.q, in.k, in.k_norm_w, in.k_norm_b, in.weights, indexer_params(lead));
  CHECK(score_error(c, in, wrong, RopeSlice::trailing) > 1e-2);
  CHECK(score_error(lead, in, wrong, RopeSlice::leading) < 2e-5);
}

TEST_CASE("hyv4: RoPE touches only the trailing slice, and position 0 is the identity") {
  const Config c = small(8, 4);
  const LayerInputs in = make_layer_inputs(c, 0);
  const IndexerOutputs o = run_indexer(in.q, in.k, in.k_norm_w, in.k_norm_b, in.weights, indexer_params(c));
  const int64_t pass = c.dim - c.rope;
  for (int64_t t = 0; t < c.s_q; ++t)
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t d = 0; d < pass; ++d) CHECK(o.q_rope.at(t, h, d) == in.q.at(t, h, d));
      if (t == 0)
        for (int64_t d = pass; d < c.dim; ++d) CHECK(o.q_rope.at(t, h, d) == in.q.at(t, h, d));
    }
  for (int64_t d = 0; d < c.dim; ++d) CHECK(o.k_rope.at(0, d) == o.k_norm.at(0, d));
  bool moved = false;
  for (int64_t d = pass; d < c.dim; ++d) moved |= o.k_rope.at(5, d) != o.k_norm.at(5, d);
  CHECK(moved);
}

TEST_CASE("hyv4: head weights are (raw * 16^-1/2) * 128^-1/2 in f32, in that order") {
  Tensor<float> raw({1, 16});
  for (int64_t h = 0; h < 16; ++h) raw[h] = 0.37f * float(h + 1) - 2.0f;
  const Tensor<float> w = indexer_weights(raw, 128);
  const float inv = float(1.0 / std::sqrt(128.0));
  CHECK(inv == 0.088388346f);
  for (int64_t h = 0; h < 16; ++h) {
    CHECK(w[h] == (raw[h] * 0.25f) * inv);
    CHECK(std::fabs(double(w[h]) - double(raw[h]) / 4.0 / std::sqrt(128.0)) <= 1e-7 * std::fabs(double(raw[h])));
  }
}

TEST_CASE("hyv4: the top-k is the brute-force sort, masked keys are -1") {
  const Config c = small(20, 8);
  const LayerInputs in = make_layer_inputs(c, 0);
  const IndexerOutputs o = run_indexer(in.q, in.k, in.k_norm_w, in.k_norm_b, in.weights, indexer_params(c));
  for (int64_t t = 0; t < c.s_q; ++t) {
    std::vector<int64_t> order(size_t(t + 1));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return o.scores.at(t, a) > o.scores.at(t, b); });
    for (int64_t j = 0; j < c.index_topk; ++j)
      CHECK(o.indices.at(t, j) == (j <= t ? order[size_t(j)] : -1));
  }
}

TEST_CASE("hyv4: gated attention matches the brute-force softmax with an unscaled sink") {
  const Config c = small(16, 6);
  const LayerInputs in = make_layer_inputs(c, 0);
  const LayerOutputs o = run_layer(c, in);
  CHECK(gated_error(c, in, o.indices, o.attn) < 1e-6);
  // Planted fault: the sink multiplied by sm_scale, as if it were a q.k logit.
  Tensor<float> scaled = in.sink;
  for (int64_t h = 0; h < c.h_q; ++h) scaled[h] *= c.sm_scale;
  const AttentionOutputs wrong =
      gated_attention(in.attn_q, in.attn_kv, o.indices, scaled, c.sm_scale, c.kv_lora, &in.w_uv, in.gate);
  CHECK(gated_error(c, in, o.indices, wrong) > 1e-3);
  // gated_bf16 is bf16(gated); lse is the kernel's, without the sink.
  for (int64_t i = 0; i < o.attn.gated.numel(); ++i) CHECK(o.attn.gated_bf16[i] == f32_to_bf16(o.attn.gated[i]));
}

TEST_CASE("hyv4: a top-k covering every key is dense causal attention with the sink, bit for bit") {
  const Config c = small(12, 16);
  const LayerInputs in = make_layer_inputs(c, 0);
  const LayerOutputs o = run_layer(c, in);
  Tensor<int32_t> ks({c.s_q}, 0), ke({c.s_q});
  for (int64_t t = 0; t < c.s_q; ++t) ke[t] = int32_t(t + 1);
  const ref::AttentionOut dense = ref::dense_attention(in.attn_q, in.attn_kv, c.sm_scale, c.kv_lora, ks, ke, &in.sink);
  CHECK(o.attn.attn.out.data == dense.out.data);
  CHECK(o.attn.attn.lse.data == dense.lse.data);
}

TEST_CASE("hyv4: a decode step is the last row of the prefill") {
  const Config c = small(18, 8);
  Config dec = c;
  dec.s_q = 1;
  const LayerOutputs full = run_layer(c, make_layer_inputs(c, 3), 3);
  const LayerOutputs one = run_layer(dec, make_layer_inputs(dec, 3), 3);
  for (int64_t j = 0; j < c.index_topk; ++j) CHECK(one.indices.at(0, j) == full.indices.at(c.s_q - 1, j));
  for (int64_t i = 0; i < one.attn.gated.numel(); ++i)
    CHECK(one.attn.gated[i] == full.attn.gated[(c.s_q - 1) * c.h_q * c.v_dim + i]);
}

TEST_CASE("hyv4: the stack under the hy-v4 schedule shares the last Full layer's indices") {
  const Config c = small(16, 4);
  const Schedule s = schedule_preset("hy-v4", 7);
  REQUIRE(s.pattern() == "FFSSSFS");
  const std::vector<LayerOutputs> out = run_stack(c, s);
  REQUIRE(out.size() == 7);
  for (int l = 0; l < 7; ++l) {
    CAPTURE(l);
    CHECK(out[size_t(l)].full == s.is_full(l));
    CHECK(out[size_t(l)].source == s.source(l));
    CHECK(out[size_t(l)].indexer.has_value() == s.is_full(l));
    CHECK(out[size_t(l)].indices.data == out[size_t(s.source(l))].indices.data);
  }
  CHECK(out[0].indices.data != out[1].indices.data);  // each Full layer its own
  CHECK(out[2].attn.gated.data != out[1].attn.gated.data);  // a Shared layer its own attention inputs
}

TEST_CASE("hyv4: bad inputs name the tensor and field") {
  const Config c = small(8, 4);
  const LayerInputs in = make_layer_inputs(c, 0);
  using simd_test::error_of;
  CHECK(error_of([&] {
    run_indexer(in.q, in.k, in.k_norm_b, Tensor<float>({3}), in.weights, indexer_params(c));
  }).find("k_norm_b") != std::string::npos);
  Tensor<float> q2 = in.q;
  q2.shape = {c.s_q, c.heads * 2, c.dim / 2};
  q2.data.resize(size_t(q2.numel()));
  CHECK(error_of([&] {
    run_indexer(q2, in.k, in.k_norm_w, in.k_norm_b, in.weights, indexer_params(c));
  }).find("head dim") != std::string::npos);
  CHECK(error_of([&] {
    gated_attention(in.attn_q, in.attn_kv, Tensor<int32_t>({c.s_q, 4}, 0), in.sink, c.sm_scale, c.kv_lora, &in.w_uv,
                    Tensor<float>({c.s_q, c.h_q, 3}));
  }).find("gate") != std::string::npos);
  Config bad = c;
  bad.rope = 3;
  CHECK(error_of([&] { bad.validate(); }).find("rope") != std::string::npos);
  bad = c;
  bad.s_q = 9;
  CHECK(error_of([&] { bad.validate(); }).find("s_q") != std::string::npos);
  CHECK(error_of([&] { parse_rope_slice("middle"); }).find("middle") != std::string::npos);
  CHECK(parse_rope_slice(rope_slice_name(RopeSlice::leading)) == RopeSlice::leading);
}

TEST_CASE("hyv4: simd kernels give ref's bits on every target, 1 and 2 threads") {
  Config c = small(40, 16);
  c.kv_lora = 128;
  const Schedule s = schedule_preset("hy-v4", 3);
  const std::vector<LayerOutputs> want = run_stack(c, s);
  simd_test::for_each_target([&](const std::string&, int) {
    const std::vector<LayerOutputs> got = run_stack(c, s, simd::kernels());
    for (size_t l = 0; l < want.size(); ++l) {
      CAPTURE(l);
      CHECK(got[l].indices.data == want[l].indices.data);
      CHECK(simd_test::first_diff(got[l].attn.attn.out, want[l].attn.attn.out) == -1);
      CHECK(simd_test::first_diff(got[l].attn.gated, want[l].attn.gated) == -1);
      CHECK(simd_test::first_diff(got[l].attn.attn.lse, want[l].attn.attn.lse) == -1);
      if (want[l].indexer) CHECK(simd_test::first_diff(got[l].indexer->scores, want[l].indexer->scores) == -1);
    }
  });
}

TEST_CASE("hyv4: the released shapes run (16 x 128 indexer, rope 64, top-2048, 32 heads, v 256)") {
  const Config c = hy_v4_config(48);
  c.validate();
  CHECK(c.d_qk() == 576);
  const LayerOutputs o = run_layer(c, make_layer_inputs(c, 1, true, simd::kernels()), 1, simd::kernels());
  CHECK(o.attn.gated.shape == Shape{48, 32, 256});
  REQUIRE(o.indices.shape == Shape{48, 2048});
  for (int64_t t = 0; t < 48; ++t) {
    CHECK(o.indices.at(t, t) >= 0);          // every causal key is picked (t + 1 <= 2048)
    CHECK(o.indices.at(t, t + 1) == -1);     // then -1
  }
}
