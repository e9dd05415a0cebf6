// Tests of ref/v4 (DeepSeek-V4 compressed sparse attention): every expected value is computed here
// by an independent brute force in long double (slots listed by token, explicit Hadamard matrix,
// a dense softmax with the sink written out, a sort for the top-k), plus invariants (HCA with every
// entry valid is a dense softmax; C4A with top-k >= #blocks equals the all-valid selection; Shared
// layers' blocks are their source's; the V4-Flash schedule counts) and injected faults that the
// checks must catch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "ref/error.h"
#include "ref/module_ops.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "ref/v4/stack.h"

using namespace indexshare;
using namespace indexshare::ref::v4;
using ld = long double;

namespace {

// Brute-force compressor entry (w, c) before the norm: tokens are walked in order over the window
// span, each contributing the half (Ca for the previous window, Cb for its own) the V4 rule gives.
std::vector<ld> brute_pooled(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& bias, int64_t D,
                             int64_t m, bool overlap, int64_t w) {
  std::vector<ld> pooled(static_cast<size_t>(D));
  for (int64_t c = 0; c < D; ++c) {
    std::vector<ld> z, v;
    const int64_t first = overlap ? std::max<int64_t>(0, (w - 1) * m) : w * m;
    for (int64_t tok = first; tok < (w + 1) * m; ++tok) {
      const bool own = tok >= w * m;  // this window's token
      const int64_t col = overlap && own ? D + c : c, slot = tok % m;
      z.push_back(ld(float(gate.at(tok, col) + bias.at(slot, col))));
      v.push_back(kv.at(tok, col));
    }
    const ld mx = *std::max_element(z.begin(), z.end());
    ld sum = 0, acc = 0;
    for (ld x : z) sum += std::exp(x - mx);
    for (size_t j = 0; j < z.size(); ++j) acc += std::exp(z[j] - mx) / sum * v[j];
    pooled[size_t(c)] = acc;
  }
  return pooled;
}

// Brute-force interleaved RoPE (sign +1) or its inverse (sign -1) in long double at position pos.
void brute_rope(std::vector<ld>& x, int64_t off, int rope_dim, int64_t pos, const std::vector<float>& freq, int sign) {
  for (int j = 0; j < rope_dim / 2; ++j) {
    const ld ang = ld(float(pos) * freq[size_t(j)]);
    const ld c = std::cos(ang), s = sign * std::sin(ang);
    const ld a = x[size_t(off + 2 * j)], b = x[size_t(off + 2 * j + 1)];
    x[size_t(off + 2 * j)] = a * c - b * s;
    x[size_t(off + 2 * j + 1)] = a * s + b * c;
  }
}

std::vector<ld> brute_entry(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& bias,
                            const Tensor<float>& norm, const CompressorParams& p, int64_t w) {
  const int64_t D = norm.dim(0);
  std::vector<ld> x = brute_pooled(kv, gate, bias, D, p.ratio, p.overlap, w);
  ld ms = 0;
  for (ld v : x) ms += v * v;
  const ld r = 1 / std::sqrt(ms / D + ld(p.eps));
  for (int64_t c = 0; c < D; ++c) x[size_t(c)] = x[size_t(c)] * r * norm[c];
  brute_rope(x, D - p.rope.rope_dim, p.rope.rope_dim, w * p.ratio, inv_freq(p.rope), +1);
  return x;
}

// max |got - want| over a compressor output against the brute force.
double compressor_error(const Tensor<float>& got, const LayerInputs& in, const CompressorParams& p, bool indexer) {
  const Tensor<float>& kv = indexer ? in.index_kv : in.comp_kv;
  const Tensor<float>& gate = indexer ? in.index_gate : in.comp_gate;
  const Tensor<float>& bias = indexer ? in.index_bias : in.comp_bias;
  const Tensor<float>& norm = indexer ? in.index_norm : in.comp_norm;
  double err = 0;
  for (int64_t w = 0; w < got.dim(0); ++w) {
    const std::vector<ld> want = brute_entry(kv, gate, bias, norm, p, w);
    for (int64_t c = 0; c < got.dim(1); ++c) err = std::max(err, double(std::fabs(got.at(w, c) - want[size_t(c)])));
  }
  return err;
}

LayerInputs csa_inputs(const Config& cfg, int layer = 0) { return make_layer_inputs(cfg, layer, LayerType::csa, true); }

}  // namespace

