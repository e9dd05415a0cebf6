// Tests of ref/module: the module-level indexer and absorbed MLA of one DSA layer. Expected values
// are re-derived here from the documented formulas (plain loops in double / long double, RoPE and
// the Hadamard matrix written out), never by calling the module functions under test; the
// lower-level primitives (quantize, block_scale, topk, sparse_attention) are tested elsewhere and
// used here only where the test needs them as given building blocks.
#include "ref/module.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ref/attention.h"
#include "ref/config.h"
#include "ref/error.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "ref/topk.h"

using namespace indexshare;
using namespace indexshare::ref;

namespace {

// bf16 unit roundoff (8 significant bits) and the f32 one.
constexpr double kUbf = 0x1p-8;
constexpr double kU32 = 0x1p-24;

Tensor<float> randn_bf16(const Shape& shape, uint64_t seed, const std::string& name) {
  Tensor<float> t(shape);
  fill(t.ptr(), t.numel(), Dist::normal, 1.0f, seed, stream_tag(name));
  for (float& v : t.data) v = round_bf16(v);
  return t;
}

// Rows [r0, r1) of a tensor (any rank >= 1).
template <typename T>
Tensor<T> rows(const Tensor<T>& a, int64_t r0, int64_t r1) {
  Tensor<T> out;
  out.shape = a.shape;
  out.shape[0] = r1 - r0;
  const int64_t inner = a.numel() / a.dim(0);
  out.data.assign(a.data.begin() + r0 * inner, a.data.begin() + r1 * inner);
  return out;
}

// y = x . w (torch layout row o of w), exact products, double sum ascending, one f32 rounding.
float dot_f32(const float* x, const float* w, int64_t n) {
  double acc = 0.0;
  for (int64_t k = 0; k < n; ++k) acc += double(x[k]) * double(w[k]);
  return float(acc);
}

// RoPE written out from its definition (non-interleaved: pair (j, j + r/2)) and the
// interleaved layout (pair (2j, 2j+1)): angle = f32(pos) * f, cos/sin in double rounded to f32,
// a' = a c - b s, b' = a s + b c with separately rounded f32 products.
void rope_by_hand(float* v, int64_t r, int64_t pos, const std::vector<float>& inv, bool interleaved) {
  for (int64_t j = 0; j < r / 2; ++j) {
    const int64_t ia = interleaved ? 2 * j : j, ib = interleaved ? 2 * j + 1 : j + r / 2;
    const float ang = float(pos) * inv[size_t(j)];
    const float c = float(std::cos(double(ang))), s = float(std::sin(double(ang)));
    const float a = v[ia], b = v[ib];
    const float ac = a * c, bs = b * s, as = a * s, bc = b * c;
    v[ia] = ac - bs;
    v[ib] = as + bc;
  }
}

bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  if (a.shape != b.shape) return false;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}
template <typename T>
bool same_codes(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape == b.shape && a.data == b.data;
}

// Calls f and returns the Error message ("" when nothing was thrown).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct IndexerCase {
  ModelConfig cfg;
  IndexerWeights w;
  Tensor<float> x, qr;
};

IndexerCase indexer_case(const std::string& preset, int64_t S, uint64_t seed) {
  IndexerCase c{model_preset(preset), {}, {}, {}};
  c.w = random_indexer_weights(c.cfg, seed, "layers.0.", 0.5f, "base.");
  c.x = randn_bf16({S, c.cfg.dim}, seed, "test.x");
  c.qr = randn_bf16({S, c.cfg.q_lora_rank}, seed, "test.qr");
  return c;
}

Tensor<int32_t> causal_ke(int64_t S, int64_t start_pos) {
  Tensor<int32_t> ke({S});
  for (int64_t t = 0; t < S; ++t) ke[t] = int32_t(start_pos + t + 1);
  return ke;
}

}  // namespace

// ---- Indexer ----------------------------------------------------------------------------------

TEST_CASE("module: indexer projections, k LayerNorm and RoPE on the leading pe slice") {
  for (const std::string preset : {"tiny-deepseek", "tiny-glm"}) {
    CAPTURE(preset);
    const int64_t S = 6, start_pos = 5;
    IndexerCase c = indexer_case(preset, S, 3);
    const ModelConfig& cfg = c.cfg;
    const int64_t H = cfg.index_n_heads, D = cfg.index_head_dim, R = cfg.qk_rope_head_dim;
    const bool inter = cfg.indexer_rope == RopeLayout::interleaved;
    CHECK(inter == (preset == "tiny-glm"));
    const std::vector<float> inv = cfg.rope_inv_freq();
    const IndexerModuleOut o = indexer_module(cfg, c.w, c.x, c.qr, start_pos, IndexerVariant::deepseek_fp8);
    REQUIRE(o.q_proj.shape == Shape{S, H, D});
    REQUIRE(o.q_rope.shape == Shape{S, H, D});
    REQUIRE(o.k_rope.shape == Shape{S, D});

    int64_t rotated = 0;
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        std::vector<float> want(static_cast<size_t>(D));
        for (int64_t d = 0; d < D; ++d)
          want[size_t(d)] = round_bf16(dot_f32(c.qr.ptr() + t * cfg.q_lora_rank,
                                               c.w.wq_b.ptr() + (h * D + d) * cfg.q_lora_rank, cfg.q_lora_rank));
        for (int64_t d = 0; d < D; ++d) REQUIRE(o.q_proj.at(t, h, d) == want[size_t(d)]);
        // pe FIRST: dims [0, R) rotated, [R, D) bit-identical to the projection.
        rope_by_hand(want.data(), R, start_pos + t, inv, inter);
        for (int64_t d = 0; d < D; ++d) {
          REQUIRE(o.q_rope.at(t, h, d) == round_bf16(want[size_t(d)]));
          if (d >= R) REQUIRE(o.q_rope.at(t, h, d) == o.q_proj.at(t, h, d));
          else rotated += o.q_rope.at(t, h, d) != o.q_proj.at(t, h, d);
        }
      }
      // k: projection, LayerNorm (two passes in double), bf16, then RoPE on dims [0, R).
      std::vector<double> kp(static_cast<size_t>(D));
      for (int64_t d = 0; d < D; ++d) {
        kp[size_t(d)] = round_bf16(dot_f32(c.x.ptr() + t * cfg.dim, c.w.wk.ptr() + d * cfg.dim, cfg.dim));
        REQUIRE(o.k_proj.at(t, d) == float(kp[size_t(d)]));
      }
      double mean = 0, var = 0;
      for (double v : kp) mean += v;
      mean /= double(D);
      for (double v : kp) var += (v - mean) * (v - mean);
      var /= double(D);
      std::vector<float> kn(static_cast<size_t>(D));
      for (int64_t d = 0; d < D; ++d) {
        kn[size_t(d)] = round_bf16(float((kp[size_t(d)] - mean) / std::sqrt(var + double(cfg.index_norm_eps)) *
                                             double(c.w.k_norm_w[d]) + double(c.w.k_norm_b[d])));
        REQUIRE(o.k_norm.at(t, d) == kn[size_t(d)]);
      }
      rope_by_hand(kn.data(), R, start_pos + t, inv, inter);
      for (int64_t d = 0; d < D; ++d) {
        REQUIRE(o.k_rope.at(t, d) == round_bf16(kn[size_t(d)]));
        if (d >= R) REQUIRE(o.k_rope.at(t, d) == o.k_norm.at(t, d));
      }
    }
    CHECK(rotated > S * H * R / 2);  // the rope really moved the pe slice (positions >= 5)
  }
}

