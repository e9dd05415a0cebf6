// Tests of ref/attention: an independent long-double softmax written here, the FlashMLA edge
// semantics (invalid indices anywhere, duplicates, empty rows, sinks, topk_length), slot-order
// invariance, and sparse == dense when every key is selected.
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <vector>

#include "ref/attention.h"
#include "ref/numerics.h"
#include "ref/rng.h"

using namespace indexshare;

namespace {
const float kInf = std::numeric_limits<float>::infinity();

struct Data {
  Tensor<bf16_t> q, kv;
};
Data make(int64_t s_q, int64_t h_q, int64_t s_kv, int64_t d_qk, uint64_t seed) {
  Data d{Tensor<bf16_t>({s_q, h_q, d_qk}), Tensor<bf16_t>({s_kv, 1, d_qk})};
  Tensor<float> a({s_q, h_q, d_qk}), b({s_kv, 1, d_qk});
  fill(a.ptr(), a.numel(), Dist::normal, 1.0f, seed, 1);
  fill(b.ptr(), b.numel(), Dist::normal, 1.0f, seed, 2);
  for (int64_t i = 0; i < a.numel(); ++i) d.q[i] = f32_to_bf16(a[i]);
  for (int64_t i = 0; i < b.numel(); ++i) d.kv[i] = f32_to_bf16(b[i]);
  return d;
}
Tensor<int32_t> idx(int64_t s_q, std::vector<int32_t> v) {
  Tensor<int32_t> t({s_q, 1, int64_t(v.size()) / s_q});
  t.data = std::move(v);
  return t;
}
// Independent naive attention for one (t, h) over a list of kv rows, in long double.
struct Naive { std::vector<long double> out; long double lse, max; };
Naive naive(const Data& d, int64_t t, int64_t h, const std::vector<int32_t>& rows, float sm, int64_t d_v) {
  const int64_t d_qk = d.q.dim(2);
  std::vector<long double> p;
  long double m = -INFINITY;
  for (int32_t r : rows) {
    long double dot = 0;
    for (int64_t c = 0; c < d_qk; ++c) dot += (long double)bf16_to_f32(d.q.at(t, h, c)) * bf16_to_f32(d.kv[r * d_qk + c]);
    p.push_back(dot * sm);
    m = std::max(m, p.back());
  }
  long double l = 0;
  for (long double v : p) l += std::exp(v - m);
  Naive n{std::vector<long double>(size_t(d_v), 0), m + std::log(l), m};
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < d_v; ++c) n.out[size_t(c)] += std::exp(p[i] - m) / l * bf16_to_f32(d.kv[rows[i] * d_qk + c]);
  return n;
}
// Bound for one f32 output against the long-double value: the final rounding to f32 (half an
// ulp, 2^-24 |x|, doubled to one ulp for the rounding of the double intermediate) plus double
// rounding through d_qk-term dots, exp and the k-term sums: about (d_qk + k + 8) 2^-53 relative
// to the magnitudes involved, which `scale` (max |V| or |lse|) bounds; a factor 4 of slack.
bool close(float got, long double want, long double scale, int64_t terms) {
  return std::fabs((long double)got - want) <= std::ldexp(std::fabs(want), -23) + 4 * (terms + 8) * std::ldexp(scale, -53);
}
}  // namespace

TEST_CASE("attention: sparse outputs match an independent long-double softmax") {
  const int64_t s_q = 5, h_q = 3, s_kv = 19, d_qk = 40, d_v = 32;
  Data d = make(s_q, h_q, s_kv, d_qk, 3);
  const float sm = 0.2f;
  Tensor<int32_t> ind = idx(s_q, {0, 3, 7, 18, 2, 4, 5, 6, 8, 9, 18, 17, 16, 15, 14, 1, 1, 1, 1, 1, 11, 12, 13, 10, 0});
  ref::AttentionOut o = ref::sparse_attention(d.q, d.kv, ind, sm, d_v);
  CHECK(o.out.shape == Shape{s_q, h_q, d_v});
  CHECK(o.lse.shape == Shape{s_q, h_q});
  for (int64_t t = 0; t < s_q; ++t) {
    std::vector<int32_t> rows(ind.data.begin() + t * 5, ind.data.begin() + t * 5 + 5);
    for (int64_t h = 0; h < h_q; ++h) {
      Naive n = naive(d, t, h, rows, sm, d_v);
      long double vmax = 0;
      for (int32_t r : rows) for (int64_t c = 0; c < d_v; ++c) vmax = std::max(vmax, (long double)std::fabs(bf16_to_f32(d.kv[r * d_qk + c])));
      for (int64_t c = 0; c < d_v; ++c) REQUIRE(close(o.out.at(t, h, c), n.out[size_t(c)], vmax, d_qk + 5));
      REQUIRE(close(o.lse.at(t, h), n.lse, std::fabs(n.lse) + std::fabs(n.max), d_qk + 5));
      REQUIRE(close(o.max_logits.at(t, h), n.max, std::fabs(n.max), d_qk));
      for (int64_t c = 0; c < d_v; ++c) REQUIRE(o.out_bf16.at(t, h, c) == f32_to_bf16(o.out.at(t, h, c)));
    }
  }
}

