// Tests of GLM-5.3's pooled indexer (ref/kpool/): the pooled keys, scores and selection against
// brute-force formulas written independently here (long double, std::exp, sorting), the
// invariants (P = 1 is the token indexer; a top-k over every pool with the tail is dense causal
// attention; the tail rule at every t mod P; Shared layers' lists are their source's; a decode
// step is the last rows of the prefill), the hybrid schedule, errors, and simd's bits on 1 and 2
// threads.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "hwy/targets.h"
#include "ref/attention.h"
#include "ref/error.h"
#include "ref/indexer.h"
#include "ref/kpool/layer.h"
#include "ref/numerics.h"
#include "ref/schedule.h"
#include "ref/topk.h"
#include "simd/simd.h"

using namespace indexshare;
using namespace indexshare::ref::kpool;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

KpoolConfig small(int64_t s_kv, int64_t P, int64_t topk) {
  KpoolConfig c;
  c.s_q = c.s_kv = s_kv;
  c.pool = P;
  c.index_topk = topk;
  c.heads = 4;
  c.dim = 32;
  c.h_q = 2;
  c.d_qk = c.d_v = 64;  // smaller than GLM-5.3's 512 to keep the tests fast; the layer test uses 512
  c.seed = 7;
  return c;
}

// Brute force: Kbar[p, d] with std::exp in long double, softmax over the P slots.
long double brute_kbar(const KpoolLayerInputs& in, int64_t P, int64_t p, int64_t d) {
  long double m = -1e30L, den = 0, num = 0;
  std::vector<long double> z(size_t(P), 0);
  for (int64_t j = 0; j < P; ++j) {
    z[size_t(j)] = (long double)(in.g.at(p * P + j, d) + in.ape.at(j, d));  // the f32 add, as specified
    m = std::max(m, z[size_t(j)]);
  }
  for (int64_t j = 0; j < P; ++j) {
    const long double e = std::exp(z[size_t(j)] - m);
    den += e;
    num += e * in.k.at(p * P + j, d);
  }
  return num / den;
}

// Brute force: I[t, p] = sum_h w ReLU(q . Kbar) / sqrt(D) for a visible pool, else -inf.
float brute_score(const KpoolLayerInputs& in, const Tensor<float>& kbar, int64_t t, int64_t pos, int64_t P, int64_t p) {
  if (p * P + P - 1 > pos) return -kInf;
  const int64_t H = in.q.dim(1), D = in.q.dim(2);
  long double acc = 0;
  for (int64_t h = 0; h < H; ++h) {
    long double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += (long double)in.q.at(t, h, d) * kbar.at(p, d);
    acc += (long double)in.weights.at(t, h) * std::max(dot, 0.0L);
  }
  return float(acc / std::sqrt((long double)D));
}

// Brute force of the selection of row t from the scores: visible pools sorted by (score desc,
// pool asc), the best min(index_topk / P, n_pools) of them expanded, the tail, in a set.
std::set<int32_t> brute_tokens(const Tensor<float>& I, int64_t t, int64_t pos, int64_t P, int64_t topk, bool tail) {
  const int64_t n = I.dim(1);
  std::vector<int64_t> cand;
  for (int64_t p = 0; p < n; ++p)
    if (p * P + P - 1 <= pos) cand.push_back(p);
  std::sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) {
    return I.at(t, a) != I.at(t, b) ? I.at(t, a) > I.at(t, b) : a < b;
  });
  const size_t k = size_t(std::min(topk / P, n));
  std::set<int32_t> s;
  for (size_t i = 0; i < std::min(k, cand.size()); ++i)
    for (int64_t j = 0; j < P; ++j) s.insert(int32_t(cand[i] * P + j));
  if (tail)
    for (int64_t x = pos - (pos + 1) % P + 1; x <= pos; ++x) s.insert(int32_t(x));
  return s;
}

std::set<int32_t> row_set(const Tensor<int32_t>& idx, int64_t t) {
  std::set<int32_t> s;
  for (int64_t c = 0; c < idx.dim(1); ++c)
    if (idx.at(t, c) >= 0) s.insert(idx.at(t, c));
  return s;
}