TEST_CASE("module: both indexer RoPE layouts reach the indexer and change the top-k") {
  for (const std::string preset : {"tiny-deepseek", "tiny-glm"}) {
    CAPTURE(preset);
    IndexerCase c = indexer_case(preset, 0, 1);
    const int64_t S = c.cfg.seq;  // 64, four times top-k (16)
    REQUIRE(S > c.cfg.index_topk);
    c.x = randn_bf16({S, c.cfg.dim}, 21, "test.x");
    c.qr = randn_bf16({S, c.cfg.q_lora_rank}, 21, "test.qr");
    ModelConfig swapped = c.cfg;
    swapped.indexer_rope = c.cfg.indexer_rope == RopeLayout::half_split ? RopeLayout::interleaved
                                                                         : RopeLayout::half_split;
    const auto v = IndexerVariant::deepseek_fp8;
    const IndexerModuleOut a = indexer_module(c.cfg, c.w, c.x, c.qr, 0, v);
    const IndexerModuleOut b = indexer_module(swapped, c.w, c.x, c.qr, 0, v);
    CHECK(same_bits(a.q_proj, b.q_proj));
    CHECK(same_bits(a.k_norm, b.k_norm));
    CHECK(!same_bits(a.q_rope, b.q_rope));
    CHECK(!same_bits(a.k_rope, b.k_rope));
    // Row 0 is position 0, where RoPE is the identity in both layouts.
    for (int64_t i = 0; i < c.cfg.index_n_heads * c.cfg.index_head_dim; ++i) REQUIRE(a.q_rope[i] == b.q_rope[i]);

    const Tensor<int32_t> ks({S}, 0), ke = causal_ke(S, 0);
    const Tensor<int32_t> ta = topk(indexer_module_logits(a, v, ks, ke), ks, ke, c.cfg.index_topk);
    const Tensor<int32_t> tb = topk(indexer_module_logits(b, v, ks, ke), ks, ke, c.cfg.index_topk);
    int64_t rows_differ = 0;
    for (int64_t t = 0; t < S; ++t) {
      std::set<int32_t> sa, sb;
      for (int64_t j = 0; j < c.cfg.index_topk; ++j) {
        sa.insert(ta.at(t, j));
        sb.insert(tb.at(t, j));
      }
      if (t + 1 <= c.cfg.index_topk) REQUIRE(sa == sb);  // every causal key selected either way
      rows_differ += sa != sb;
    }
    MESSAGE(preset << ": rows whose top-" << c.cfg.index_topk << " set differs between the layouts: "
                   << rows_differ << " of " << S - c.cfg.index_topk);
    CHECK(rows_differ >= 1);
  }
}

TEST_CASE("module: indexer Hadamard equals the Sylvester matrix product, then bf16") {
  const int64_t S = 8;
  IndexerCase c = indexer_case("tiny-deepseek", S, 4);
  const int64_t H = c.cfg.index_n_heads, D = c.cfg.index_head_dim;
  const IndexerModuleOut o = indexer_module(c.cfg, c.w, c.x, c.qr, 2, IndexerVariant::deepseek_fp8);
  const float scale = float(1.0L / std::sqrt((long double)D));  // Python D ** -0.5 as an f32 operand
  // want[i] = bf16( f32(sum_j (-1)^popcount(i & j) x[j]) * scale ), the sum exact in double
  // (D = 32 bf16 terms). The code's f32 butterfly equals the exact sum unless a partial sum needs
  // more than 24 bits (a tiny term next to large ones), where it can differ by one f32 rounding,
  // which can flip the final bf16 by one ulp: allow that, but require nearly all to be bit-exact.
  int64_t total = 0, exact = 0;
  auto check_vec = [&](const float* in, const float* got) {
    for (int64_t i = 0; i < D; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < D; ++j)
        sum += (std::popcount(uint64_t(i & j)) % 2 ? -1.0 : 1.0) * double(in[j]);
      const float want = round_bf16(float(sum) * scale);
      const double ulp = want == 0.0f ? 0x1p-133 : std::ldexp(1.0, std::ilogb(want) - 7);
      REQUIRE(std::fabs(double(got[i]) - double(want)) <= ulp);
      REQUIRE(got[i] == round_bf16(got[i]));
      exact += got[i] == want;
      ++total;
    }
  };
  for (int64_t i = 0; i < S * H; ++i) check_vec(o.q_rope.ptr() + i * D, o.q_hadamard.ptr() + i * D);
  for (int64_t t = 0; t < S; ++t) check_vec(o.k_rope.ptr() + t * D, o.k_hadamard.ptr() + t * D);
  MESSAGE("Hadamard outputs bit-equal to the exact matrix product: " << exact << " of " << total);
  CHECK(exact * 100 >= total * 99);
  CHECK(same_bits(o.q, o.q_hadamard));
  CHECK(same_bits(o.k, o.k_hadamard));
}

