// Tests of ref/train/attention_bwd (the sparse attention backward) and its simd/ mirror:
//   an independent long-double backward written here (gather by slot, no sorting, the sink as an
//   explicit extra logit), central finite differences of a double forward written here, the
//   invariants (out and lse are the forward's bits; with q = 0 dkv is the V part alone, sum P dO;
//   a duplicate adds what a copied kv row would; -1, out-of-range and past-topk_length slots and
//   slot order change no bit; empty rows and infinite sinks), the low-precision emulation against
//   the truth by TileLang's similarity (and an injected fault that fails it), and simd's bits on
//   every target with 1 and 2 threads.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "ref/attention.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "ref/train/attention_bwd.h"
#include "simd/simd.h"
#include "tests/simd_targets.h"

using namespace indexshare;

namespace {
const float kInf = std::numeric_limits<float>::infinity();

struct Data {
  Tensor<bf16_t> q, kv, dO;
};
Data make(int64_t s_q, int64_t h_q, int64_t s_kv, int64_t d_qk, int64_t d_v, uint64_t seed, float q_scale = 1.0f) {
  Data d{Tensor<bf16_t>({s_q, h_q, d_qk}), Tensor<bf16_t>({s_kv, 1, d_qk}), Tensor<bf16_t>({s_q, h_q, d_v})};
  for (auto [t, tag, scale] : {std::tuple{&d.q, 1, q_scale}, std::tuple{&d.kv, 2, 1.0f}, std::tuple{&d.dO, 3, 1.0f}}) {
    Tensor<float> a(t->shape);
    fill(a.ptr(), a.numel(), Dist::normal, scale, seed, uint64_t(tag));
    for (int64_t i = 0; i < a.numel(); ++i) (*t)[i] = f32_to_bf16(a[i]);
  }
  return d;
}
Tensor<int32_t> idx(int64_t s_q, std::vector<int32_t> v) {
  Tensor<int32_t> t({s_q, 1, int64_t(v.size()) / s_q});
  t.data = std::move(v);
  return t;
}
double val(bf16_t x) { return double(bf16_to_f32(x)); }

// The backward written independently: per (t, h) the valid SLOTS in slot order (a duplicate is two
// slots), logits in long double, the sink as an extra logit with a zero value row, normalised by
// the largest logit; gradients scattered slot by slot.
struct Naive {
  std::vector<long double> dq, dkv, delta, d_sink, p;  // p per [t, h, slot]
};
// delta_bf16: Delta from bf16(f32(O)) (the kernel bug), every other step exact.
Naive naive(const Data& d, const Tensor<int32_t>& ind, float sm, int64_t d_v, const Tensor<int32_t>* len,
            const Tensor<float>* sink, bool delta_bf16 = false) {
  const int64_t s_q = d.q.dim(0), h_q = d.q.dim(1), d_qk = d.q.dim(2), s_kv = d.kv.dim(0), topk = ind.dim(2);
  Naive n{std::vector<long double>(size_t(s_q * h_q * d_qk)), std::vector<long double>(size_t(s_kv * d_qk)),
          std::vector<long double>(size_t(s_q * h_q)), std::vector<long double>(size_t(h_q)),
          std::vector<long double>(size_t(s_q * h_q * topk))};
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t h = 0; h < h_q; ++h) {
      std::vector<int64_t> slots;
      for (int64_t j = 0; j < (len ? (*len)[t] : topk); ++j)
        if (ind[t * topk + j] >= 0 && ind[t * topk + j] < s_kv) slots.push_back(j);
      if (slots.empty()) continue;
      const bf16_t* q = d.q.ptr() + (t * h_q + h) * d_qk;
      const bf16_t* dO = d.dO.ptr() + (t * h_q + h) * d_v;
      std::vector<long double> s;
      for (int64_t j : slots) {
        long double dot = 0;
        for (int64_t c = 0; c < d_qk; ++c) dot += (long double)val(q[c]) * val(d.kv[ind[t * topk + j] * d_qk + c]);
        s.push_back(dot * sm);
      }
      long double mx = *std::max_element(s.begin(), s.end());
      if (sink) mx = std::max(mx, (long double)(*sink)[h]);
      long double z = sink ? std::exp((long double)(*sink)[h] - mx) : 0;
      for (long double v : s) z += std::exp(v - mx);
      std::vector<long double> pr, o(size_t(d_v), 0);
      for (size_t a = 0; a < slots.size(); ++a) {
        pr.push_back(std::exp(s[a] - mx) / z);
        n.p[size_t((t * h_q + h) * topk + slots[a])] = pr[a];
        for (int64_t c = 0; c < d_v; ++c) o[size_t(c)] += pr[a] * val(d.kv[ind[t * topk + slots[a]] * d_qk + c]);
      }
      long double delta = 0;
      for (int64_t c = 0; c < d_v; ++c)
        delta += (delta_bf16 ? (long double)round_bf16(float(o[size_t(c)])) : o[size_t(c)]) * val(dO[c]);
      n.delta[size_t(t * h_q + h)] = delta;
      if (sink) n.d_sink[size_t(h)] += -(std::exp((long double)(*sink)[h] - mx) / z) * delta;
      for (size_t a = 0; a < slots.size(); ++a) {
        const int64_t r = ind[t * topk + slots[a]];
        long double dp = 0;
        for (int64_t c = 0; c < d_v; ++c) dp += (long double)val(dO[c]) * val(d.kv[r * d_qk + c]);
        const long double ds = pr[a] * (dp - delta);
        for (int64_t c = 0; c < d_qk; ++c) {
          n.dq[size_t((t * h_q + h) * d_qk + c)] += sm * ds * val(d.kv[r * d_qk + c]);
          n.dkv[size_t(r * d_qk + c)] += sm * ds * val(q[c]) + (c < d_v ? pr[a] * val(dO[c]) : 0.0L);
        }
      }
    }
  return n;
}