TEST_CASE("v4 compressor: C4A overlapping windows and HCA windows equal the brute force") {
  const Config cfg = tiny_config();
  const LayerInputs c = csa_inputs(cfg);
  const CompressorParams pc = compressor_params(cfg, LayerType::csa);
  const Tensor<float> e = compress(c.comp_kv, c.comp_gate, c.comp_bias, c.comp_norm, pc);
  CHECK(e.shape == Shape{cfg.n_tokens / 4, cfg.head_dim});
  // f32 roundings of weights, pooled value, norm and RoPE: a few f32 ulps of values of order 1..4.
  CHECK(compressor_error(e, c, pc, false) < 1e-6);
  const Tensor<float> ei = compress(c.index_kv, c.index_gate, c.index_bias, c.index_norm, indexer_compressor_params(cfg));
  CHECK(compressor_error(ei, c, indexer_compressor_params(cfg), true) < 1e-6);
  const LayerInputs h = make_layer_inputs(cfg, 1, LayerType::hca, false);
  const CompressorParams ph = compressor_params(cfg, LayerType::hca);
  const Tensor<float> eh = compress(h.comp_kv, h.comp_gate, h.comp_bias, h.comp_norm, ph);
  CHECK(eh.shape == Shape{cfg.n_tokens / cfg.hca_ratio, cfg.head_dim});
  CHECK(compressor_error(eh, h, ph, false) < 1e-6);

  // Injected faults the check must catch: the halves swapped, window 0 with a previous window
  // (wrapping), the RoPE at position w instead of w m.
  LayerInputs swapped = c;
  for (int64_t t = 0; t < cfg.n_tokens; ++t)
    for (int64_t col = 0; col < cfg.head_dim; ++col) {
      std::swap(swapped.comp_kv.at(t, col), swapped.comp_kv.at(t, cfg.head_dim + col));
      std::swap(swapped.comp_gate.at(t, col), swapped.comp_gate.at(t, cfg.head_dim + col));
    }
  CHECK(compressor_error(compress(swapped.comp_kv, swapped.comp_gate, c.comp_bias, c.comp_norm, pc), c, pc, false) > 1e-2);
  Tensor<float> e_pos(e.shape);
  const std::vector<float> freq = inv_freq(pc.rope);
  for (int64_t w = 0; w < e.dim(0); ++w) {
    compress_window(c.comp_kv, c.comp_gate, c.comp_bias, c.comp_norm, pc, freq, w, e_pos.ptr() + w * cfg.head_dim);
    ref::apply_rope(e_pos.ptr() + w * cfg.head_dim + cfg.head_dim - 16, 16, w, freq, ref::RopeLayout::interleaved);
  }
  CHECK(compressor_error(e_pos, c, pc, false) > 1e-2);
}