TEST_CASE("module: indexer act_quant per head and the head weights formula") {
  for (ScaleRule rule : {ScaleRule::deepseek_ue8m0, ScaleRule::fp32_amax}) {
    CAPTURE(scale_rule_name(rule));
    const int64_t S = 7;
    IndexerCase c = indexer_case("tiny-glm", S, 5);
    c.cfg.index_scale_rule = rule;
    const int64_t H = c.cfg.index_n_heads, D = c.cfg.index_head_dim, dim = c.cfg.dim;
    const IndexerModuleOut o = indexer_module(c.cfg, c.w, c.x, c.qr, 0, IndexerVariant::deepseek_fp8);
    REQUIRE(o.q8.shape == Shape{S, H, D});
    REQUIRE(o.q_scale.shape == Shape{S, H});
    REQUIRE(o.k8.shape == Shape{S, D});
    REQUIRE(o.k_scale.shape == Shape{S});
    REQUIRE(o.weights.shape == Shape{S, H});
    const float h_scale = float(1.0L / std::sqrt((long double)H)), d_scale = float(1.0L / std::sqrt((long double)D));
    bool non_pow2 = false;
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        Tensor<float> head({1, D});
        for (int64_t d = 0; d < D; ++d) head[d] = o.q_hadamard.at(t, h, d);
        const Quantized q = quantize(head, int(D), rule, "test q");
        for (int64_t d = 0; d < D; ++d) REQUIRE(o.q8.at(t, h, d) == q.codes[d]);
        REQUIRE(o.q_scale.at(t, h) == q.scales[0]);
        non_pow2 |= std::bit_cast<uint32_t>(q.scales[0]) & 0x7FFFFFu;
        // weights_proj(x.float()) in f32, then * H^-0.5 * q_scale * D^-0.5 left to right in f32.
        const float wp = dot_f32(c.x.ptr() + t * dim, c.w.weights_proj.ptr() + h * dim, dim);
        const float w1 = wp * h_scale, w2 = w1 * q.scales[0], w3 = w2 * d_scale;
        REQUIRE(o.weights.at(t, h) == w3);
      }
      Tensor<float> krow({1, D});
      for (int64_t d = 0; d < D; ++d) krow[d] = o.k_hadamard.at(t, d);
      const Quantized kq = quantize(krow, int(D), rule, "test k");
      for (int64_t d = 0; d < D; ++d) REQUIRE(o.k8.at(t, d) == kq.codes[d]);
      REQUIRE(o.k_scale[t] == kq.scales[0]);
    }
    CHECK(non_pow2 == (rule == ScaleRule::fp32_amax));  // the config's rule was used

    // hf_bf16: no Hadamard, no FP8; D^-0.5 folded into the weights; unit scales.
    const IndexerModuleOut hf = indexer_module(c.cfg, c.w, c.x, c.qr, 0, IndexerVariant::hf_bf16);
    CHECK(same_bits(hf.q, o.q_rope));
    CHECK(same_bits(hf.k, o.k_rope));
    CHECK(hf.q8.numel() == 0);
    CHECK(hf.k8.numel() == 0);
    CHECK(hf.q_hadamard.numel() == 0);
    REQUIRE(hf.k_scale.shape == Shape{S});
    for (int64_t t = 0; t < S; ++t) {
      REQUIRE(hf.k_scale[t] == 1.0f);
      for (int64_t h = 0; h < H; ++h) {
        const float wp = dot_f32(c.x.ptr() + t * dim, c.w.weights_proj.ptr() + h * dim, dim);
        const float w1 = wp * h_scale, w2 = w1 * d_scale;
        REQUIRE(hf.weights.at(t, h) == w2);
        REQUIRE(hf.q_scale.at(t, h) == 1.0f);
      }
    }
  }
}

TEST_CASE("module: hf_bf16 and deepseek_fp8 indexer logits are close but not identical") {
  for (const std::string preset : {"tiny-deepseek", "tiny-glm"}) {
    CAPTURE(preset);
    IndexerCase c = indexer_case(preset, 0, 9);
    const int64_t S = c.cfg.seq;
    c.x = randn_bf16({S, c.cfg.dim}, 9, "test.x");
    c.qr = randn_bf16({S, c.cfg.q_lora_rank}, 9, "test.qr");
    const Tensor<int32_t> ks({S}, 0), ke = causal_ke(S, 0);
    const IndexerModuleOut f = indexer_module(c.cfg, c.w, c.x, c.qr, 0, IndexerVariant::deepseek_fp8);
    const IndexerModuleOut b = indexer_module(c.cfg, c.w, c.x, c.qr, 0, IndexerVariant::hf_bf16);
    const Tensor<float> lf = indexer_module_logits(f, IndexerVariant::deepseek_fp8, ks, ke);
    const Tensor<float> lb = indexer_module_logits(b, IndexerVariant::hf_bf16, ks, ke);
    REQUIRE(lf.shape == lb.shape);
    long double num = 0, den = 0;
    int64_t differ = 0;
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t s = 0; s < S; ++s) {
        const bool in = s < ke[t];
        REQUIRE(std::isfinite(lf.at(t, s)) == in);
        REQUIRE(std::isfinite(lb.at(t, s)) == in);
        if (!in) continue;
        const long double d = (long double)lf.at(t, s) - lb.at(t, s);
        num += d * d;
        den += (long double)lb.at(t, s) * lb.at(t, s);
        differ += lf.at(t, s) != lb.at(t, s);
      }
    }
    const double rel = double(std::sqrt(num / den));
    MESSAGE(preset << ": relative L2 difference of the logits, deepseek_fp8 vs hf_bf16: " << rel
                   << " (" << differ << " of " << S * (S + 1) / 2 << " entries differ)");
    CHECK(rel > 0);
    CHECK(rel < 0.1);
  }
}