// Every row of a layer's list against the brute-force selection; the count of mismatching rows.
int mismatching_rows(const KpoolConfig& c, const Tensor<float>& I, const Tensor<int32_t>& idx) {
  int bad = 0;
  for (int64_t t = 0; t < c.s_q; ++t)
    if (row_set(idx, t) != brute_tokens(I, t, c.s_kv - c.s_q + t, c.pool, c.index_topk, c.tail)) ++bad;
  return bad;
}

}  // namespace

TEST_CASE("kpool: pooled keys match the brute-force softmax-weighted sum (f32 spec)") {
  for (int64_t P : {1, 2, 4, 16}) {
    CAPTURE(P);
    const KpoolConfig c = small(64, P, 32);
    const KpoolLayerInputs in = make_kpool_layer_inputs(c, 0);
    const KpoolIndexerOutputs o = run_kpool_indexer(c, in);
    REQUIRE(o.kbar.shape == Shape{64 / P, 32});
    REQUIRE(o.z.shape == Shape{64 / P, P, 32});
    double worst = 0;
    for (int64_t p = 0; p < o.kbar.dim(0); ++p)
      for (int64_t d = 0; d < 32; ++d) {
        const long double b = brute_kbar(in, P, p, d);
        worst = std::max(worst, double(std::fabs(o.kbar.at(p, d) - b) / std::max(std::fabs(b), 1e-3L)));
        for (int64_t j = 0; j < P; ++j) CHECK(o.z.at(p, j, d) == in.g.at(p * P + j, d) + in.ape.at(j, d));
      }
    CHECK(worst < 1e-6);  // one f32 rounding of a double sum: ~6e-8 relative
    if (P == 1)           // a softmax over one slot is exactly 1: the pooled key is the token key
      for (int64_t i = 0; i < o.kbar.numel(); ++i) CHECK(o.kbar[i] == in.k[i]);
  }
}

TEST_CASE("kpool: pool_channel limits (equal logits give the mean, a dominant logit its key)") {
  const float k[4] = {1.0f, 2.0f, 4.0f, 8.0f};
  const float eq[4] = {0.25f, 0.25f, 0.25f, 0.25f};
  CHECK(pool_channel(eq, k, 4, 1, PoolRounding::f32) == 3.75f);
  const float dom[4] = {-200.0f, 0.0f, 300.0f, -1.0f};  // exp(-300) underflows relative to 1
  CHECK(pool_channel(dom, k, 4, 1, PoolRounding::f32) == 4.0f);
  CHECK(pool_channel(dom, k, 4, 1, PoolRounding::hf_bf16) == 4.0f);
  // hf_bf16 with equal logits: a = bf16(0.25) exact, products exact, sum 3.75 exact in bf16.
  CHECK(pool_channel(eq, k, 4, 1, PoolRounding::hf_bf16) == 3.75f);
}

TEST_CASE("kpool: the hf-bf16 rounding is within one bf16 ulp of an f32-softmax emulation") {
  KpoolConfig c = small(64, 4, 32);
  c.rounding = PoolRounding::hf_bf16;
  const KpoolLayerInputs in = make_kpool_layer_inputs(c, 0);
  const Tensor<float> z = pool_logits(in.g, in.ape);
  const Tensor<float> kb = pool_keys(in.k, z, PoolRounding::hf_bf16);
  const Tensor<float> kf = pool_keys(in.k, z, PoolRounding::f32);
  int differ_from_f32 = 0;
  for (int64_t p = 0; p < kb.dim(0); ++p)
    for (int64_t d = 0; d < 32; ++d) {
      // torch's order in f32: softmax with std::exp in float, probabilities to bf16, bf16 products, f32 sum.
      float m = -kInf, den = 0;
      for (int j = 0; j < 4; ++j) m = std::max(m, z.at(p, j, d));
      float e[4];
      for (int j = 0; j < 4; ++j) den += (e[j] = std::exp(z.at(p, j, d) - m));
      float sum = 0;
      for (int j = 0; j < 4; ++j) sum += round_bf16(round_bf16(e[j] / den) * in.k.at(p * 4 + j, d));
      const float want = round_bf16(sum), got = kb.at(p, d);
      CHECK(got == round_bf16(got));  // bf16 values
      const float ulp = std::ldexp(1.0f, std::ilogb(std::max(std::fabs(want), 1e-30f)) - 7);
      CHECK(std::fabs(got - want) <= ulp);
      differ_from_f32 += got != kf.at(p, d);
    }
  CHECK(differ_from_f32 > 0);  // the variant is not the f32 spec in disguise
}