TEST_CASE("v4 compressor: only complete windows, causal in the tokens, w = 0 has no previous half") {
  Config cfg = tiny_config();
  const LayerInputs c = csa_inputs(cfg);
  const CompressorParams pc = compressor_params(cfg, LayerType::csa);
  const Tensor<float> full = compress(c.comp_kv, c.comp_gate, c.comp_bias, c.comp_norm, pc);
  // The first 4k + 3 tokens give the first k entries, bit for bit.
  const int64_t T = 4 * 5 + 3;
  auto head = [&](const Tensor<float>& x) {
    Tensor<float> r({T, x.dim(1)});
    std::copy(x.data.begin(), x.data.begin() + T * x.dim(1), r.data.begin());
    return r;
  };
  const Tensor<float> part = compress(head(c.comp_kv), head(c.comp_gate), c.comp_bias, c.comp_norm, pc);
  REQUIRE(part.dim(0) == 5);
  CHECK(std::equal(part.data.begin(), part.data.end(), full.data.begin()));
  // Changing token 9's Ca half changes entry 3 only; its Cb half entry 2 only.
  for (int half = 0; half < 2; ++half) {
    LayerInputs d = c;
    for (int64_t col = 0; col < cfg.head_dim; ++col) d.comp_kv.at(9, half * cfg.head_dim + col) += 1.0f;
    const Tensor<float> e = compress(d.comp_kv, d.comp_gate, d.comp_bias, d.comp_norm, pc);
    for (int64_t w = 0; w < e.dim(0); ++w) {
      const bool same = std::equal(e.data.begin() + w * cfg.head_dim, e.data.begin() + (w + 1) * cfg.head_dim,
                                   full.data.begin() + w * cfg.head_dim);
      CHECK_MESSAGE(same == (w != (half == 0 ? 3 : 2)), "half " << half << " entry " << w);
    }
  }
  // Window 0's Ca slots are absent: an Ca gate of +large on tokens 0-3 changes entry 1, not 0.
  LayerInputs g = c;
  for (int64_t t = 0; t < 4; ++t) g.comp_gate.at(t, 0) = 30.0f;
  const Tensor<float> eg = compress(g.comp_kv, g.comp_gate, g.comp_bias, g.comp_norm, pc);
  CHECK(std::equal(eg.data.begin(), eg.data.begin() + cfg.head_dim, full.data.begin()));
  CHECK(eg.at(1, 0) != full.at(1, 0));
  // Bad input is named.
  LayerInputs bad = c;
  bad.comp_gate.at(2, 5) = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(compress(bad.comp_kv, bad.comp_gate, c.comp_bias, c.comp_norm, pc),
                       doctest::Contains("compressor gate: non-finite value at token 2"), Error);
  CHECK_THROWS_WITH_AS(compress(c.comp_kv, c.comp_gate, c.index_bias, c.comp_norm, pc),
                       doctest::Contains("compressor position_bias"), Error);
}

TEST_CASE("v4 compressor: transformers' bf16 rounding points by name") {
  const Config cfg = tiny_config();
  const LayerInputs c = csa_inputs(cfg);
  CompressorParams pf = compressor_params(cfg, LayerType::csa), pb = pf;
  pb.rounding = parse_rounding("hf");
  CHECK(rounding_name(pb.rounding) == "hf_bf16");
  CHECK(parse_rounding("megatron") == CompressorRounding::f32);
  CHECK_THROWS_WITH_AS(parse_rounding("fp16"), doctest::Contains("unknown value 'fp16'"), Error);
  const Tensor<float> f = compress(c.comp_kv, c.comp_gate, c.comp_bias, c.comp_norm, pf);
  const Tensor<float> b = compress(c.comp_kv, c.comp_gate, c.comp_bias, c.comp_norm, pb);
  REQUIRE(b.shape == f.shape);
  int64_t differ = 0;
  double err = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    CHECK(round_bf16(b[i]) == b[i]);  // every value is a bf16 number
    differ += b[i] != f[i];
    err = std::max(err, double(std::fabs(b[i] - f[i])));
  }
  // bf16 weights, products, pooled value and norm output: a few bf16 ulps of values of order 1..4.
  CHECK(err < 0.06);
  CHECK(differ > b.numel() / 2);
}

TEST_CASE("v4 inverse RoPE undoes the RoPE") {
  const std::vector<float> freq = inv_freq(v4_compress_rope());
  std::vector<float> x(64);
  fill(x.data(), 64, Dist::normal, 1.0f, 3, 4);
  for (int64_t pos : {0, 1, 17, 4095, 100000}) {
    std::vector<float> y = x;
    ref::apply_rope(y.data(), 64, pos, freq, ref::RopeLayout::interleaved);
    if (pos > 0) CHECK(y != x);
    apply_rope_inverse(y.data(), 64, pos, freq);
    for (size_t i = 0; i < 64; ++i) CHECK(std::fabs(y[i] - x[i]) < 2e-6f * (1 + std::fabs(x[i])));
  }
}