TEST_CASE("module: chunked computation with concatenated keys equals the whole sequence") {
  const int64_t S = 40, S1 = 25;
  IndexerCase c = indexer_case("tiny-deepseek", S, 12);
  const MlaWeights mw = random_mla_weights(c.cfg, 12, "layers.0.", 0.5f, "base.");
  for (IndexerVariant v : {IndexerVariant::deepseek_fp8, IndexerVariant::hf_bf16}) {
    CAPTURE(indexer_variant_name(v));
    const IndexerModuleOut whole = indexer_module(c.cfg, c.w, c.x, c.qr, 0, v);
    const IndexerModuleOut c1 = indexer_module(c.cfg, c.w, rows(c.x, 0, S1), rows(c.qr, 0, S1), 0, v);
    const IndexerModuleOut c2 = indexer_module(c.cfg, c.w, rows(c.x, S1, S), rows(c.qr, S1, S), S1, v);
    const IndexerKeys keys = concat_keys(concat_keys(IndexerKeys{}, indexer_keys(c1)), indexer_keys(c2));
    CHECK(same_codes(keys.k8, whole.k8));
    CHECK(same_bits(keys.k, whole.k));
    CHECK(same_bits(keys.k_scale, whole.k_scale));
    CHECK(same_bits(concat_rows(c1.weights, c2.weights), whole.weights));
    const Tensor<int32_t> ks({S}, 0), ke = causal_ke(S, 0);
    const Tensor<float> lw = indexer_module_logits(whole, v, ks, ke);
    const Tensor<int32_t> ks2({S - S1}, 0), ke2 = causal_ke(S - S1, S1);
    const Tensor<float> l2 = indexer_module_logits(c2, keys, v, ks2, ke2);
    CHECK(same_bits(l2, rows(lw, S1, S)));
  }
  const MlaQuery qw = mla_query(c.cfg, mw, c.x, 0), q2 = mla_query(c.cfg, mw, rows(c.x, S1, S), S1);
  CHECK(same_codes(q2.q, rows(qw.q, S1, S)));
  CHECK(same_bits(q2.qr, rows(qw.qr, S1, S)));
  const Tensor<bf16_t> kw = mla_kv(c.cfg, mw, c.x, 0, true);
  CHECK(same_codes(concat_rows(mla_kv(c.cfg, mw, rows(c.x, 0, S1), 0, true),
                               mla_kv(c.cfg, mw, rows(c.x, S1, S), S1, true)), kw));
}

// ---- MLA ------------------------------------------------------------------------------------

TEST_CASE("module: mla_query is RMSNorm, wq_b, interleaved RoPE on the trailing pe, W_uk absorption") {
  const ModelConfig cfg = model_preset("tiny-deepseek");
  const MlaWeights w = random_mla_weights(cfg, 2, "layers.1.", 0.3f, "base.");
  const int64_t S = 5, start_pos = 9, nh = cfg.n_heads, nope = cfg.qk_nope_head_dim, R = cfg.qk_rope_head_dim,
                v = cfg.v_head_dim, kvl = cfg.kv_lora_rank, qlr = cfg.q_lora_rank, dim = cfg.dim;
  const Tensor<float> x = randn_bf16({S, dim}, 2, "test.x");
  const MlaQuery q = mla_query(cfg, w, x, start_pos);
  REQUIRE(q.q.shape == Shape{S, nh, kvl + R});
  REQUIRE(q.qr.shape == Shape{S, qlr});
  const std::vector<float> inv = cfg.rope_inv_freq();
  for (int64_t t = 0; t < S; ++t) {
    std::vector<double> a(static_cast<size_t>(qlr));
    double ms = 0;
    for (int64_t i = 0; i < qlr; ++i) {
      a[size_t(i)] = round_bf16(dot_f32(x.ptr() + t * dim, w.wq_a.ptr() + i * dim, dim));
      ms += a[size_t(i)] * a[size_t(i)];
    }
    const double denom = std::sqrt(ms / double(qlr) + double(cfg.rms_eps));
    std::vector<float> qr(static_cast<size_t>(qlr));
    for (int64_t i = 0; i < qlr; ++i) {
      qr[size_t(i)] = round_bf16(float(a[size_t(i)] / denom * double(w.q_norm[i])));
      REQUIRE(q.qr.at(t, i) == qr[size_t(i)]);
    }
    for (int64_t h = 0; h < nh; ++h) {
      std::vector<float> qh(static_cast<size_t>(nope + R));
      for (int64_t d = 0; d < nope + R; ++d)
        qh[size_t(d)] = round_bf16(dot_f32(qr.data(), w.wq_b.ptr() + (h * (nope + R) + d) * qlr, qlr));
      for (int64_t n = 0; n < nope; ++n) REQUIRE(q.q_nope.at(t, h, n) == qh[size_t(n)]);
      rope_by_hand(qh.data() + nope, R, start_pos + t, inv, /*interleaved=*/true);
      for (int64_t r = 0; r < R; ++r) REQUIRE(bf16_to_f32(q.q.at(t, h, kvl + r)) == round_bf16(qh[size_t(nope + r)]));
      // q_abs[c] = sum_n q_nope[n] wkv_b[h*(nope+v) + n, c], exact in long double, then within
      // the double -> f32 -> bf16 rounding (2^-8 + 2^-24 relative; 2^-23 covers the rest).
      for (int64_t c = 0; c < kvl; ++c) {
        long double e = 0;
        for (int64_t n = 0; n < nope; ++n)
          e += (long double)qh[size_t(n)] * w.wkv_b.at(h * (nope + v) + n, c);
        const long double got = bf16_to_f32(q.q.at(t, h, c));
        REQUIRE(std::fabs(got - e) <= (kUbf + 0x1p-23) * std::fabs(e) + 1e-30L);
        // ... and exactly the specified sum: double, n ascending, then f32, then bf16.
        double acc = 0.0;
        for (int64_t n = 0; n < nope; ++n) acc += double(qh[size_t(n)]) * double(w.wkv_b.at(h * (nope + v) + n, c));
        REQUIRE(q.q.at(t, h, c).bits == f32_to_bf16(float(acc)).bits);
      }
    }
  }
}