TEST_CASE("attention: invalid indices are ignored wherever they sit, duplicates count twice") {
  const int64_t s_kv = 9, d_qk = 16, d_v = 8;
  Data d = make(1, 2, s_kv, d_qk, 5);
  auto run = [&](std::vector<int32_t> v) { return ref::sparse_attention(d.q, d.kv, idx(1, v), 0.3f, d_v); };
  const ref::AttentionOut base = run({2, 5, 7});
  // Leading, middle and trailing -1, other negatives and values >= s_kv give the same bits.
  for (auto v : std::vector<std::vector<int32_t>>{{-1, 2, 5, 7}, {2, -1, 5, 7}, {2, 5, 7, -1},
                                                   {INT_MIN, 2, 9, 5, -123456, 7, INT_MAX, 114514}}) {
    ref::AttentionOut o = run(v);
    CHECK(o.out.data == base.out.data);
    CHECK(o.lse.data == base.lse.data);
    CHECK(o.max_logits.data == base.max_logits.data);
  }
  // Slot order carries no meaning: any permutation gives the same bits.
  CHECK(run({7, 2, 5}).out.data == base.out.data);
  // A duplicate counts once per occurrence: compare with the naive formula over {2, 5, 5, 7}.
  ref::AttentionOut dup = run({5, 2, 5, 7});
  CHECK(dup.out.data != base.out.data);
  for (int64_t h = 0; h < 2; ++h) {
    Naive n = naive(d, 0, h, {2, 5, 5, 7}, 0.3f, d_v);
    for (int64_t c = 0; c < d_v; ++c) CHECK(close(dup.out.at(0, h, c), n.out[size_t(c)], 8, d_qk + 4));
    CHECK(close(dup.lse.at(0, h), n.lse, std::fabs(n.lse) + std::fabs(n.max), d_qk + 4));
  }
}

TEST_CASE("attention: empty rows, attention sink and topk_length") {
  const int64_t s_kv = 6, d_qk = 8, d_v = 4, h_q = 3;
  Data d = make(2, h_q, s_kv, d_qk, 7);
  Tensor<int32_t> ind = idx(2, {-1, -1, 6, 1, 3, 4});
  SUBCASE("a row without a valid index: out 0, lse +inf, max_logits -inf") {
    ref::AttentionOut o = ref::sparse_attention(d.q, d.kv, ind, 0.5f, d_v);
    for (int64_t h = 0; h < h_q; ++h) {
      CHECK(o.lse.at(0, h) == kInf);
      CHECK(o.max_logits.at(0, h) == -kInf);
      for (int64_t c = 0; c < d_v; ++c) CHECK(o.out.at(0, h, c) == 0.0f);
      CHECK(std::isfinite(o.lse.at(1, h)));
    }
  }
  SUBCASE("sink: +inf zeroes out, -inf changes nothing, finite scales by 1/(1+exp(sink-lse))") {
    ref::AttentionOut plain = ref::sparse_attention(d.q, d.kv, ind, 0.5f, d_v);
    Tensor<float> sink({h_q});
    sink.data = {kInf, -kInf, 0.25f};
    ref::AttentionOut o = ref::sparse_attention(d.q, d.kv, ind, 0.5f, d_v, nullptr, &sink);
    CHECK(o.lse.data == plain.lse.data);              // lse never includes the sink
    CHECK(o.max_logits.data == plain.max_logits.data);
    for (int64_t c = 0; c < d_v; ++c) {
      CHECK(o.out.at(1, 0, c) == 0.0f);
      CHECK(o.out.at(1, 1, c) == plain.out.at(1, 1, c));
      const double f = 1.0 / (1.0 + std::exp(0.25 - double(plain.lse.at(1, 2))));
      CHECK(std::fabs(o.out.at(1, 2, c) - plain.out.at(1, 2, c) * f) <= 1e-6 * std::fabs(plain.out.at(1, 2, c)) + 1e-12);
      CHECK(o.out.at(0, 2, c) == 0.0f);                // empty rows stay 0 with any sink
    }
  }
  SUBCASE("topk_length truncates each row; bad lengths are refused") {
    Tensor<int32_t> len({2});
    len.data = {3, 1};
    ref::AttentionOut o = ref::sparse_attention(d.q, d.kv, ind, 0.5f, d_v, &len);
    ref::AttentionOut one = ref::sparse_attention(d.q, d.kv, idx(2, {-1, -1, -1, 1, -1, -1}), 0.5f, d_v);
    CHECK(o.out.data == one.out.data);
    CHECK(o.lse.data == one.lse.data);
    len.data = {3, 4};
    CHECK_THROWS_WITH_AS(ref::sparse_attention(d.q, d.kv, ind, 0.5f, d_v, &len),
                         doctest::Contains("topk_length: row 1"), Error);
    len.data = {-1, 0};
    CHECK_THROWS_AS(ref::sparse_attention(d.q, d.kv, ind, 0.5f, d_v, &len), Error);
  }
}