namespace {

// Brute-force I [T, n_b] in long double, with the explicit Hadamard matrix when rotating.
std::vector<std::vector<ld>> brute_scores(const LayerInputs& in, const Tensor<float>& K, int64_t m, bool rotate) {
  const int64_t T = in.index_q.dim(0), H = in.index_q.dim(1), D = in.index_q.dim(2), n_b = K.dim(0);
  auto rot = [&](const float* x) {
    std::vector<ld> y(static_cast<size_t>(D));
    for (int64_t i = 0; i < D; ++i) {
      ld s = 0;
      for (int64_t j = 0; j < D; ++j) s += (__builtin_popcountll(uint64_t(i & j)) % 2 ? -1 : 1) * ld(x[j]);
      y[size_t(i)] = rotate ? s / std::sqrt(ld(D)) : ld(x[i]);
    }
    return y;
  };
  std::vector<std::vector<ld>> I(size_t(T), std::vector<ld>(size_t(n_b), -INFINITY));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < n_b && s < (t + 1) / m; ++s) {
      const std::vector<ld> k = rot(K.ptr() + s * D);
      ld acc = 0;
      for (int64_t h = 0; h < H; ++h) {
        const std::vector<ld> q = rot(in.index_q.ptr() + (t * H + h) * D);
        ld dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[size_t(d)] * k[size_t(d)];
        acc += ld(in.index_weights.at(t, h)) * std::max<ld>(dot, 0) / std::sqrt(ld(D));
      }
      I[size_t(t)][size_t(s)] = acc;
    }
  return I;
}

}  // namespace

TEST_CASE("v4 indexer: scores over causally complete blocks, Hadamard by name, top-k with -1") {
  Config cfg = tiny_config();
  const LayerInputs in = csa_inputs(cfg);
  const Tensor<float> K = compress(in.index_kv, in.index_gate, in.index_bias, in.index_norm, indexer_compressor_params(cfg));
  for (const char* name : {"hf", "megatron"}) {
    CAPTURE(name);
    const IndexerRotation r = parse_rotation(name);
    const Tensor<float> I = index_scores(in.index_q, K, in.index_weights, 4, r);
    const auto want = brute_scores(in, K, 4, r == IndexerRotation::hadamard);
    double err = 0;
    int masked = 0;
    for (int64_t t = 0; t < I.dim(0); ++t)
      for (int64_t s = 0; s < I.dim(1); ++s) {
        const ld w = want[size_t(t)][size_t(s)];
        if (std::isinf(w)) {
          masked += std::isinf(I.at(t, s)) && I.at(t, s) < 0;
          continue;
        }
        err = std::max(err, double(std::fabs(I.at(t, s) - w) / (1 + std::fabs(w))));
      }
    CHECK(err < 2e-6);
    // Masked: rows t see blocks s < floor((t + 1) / 4): sum over t of (n_b - that).
    int64_t expect_masked = 0;
    for (int64_t t = 0; t < cfg.n_tokens; ++t) expect_masked += K.dim(0) - std::min<int64_t>((t + 1) / 4, K.dim(0));
    CHECK(masked == expect_masked);
    // Top-k by sorting (score desc, index asc) over the valid blocks, -1 padded, width min(k, n_b).
    for (int64_t topk : {int64_t(1), int64_t(4), int64_t(100)}) {
      const Tensor<int32_t> b = select_blocks(I, 4, topk);
      const int64_t k = std::min(topk, K.dim(0));
      REQUIRE(b.shape == Shape{cfg.n_tokens, k});
      for (int64_t t = 0; t < cfg.n_tokens; ++t) {
        std::vector<int32_t> order((t + 1) / 4 < K.dim(0) ? (t + 1) / 4 : K.dim(0));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t c) { return I.at(t, a) > I.at(t, c); });
        order.resize(size_t(std::min<int64_t>(k, int64_t(order.size()))));
        order.resize(size_t(k), -1);
        CHECK(std::equal(order.begin(), order.end(), b.data.begin() + t * k));
      }
    }
  }
  // The Hadamard matrix is orthogonal, so rotating both q and k leaves every dot product unchanged
  // up to rounding: the two names differ only in the last bits here (the rotation matters once q and
  // k are quantized, e.g. to FP8, which this f32 indexer does not do).
  const Tensor<float> a = index_scores(in.index_q, K, in.index_weights, 4, IndexerRotation::none);
  const Tensor<float> b = index_scores(in.index_q, K, in.index_weights, 4, IndexerRotation::hadamard);
  CHECK(a.data != b.data);
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::isfinite(a[i])) CHECK(std::fabs(a[i] - b[i]) <= 4e-6 * (1 + std::fabs(a[i])));
  CHECK_THROWS_WITH_AS(parse_rotation("walsh"), doctest::Contains("unknown value 'walsh'"), Error);
  // No complete block yet: width 0.
  CHECK(select_blocks(Tensor<float>({3, 0}), 4, 8).shape == Shape{3, 0});
}