// Every element within one f32 rounding (2^-23 relative, for the double intermediate's rounding
// too) plus 1e-12 of the tensor's largest magnitude (double sums of a few hundred terms).
void check_close(const Tensor<float>& got, const std::vector<long double>& want, const char* what) {
  CAPTURE(what);
  REQUIRE(size_t(got.numel()) == want.size());
  long double mag = 0;
  for (long double w : want) mag = std::max(mag, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    REQUIRE(std::fabs((long double)got[int64_t(i)] - want[i]) <= std::ldexp(std::fabs(want[i]), -23) + 1e-12L * mag);
  }
}

bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  // memcmp with a null pointer (an empty tensor's) is undefined even for 0 bytes: UBSan says so.
  return a.shape == b.shape && (a.numel() == 0 || std::memcmp(a.ptr(), b.ptr(), size_t(a.numel()) * 4) == 0);
}
bool same_grads(const ref::AttentionBackwardOut& a, const ref::AttentionBackwardOut& b) {
  return same_bits(a.out, b.out) && same_bits(a.lse, b.lse) && same_bits(a.delta, b.delta) && same_bits(a.p, b.p) &&
         same_bits(a.ds, b.ds) && same_bits(a.dq, b.dq) && same_bits(a.dkv, b.dkv) && same_bits(a.d_sink, b.d_sink) &&
         a.dq_bf16.data == b.dq_bf16.data && a.dkv_bf16.data == b.dkv_bf16.data;
}
}  // namespace

TEST_CASE("attention backward: equals an independent long-double backward (sink, -1, duplicates, topk_length)") {
  const int64_t s_q = 6, h_q = 3, s_kv = 23, d_qk = 37, d_v = 21;
  const Data d = make(s_q, h_q, s_kv, d_qk, d_v, 11);
  const Tensor<int32_t> ind = idx(s_q, {0, 3, 7, 22, 5, 2,  4, 4, 4, -1, 9, 30,  22, 21, 20, 19, 18, 17,
                                        -1, -1, -1, -1, -1, -1,  1, 6, 1, 8, 10, 12,  13, 14, 15, 16, 11, 0});
  Tensor<int32_t> len({s_q});
  len.data = {6, 6, 4, 6, 6, 3};
  Tensor<float> sink({h_q});
  sink.data = {0.5f, -1.25f, 2.0f};
  for (bool with_sink : {false, true})
    for (bool with_len : {false, true}) {
      CAPTURE(with_sink);
      CAPTURE(with_len);
      const Tensor<float>* sk = with_sink ? &sink : nullptr;
      const Tensor<int32_t>* ln = with_len ? &len : nullptr;
      const auto o = ref::sparse_attention_backward(d.q, d.kv, ind, 0.15f, d_v, d.dO, ln, sk);
      const Naive n = naive(d, ind, 0.15f, d_v, ln, sk);
      check_close(o.dq, n.dq, "dq");
      check_close(o.dkv, n.dkv, "dkv");
      check_close(o.delta, n.delta, "delta");
      check_close(o.p, n.p, "p");
      if (with_sink) check_close(o.d_sink, n.d_sink, "d_sink");
      CHECK(o.d_sink.numel() == (with_sink ? h_q : 0));
      for (int64_t i = 0; i < o.dq.numel(); ++i) REQUIRE(o.dq_bf16[i] == f32_to_bf16(o.dq[i]));
      for (int64_t i = 0; i < o.dkv.numel(); ++i) REQUIRE(o.dkv_bf16[i] == f32_to_bf16(o.dkv[i]));
      // lse is the forward's bits; O is not formed (out stays empty).
      const ref::AttentionOut f = ref::sparse_attention(d.q, d.kv, ind, 0.15f, d_v, ln, sk);
      CHECK(o.out.numel() == 0);
      CHECK(same_bits(o.lse, f.lse));
      // Without the per-slot outputs: p and ds [s_q, h_q, 0], every other output the same bits.
      ref::AttentionBackwardOut ns = ref::sparse_attention_backward(d.q, d.kv, ind, 0.15f, d_v, d.dO, ln, sk, false);
      CHECK(ns.p.shape == std::vector<int64_t>{s_q, h_q, 0});
      CHECK(ns.ds.shape == std::vector<int64_t>{s_q, h_q, 0});
      ns.p = o.p;
      ns.ds = o.ds;
      CHECK(same_grads(o, ns));
    }
}