TEST_CASE("kpool: scores match the brute-force formula, -inf before a pool is complete") {
  for (int64_t P : {1, 4, 8}) {
    CAPTURE(P);
    const KpoolConfig c = small(48, P, 16);
    const KpoolLayerInputs in = make_kpool_layer_inputs(c, 1);
    const KpoolIndexerOutputs o = run_kpool_indexer(c, in);
    for (int64_t t = 0; t < c.s_q; ++t)
      for (int64_t p = 0; p < c.n_pools(); ++p) {
        const float want = brute_score(in, o.kbar, t, t, P, p), got = o.scores.at(t, p);
        CHECK(bool(o.valid.at(t, p)) == (want != -kInf));
        if (want == -kInf) CHECK(got == -kInf);
        else CHECK(std::fabs(got - want) <= 1e-6f * std::max(1.0f, std::fabs(want)));
      }
  }
}

TEST_CASE("kpool: the selection equals the brute-force sort, expansion and tail") {
  for (int64_t P : {1, 2, 4, 16})
    for (bool tail : {true, false}) {
      CAPTURE(P);
      CAPTURE(tail);
      KpoolConfig c = small(96, P, 32);
      c.tail = tail;
      const KpoolLayerInputs in = make_kpool_layer_inputs(c, 2);
      const KpoolIndexerOutputs o = run_kpool_indexer(c, in);
      REQUIRE(o.sel.indices.shape == Shape{96, c.width()});
      CHECK(o.sel.select_k == std::min<int64_t>(32 / P, 96 / P));
      CHECK(mismatching_rows(c, o.scores, o.sel.indices) == 0);
      for (int64_t t = 0; t < c.s_q; ++t) {  // no duplicates: the attention counts a duplicate twice
        int64_t n_valid = 0;
        for (int64_t col = 0; col < c.width(); ++col) n_valid += o.sel.indices.at(t, col) >= 0;
        CHECK(int64_t(row_set(o.sel.indices, t).size()) == n_valid);
      }
      // The layout: history in [0, select_k * P), pools ascending inside, the tail right after.
      for (int64_t t = 0; t < c.s_q; ++t) {
        for (int64_t i = 0; i < o.sel.select_k; ++i) {
          const int32_t p = o.sel.pools.at(t, i);
          for (int64_t j = 0; j < P; ++j) CHECK(o.sel.indices.at(t, i * P + j) == (p < 0 ? -1 : p * P + j));
        }
        for (int64_t j = 0; j < (tail ? P - 1 : 0); ++j)
          CHECK(o.sel.indices.at(t, o.sel.select_k * P + j) == o.sel.tail.at(t, j));
      }
    }
}

TEST_CASE("kpool: a planted fault in the selection is caught by the brute-force check") {
  const KpoolConfig c = small(64, 4, 16);
  const KpoolIndexerOutputs o = run_kpool_indexer(c, make_kpool_layer_inputs(c, 0));
  REQUIRE(mismatching_rows(c, o.scores, o.sel.indices) == 0);
  Tensor<int32_t> off = o.sel.indices;  // tail off by one at row 62 (pos 62: tail 60, 61, 62)
  REQUIRE(off.at(62, 4 * 4) == 60);
  off.at(62, 4 * 4) = 59;
  CHECK(mismatching_rows(c, o.scores, off) == 1);
  // The best pool of row 40 swapped for a visible pool it did not select.
  Tensor<int32_t> swapped = o.sel.indices;
  std::set<int32_t> chosen;
  for (int64_t i = 0; i < o.sel.select_k; ++i) chosen.insert(o.sel.pools.at(40, i));
  int32_t other = 0;
  while (chosen.count(other)) ++other;
  REQUIRE(other < o.ke[40]);
  for (int64_t j = 0; j < 4; ++j) swapped.at(40, j) = int32_t(other * 4 + j);
  CHECK(mismatching_rows(c, o.scores, swapped) == 1);
}