TEST_CASE("module: mla_kv row layout [latent | k_pe] and the FP8 round trip of the latent") {
  for (const std::string preset : {"tiny-deepseek", "tiny-glm"}) {
    CAPTURE(preset);
    const ModelConfig cfg = model_preset(preset);
    const MlaWeights w = random_mla_weights(cfg, 6, "layers.2.", 0.0f, "base.");
    const int64_t S = 9, start_pos = 4, R = cfg.qk_rope_head_dim, kvl = cfg.kv_lora_rank, dim = cfg.dim;
    const Tensor<float> x = randn_bf16({S, dim}, 6, "test.x");
    const Tensor<bf16_t> plain = mla_kv(cfg, w, x, start_pos, false);
    const Tensor<bf16_t> rt = mla_kv(cfg, w, x, start_pos, true);
    REQUIRE(plain.shape == Shape{S, 1, kvl + R});
    REQUIRE(rt.shape == plain.shape);
    const std::vector<float> inv = cfg.rope_inv_freq();
    int64_t changed = 0;
    for (int64_t t = 0; t < S; ++t) {
      std::vector<double> kv(static_cast<size_t>(kvl + R));
      double ms = 0;
      for (int64_t i = 0; i < kvl + R; ++i) {
        kv[size_t(i)] = round_bf16(dot_f32(x.ptr() + t * dim, w.wkv_a.ptr() + i * dim, dim));
        if (i < kvl) ms += kv[size_t(i)] * kv[size_t(i)];
      }
      const double denom = std::sqrt(ms / double(kvl) + double(cfg.rms_eps));
      float amax = 0;
      std::vector<float> lat(static_cast<size_t>(kvl));
      for (int64_t c = 0; c < kvl; ++c) {
        lat[size_t(c)] = round_bf16(float(kv[size_t(c)] / denom * double(w.kv_norm[c])));
        REQUIRE(bf16_to_f32(plain.at(t, 0, c)) == lat[size_t(c)]);
        amax = std::max(amax, std::fabs(lat[size_t(c)]));
      }
      std::vector<float> pe(static_cast<size_t>(R));
      for (int64_t r = 0; r < R; ++r) pe[size_t(r)] = float(kv[size_t(kvl + r)]);
      rope_by_hand(pe.data(), R, start_pos + t, inv, /*interleaved=*/true);
      for (int64_t r = 0; r < R; ++r) {
        REQUIRE(bf16_to_f32(plain.at(t, 0, kvl + r)) == round_bf16(pe[size_t(r)]));
        REQUIRE(rt.at(t, 0, kvl + r) == plain.at(t, 0, kvl + r));  // k_pe is not quantized
      }
      // Round trip: one block (kv_lora = 32 < 128) per row. The e4m3 value of a normal code is
      // within 2^-4 relative (3 mantissa bits, round to nearest); a code below 2^-6 is subnormal
      // with absolute spacing 2^-9, so add half of it times the scale s < 2 max(amax, 1e-4)/448.
      REQUIRE(kvl <= 128);
      const float s = block_scale(amax, cfg.index_scale_rule);
      const double slack = std::ldexp(2.0 * std::max(double(amax), 1e-4) / 448.0, -10);
      for (int64_t c = 0; c < kvl; ++c) {
        const float o = lat[size_t(c)], got = bf16_to_f32(rt.at(t, 0, c));
        REQUIRE(std::fabs(double(got) - double(o)) <= 0x1p-4 * std::fabs(double(o)) + slack);
        REQUIRE(got == e4m3_to_f32(f32_to_e4m3(o / s)) * s);  // the documented quantize/dequantize
        changed += got != o;
      }
    }
    MESSAGE(preset << ": latent entries changed by the FP8 round trip: " << changed << " of " << S * kvl);
    CHECK(changed > 0);
  }
}

TEST_CASE("module: mla_value_up and mla_output follow W_uv and wo") {
  const ModelConfig cfg = model_preset("tiny-glm");
  const MlaWeights w = random_mla_weights(cfg, 8, "layers.0.", 0.5f, "base.");
  const int64_t S = 3, nh = cfg.n_heads, nope = cfg.qk_nope_head_dim, v = cfg.v_head_dim, kvl = cfg.kv_lora_rank;
  Tensor<float> o_lat({S, nh, kvl});
  fill(o_lat.ptr(), o_lat.numel(), Dist::normal, 0.5f, 8, stream_tag("test.o_lat"));  // f32, not bf16
  const Tensor<float> up = mla_value_up(cfg, w, o_lat);
  const Tensor<float> out = mla_output(cfg, w, o_lat);
  REQUIRE(up.shape == Shape{S, nh, v});
  REQUIRE(out.shape == Shape{S, cfg.dim});
  for (int64_t t = 0; t < S; ++t) {
    std::vector<float> flat(static_cast<size_t>(nh * v));
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t j = 0; j < v; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < kvl; ++c)
          acc += double(round_bf16(o_lat.at(t, h, c))) * double(w.wkv_b.at(h * (nope + v) + nope + j, c));
        flat[size_t(h * v + j)] = round_bf16(float(acc));
        REQUIRE(up.at(t, h, j) == flat[size_t(h * v + j)]);
      }
    }
    for (int64_t i = 0; i < cfg.dim; ++i)
      REQUIRE(out.at(t, i) == round_bf16(dot_f32(flat.data(), w.wo.ptr() + i * nh * v, nh * v)));
  }
}