namespace {

// Dense attention written out: row t, head h over the kv rows `rows` of kv_full with the sink,
// then the inverse RoPE at t; long double.
std::vector<ld> brute_attention(const Config& cfg, const LayerInputs& in, const Tensor<bf16_t>& kv_full,
                                const std::vector<int64_t>& rows, int64_t t, int64_t h, const RopeParams& rope) {
  const int64_t D = cfg.head_dim;
  std::vector<ld> logit;
  for (int64_t r : rows) {
    ld dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += ld(bf16_to_f32(in.q.at(t, h, d))) * bf16_to_f32(kv_full.at(r, 0, d));
    logit.push_back(dot * cfg.sm_scale());
  }
  const ld mx = *std::max_element(logit.begin(), logit.end());
  ld denom = std::exp(ld(in.sink[h]) - mx);
  for (ld x : logit) denom += std::exp(x - mx);
  std::vector<ld> out(size_t(D), 0);
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t d = 0; d < D; ++d) out[size_t(d)] += std::exp(logit[i] - mx) / denom * bf16_to_f32(kv_full.at(rows[i], 0, d));
  brute_rope(out, D - rope.rope_dim, rope.rope_dim, t, inv_freq(rope), -1);
  return out;
}

double attention_error(const Config& cfg, const LayerInputs& in, const LayerOutputs& o, int64_t hca_ratio_or_0,
                       const RopeParams& rope) {
  double err = 0;
  const int64_t n_c = o.entries.numel() ? o.entries.dim(0) : 0;
  for (int64_t t = 0; t < cfg.n_tokens; ++t) {
    std::vector<int64_t> rows;
    for (int64_t p = std::max<int64_t>(0, t - cfg.window + 1); p <= t; ++p) rows.push_back(p);
    if (hca_ratio_or_0)
      for (int64_t j = 0; j < n_c && j < (t + 1) / hca_ratio_or_0; ++j) rows.push_back(cfg.n_tokens + j);
    for (int64_t h = 0; h < cfg.n_heads; ++h) {
      const std::vector<ld> want = brute_attention(cfg, in, o.kv_full, rows, t, h, rope);
      for (int64_t d = 0; d < cfg.head_dim; ++d)
        err = std::max(err, double(std::fabs(o.attn.out.at(t, h, d) - want[size_t(d)])));
    }
  }
  return err;
}

}  // namespace

TEST_CASE("v4 attention: HCA and SWA equal a dense softmax over window and entries with the sink") {
  const Config cfg = tiny_config();
  const LayerInputs h = make_layer_inputs(cfg, 1, LayerType::hca, false);
  const LayerOutputs oh = run_layer(cfg, h);
  REQUIRE(oh.kv_full.shape == Shape{cfg.n_tokens + cfg.n_tokens / cfg.hca_ratio, 1, cfg.head_dim});
  // The entries in kv_full are bf16 of the compressor's f32 entries.
  CHECK(bf16_to_f32(oh.kv_full.at(cfg.n_tokens + 2, 0, 7)) == round_bf16(oh.entries.at(2, 7)));
  CHECK(attention_error(cfg, h, oh, cfg.hca_ratio, cfg.compress_rope) < 1e-6);
  for (int64_t i = 0; i < oh.attn.out.numel(); ++i) REQUIRE(oh.attn.out_bf16[i] == f32_to_bf16(oh.attn.out[i]));
  // Faults: the inverse RoPE at the main RoPE, an off-by-one causal bound on the entries.
  CHECK(attention_error(cfg, h, oh, cfg.hca_ratio, cfg.main_rope) > 1e-3);
  // The bound (t + 2) / m' instead of (t + 1) / m':
  LayerOutputs bad = oh;
  {
    Tensor<int32_t> idx = oh.indices;
    for (int64_t t = 0; t < cfg.n_tokens; ++t)
      for (int64_t j = 0; j < cfg.n_tokens / cfg.hca_ratio; ++j)
        idx.at(t, 0, cfg.window + j) = j < (t + 2) / cfg.hca_ratio ? int32_t(cfg.n_tokens + j) : -1;
    bad.attn = ref::sparse_attention(h.q, oh.kv_full, idx, cfg.sm_scale(), cfg.head_dim, nullptr, &h.sink);
    const std::vector<float> freq = inv_freq(cfg.compress_rope);
    for (int64_t t = 0; t < cfg.n_tokens; ++t)
      for (int64_t hh = 0; hh < cfg.n_heads; ++hh)
        apply_rope_inverse(&bad.attn.out.at(t, hh, cfg.head_dim - 16), 16, t, freq);
  }
  CHECK(attention_error(cfg, h, bad, cfg.hca_ratio, cfg.compress_rope) > 1e-3);
  // SWA: the window only, main RoPE.
  const LayerInputs s = make_layer_inputs(cfg, 0, LayerType::sliding, false);
  const LayerOutputs os = run_layer(cfg, s);
  CHECK(os.indices.shape == Shape{cfg.n_tokens, 1, cfg.window});
  CHECK(attention_error(cfg, s, os, 0, cfg.main_rope) < 1e-6);
}