namespace {
// A double forward written here on double inputs (q [h][d], kv [r][d] of one query row, sink per
// head), L = sum_h out_h . dO_h, for finite differences.
double loss(const std::vector<double>& q, const std::vector<double>& kv, const std::vector<double>& sink,
            const std::vector<double>& dO, const std::vector<int>& slots, int64_t h_q, int64_t d_qk, int64_t d_v,
            double sm) {
  double L = 0;
  for (int64_t h = 0; h < h_q; ++h) {
    std::vector<double> s;
    for (int r : slots) {
      double dot = 0;
      for (int64_t c = 0; c < d_qk; ++c) dot += q[size_t(h * d_qk + c)] * kv[size_t(r * d_qk + c)];
      s.push_back(sm * dot);
    }
    double z = std::exp(sink[size_t(h)]);
    for (double v : s) z += std::exp(v);
    for (size_t a = 0; a < slots.size(); ++a)
      for (int64_t c = 0; c < d_v; ++c)
        L += std::exp(s[a]) / z * kv[size_t(slots[a] * d_qk + c)] * dO[size_t(h * d_v + c)];
  }
  return L;
}
}  // namespace

TEST_CASE("attention backward: central finite differences of a double forward (dq, dkv, d_sink)") {
  const int64_t h_q = 2, s_kv = 5, d_qk = 6, d_v = 4;
  const Data d = make(1, h_q, s_kv, d_qk, d_v, 5);
  const std::vector<int> slots = {3, 0, 3, 4};  // kv row 3 twice; slots -1 and 9 below are ignored
  const Tensor<int32_t> ind = idx(1, {3, -1, 0, 3, 9, 4});
  Tensor<float> sink({h_q});
  sink.data = {-0.5f, 0.75f};
  const float sm = 0.4f;
  const auto o = ref::sparse_attention_backward(d.q, d.kv, ind, sm, d_v, d.dO, nullptr, &sink);
  std::vector<double> q, kv, sk = {-0.5, 0.75}, dO;
  for (int64_t i = 0; i < d.q.numel(); ++i) q.push_back(val(d.q[i]));
  for (int64_t i = 0; i < d.kv.numel(); ++i) kv.push_back(val(d.kv[i]));
  for (int64_t i = 0; i < d.dO.numel(); ++i) dO.push_back(val(d.dO[i]));
  const double eps = 1e-5;
  const auto fd = [&](std::vector<double>& x, size_t i) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double up = loss(q, kv, sk, dO, slots, h_q, d_qk, d_v, sm);
    x[i] = keep - eps;
    const double down = loss(q, kv, sk, dO, slots, h_q, d_qk, d_v, sm);
    x[i] = keep;
    return (up - down) / (2 * eps);
  };
  // Central differences err by eps^2 |L'''| / 6 + 1e-16 |L| / eps, about 1e-10 here.
  const auto near = [](double got, double want) { return std::fabs(got - want) <= 1e-7 + 1e-6 * std::fabs(want); };
  int checked = 0, rows_unused_zero = 0;
  for (size_t i = 0; i < q.size(); ++i, ++checked) REQUIRE(near(o.dq[int64_t(i)], fd(q, i)));
  for (size_t i = 0; i < kv.size(); ++i, ++checked) {
    CAPTURE(i);
    REQUIRE(near(o.dkv[int64_t(i)], fd(kv, i)));
    if (i / size_t(d_qk) == 1 || i / size_t(d_qk) == 2) rows_unused_zero += o.dkv[int64_t(i)] == 0.0f;
  }
  for (size_t h = 0; h < 2; ++h, ++checked) REQUIRE(near(o.d_sink[int64_t(h)], fd(sk, h)));
  CHECK(checked == int(q.size() + kv.size() + 2));
  CHECK(rows_unused_zero == 2 * d_qk);  // kv rows 1 and 2 are selected by nobody
}

TEST_CASE("attention backward: with q = 0 dkv is the V part alone, sum P dO with uniform P") {
  const int64_t s_q = 3, h_q = 2, s_kv = 7, d_qk = 12, d_v = 8;
  Data d = make(s_q, h_q, s_kv, d_qk, d_v, 9);
  std::fill(d.q.data.begin(), d.q.data.end(), f32_to_bf16(0.0f));
  const Tensor<int32_t> ind = idx(s_q, {1, 2, 2, 5, -1, 6, 0, 1, 4, 4, 4, -1});
  const auto o = ref::sparse_attention_backward(d.q, d.kv, ind, 0.3f, d_v, d.dO);
  std::vector<long double> want(size_t(s_kv * d_v), 0);
  for (int64_t t = 0; t < s_q; ++t) {
    std::vector<int32_t> valid;
    for (int64_t j = 0; j < 4; ++j)
      if (ind[t * 4 + j] >= 0) valid.push_back(ind[t * 4 + j]);
    for (int64_t h = 0; h < h_q; ++h)
      for (int32_t r : valid)
        for (int64_t c = 0; c < d_v; ++c) want[size_t(r * d_v + c)] += val(d.dO.at(t, h, c)) / (long double)valid.size();
  }
  for (int64_t j = 0; j < s_kv; ++j)
    for (int64_t c = 0; c < d_qk; ++c) {
      if (c >= d_v) {
        REQUIRE(o.dkv[j * d_qk + c] == 0.0f);  // the K part is sm * dS * q = 0
        continue;
      }
      const long double w = want[size_t(j * d_v + c)];
      REQUIRE(std::fabs((long double)o.dkv[j * d_qk + c] - w) <= std::ldexp(std::fabs(w), -23) + 1e-15L);
    }
}

