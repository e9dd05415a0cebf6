// Tests of ref/indexer against an independent formula written here: the FP8 dot products are
// computed with int64 arithmetic on the codes' integer significands, which is exact by
// construction, and the head sum is re-done in the documented order.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "ref/indexer.h"
#include "ref/numerics.h"
#include "ref/rng.h"

using namespace indexshare;

namespace {

// e4m3 value times 2^9, an exact integer (|v| <= 448 * 512), from the format definition.
int64_t e4m3_times_512(e4m3_t c) {
  const int s = c.bits >> 7, e = (c.bits >> 3) & 15, m = c.bits & 7;
  const int64_t mag = e == 0 ? m : int64_t(8 + m) << (e - 1);  // (8+m) * 2^(e-10) * 2^9
  return s ? -mag : mag;
}

struct Inputs {
  Tensor<e4m3_t> q, k;
  Tensor<float> k_scale, w;
  Tensor<int32_t> ks, ke;
};

Inputs make_inputs(int64_t s_q, int64_t s_kv, int64_t H, int64_t D, Dist dist, uint64_t seed) {
  Inputs in;
  Tensor<float> qf({s_q, H, D}), kf({s_kv, D});
  fill(qf.ptr(), qf.numel(), dist, 3.0f, seed, 1);
  fill(kf.ptr(), kf.numel(), dist, 3.0f, seed, 2);
  Quantized qq = quantize(qf, int(D), ScaleRule::deepseek_ue8m0, "q");
  Quantized kq = quantize(kf, int(D), ScaleRule::deepseek_ue8m0, "k");
  in.q = qq.codes;
  in.k = kq.codes;
  in.k_scale = Tensor<float>({s_kv});
  in.k_scale.data = kq.scales.data;
  in.w = Tensor<float>({s_q, H});
  fill(in.w.ptr(), in.w.numel(), Dist::normal, 0.1f, seed, 3);
  in.ks = Tensor<int32_t>({s_q});
  in.ke = Tensor<int32_t>({s_q});
  for (int64_t t = 0; t < s_q; ++t) {  // varied windows, including empty ones
    in.ks[t] = int32_t((t * 3) % (s_kv / 2 + 1));
    in.ke[t] = int32_t(std::min<int64_t>(s_kv, in.ks[t] + (t * 7) % (s_kv + 1)));
  }
  return in;
}

}  // namespace

TEST_CASE("indexer: FP8 logits equal the exact integer formula bit for bit") {
  for (Dist dist : {Dist::normal, Dist::uniform, Dist::ties, Dist::integer}) {
    for (int64_t D : {1, 7, 64, 128}) {
      CAPTURE(dist_name(dist));
      CAPTURE(D);
      const int64_t s_q = 9, s_kv = 23, H = 5;
      Inputs in = make_inputs(s_q, s_kv, H, D, dist, 100 + uint64_t(D));
      Tensor<float> got = ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke);
      REQUIRE(got.shape == Shape{s_q, s_kv});
      for (int64_t t = 0; t < s_q; ++t) {
        for (int64_t s = 0; s < s_kv; ++s) {
          if (s < in.ks[t] || s >= in.ke[t]) {
            REQUIRE(got.at(t, s) == -std::numeric_limits<float>::infinity());
            continue;
          }
          double acc = 0.0;
          for (int64_t h = 0; h < H; ++h) {
            int64_t dot = 0;  // exact: sum of products of integers, times 2^-18 below
            for (int64_t d = D - 1; d >= 0; --d)  // reversed order on purpose: exactness
              dot += e4m3_times_512(in.q.at(t, h, d)) * e4m3_times_512(in.k.at(s, d));
            const double relu = dot > 0 ? std::ldexp(double(dot), -18) : 0.0;
            acc = acc + double(in.w.at(t, h)) * relu;
          }
          REQUIRE(got.at(t, s) == float(acc * double(in.k_scale[s])));
        }
      }
    }
  }
}