TEST_CASE("v4 attention: C4A with top-k >= #blocks equals the all-valid selection, and the indices layout") {
  Config cfg = tiny_config();
  cfg.index_topk = 1000;
  const LayerInputs in = csa_inputs(cfg);
  const LayerOutputs o = run_layer(cfg, in);
  const int64_t n_b = cfg.n_tokens / 4;
  REQUIRE(o.blocks.shape == Shape{cfg.n_tokens, n_b});
  Tensor<int32_t> all({cfg.n_tokens, n_b});
  for (int64_t t = 0; t < cfg.n_tokens; ++t)
    for (int64_t j = 0; j < n_b; ++j) all.at(t, j) = j < (t + 1) / 4 ? int32_t(j) : -1;
  const LayerOutputs a = run_layer(cfg, in, &all);
  CHECK(a.attn.out.data == o.attn.out.data);
  CHECK(a.attn.lse.data == o.attn.lse.data);
  // And that is the dense softmax over window + valid entries (HCA's rule at ratio 4).
  CHECK(attention_error(cfg, in, o, 4, cfg.compress_rope) < 1e-6);
  // Layout: row 10 (W 8): window 3..10, then T + blocks (here blocks 0, 1 valid at t = 10).
  std::vector<int32_t> row10(o.indices.data.begin() + 10 * (cfg.window + n_b), o.indices.data.begin() + 10 * (cfg.window + n_b) + cfg.window);
  CHECK(row10 == std::vector<int32_t>{3, 4, 5, 6, 7, 8, 9, 10});
  const std::vector<int32_t> w0 = {-1, -1, -1, -1, -1, -1, -1, 0};
  CHECK(std::equal(w0.begin(), w0.end(), o.indices.data.begin()));
  std::vector<int32_t> comp10(o.indices.data.begin() + 10 * (cfg.window + n_b) + cfg.window,
                              o.indices.data.begin() + 11 * (cfg.window + n_b));
  std::sort(comp10.begin(), comp10.end());
  CHECK(comp10[comp10.size() - 1] == cfg.n_tokens + 1);
  CHECK(comp10[comp10.size() - 2] == cfg.n_tokens + 0);
  CHECK(comp10[comp10.size() - 3] == -1);
  // A small top-k selects: the attention then differs from the all-valid one.
  Config small = cfg;
  small.index_topk = 1;
  CHECK(run_layer(small, in).attn.out.data != o.attn.out.data);
}