TEST_CASE("kpool: the tail rule at every t mod P (the query attended only via its tail or its own pool)") {
  const int64_t P = 4;
  const KpoolConfig c = small(64, P, 8);  // 2 pools of history: the own pool often loses
  const KpoolIndexerOutputs o = run_kpool_indexer(c, make_kpool_layer_inputs(c, 3));
  int closed_lost = 0, closed_won = 0;
  for (int64_t t = 0; t < c.s_q; ++t) {
    const int64_t cnt = (t + 1) % P;
    std::set<int32_t> tail;
    for (int64_t j = 0; j < P - 1; ++j)
      if (o.sel.tail.at(t, j) >= 0) tail.insert(o.sel.tail.at(t, j));
    std::set<int32_t> want;
    for (int64_t x = t - cnt + 1; x <= t; ++x) want.insert(int32_t(x));
    CHECK(tail == want);
    const std::set<int32_t> all = row_set(o.sel.indices, t);
    bool own_pool = false;
    for (int64_t i = 0; i < o.sel.select_k; ++i) own_pool |= o.sel.pools.at(t, i) == t / P && cnt == 0;
    CHECK(bool(all.count(int32_t(t))) == (cnt != 0 || own_pool));
    if (cnt == 0 && t >= 2 * P) (own_pool ? closed_won : closed_lost) += 1;
  }
  CHECK(closed_lost > 0);  // the data exercises both cases of a closed own pool
  CHECK(closed_won > 0);
}

TEST_CASE("kpool: short sequences (s_kv <= index_topk) select every token: dense causal attention") {
  // (s_kv, P, index_topk): s_kv <= index_topk, and 66 > 64 keys whose 16 complete pools all fit the
  // 64-token budget (the 2 keys past them are the last rows' tail).
  for (auto [s_kv, P, topk] : {std::array<int64_t, 3>{64, 1, 64}, {64, 4, 64}, {64, 16, 64}, {66, 4, 64}}) {
    CAPTURE(P);
    CAPTURE(s_kv);
    KpoolConfig c = small(s_kv, P, topk);
    c.d_qk = c.d_v = 512;
    const KpoolLayerInputs in = make_kpool_layer_inputs(c, 0);
    const KpoolLayerOutputs o = run_kpool_layer(c, in);
    for (int64_t t = 0; t < c.s_q; ++t) {
      std::set<int32_t> want;
      for (int32_t x = 0; x <= t; ++x) want.insert(x);
      CHECK(row_set(o.indices, t) == want);
    }
    Tensor<int32_t> ks({c.s_q}, 0), ke({c.s_q});
    for (int64_t t = 0; t < c.s_q; ++t) ke[t] = int32_t(t + 1);
    const ref::AttentionOut dense = ref::dense_attention(in.attn_q, in.attn_kv, c.sm_scale, c.d_v, ks, ke);
    CHECK(o.attn.out.data == dense.out.data);  // bit for bit
    CHECK(o.attn.lse.data == dense.lse.data);
  }
}

TEST_CASE("kpool: P = 1 is the token indexer (scores = indexer_logits_f32, selection = topk)") {
  KpoolConfig c = small(40, 1, 8);
  const KpoolLayerInputs in = make_kpool_layer_inputs(c, 0);
  const KpoolIndexerOutputs o = run_kpool_indexer(c, in);
  Tensor<int32_t> ks({c.s_q}, 0), ke({c.s_q});
  for (int64_t t = 0; t < c.s_q; ++t) ke[t] = int32_t(t + 1);
  const Tensor<float> ksc({c.s_kv}, float(1.0 / std::sqrt(32.0)));
  const Tensor<float> logits = ref::indexer_logits_f32(in.q, in.k, ksc, in.weights, ks, ke);
  CHECK(o.scores.data == logits.data);
  const Tensor<int32_t> tk = ref::topk(logits, ks, ke, 8);
  CHECK(o.sel.indices.data == tk.data);
  CHECK(o.sel.tail.numel() == 0);
}