TEST_CASE("module: absorbed MLA equals the non-absorbed MHA form within the derived bound") {
  for (const std::string preset : {"tiny-deepseek", "tiny-glm"}) {
    CAPTURE(preset);
    const ModelConfig cfg = model_preset(preset);
    const MlaWeights w = random_mla_weights(cfg, 13, "layers.0.", 0.0f, "base.");
    const int64_t S = 12, start_pos = 3, nh = cfg.n_heads, nope = cfg.qk_nope_head_dim, R = cfg.qk_rope_head_dim,
                  v = cfg.v_head_dim, kvl = cfg.kv_lora_rank;
    const Tensor<float> x = randn_bf16({S, cfg.dim}, 13, "test.x");
    const MlaQuery q = mla_query(cfg, w, x, start_pos);
    const Tensor<bf16_t> kv = mla_kv(cfg, w, x, start_pos, true);
    // Causal selection of every key: row t sees kv rows 0..t, the rest -1.
    Tensor<int32_t> idx({S, 1, S}, -1);
    for (int64_t t = 0; t < S; ++t)
      for (int64_t s = 0; s <= t; ++s) idx.at(t, 0, s) = int32_t(s);
    const float scale = float(cfg.softmax_scale());
    const AttentionOut att = sparse_attention(q.q, kv, idx, scale, kvl);
    const Tensor<float> got = mla_value_up(cfg, w, att.out);

    // Reference: the MHA form in long double. Per head, k_nope_i = W_uk latent_i, v_i = W_uv
    // latent_i, logit_i = (q_nope . k_nope_i + q_pe . k_pe_i) * scale, softmax, o = sum p_i v_i.
    // q_nope and q_pe are the module's bf16 values (checked against their formula above).
    //
    // Derived bound. In exact arithmetic absorption is an identity (q_nope . (W_uk l) =
    // (q_nope W_uk) . l, and sum p_i W_uv l_i = W_uv sum p_i l_i). The absorbed path rounds:
    //   (1) q_abs to bf16: |e_c| <= u |qabs_c| with u = 2^-8 + 2^-23 (f32 then bf16), so logit i
    //       moves by |d_i| <= D_i = scale u sum_c |qabs_c| |l_ic|;
    //   (2) then p'_i = p_i e^{d_i} / sum_j p_j e^{d_j}, so |p'_i - p_i| <= p_i eps_i with
    //       eps_i = max(e^{D_i} / sum_j p_j e^{-D_j} - 1, 1 - e^{-D_i} / sum_j p_j e^{D_j});
    //   (3) o_lat'_c = sum p'_i l_ic (f32, 2^-24 relative): |o_lat'_c - o_lat_c| <= sum_i eps_i
    //       p_i |l_ic| + 2^-24 |o_lat'_c| =: F_c, and its bf16 rounding adds u (|o_lat_c| + F_c),
    //       giving E_c;
    //   (4) o'_j = sum_c W_uv[j][c] bf16(o_lat'_c): |o'_j - o_j| <= G_j = sum_c |W_uv[j][c]| E_c,
    //       and the final f32 -> bf16 rounding adds u (|o_j| + G_j).
    // The double arithmetic of the kernel and of the sums (~2^-50 relative) is covered by a 1%
    // margin. The logits' own bf16 inputs (q_pe, k_pe, latent) are shared by both forms.
    const long double u = kUbf + 0x1p-23;
    long double worst_ratio = 0, num = 0, den = 0, max_tol_rel = 0;
    for (int64_t t = 0; t < S; ++t) {
      const int64_t n_keys = t + 1;
      for (int64_t h = 0; h < nh; ++h) {
        auto Wuk = [&](int64_t n, int64_t c) { return (long double)w.wkv_b.at(h * (nope + v) + n, c); };
        auto Wuv = [&](int64_t j, int64_t c) { return (long double)w.wkv_b.at(h * (nope + v) + nope + j, c); };
        auto lat = [&](int64_t i, int64_t c) { return (long double)bf16_to_f32(kv.at(i, 0, c)); };
        std::vector<long double> qabs(static_cast<size_t>(kvl), 0);
        for (int64_t c = 0; c < kvl; ++c)
          for (int64_t n = 0; n < nope; ++n) qabs[size_t(c)] += (long double)q.q_nope.at(t, h, n) * Wuk(n, c);
        std::vector<long double> logit(static_cast<size_t>(n_keys)), Dk(static_cast<size_t>(n_keys));
        long double m = -std::numeric_limits<long double>::infinity();
        for (int64_t i = 0; i < n_keys; ++i) {
          long double s = 0, a = 0;
          for (int64_t n = 0; n < nope; ++n) {
            long double kn = 0;
            for (int64_t c = 0; c < kvl; ++c) kn += Wuk(n, c) * lat(i, c);
            s += (long double)q.q_nope.at(t, h, n) * kn;
          }
          for (int64_t r = 0; r < R; ++r)
            s += (long double)bf16_to_f32(q.q.at(t, h, kvl + r)) * bf16_to_f32(kv.at(i, 0, kvl + r));
          for (int64_t c = 0; c < kvl; ++c) a += std::fabs(qabs[size_t(c)]) * std::fabs(lat(i, c));
          logit[size_t(i)] = s * scale;
          Dk[size_t(i)] = scale * u * a;
          m = std::max(m, logit[size_t(i)]);
        }
        std::vector<long double> p(static_cast<size_t>(n_keys));
        long double l = 0;
        for (int64_t i = 0; i < n_keys; ++i) l += (p[size_t(i)] = std::exp(logit[size_t(i)] - m));
        long double sum_lo = 0, sum_hi = 0;
        for (int64_t i = 0; i < n_keys; ++i) {
          p[size_t(i)] /= l;
          sum_lo += p[size_t(i)] * std::exp(-Dk[size_t(i)]);
          sum_hi += p[size_t(i)] * std::exp(Dk[size_t(i)]);
        }
        std::vector<long double> o_lat(static_cast<size_t>(kvl), 0), F(static_cast<size_t>(kvl), 0);
        for (int64_t c = 0; c < kvl; ++c) {
          for (int64_t i = 0; i < n_keys; ++i) {
            const long double eps = std::max(std::exp(Dk[size_t(i)]) / sum_lo - 1, 1 - std::exp(-Dk[size_t(i)]) / sum_hi);
            o_lat[size_t(c)] += p[size_t(i)] * lat(i, c);
            F[size_t(c)] += eps * p[size_t(i)] * std::fabs(lat(i, c));
          }
        }
        for (int64_t c = 0; c < kvl; ++c) {
          F[size_t(c)] += kU32 * (std::fabs(o_lat[size_t(c)]) + F[size_t(c)]);
          F[size_t(c)] += u * (std::fabs(o_lat[size_t(c)]) + F[size_t(c)]);  // now E_c
        }
        for (int64_t j = 0; j < v; ++j) {
          long double o = 0, G = 0;
          for (int64_t c = 0; c < kvl; ++c) {
            o += Wuv(j, c) * o_lat[size_t(c)];
            G += std::fabs(Wuv(j, c)) * F[size_t(c)];
          }
          const long double tol = 1.01L * (G + u * (std::fabs(o) + G)) + 1e-30L;
          const long double err = std::fabs((long double)got.at(t, h, j) - o);
          REQUIRE(err <= tol);
          worst_ratio = std::max(worst_ratio, err / tol);
          max_tol_rel = std::max(max_tol_rel, tol);
          num += err * err;
          den += o * o;
        }
      }
    }
    const double rel = double(std::sqrt(num / den));
    MESSAGE(preset << ": absorbed vs MHA: max err/bound " << double(worst_ratio) << ", largest bound "
                   << double(max_tol_rel) << ", relative L2 error " << rel);
    // The bound is worst case (every rounding aligned). Typical errors add in quadrature, so the
    // overall relative error is a small multiple of u; a wrong head block or slice of wkv_b would
    // give O(1) errors.
    CHECK(rel < 4 * kUbf);
  }
}