TEST_CASE("v4 schedules: V4-Flash layer types, C4A-only counting, both freq rules") {
  const std::vector<LayerType> t = flash_layer_types();
  REQUIRE(t.size() == 43);
  CHECK(format_layer_types(t).substr(0, 6) == "SSCHCH");
  CHECK(std::count(t.begin(), t.end(), LayerType::csa) == 21);
  CHECK(std::count(t.begin(), t.end(), LayerType::hca) == 20);
  for (int l = 2; l < 43; ++l) CHECK((t[size_t(l)] == LayerType::csa) == (l % 2 == 0));
  for (const char* rule : {"j%f==0", "max(j-1,0)%f"}) {
    const Schedule s = from_freq(t, 2, parse_freq_rule(rule));
    CHECK(s.indexers() == 11);
    CHECK(freq_rule_name(parse_freq_rule(rule)) == rule);
  }
  const ref::v4::Schedule a = from_freq(t, 2, FreqRule::modulo), b = from_freq(t, 2, FreqRule::max_minus_one);
  // C4A ranks j are layers 2 + 2 j. modulo: Full j = 0, 2, ...; max(j-1,0): Full j = 0, 1, 3, 5, ...
  CHECK(a.full(2));
  CHECK(!a.full(4));
  CHECK(a.source[4] == 2);
  CHECK(a.full(6));
  CHECK(b.full(2));
  CHECK(b.full(4));
  CHECK(!b.full(6));
  CHECK(b.source[6] == 4);
  CHECK(a.source[3] == -1);
  CHECK(a.source[0] == -1);
  CHECK(all_full(t).indexers() == 21);
  CHECK(from_freq(t, 1, FreqRule::modulo).indexers() == 21);
  const ref::v4::Schedule p = from_pattern(parse_layer_types("SCHCCH"), "FSF");
  CHECK(p.pattern() == ".F.sF.");
  CHECK(p.source == std::vector<int>{-1, 1, -1, 1, 4, -1});
  CHECK_THROWS_WITH_AS(from_pattern(parse_layer_types("SCHC"), "SF"), doctest::Contains("must start with F"), Error);
  CHECK_THROWS_WITH_AS(from_pattern(parse_layer_types("SCHC"), "F"), doctest::Contains("1 characters for 2 C4A"), Error);
  CHECK_THROWS_WITH_AS(parse_layer_types("SCX"), doctest::Contains("'X' at 2"), Error);
  CHECK_THROWS_WITH_AS(parse_freq_rule("j%f"), doctest::Contains("unknown value"), Error);
}

TEST_CASE("v4 stack: Shared C4A layers take their source's blocks and run no indexer") {
  Config cfg = tiny_config();
  cfg.n_tokens = 32;
  const ref::v4::Schedule s = from_pattern(parse_layer_types("SCHCCHC"), "FSSF");
  const StackOutputs st = run_stack(cfg, s);
  REQUIRE(st.layers.size() == 7);
  CHECK(st.layers[3].blocks.data == st.layers[1].blocks.data);
  CHECK(st.layers[4].blocks.data == st.layers[1].blocks.data);
  CHECK(!st.inputs[3].has_indexer);
  CHECK(st.layers[3].index_scores.numel() == 0);
  CHECK(st.layers[6].index_scores.numel() > 0);
  // Layer 3's own entries and attention (its own kv) differ from layer 1's.
  CHECK(st.layers[3].entries.data != st.layers[1].entries.data);
  // An own indexer would have chosen differently (the layers' indexer inputs are independent).
  const LayerOutputs own = run_layer(cfg, make_layer_inputs(cfg, 3, LayerType::csa, true));
  CHECK(own.blocks.data != st.layers[3].blocks.data);
  // The layer is the stand-alone layer on the same inputs.
  const LayerOutputs one = run_layer(cfg, make_layer_inputs(cfg, 6, LayerType::csa, true));
  CHECK(one.attn.out.data == st.layers[6].attn.out.data);
  CHECK_THROWS_WITH_AS(run_layer(cfg, st.inputs[3]), doctest::Contains("needs indexer inputs"), Error);
}

TEST_CASE("v4 visit_tensors: every tensor of a layer under its golden name") {
  const Config cfg = tiny_config();
  const LayerInputs in = csa_inputs(cfg, 2);
  const LayerOutputs o = run_layer(cfg, in);
  std::vector<std::string> names;
  int64_t inputs = 0;
  visit_tensors(in, o, "layers.2.", [&](const std::string& name, const auto& t, bool input) {
    names.push_back(name);
    inputs += input;
    CHECK(t.numel() > 0);
  });
  CHECK(names.size() == 22);
  CHECK(inputs == 13);
  CHECK(names.front() == "layers.2.attn.q");
  CHECK(std::find(names.begin(), names.end(), "layers.2.indexer.blocks") != names.end());
  // A Shared C4A layer has no indexer tensors but its (borrowed) blocks; an SWA layer no compressor.
  const LayerInputs sh = make_layer_inputs(cfg, 3, LayerType::csa, false);
  names.clear();
  visit_tensors(sh, run_layer(cfg, sh, &o.blocks), "", [&](const std::string& n, const auto&, bool) { names.push_back(n); });
  CHECK(names.size() == 22 - 8);  // six indexer inputs, indexer.entries and indexer.scores
}