TEST_CASE("attention backward: a duplicate adds exactly what a copied kv row adds") {
  const int64_t h_q = 3, s_kv = 9, d_qk = 16, d_v = 8;
  const Data d = make(2, h_q, s_kv, d_qk, d_v, 13);
  // Dup: kv row 4 twice in row 0. Copy: kv row 4 appended as row 9, row 0 selects 4 and 9.
  const Tensor<int32_t> dup = idx(2, {4, 1, 4, 7, 2, 4, 5, 8});
  const Tensor<int32_t> cpy = idx(2, {4, 1, 9, 7, 2, 4, 5, 8});
  Data d2 = d;
  d2.kv = Tensor<bf16_t>({s_kv + 1, 1, d_qk});
  std::copy(d.kv.data.begin(), d.kv.data.end(), d2.kv.data.begin());
  std::copy(d.kv.ptr() + 4 * d_qk, d.kv.ptr() + 5 * d_qk, d2.kv.ptr() + s_kv * d_qk);
  const auto a = ref::sparse_attention_backward(d.q, d.kv, dup, 0.25f, d_v, d.dO);
  const auto b = ref::sparse_attention_backward(d2.q, d2.kv, cpy, 0.25f, d_v, d2.dO);
  const auto near = [](double x, double y) { return std::fabs(x - y) <= 1e-6 * std::fabs(y) + 1e-6; };
  for (int64_t i = 0; i < a.dq.numel(); ++i) REQUIRE(near(a.dq[i], b.dq[i]));
  for (int64_t i = 0; i < a.delta.numel(); ++i) REQUIRE(near(a.delta[i], b.delta[i]));
  for (int64_t j = 0; j < s_kv; ++j)
    for (int64_t c = 0; c < d_qk; ++c) {
      const double want = j == 4 ? double(b.dkv[4 * d_qk + c]) + b.dkv[s_kv * d_qk + c] : b.dkv[j * d_qk + c];
      REQUIRE(near(a.dkv[j * d_qk + c], want));
    }
  // Both occurrences carry the same P and dS per slot.
  for (int64_t h = 0; h < h_q; ++h) {
    CHECK(a.p.at(0, h, 0) == a.p.at(0, h, 2));
    CHECK(a.ds.at(0, h, 0) == a.ds.at(0, h, 2));
    CHECK(a.p.at(0, h, 0) > 0.0f);
  }
}

TEST_CASE("attention backward: ignored slots, slot order and every-key rows change no bit") {
  const int64_t s_kv = 10, d_qk = 24, d_v = 16, h_q = 2;
  const Data d = make(2, h_q, s_kv, d_qk, d_v, 17);
  const auto run = [&](const Tensor<int32_t>& ind, const Tensor<int32_t>* len = nullptr) {
    return ref::sparse_attention_backward(d.q, d.kv, ind, 0.2f, d_v, d.dO, len);
  };
  const auto base = run(idx(2, {2, 5, 7, 1, 3, 8}));
  const auto noisy = run(idx(2, {INT_MIN, 2, -1, 5, 10, 7, 1, 114514, 3, -7, 8, INT_MAX}));
  CHECK(same_bits(base.dq, noisy.dq));
  CHECK(same_bits(base.dkv, noisy.dkv));
  CHECK(same_bits(base.delta, noisy.delta));
  for (int64_t h = 0; h < h_q; ++h) {
    CHECK(noisy.p.at(0, h, 0) == 0.0f);  // ignored slots: P = dS = 0
    CHECK(noisy.ds.at(0, h, 2) == 0.0f);
    CHECK(noisy.p.at(0, h, 1) == base.p.at(0, h, 0));
  }
  // Slots past topk_length hold valid indices and are ignored too.
  Tensor<int32_t> len({2});
  len.data = {3, 3};
  const auto cut = run(idx(2, {2, 5, 7, 4, 1, 3, 8, 0}), &len);
  CHECK(same_bits(base.dq, cut.dq));
  CHECK(same_bits(base.dkv, cut.dkv));
  // Every key, in two slot orders with -1 between: the same bits.
  std::vector<int32_t> asc, perm;
  for (int32_t i = 0; i < s_kv; ++i) asc.push_back(i), asc.push_back(-1);
  for (int32_t i = 0; i < s_kv; ++i) perm.push_back((i * 7 + 3) % int32_t(s_kv)), perm.push_back(-1);
  std::vector<int32_t> a2 = asc, p2 = perm;
  a2.insert(a2.end(), asc.begin(), asc.end());
  p2.insert(p2.end(), asc.rbegin(), asc.rend());
  const auto all_a = run(idx(2, a2)), all_p = run(idx(2, p2));
  CHECK(same_bits(all_a.dq, all_p.dq));
  CHECK(same_bits(all_a.dkv, all_p.dkv));
  CHECK(same_bits(all_a.delta, all_p.delta));
}