// ---- Weights ----------------------------------------------------------------------------------

TEST_CASE("module: random weights follow the similarity mix") {
  const ModelConfig cfg = model_preset("tiny-deepseek");
  const uint64_t seed = 31;
  SUBCASE("shapes") {
    const IndexerWeights iw = random_indexer_weights(cfg, seed, "layers.1.", 0.5f, "base.");
    const MlaWeights mw = random_mla_weights(cfg, seed, "layers.1.", 0.5f, "base.");
    CHECK_NOTHROW(check_indexer_weights(cfg, iw));
    CHECK_NOTHROW(check_mla_weights(cfg, mw));
    CHECK(iw.wq_b.shape == Shape{cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank});
    CHECK(mw.wkv_b.shape == Shape{cfg.n_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank});
    CHECK(mw.wo.shape == Shape{cfg.dim, cfg.n_heads * cfg.v_head_dim});
  }
  SUBCASE("similarity 1: identical for every prefix; 0: independent") {
    const IndexerWeights a1 = random_indexer_weights(cfg, seed, "layers.1.", 1.0f, "base.");
    const IndexerWeights b1 = random_indexer_weights(cfg, seed, "layers.7.", 1.0f, "base.");
    CHECK(same_bits(a1.wq_b, b1.wq_b));
    CHECK(same_bits(a1.wk, b1.wk));
    CHECK(same_bits(a1.k_norm_w, b1.k_norm_w));
    CHECK(same_bits(a1.k_norm_b, b1.k_norm_b));
    CHECK(same_bits(a1.weights_proj, b1.weights_proj));
    const MlaWeights m1 = random_mla_weights(cfg, seed, "layers.1.", 1.0f, "base.");
    const MlaWeights n1 = random_mla_weights(cfg, seed, "layers.7.", 1.0f, "base.");
    for (auto f : {&MlaWeights::wq_a, &MlaWeights::q_norm, &MlaWeights::wq_b, &MlaWeights::wkv_a,
                   &MlaWeights::kv_norm, &MlaWeights::wkv_b, &MlaWeights::wo})
      CHECK(same_bits(m1.*f, n1.*f));
    const IndexerWeights a0 = random_indexer_weights(cfg, seed, "layers.1.", 0.0f, "base.");
    const IndexerWeights b0 = random_indexer_weights(cfg, seed, "layers.7.", 0.0f, "base.");
    CHECK(!same_bits(a0.wq_b, b0.wq_b));
    CHECK(!same_bits(a0.k_norm_b, b0.k_norm_b));
    const MlaWeights m0 = random_mla_weights(cfg, seed, "layers.1.", 0.0f, "base.");
    const MlaWeights n0 = random_mla_weights(cfg, seed, "layers.7.", 0.0f, "base.");
    for (auto f : {&MlaWeights::wq_a, &MlaWeights::q_norm, &MlaWeights::wq_b, &MlaWeights::wkv_a,
                   &MlaWeights::kv_norm, &MlaWeights::wkv_b, &MlaWeights::wo})
      CHECK(!same_bits(m0.*f, n0.*f));
    // Similarity 0: the layer's own stream alone, scaled by fan_in^-0.5.
    Tensor<float> e({cfg.dim});
    fill(e.ptr(), e.numel(), Dist::normal, 1.0f, seed, stream_tag("layers.1.indexer.wk"));
    const float s = float(1.0L / std::sqrt((long double)cfg.dim));
    for (int64_t i = 0; i < cfg.dim; ++i) REQUIRE(a0.wk[i] == round_bf16(s * e[i]));  // row 0 of wk
  }
  SUBCASE("the mix formula and the cross-layer correlation a^2") {
    const float a = 0.6f, b = float(std::sqrt(1.0L - (long double)a * a));  // 0.8
    const IndexerWeights x = random_indexer_weights(cfg, seed, "layers.2.", a, "base.");
    const IndexerWeights y = random_indexer_weights(cfg, seed, "layers.3.", a, "base.");
    const MlaWeights mx = random_mla_weights(cfg, seed, "layers.2.", a, "base.");
    const int64_t D = cfg.index_head_dim;
    Tensor<float> B({D}), E({D});
    fill(B.ptr(), D, Dist::normal, 1.0f, seed, stream_tag("base.indexer.k_norm_w"));
    fill(E.ptr(), D, Dist::normal, 1.0f, seed, stream_tag("layers.2.indexer.k_norm_w"));
    for (int64_t i = 0; i < D; ++i) {
      const float ab = a * B[i], be = b * E[i], mix = ab + be, d = 0.1f * mix;
      REQUIRE(x.k_norm_w[i] == round_bf16(1.0f + d));
    }
    const int64_t n = mx.q_norm.numel();
    Tensor<float> Bq({n}), Eq({n});
    fill(Bq.ptr(), n, Dist::normal, 1.0f, seed, stream_tag("base.mla.q_norm"));
    fill(Eq.ptr(), n, Dist::normal, 1.0f, seed, stream_tag("layers.2.mla.q_norm"));
    for (int64_t i = 0; i < n; ++i) {
      const float ab = a * Bq[i], be = b * Eq[i], mix = ab + be, d = 0.1f * mix;
      REQUIRE(mx.q_norm[i] == round_bf16(1.0f + d));
    }
    // Entry-wise correlation of two layers' wq_b (4096 entries): a^2 = 0.36, sd ~ 0.015.
    long double sxy = 0, sxx = 0, syy = 0;
    for (int64_t i = 0; i < x.wq_b.numel(); ++i) {
      sxy += (long double)x.wq_b[i] * y.wq_b[i];
      sxx += (long double)x.wq_b[i] * x.wq_b[i];
      syy += (long double)y.wq_b[i] * y.wq_b[i];
    }
    const double corr = double(sxy / std::sqrt(sxx * syy));
    MESSAGE("correlation of two layers' indexer.wq_b at similarity 0.6: " << corr);
    CHECK(std::fabs(corr - 0.36) < 0.08);
  }
  SUBCASE("a tensor longer than the mixer's block (its second stream is drawn block by block)") {
    // wq_a [q_lora, dim] with 768 x 1000 = 768000 values: 2.9 blocks of 64 * 4096, the last partial.
    ModelConfig big = cfg;
    big.q_lora_rank = 768;
    big.dim = 1000;
    const float a = 0.6f, b = float(std::sqrt(1.0L - (long double)a * a));
    const MlaWeights mw = random_mla_weights(big, seed, "layers.2.", a, "base.");
    const int64_t n = mw.wq_a.numel();
    REQUIRE(n == 768000);
    Tensor<float> B({n}), E({n});
    fill(B.ptr(), n, Dist::normal, 1.0f, seed, stream_tag("base.mla.wq_a"));
    fill(E.ptr(), n, Dist::normal, 1.0f, seed, stream_tag("layers.2.mla.wq_a"));
    const float s = float(1.0L / std::sqrt((long double)big.dim));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float ab = a * B[i], be = b * E[i], mix = ab + be;
      bad += std::bit_cast<uint32_t>(mw.wq_a[i]) != std::bit_cast<uint32_t>(round_bf16(s * mix));
    }
    CHECK(bad == 0);
  }
  SUBCASE("similarity outside [0, 1] throws") {
    for (float bad : {-0.01f, 1.01f, std::numeric_limits<float>::quiet_NaN()}) {
      CHECK(error_of([&] { random_indexer_weights(cfg, seed, "l.", bad, "b."); }).find("similarity") !=
            std::string::npos);
      CHECK(error_of([&] { random_mla_weights(cfg, seed, "l.", bad, "b."); }).find("similarity") !=
            std::string::npos);
    }
  }
}