TEST_CASE("v4 V4-Flash shapes: one C4A layer runs at real widths") {
  const Config cfg = flash_config(256);
  const LayerInputs in = make_layer_inputs(cfg, 2, LayerType::csa, true);
  CHECK(in.comp_kv.shape == Shape{256, 1024});
  CHECK(in.index_q.shape == Shape{256, 64, 128});
  Config small = cfg;
  small.n_heads = 2;  // keep the test quick: two attention heads
  const LayerInputs in2 = make_layer_inputs(small, 2, LayerType::csa, true);
  const LayerOutputs o = run_layer(small, in2);
  CHECK(o.entries.shape == Shape{64, 512});
  CHECK(o.index_entries.shape == Shape{64, 128});
  CHECK(o.blocks.shape == Shape{256, 64});            // min(512, 64)
  CHECK(o.indices.shape == Shape{256, 1, 128 + 64});
  CHECK(o.attn.out.shape == Shape{256, 2, 512});
  for (float v : o.attn.lse.data) CHECK(std::isfinite(v));
}

// ---- simd: the compressor and the V4 layer through simd::kernels(), on every target, 1 and 2 threads ----

#include <omp.h>

#include "simd/simd.h"
#include "tests/simd_targets.h"

namespace {

bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape == b.shape && (a.numel() == 0 || std::memcmp(a.ptr(), b.ptr(), size_t(a.numel()) * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("v4 simd: the compressor is bit-identical to ref (C4A, HCA, odd widths, extreme gates)") {
  Config cfg = tiny_config();
  cfg.head_dim = 36;  // not a multiple of any vector width: the scalar tail runs too
  cfg.n_tokens = 45;
  cfg.main_rope.rope_dim = cfg.compress_rope.rope_dim = 8;
  const LayerInputs c = csa_inputs(cfg);
  LayerInputs wide = c;
  // Gates far apart: weights near 0 and 1, exp underflow in some slots.
  for (int64_t i = 0; i < wide.comp_gate.numel(); i += 7) wide.comp_gate[i] *= 300.0f;
  const LayerInputs h = make_layer_inputs(cfg, 1, LayerType::hca, false);
  struct Case {
    const LayerInputs* in;
    LayerType type;
  };
  for (const Case& k : {Case{&c, LayerType::csa}, Case{&wide, LayerType::csa}, Case{&h, LayerType::hca}})
   for (CompressorRounding rounding : {CompressorRounding::f32, CompressorRounding::hf_bf16}) {
    CompressorParams p = compressor_params(cfg, k.type);
    p.rounding = rounding;
    const Tensor<float> want = compress(k.in->comp_kv, k.in->comp_gate, k.in->comp_bias, k.in->comp_norm, p);
    simd_test::for_each_target([&](const std::string&, int) {
      CHECK(same_bits(simd::v4_compress(k.in->comp_kv, k.in->comp_gate, k.in->comp_bias, k.in->comp_norm, p), want));
    });
  }
  // Errors are ref's.
  CHECK_THROWS_WITH_AS(simd::v4_compress(c.comp_kv, c.comp_gate, c.index_bias, c.comp_norm, compressor_params(cfg, LayerType::csa)),
                       doctest::Contains("compressor position_bias"), Error);
}

TEST_CASE("v4 simd: a stack through simd::kernels() equals ref's, bit for bit") {
  Config cfg = tiny_config();
  cfg.n_tokens = 40;
  cfg.rotation = IndexerRotation::hadamard;
  const ref::v4::Schedule s = from_freq(parse_layer_types("SCHCHC"), 2, FreqRule::max_minus_one);
  const StackOutputs want = run_stack(cfg, s);
  simd_test::for_each_target([&](const std::string&, int) {
    const StackOutputs got = run_stack(cfg, s, simd::kernels());
    for (size_t l = 0; l < want.layers.size(); ++l) {
      CAPTURE(l);
      CHECK(same_bits(got.layers[l].entries, want.layers[l].entries));
      CHECK(same_bits(got.layers[l].index_scores, want.layers[l].index_scores));
      CHECK(got.layers[l].blocks.data == want.layers[l].blocks.data);
      CHECK(same_bits(got.layers[l].attn.out, want.layers[l].attn.out));
      CHECK(same_bits(got.layers[l].attn.lse, want.layers[l].attn.lse));
    }
  });
}