TEST_CASE("attention backward: empty rows give zero gradients, infinite sinks their limits") {
  const int64_t s_kv = 6, d_qk = 8, d_v = 8, h_q = 3;
  Data d = make(2, h_q, s_kv, d_qk, d_v, 19);
  const Tensor<int32_t> ind = idx(2, {-1, -1, 6, 1, 3, 4});
  const auto o = ref::sparse_attention_backward(d.q, d.kv, ind, 0.5f, d_v, d.dO);
  for (int64_t h = 0; h < h_q; ++h) {
    CHECK(o.delta.at(0, h) == 0.0f);
    CHECK(o.lse.at(0, h) == kInf);
    for (int64_t c = 0; c < d_qk; ++c) CHECK(o.dq.at(0, h, c) == 0.0f);
  }
  // The empty row's dO changes nothing.
  Data d2 = d;
  for (int64_t i = 0; i < h_q * d_v; ++i) d2.dO[i] = f32_to_bf16(123.0f);
  CHECK(same_bits(o.dkv, ref::sparse_attention_backward(d2.q, d2.kv, ind, 0.5f, d_v, d2.dO).dkv));
  // Sinks: +inf on head 0 (out 0: no gradient), -inf on head 1 (as no sink), finite on head 2.
  Tensor<float> sink({h_q});
  sink.data = {kInf, -kInf, 0.5f};
  const auto s = ref::sparse_attention_backward(d.q, d.kv, ind, 0.5f, d_v, d.dO, nullptr, &sink);
  CHECK(s.d_sink[0] == 0.0f);
  CHECK(s.d_sink[1] == 0.0f);
  CHECK(s.d_sink[2] != 0.0f);
  for (int64_t c = 0; c < d_qk; ++c) {
    CHECK(s.dq.at(1, 0, c) == 0.0f);
    CHECK(s.dq.at(1, 1, c) == o.dq.at(1, 1, c));
  }
  CHECK(s.p.at(1, 0, 1) == 0.0f);
  CHECK(s.p.at(1, 1, 1) == o.p.at(1, 1, 1));
  Tensor<float> all_inf({h_q}, kInf);
  const auto z = ref::sparse_attention_backward(d.q, d.kv, ind, 0.5f, d_v, d.dO, nullptr, &all_inf);
  for (float v : z.dkv.data) REQUIRE(v == 0.0f);
}

TEST_CASE("attention backward: bad input names the tensor") {
  const Data d = make(2, 2, 5, 8, 4, 1);
  const Tensor<int32_t> ind = idx(2, {0, 1, 2, 3});
  Tensor<bf16_t> bad_do({2, 2, 5});
  CHECK_THROWS_WITH_AS(ref::sparse_attention_backward(d.q, d.kv, ind, 0.5f, 4, bad_do),
                       doctest::Contains("attention backward d_out: expected shape [2,2,4]"), Error);
  CHECK_THROWS_WITH_AS(simd::sparse_attention_backward(d.q, d.kv, ind, 0.5f, 4, bad_do),
                       doctest::Contains("attention backward d_out"), Error);
  Tensor<int32_t> len({2});
  len.data = {1, 3};
  CHECK_THROWS_WITH_AS(ref::sparse_attention_backward(d.q, d.kv, ind, 0.5f, 4, d.dO, &len),
                       doctest::Contains("attention backward topk_length: row 1 has 3"), Error);
  CHECK_THROWS_AS(ref::sparse_attention_backward(d.q, d.kv, idx(1, {0, 1}), 0.5f, 4, d.dO), Error);
  Tensor<float> sink({3});
  CHECK_THROWS_WITH_AS(ref::sparse_attention_backward(d.q, d.kv, ind, 0.5f, 4, d.dO, nullptr, &sink),
                       doctest::Contains("attn_sink"), Error);
}