TEST_CASE("kpool: a decode step (s_q < s_kv) is the last rows of the whole prefill") {
  KpoolConfig full = small(64, 4, 16), dec = full;
  dec.s_q = 5;
  const KpoolLayerOutputs a = run_kpool_layer(full, make_kpool_layer_inputs(full, 1), 1);
  const KpoolLayerOutputs b = run_kpool_layer(dec, make_kpool_layer_inputs(dec, 1), 1);
  for (int64_t t = 0; t < 5; ++t) {
    const int64_t r = 59 + t;
    for (int64_t c = 0; c < full.width(); ++c) CHECK(b.indices.at(t, c) == a.indices.at(r, c));
    for (int64_t p = 0; p < full.n_pools(); ++p) CHECK(b.indexer->scores.at(t, p) == a.indexer->scores.at(r, p));
    for (int64_t i = 0; i < 2 * 64; ++i) CHECK(b.attn.out[t * 128 + i] == a.attn.out[r * 128 + i]);
  }
}

TEST_CASE("kpool: the stack shares whole lists (tail included) over the DSA layers of a hybrid model") {
  const KpoolConfig c = small(48, 4, 16);
  // 12 decoder layers, DSA at 3, 7, 11 (GLM-5.3's layer_types); model-wide kinds F S F S ... where
  // the DSA layers get F, S, F via the explicit list.
  const std::vector<bool> dsa = glm53_dsa_layers(12);
  CHECK(dsa == std::vector<bool>{false, false, false, true, false, false, false, true, false, false, false, true});
  std::vector<LayerKind> kinds(12, LayerKind::full);
  kinds[7] = LayerKind::shared;
  kinds[0] = LayerKind::shared;  // a KDA layer: ignored
  const Schedule s = dsa_schedule(kinds, dsa);
  CHECK(s.pattern() == "FSF");
  const std::vector<KpoolLayerOutputs> out = run_kpool_stack(c, {dsa, s});
  REQUIRE(out.size() == 3);
  CHECK(out[0].model_layer == 3);
  CHECK(out[1].model_layer == 7);
  CHECK((!out[1].full && out[1].source == 3 && !out[1].indexer));
  CHECK(out[1].indices.data == out[0].indices.data);  // verbatim, tail included
  CHECK(out[2].full);
  CHECK(out[2].indices.data != out[0].indices.data);
  // Each layer attends with its own inputs: the Shared layer equals its own attention over the list.
  const KpoolLayerInputs in7 = make_kpool_layer_inputs(c, 7, false);
  CHECK(kpool_attention(c, in7, out[0].indices).out.data == out[1].attn.out.data);
  CHECK(out[1].attn.out.data != out[0].attn.out.data);
  // The freq rule over all layer indices (transformers) picks the DSA layers' entries.
  const Schedule all = schedule_from_freq(12, 8, 4);  // full 0, 3, 11
  CHECK(dsa_schedule(all.kinds, dsa).pattern() == "FSF");
  CHECK_THROWS_WITH_AS(dsa_schedule(schedule_from_freq(12, 4, 1).kinds, dsa),
                       doctest::Contains("first DSA layer is shared"), Error);
}

TEST_CASE("kpool: bad inputs name the tensor and field") {
  KpoolConfig c = small(32, 4, 18);
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("index_topk"), Error);
  c = small(32, 4, 16);
  c.s_q = 40;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("s_q"), Error);
  c = small(32, 4, 16);
  KpoolLayerInputs in = make_kpool_layer_inputs(c, 0);
  in.g.at(5, 3) = std::nanf("");
  CHECK_THROWS_WITH_AS(run_kpool_indexer(c, in), doctest::Contains("kpool g: non-finite"), Error);
  in = make_kpool_layer_inputs(c, 0);
  in.ape = Tensor<float>({3, 32});
  CHECK_THROWS_WITH_AS(run_kpool_indexer(c, in), doctest::Contains("kpool ape"), Error);
  CHECK_THROWS_WITH_AS(parse_rounding("bf16"), doctest::Contains("unknown 'bf16'"), Error);
  CHECK_THROWS_WITH_AS(run_kpool_indexer(c, make_kpool_layer_inputs(c, 0, false)),
                       doctest::Contains("no indexer inputs"), Error);
}

TEST_CASE("kpool: fewer keys than one pool select only the tail") {
  KpoolConfig c = small(3, 4, 16);
  const KpoolIndexerOutputs o = run_kpool_indexer(c, make_kpool_layer_inputs(c, 0));
  CHECK(o.kbar.shape == Shape{0, 32});
  CHECK(o.sel.select_k == 0);
  for (int64_t t = 0; t < 3; ++t) {
    std::set<int32_t> want;
    for (int32_t x = 0; x <= t; ++x) want.insert(x);
    CHECK(row_set(o.sel.indices, t) == want);
  }
}