// ---- Errors -----------------------------------------------------------------------------------

TEST_CASE("module: shape errors name the tensor") {
  IndexerCase c = indexer_case("tiny-deepseek", 4, 1);
  const ModelConfig& cfg = c.cfg;
  const MlaWeights mw = random_mla_weights(cfg, 1, "layers.0.", 0.5f, "base.");
  const auto v = IndexerVariant::deepseek_fp8;
  auto has = [](const std::string& msg, const std::string& what) {
    INFO("message: '" << msg << "', expected to contain '" << what << "'");
    CHECK(msg.find(what) != std::string::npos);
  };
  has(error_of([&] { indexer_module(cfg, c.w, Tensor<float>({4, cfg.dim + 1}), c.qr, 0, v); }), "indexer_module x");
  has(error_of([&] { indexer_module(cfg, c.w, Tensor<float>({4 * cfg.dim}), c.qr, 0, v); }), "indexer_module x");
  has(error_of([&] { indexer_module(cfg, c.w, c.x, Tensor<float>({3, cfg.q_lora_rank}), 0, v); }),
      "indexer_module qr");
  has(error_of([&] { indexer_module(cfg, c.w, c.x, c.qr, -1, v); }), "start_pos");
  IndexerWeights bad = c.w;
  bad.wk = Tensor<float>({cfg.index_head_dim, cfg.dim - 1});
  has(error_of([&] { indexer_module(cfg, bad, c.x, c.qr, 0, v); }), "indexer wk");
  bad = c.w;
  bad.k_norm_b = Tensor<float>({1});
  has(error_of([&] { indexer_module(cfg, bad, c.x, c.qr, 0, v); }), "indexer k_norm_b");
  const IndexerModuleOut hf = indexer_module(cfg, c.w, c.x, c.qr, 0, IndexerVariant::hf_bf16);
  has(error_of([&] { indexer_module_logits(hf, v, Tensor<int32_t>({4}, 0), causal_ke(4, 0)); }), "q8");
  has(error_of([&] { indexer_module_logits(hf, IndexerVariant::hf_bf16, Tensor<int32_t>({3}, 0), causal_ke(3, 0)); }),
      "indexer ks");

  MlaWeights mb = mw;
  mb.wkv_b = Tensor<float>({1, cfg.kv_lora_rank});
  has(error_of([&] { mla_query(cfg, mb, c.x, 0); }), "mla wkv_b");
  has(error_of([&] { mla_kv(cfg, mw, Tensor<float>({4, 3}), 0, false); }), "mla_kv x");
  has(error_of([&] { mla_query(cfg, mw, Tensor<float>({4, 3}), 0); }), "mla_query x");
  has(error_of([&] { mla_output(cfg, mw, Tensor<float>({4, cfg.n_heads, cfg.kv_lora_rank + 1})); }), "o_lat");
  has(error_of([&] { mla_output(cfg, mw, Tensor<float>({4, cfg.n_heads * cfg.kv_lora_rank})); }), "o_lat");

  has(error_of([&] { concat_rows(Tensor<float>({2, 3}), Tensor<float>({2, 4})); }), "concat_rows");
  has(error_of([&] { parse_indexer_variant("fp4"); }), "fp4");
  CHECK(parse_indexer_variant("hf_bf16") == IndexerVariant::hf_bf16);
  CHECK(parse_indexer_variant(indexer_variant_name(IndexerVariant::deepseek_fp8)) == IndexerVariant::deepseek_fp8);
}