TEST_CASE("attention backward: the low-precision emulation is near the truth, a dropped V part is not") {
  const int64_t s_q = 32, h_q = 8, s_kv = 128, d_qk = 72, d_v = 64, topk = 32;
  const Data d = make(s_q, h_q, s_kv, d_qk, d_v, 23, 0.5f);
  Tensor<int32_t> ind({s_q, 1, topk});
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t j = 0; j < topk; ++j) ind[t * topk + j] = int32_t((t * 37 + j * 11) % s_kv);
  Tensor<float> sink({h_q}, 0.5f);
  const float sm = 1.0f / std::sqrt(float(d_qk));
  auto exact = ref::sparse_attention_backward(d.q, d.kv, ind, sm, d_v, d.dO, nullptr, &sink);
  exact.out = ref::sparse_attention(d.q, d.kv, ind, sm, d_v, nullptr, &sink).out;  // the bounds read the forward's out
  const auto lowp = cmp::emulate_attention_backward_lowp(d.q, d.kv, ind, sm, d_v, d.dO, nullptr, &sink);
  const double sim_dq = cmp::gradient_similarity(exact.dq, lowp.dq), sim_dkv = cmp::gradient_similarity(exact.dkv, lowp.dkv);
  MESSAGE("similarity dq " << sim_dq << ", dkv " << sim_dkv);
  CHECK(sim_dq <= 1e-4);
  CHECK(sim_dkv <= 1e-4);
  CHECK(sim_dq > 0);  // the emulation is not the truth
  CHECK(cmp::gradient_similarity(exact.dq, exact.dq) == 0.0);
  // Fault: dkv without its V part (a kernel that forgot P^T dO; the V part scattered here from P per
  // slot) fails by far.
  Tensor<float> noV = exact.dkv;
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t h = 0; h < h_q; ++h)
      for (int64_t j = 0; j < topk; ++j)
        for (int64_t c = 0; c < d_v; ++c)
          noV[ind[t * topk + j] * d_qk + c] -= exact.p.at(t, h, j) * bf16_to_f32(d.dO.at(t, h, c));
  MESSAGE("fault (no V part): dkv similarity " << cmp::gradient_similarity(exact.dkv, noV));
  CHECK(cmp::gradient_similarity(exact.dkv, noV) > 1e-2);
  // The emulated Delta uses the bf16 out: off the truth's by about a bf16 rounding of out.
  double worst = 0;
  for (int64_t i = 0; i < exact.delta.numel(); ++i) worst = std::max(worst, double(std::fabs(exact.delta[i] - lowp.delta[i])));
  CHECK(worst > 0);
}

TEST_CASE("simd: attention backward bit-identical to ref on every target and thread count") {
  struct Case {
    int64_t s_q, h_q, s_kv, d_qk, d_v, topk;
    bool sink, len;
  };
  const int threads0 = omp_get_max_threads();
  // Row chunks of 1, 4 and the default (all rows here), h_q 3 and 10 not a multiple of the head
  // tiles, d_qk 37 and d_v 19 not of 8, several kv-row tiles per query row and block (s_kv 300).
  for (const Case& c : {Case{5, 3, 40, 37, 19, 12, true, true}, Case{9, 4, 300, 64, 48, 160, false, false},
                        Case{3, 2, 17, 8, 8, 20, true, false}, Case{21, 10, 300, 72, 64, 96, true, true}}) {
    const Data d = make(c.s_q, c.h_q, c.s_kv, c.d_qk, c.d_v, uint64_t(c.topk));
    Tensor<int32_t> ind({c.s_q, 1, c.topk});
    for (int64_t t = 0; t < c.s_q; ++t)
      for (int64_t j = 0; j < c.topk; ++j) {
        const int64_t v = (t * 131 + j * 7919) % (c.s_kv + 5) - 2;  // some -2, -1, >= s_kv; duplicates
        ind[t * c.topk + j] = t == 1 ? -1 : int32_t(v);                // row 1 empty
      }
    Tensor<int32_t> len({c.s_q});
    for (int64_t t = 0; t < c.s_q; ++t) len[t] = int32_t((t * 5) % (c.topk + 1));
    Tensor<float> sink({c.h_q});
    for (int64_t h = 0; h < c.h_q; ++h) sink[h] = h == 0 ? kInf : 0.25f * float(h) - 0.5f;
    const Tensor<float>* sk = c.sink ? &sink : nullptr;
    const Tensor<int32_t>* ln = c.len ? &len : nullptr;
    const auto want = ref::sparse_attention_backward(d.q, d.kv, ind, 0.125f, c.d_v, d.dO, ln, sk);
    const auto want_ns = ref::sparse_attention_backward(d.q, d.kv, ind, 0.125f, c.d_v, d.dO, ln, sk, false);
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      CAPTURE(std::string(hwy::TargetName(target)));
      for (int threads : {1, 2}) {
        CAPTURE(threads);
        omp_set_num_threads(threads);
        CHECK(same_grads(want, simd::sparse_attention_backward(d.q, d.kv, ind, 0.125f, c.d_v, d.dO, ln, sk)));
        CHECK(same_grads(want, simd::kernels().sparse_attention_backward(d.q, d.kv, ind, 0.125f, c.d_v, d.dO, ln, sk)));
        CHECK(same_grads(want_ns, simd::sparse_attention_backward(d.q, d.kv, ind, 0.125f, c.d_v, d.dO, ln, sk, false)));
        for (int64_t chunk : {1, 4}) {  // query rows per chunk: boundaries inside the problem
          CAPTURE(chunk);
          simd::set_attention_backward_chunk_rows(chunk);
          CHECK(same_grads(want, simd::sparse_attention_backward(d.q, d.kv, ind, 0.125f, c.d_v, d.dO, ln, sk)));
          simd::set_attention_backward_chunk_rows(0);
        }
      }
    }
    hwy::SetSupportedTargetsForTest(0);
    omp_set_num_threads(threads0);
  }
  // The comparison catches one flipped bit in any output.
  const Data d = make(2, 2, 9, 16, 8, 3);
  const Tensor<int32_t> ind = idx(2, {1, 4, 4, 8, 0, 2, 3, -1});
  const auto a = ref::sparse_attention_backward(d.q, d.kv, ind, 0.3f, 8, d.dO);
  for (Tensor<float> ref::AttentionBackwardOut::*field :
       {&ref::AttentionBackwardOut::dq, &ref::AttentionBackwardOut::dkv, &ref::AttentionBackwardOut::delta,
        &ref::AttentionBackwardOut::p, &ref::AttentionBackwardOut::ds}) {
    auto b = a;
    uint32_t bits;
    std::memcpy(&bits, (b.*field).ptr() + 3, 4);
    bits ^= 1u;
    std::memcpy((b.*field).ptr() + 3, &bits, 4);
    CHECK_FALSE(same_grads(a, b));
  }
  const decltype(ref::Kernels{}.sparse_attention_backward) ref_fn = &ref::sparse_attention_backward;
  const bool ref_table = ref::Kernels{}.sparse_attention_backward == ref_fn;
  CHECK(ref_table);
}