TEST_CASE("kpool: SGLang's FP8 pooled keys (bf16, Hadamard, bf16, one scale per key) dequantize close") {
  const KpoolConfig c = small(64, 4, 16);
  const KpoolIndexerOutputs o = run_kpool_indexer(c, make_kpool_layer_inputs(c, 0));
  for (bool pow2 : {false, true}) {
    const PooledFp8 f = sglang_pooled_fp8(o.kbar, pow2);
    for (int64_t p = 0; p < f.codes.dim(0); ++p) {
      if (pow2) CHECK(f.scale[p] == pow2_ceil(f.scale[p]));
      // Undo the rotation (H / sqrt(n) is its own inverse) and compare with Kbar.
      std::vector<float> back(32);
      for (int64_t d = 0; d < 32; ++d) back[size_t(d)] = e4m3_to_f32(f.codes.at(p, d)) * f.scale[p];
      ref::hadamard_transform(back.data(), 32);
      float amax = 0;
      for (int64_t d = 0; d < 32; ++d) amax = std::max(amax, std::fabs(o.kbar.at(p, d)));
      for (int64_t d = 0; d < 32; ++d) CHECK(std::fabs(back[size_t(d)] - o.kbar.at(p, d)) <= 0.15f * amax);
    }
  }
}

TEST_CASE("kpool: simd kernels give ref's bits on 1 and 2 threads") {
  KpoolConfig c = small(80, 4, 16);
  c.d_qk = c.d_v = 512;
  const int threads = omp_get_max_threads();
  const std::vector<KpoolLayerOutputs> want =
      run_kpool_stack(c, {std::vector<bool>(3, true), schedule_from_pattern("FSF")});
  for (int n : {1, 2}) {
    CAPTURE(n);
    omp_set_num_threads(n);
    const std::vector<KpoolLayerOutputs> got =
        run_kpool_stack(c, {std::vector<bool>(3, true), schedule_from_pattern("FSF")}, simd::kernels());
    for (size_t l = 0; l < 3; ++l) {
      CHECK(got[l].indices.data == want[l].indices.data);
      CHECK(got[l].attn.out.data == want[l].attn.out.data);
      CHECK(got[l].attn.lse.data == want[l].attn.lse.data);
      if (want[l].indexer) {
        CHECK(got[l].indexer->kbar.data == want[l].indexer->kbar.data);
        CHECK(got[l].indexer->scores.data == want[l].indexer->scores.data);
      }
    }
  }
  omp_set_num_threads(threads);
}

TEST_CASE("kpool: simd pooled keys are bit-identical to ref on every target, 1 and 2 threads") {
  const int threads = omp_get_max_threads();
  for (int64_t P : {1, 3, 4, 16})
    for (int64_t D : {32, 37}) {  // 37: the channels past the last full vector take the scalar path
      CAPTURE(P);
      CAPTURE(D);
      KpoolConfig c = small(P * 70 + 1, P, 16 * P);
      c.dim = D;
      const KpoolLayerInputs in = make_kpool_layer_inputs(c, 0);
      Tensor<float> z = pool_logits(in.g, in.ape);
      for (int64_t i = 0; i < z.numel(); i += 7) z[i] *= 40.0f;  // wide logits: exp far from 1
      for (PoolRounding r : {PoolRounding::f32, PoolRounding::hf_bf16}) {
        const Tensor<float> want = pool_keys(in.k, z, r);
        for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
          hwy::SetSupportedTargetsForTest(target);
          CAPTURE(hwy::TargetName(target));
          for (int n : {1, 2}) {
            omp_set_num_threads(n);
            CHECK(simd::kpool_pool_keys(in.k, z, r).data == want.data);
          }
        }
        hwy::SetSupportedTargetsForTest(0);
      }
    }
  omp_set_num_threads(threads);
  Tensor<float> k({8, 4}, 1.0f), z({2, 4, 4}, 0.0f);
  z[3] = std::nanf("");  // non-finite: ref's result (no check in pool_keys itself), the same bits
  CHECK(simd::kpool_pool_keys(k, z, PoolRounding::f32).data.size() == 8);
}