TEST_CASE("attention: sparse equals dense bit for bit when every causal key is selected") {
  const int64_t s_q = 7, s_kv = 12, h_q = 2, d_qk = 24, d_v = 16;
  Data d = make(s_q, h_q, s_kv, d_qk, 9);
  Tensor<int32_t> ks({s_q}, 0), ke({s_q});
  for (int64_t t = 0; t < s_q; ++t) ke[t] = int32_t(s_kv - s_q + t + 1);
  // Indices: every causal key of the row in a scrambled order, padded with -1 to topk = 16.
  Tensor<int32_t> ind({s_q, 1, 16}, -1);
  for (int64_t t = 0; t < s_q; ++t)
    for (int32_t j = 0; j < ke[t]; ++j) ind[t * 16 + j] = int32_t((ke[t] - 1 - j + t) % ke[t]);
  for (int64_t t = 0; t < s_q; ++t) {  // the scrambled rows are a permutation of [0, ke)
    std::vector<int32_t> r(ind.data.begin() + t * 16, ind.data.begin() + t * 16 + ke[t]);
    std::sort(r.begin(), r.end());
    for (int32_t j = 0; j < ke[t]; ++j) REQUIRE(r[size_t(j)] == j);
  }
  Tensor<float> sink({h_q});
  sink.data = {0.5f, -1.0f};
  ref::AttentionOut sp = ref::sparse_attention(d.q, d.kv, ind, 0.125f, d_v, nullptr, &sink);
  ref::AttentionOut de = ref::dense_attention(d.q, d.kv, 0.125f, d_v, ks, ke, &sink);
  CHECK(sp.out.data == de.out.data);
  CHECK(sp.lse.data == de.lse.data);
  CHECK(sp.max_logits.data == de.max_logits.data);
}

TEST_CASE("attention: shape errors name the tensor") {
  Data d = make(2, 2, 5, 8, 1);
  CHECK_THROWS_WITH_AS(ref::sparse_attention(d.q, d.kv, idx(1, {0, 1}), 1.0f, 4),
                       doctest::Contains("attention indices"), Error);
  CHECK_THROWS_WITH_AS(ref::sparse_attention(d.q, d.kv, idx(2, {0, 1}), 1.0f, 9),
                       doctest::Contains("d_v"), Error);
  Tensor<bf16_t> kv2({5, 2, 8});
  CHECK_THROWS_WITH_AS(ref::sparse_attention(d.q, kv2, idx(2, {0, 1}), 1.0f, 4),
                       doctest::Contains("attention kv"), Error);
  Tensor<float> sink({3});
  CHECK_THROWS_WITH_AS(ref::sparse_attention(d.q, d.kv, idx(2, {0, 1}), 1.0f, 4, nullptr, &sink),
                       doctest::Contains("attn_sink"), Error);
}