TEST_CASE("simd: the backward's dq and dkv bounds bit-identical to ref on every target and thread count") {
  struct Case {
    int64_t s_q, h_q, s_kv, d_qk, d_v, topk;
    bool len, from_bf16;
  };
  // h_q 3 and 10 not a multiple of the lanes, d_qk 37 / 72 / 130 not of the 64-column blocks, d_v
  // 19 not of 8; -1, -2 and >= s_kv slots, duplicates, an empty row, topk_length (0 included).
  for (const Case& c : {Case{5, 3, 40, 37, 19, 12, true, true}, Case{9, 4, 300, 72, 64, 96, false, false},
                        Case{7, 10, 90, 130, 128, 40, true, false}}) {
    CAPTURE(c.d_qk);
    const Data d = make(c.s_q, c.h_q, c.s_kv, c.d_qk, c.d_v, uint64_t(c.topk));
    Tensor<int32_t> ind({c.s_q, 1, c.topk});
    for (int64_t t = 0; t < c.s_q; ++t)
      for (int64_t j = 0; j < c.topk; ++j) {
        const int64_t v = (t * 131 + j * 7919) % (c.s_kv + 5) - 2;
        ind[t * c.topk + j] = t == 1 ? -1 : int32_t(v);
      }
    Tensor<int32_t> len({c.s_q});
    for (int64_t t = 0; t < c.s_q; ++t) len[t] = int32_t((t * 5) % (c.topk + 1));
    const Tensor<int32_t>* ln = c.len ? &len : nullptr;
    ref::AttentionBackwardOut exact = ref::sparse_attention_backward(d.q, d.kv, ind, 0.125f, c.d_v, d.dO, ln);
    exact.out = ref::sparse_attention(d.q, d.kv, ind, 0.125f, c.d_v, ln).out;
    const cmp::AttentionBackwardBounds want =
        cmp::attention_backward_bounds(d.q, d.kv, ind, 0.125f, c.d_v, d.dO, ln, exact, c.from_bf16);
    simd_test::for_each_target([&](const std::string&, int) {
      const cmp::AttentionBackwardBounds got =
          simd::kernels().attention_backward_bounds(d.q, d.kv, ind, 0.125f, c.d_v, d.dO, ln, exact, c.from_bf16);
      CHECK(std::memcmp(got.dq.data(), want.dq.data(), want.dq.size() * 4) == 0);
      CHECK(std::memcmp(got.dkv.data(), want.dkv.data(), want.dkv.size() * 4) == 0);
      for (int64_t chunk : {1, 3}) {  // query rows per chunk: boundaries inside the problem
        simd::set_attention_backward_chunk_rows(chunk);
        const cmp::AttentionBackwardBounds ch =
            simd::attention_backward_bounds(d.q, d.kv, ind, 0.125f, c.d_v, d.dO, ln, exact, c.from_bf16);
        simd::set_attention_backward_chunk_rows(0);
        CHECK(std::memcmp(ch.dq.data(), want.dq.data(), want.dq.size() * 4) == 0);
        CHECK(std::memcmp(ch.dkv.data(), want.dkv.data(), want.dkv.size() * 4) == 0);
      }
    });
  }
}