TEST_CASE("indexer: unquantized mode matches a long-double formula within its rounding bound") {
  const int64_t s_q = 6, s_kv = 11, H = 4, D = 96;
  Tensor<float> q({s_q, H, D}), k({s_kv, D}), w({s_q, H}), ksc({s_kv}, 1.0f);
  fill(q.ptr(), q.numel(), Dist::normal, 1.0f, 5, 1);
  fill(k.ptr(), k.numel(), Dist::normal, 1.0f, 5, 2);
  fill(w.ptr(), w.numel(), Dist::normal, 1.0f, 5, 3);
  for (float& v : q.data) v = round_bf16(v);
  for (float& v : k.data) v = round_bf16(v);
  Tensor<int32_t> ks({s_q}, 0), ke({s_q});
  for (int64_t t = 0; t < s_q; ++t) ke[t] = int32_t(s_kv - s_q + t + 1);
  Tensor<float> got = ref::indexer_logits_f32(q, k, ksc, w, ks, ke);
  for (int64_t t = 0; t < s_q; ++t) {
    for (int64_t s = 0; s < ke[t]; ++s) {
      long double acc = 0, mag = 0;
      for (int64_t h = 0; h < H; ++h) {
        long double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += (long double)q.at(t, h, d) * k.at(s, d);
        if (dot < 0) dot = 0;
        acc += (long double)w.at(t, h) * dot;
        mag += std::fabs((long double)w.at(t, h)) * dot;
      }
      // Bound: the final f32 rounding (half an ulp, <= 2^-24 |acc|) plus the double rounding
      // of D + 2H operations on terms of total magnitude `mag` ((D + 2H) 2^-53 mag), doubled.
      const long double tol = std::ldexp(std::fabs(acc), -24) + 2 * (D + 2 * H) * std::ldexp(mag, -53);
      REQUIRE(std::fabs((long double)got.at(t, s) - acc) <= tol);
    }
  }
}

TEST_CASE("indexer: bad shapes and bounds are refused with the tensor named, NaN propagates") {
  Inputs in = make_inputs(4, 8, 2, 16, Dist::normal, 1);
  CHECK_NOTHROW(ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke));
  Tensor<int32_t> bad_ke = in.ke;
  bad_ke[2] = 9;
  CHECK_THROWS_WITH_AS(ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, bad_ke),
                       doctest::Contains("row 2"), Error);
  Tensor<int32_t> bad_ks = in.ks;
  bad_ks[1] = in.ke[1] + 1;
  CHECK_THROWS_WITH_AS(ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, bad_ks, in.ke),
                       doctest::Contains("indexer ks/ke: row 1"), Error);
  Tensor<float> w3({4, 3});
  CHECK_THROWS_WITH_AS(ref::indexer_logits_fp8(in.q, in.k, in.k_scale, w3, in.ks, in.ke),
                       doctest::Contains("indexer weights: expected shape [4,2], got [4,3]"), Error);
  Tensor<e4m3_t> k_bad({8, 15});
  CHECK_THROWS_WITH_AS(ref::indexer_logits_fp8(in.q, k_bad, in.k_scale, in.w, in.ks, in.ke),
                       doctest::Contains("indexer k: head dim 15"), Error);
  Tensor<float> ksc_bad({7});
  CHECK_THROWS_WITH_AS(ref::indexer_logits_fp8(in.q, in.k, ksc_bad, in.w, in.ks, in.ke),
                       doctest::Contains("indexer k_scale"), Error);
  // A NaN code in q is not hidden by the ReLU: the logits of that row become NaN.
  Tensor<e4m3_t> qn = in.q;
  qn.at(3, 1, 0) = e4m3_t{0x7F};
  Tensor<int32_t> ks({4}, 0), ke({4}, 8);
  Tensor<float> got = ref::indexer_logits_fp8(qn, in.k, in.k_scale, in.w, ks, ke);
  CHECK(std::isnan(got.at(3, 0)));
  CHECK(!std::isnan(got.at(2, 0)));
}