TEST_CASE("attention backward: the derived bounds hold the emulation, are tight enough to catch a dropped key") {
  const int64_t s_q = 16, h_q = 4, s_kv = 64, d_qk = 72, d_v = 64, topk = 16;
  const Data d = make(s_q, h_q, s_kv, d_qk, d_v, 29, 0.5f);
  Tensor<int32_t> ind({s_q, 1, topk});
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t j = 0; j < topk; ++j) ind[t * topk + j] = j == 3 ? -1 : int32_t((t * 13 + j * 5) % s_kv);
  Tensor<float> sink({h_q}, 0.25f);
  const float sm = 1.0f / std::sqrt(float(d_qk));
  auto exact = ref::sparse_attention_backward(d.q, d.kv, ind, sm, d_v, d.dO, nullptr, &sink);
  exact.out = ref::sparse_attention(d.q, d.kv, ind, sm, d_v, nullptr, &sink).out;  // the bounds read the forward's out
  const auto lowp = cmp::emulate_attention_backward_lowp(d.q, d.kv, ind, sm, d_v, d.dO, nullptr, &sink);
  const auto b = cmp::attention_backward_bounds(d.q, d.kv, ind, sm, d_v, d.dO, nullptr, exact, true);
  // The emulation (Delta from its bf16 out) and the truth's bf16 copies are within the bounds everywhere.
  double worst_q = 0, worst_kv = 0, max_dq = 0, max_bq = 0;
  for (int64_t i = 0; i < exact.dq.numel(); ++i) {
    REQUIRE(std::fabs(lowp.dq[i] - exact.dq[i]) <= b.dq[size_t(i)]);
    REQUIRE(std::fabs(bf16_to_f32(exact.dq_bf16[i]) - exact.dq[i]) <= b.dq[size_t(i)]);
    worst_q = std::max(worst_q, double(std::fabs(lowp.dq[i] - exact.dq[i])) / b.dq[size_t(i)]);
    max_dq = std::max(max_dq, double(std::fabs(exact.dq[i])));
    max_bq = std::max(max_bq, double(b.dq[size_t(i)]));
  }
  for (int64_t i = 0; i < exact.dkv.numel(); ++i) {
    REQUIRE(std::fabs(lowp.dkv[i] - exact.dkv[i]) <= b.dkv[size_t(i)]);
    worst_kv = std::max(worst_kv, b.dkv[size_t(i)] > 0 ? double(std::fabs(lowp.dkv[i] - exact.dkv[i])) / b.dkv[size_t(i)] : 0.0);
  }
  MESSAGE("emulation error / bound: dq " << worst_q << ", dkv " << worst_kv << "; max bound / max |dq| " << max_bq / max_dq);
  CHECK(max_bq < 0.1 * max_dq);  // not vacuous
  // Fault: the kernel drops one key of row 5 (list slot 7) from dq: some element leaves its bound.
  Tensor<float> faulty = lowp.dq;
  const int64_t r = ind[5 * topk + 7];
  for (int64_t h = 0; h < h_q; ++h)
    for (int64_t c = 0; c < d_qk; ++c)
      faulty.at(5, h, c) -= sm * exact.ds.at(5, h, 7) * bf16_to_f32(d.kv[r * d_qk + c]);
  int64_t out = 0;
  for (int64_t i = 0; i < faulty.numel(); ++i) out += std::fabs(faulty[i] - exact.dq[i]) > b.dq[size_t(i)];
  CHECK(out > 0);
  // Rows without keys: bound 0 where the gradient is exactly 0 (no kv row unselected here has slack).
  for (int64_t j = 0; j < s_kv; ++j) {
    bool selected = false;
    for (int64_t i = 0; i < ind.numel(); ++i) selected |= ind[i] == j;
    if (!selected)
      for (int64_t c = 0; c < d_qk; ++c) REQUIRE(b.dkv[size_t(j * d_qk + c)] == 0.0f);
  }
}

TEST_CASE("attention backward: the Delta-from-bf16-out hypothesis equals that bug computed independently") {
  const int64_t s_q = 6, h_q = 3, s_kv = 23, d_qk = 37, d_v = 21;
  const Data d = make(s_q, h_q, s_kv, d_qk, d_v, 31);
  const Tensor<int32_t> ind = idx(s_q, {0, 3, 7, 22, 5, 2,  4, 4, 4, -1, 9, 30,  22, 21, 20, 19, 18, 17,
                                        -1, -1, -1, -1, -1, -1,  1, 6, 1, 8, 10, 12,  13, 14, 15, 16, 11, 0});
  Tensor<float> sink({h_q});
  sink.data = {0.5f, -1.25f, 2.0f};
  auto exact = ref::sparse_attention_backward(d.q, d.kv, ind, 0.15f, d_v, d.dO, nullptr, &sink);
  exact.out = ref::sparse_attention(d.q, d.kv, ind, 0.15f, d_v, nullptr, &sink).out;  // the hypothesis reads the forward's out
  const auto hyp = cmp::hypothesis_delta_from_bf16_out(d.q, d.kv, ind, 0.15f, d_v, d.dO, nullptr, exact);
  const Naive bug = naive(d, ind, 0.15f, d_v, nullptr, &sink, true);
  const auto near = [](const Tensor<float>& got, const std::vector<long double>& want) {
    long double mag = 0, worst = 0;
    for (long double w : want) mag = std::max(mag, std::fabs(w));
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs((long double)got[int64_t(i)] - want[i]));
    return worst <= 1e-6L * mag;
  };
  CHECK(near(hyp.dq, bug.dq));
  CHECK(near(hyp.dkv, bug.dkv));
  CHECK(near(hyp.delta, bug.delta));
  CHECK(near(hyp.d_sink, bug.d_sink));
  // The bug is visible: its dq departs from the truth by far more than the truth's f32 rounding.
  double dep = 0, mag = 0;
  for (int64_t i = 0; i < exact.dq.numel(); ++i) {
    dep = std::max(dep, double(std::fabs(hyp.dq[i] - exact.dq[i])));
    mag = std::max(mag, double(std::fabs(exact.dq[i])));
  }
  MESSAGE("Delta from bf16 out: max |dq - truth| / max |dq| = " << dep / mag);
  CHECK(dep > 1e-5 * mag);
}
