// Tests of simd/ against ref/, on every compiled Highway target and with 1 and 2 OpenMP threads.
//
//   indexer logits (FP8 and f32)   bit-identical to ref (NaN: same positions)
//   topk, streaming indexer_topk   identical to ref (ties, -1 padding, error messages)
//   attention, exp_portable        bit-identical to ref (ref fixes every operation; simd performs
//                                  the same ones), and so across thread counts; attention is also
//                                  checked against the order-free tolerance derived below, the
//                                  bound any summation order would meet
// The other kernels (exp_portable, linear, the module level, FP8 quantization, the generator):
// tests/test_simd_numerics.cc; the helpers both use: tests/simd_targets.h.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "ref/attention.h"
#include "tools/judge/compare.h"
#include "ref/config.h"
#include "ref/model.h"
#include "ref/module.h"
#include "ref/module_ops.h"
#include "ref/indexer.h"
#include "ref/numerics.h"
#include "ref/overlap.h"
#include "ref/problem.h"
#include "ref/rng.h"
#include "ref/topk.h"
#include "simd/simd.h"
#include "tools/lib/impl.h"
#include "tools/lib/options.h"
#include "tools/lib/svg.h"

#include "tests/simd_targets.h"

using namespace indexshare;
using namespace indexshare::simd_test;

namespace {

// ---- indexer inputs -----------------------------------------------------------------------------

struct IndexerInputs {
  Tensor<e4m3_t> q, k;
  Tensor<float> k_scale, w;
  Tensor<int32_t> ks, ke;
};

// Windows: "varied" mixes empty rows (row 0 always), short and long windows at varied offsets;
// "causal" is the last s_q rows of a causal prefill (ks = 0, ke = s_kv - s_q + t + 1).
enum class Windows { varied, causal };

void set_windows(IndexerInputs& in, int64_t s_q, int64_t s_kv, Windows windows) {
  in.ks = Tensor<int32_t>({s_q});
  in.ke = Tensor<int32_t>({s_q});
  for (int64_t t = 0; t < s_q; ++t) {
    if (windows == Windows::causal) {
      in.ks[t] = 0;
      in.ke[t] = int32_t(std::clamp<int64_t>(s_kv - s_q + t + 1, 0, s_kv));
    } else {
      in.ks[t] = int32_t((t * 3) % (s_kv / 2 + 1));
      in.ke[t] = int32_t(std::min<int64_t>(s_kv, in.ks[t] + (t * 7) % (s_kv + 1)));
    }
  }
}

IndexerInputs make_indexer(int64_t s_q, int64_t s_kv, int64_t H, int64_t D, Dist dist,
                           uint64_t seed, Windows windows = Windows::varied) {
  IndexerInputs in;
  Tensor<float> qf({s_q, H, D}), kf({s_kv, D});
  fill(qf.ptr(), qf.numel(), dist, 3.0f, seed, 1);
  fill(kf.ptr(), kf.numel(), dist, 3.0f, seed, 2);
  in.q = quantize(qf, int(D), ScaleRule::deepseek_ue8m0, "q").codes;
  Quantized kq = quantize(kf, int(D), ScaleRule::deepseek_ue8m0, "k");
  in.k = kq.codes;
  in.k_scale = Tensor<float>({s_kv});
  in.k_scale.data = kq.scales.data;
  in.w = Tensor<float>({s_q, H});
  fill(in.w.ptr(), in.w.numel(), dist == Dist::ties ? Dist::ties : Dist::normal, 0.1f, seed, 3);
  set_windows(in, s_q, s_kv, windows);
  return in;
}

struct Shape4 {
  int64_t s_q, s_kv, H, D;
};

}  // namespace

TEST_CASE("simd: dispatch lists, selects and refuses targets") {
  TargetGuard guard;
  const std::vector<std::string> names = simd::compiled_targets();
  REQUIRE(!names.empty());
  for (const std::string& name : names) {
    simd::set_target(name);
    CHECK(simd::current_target() == name);
  }
  simd::set_target("best");
  CHECK(simd::current_target() == names.front());
  CHECK_THROWS_WITH_AS(simd::set_target("NO_SUCH_TARGET"),
                       doctest::Contains("unknown or unsupported target 'NO_SUCH_TARGET'"), Error);
}

TEST_CASE("simd: FP8 indexer logits are bit-identical to ref on every target and thread count") {
  // Prime sizes, D not a multiple of any lane count (7, 33), H not a multiple of a tile (5, 17),
  // one-element problems, causal and varied windows (with empty rows).
  const std::vector<Shape4> shapes = {{1, 1, 1, 1},   {9, 23, 5, 7},  {13, 61, 8, 33},
                                      {7, 50, 16, 64}, {5, 97, 3, 128}, {3, 29, 17, 1}};
  for (const Shape4& sh : shapes) {
    for (Dist dist : {Dist::normal, Dist::ties}) {
      for (Windows windows : {Windows::varied, Windows::causal}) {
        CAPTURE(sh.s_q);
        CAPTURE(sh.s_kv);
        CAPTURE(sh.H);
        CAPTURE(sh.D);
        CAPTURE(dist_name(dist));
        const IndexerInputs in = make_indexer(sh.s_q, sh.s_kv, sh.H, sh.D, dist, 7 + uint64_t(sh.D), windows);
        const Tensor<float> exp = ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke);
        for_each_target([&](const std::string&, int) {
          const Tensor<float> got = simd::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke);
          REQUIRE(first_diff(got, exp) == -1);
        });
      }
    }
  }
}

TEST_CASE("simd: f32 indexer logits are bit-identical to ref on every target and thread count") {
  // Full-precision f32 values (not bf16-rounded), so partial sums of the dot round in double. The
  // double rounding rarely reaches the f32 result, so the data also carries a cancelling pair per
  // key (+big at d = 0, -big at d = D - 1, q = 1 there): the small terms in between are rounded at
  // big's ulp, and the f32 result depends on the summation order. Only ref's ascending-d order per
  // key reproduces the bits (reversing d fails this test).
  for (const Shape4& sh : std::vector<Shape4>{{6, 31, 4, 96}, {4, 17, 9, 7}, {3, 41, 3, 33}}) {
    CAPTURE(sh.D);
    Tensor<float> q({sh.s_q, sh.H, sh.D}), k({sh.s_kv, sh.D}), w({sh.s_q, sh.H}), ksc({sh.s_kv});
    fill(q.ptr(), q.numel(), Dist::normal, 1.0f, 11, 1);
    fill(k.ptr(), k.numel(), Dist::uniform, 1.0f, 11, 2);
    fill(w.ptr(), w.numel(), Dist::normal, 1.0f, 11, 3);
    fill(ksc.ptr(), ksc.numel(), Dist::uniform, 2.0f, 11, 4);
    for (int64_t t = 0; t < sh.s_q; ++t)
      for (int64_t h = 0; h < sh.H; ++h) q.at(t, h, 0) = q.at(t, h, sh.D - 1) = 1.0f;
    for (int64_t s = 0; s < sh.s_kv; ++s) {
      k.at(s, 0) = std::ldexp(1.0f + float(s) / 64, 36);
      k.at(s, sh.D - 1) = -k.at(s, 0);
    }
    IndexerInputs win;
    set_windows(win, sh.s_q, sh.s_kv, Windows::varied);
    const Tensor<float> exp = ref::indexer_logits_f32(q, k, ksc, w, win.ks, win.ke);
    for_each_target([&](const std::string&, int) {
      const Tensor<float> got = simd::indexer_logits_f32(q, k, ksc, w, win.ks, win.ke);
      REQUIRE(first_diff(got, exp) == -1);
    });
  }
}

TEST_CASE("simd: indexer NaN propagates as in ref, and input errors carry ref's messages") {
  IndexerInputs in = make_indexer(6, 19, 5, 9, Dist::normal, 3);
  in.q.at(3, 1, 0) = e4m3_t{0x7F};  // NaN code in a query head
  in.k.at(4, 8) = e4m3_t{0xFF};     // NaN code in a key
  in.w.at(5, 4) = std::numeric_limits<float>::quiet_NaN();
  in.k_scale[7] = std::numeric_limits<float>::quiet_NaN();
  in.w.at(2, 0) = kInf;  // inf * relu(0) = NaN where a dot is <= 0
  const Tensor<float> exp = ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke);
  int64_t nans = 0;
  for (float x : exp.data) nans += std::isnan(x);
  REQUIRE(nans > 0);
  for_each_target([&](const std::string&, int) {
    REQUIRE(first_diff(simd::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke), exp) == -1);
  });
  Tensor<int32_t> bad_ke = in.ke;
  bad_ke[2] = 20;
  const std::string msg = error_of([&] { ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, bad_ke); });
  CHECK(error_of([&] { simd::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, bad_ke); }) == msg);
  CHECK(error_of([&] { simd::indexer_topk_fp8(in.q, in.k, in.k_scale, in.w, in.ks, bad_ke, 4); }) == msg);
  Tensor<float> w_bad({6, 4});
  CHECK(error_of([&] { simd::indexer_logits_fp8(in.q, in.k, in.k_scale, w_bad, in.ks, in.ke); }) ==
        error_of([&] { ref::indexer_logits_fp8(in.q, in.k, in.k_scale, w_bad, in.ks, in.ke); }));
}

TEST_CASE("simd: top-k equals ref (ties, signed zeros, infinities, short rows, every k)") {
  const int64_t s_q = 11, s_kv = 37;
  Tensor<int32_t> ks({s_q}), ke({s_q});
  for (int64_t t = 0; t < s_q; ++t) {  // empty, length-1, full, and varied windows
    ks[t] = int32_t((t * 5) % 13);
    ke[t] = int32_t(std::min<int64_t>(s_kv, ks[t] + (t * 11) % 38));
  }
  ks[1] = 0, ke[1] = s_kv;  // full row
  ks[2] = 36, ke[2] = 37;   // one element
  ks[3] = 20, ke[3] = 20;   // empty
  std::vector<Tensor<float>> cases;
  for (Dist dist : {Dist::ties, Dist::normal, Dist::integer}) {
    Tensor<float> x({s_q, s_kv});
    fill(x.ptr(), x.numel(), dist, 1.0f, 21, uint64_t(dist));
    cases.push_back(x);
  }
  Tensor<float> special({s_q, s_kv});
  const float pool[] = {-kInf, kInf, -0.0f, 0.0f, 1.0f, -1.0f, 1e-45f, -1e-45f, 3.0f};
  Xoshiro256 pick(17);
  for (int64_t i = 0; i < special.numel(); ++i) special[i] = pool[pick.below(9)];
  cases.push_back(special);
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int64_t k : {1, 2, 3, 16, 36, 37, 40, 100}) {
      CAPTURE(c);
      CAPTURE(k);
      const Tensor<int32_t> exp = ref::topk(cases[c], ks, ke, k);
      for_each_target([&](const std::string&, int) {
        const Tensor<int32_t> got = simd::topk(cases[c], ks, ke, k);
        REQUIRE(got.shape == exp.shape);
        REQUIRE(got.data == exp.data);
      });
    }
  }
  // Long rows: the pruning and the vector pre-filter run many times (ascending, descending and
  // random scores, and ties).
  const int64_t n = 1500;
  Tensor<float> rows({4, n});
  fill(rows.ptr(), n, Dist::normal, 1.0f, 5, 1);
  for (int64_t i = 0; i < n; ++i) rows.at(1, i) = float(i);
  for (int64_t i = 0; i < n; ++i) rows.at(2, i) = float(-i);
  fill(rows.ptr() + 3 * n, n, Dist::ties, 1.0f, 5, 2);
  Tensor<int32_t> lks({4}, 3), lke({4}, int32_t(n - 2));
  for (int64_t k : {1, 7, 64, 700, 1495, 1496}) {
    CAPTURE(k);
    const Tensor<int32_t> exp = ref::topk(rows, lks, lke, k);
    for_each_target([&](const std::string&, int) { REQUIRE(simd::topk(rows, lks, lke, k).data == exp.data); });
  }
}

TEST_CASE("simd: top-k errors are ref's, for the same first fault") {
  Tensor<float> x({4, 10});
  fill(x.ptr(), x.numel(), Dist::normal, 1.0f, 2, 1);
  Tensor<int32_t> ks({4}, 0), ke({4}, 10);
  x.at(2, 7) = std::numeric_limits<float>::quiet_NaN();
  x.at(2, 4) = std::numeric_limits<float>::quiet_NaN();
  x.at(3, 1) = std::numeric_limits<float>::quiet_NaN();
  Tensor<int32_t> ke_bad = ke;
  ke_bad[3] = 11;
  Tensor<int32_t> ks_short = ks;
  ks_short[2] = 8;  // NaN at column 4 and 7 now outside row 2's window
  for_each_target([&](const std::string&, int) {
    for (int64_t k : {1, 5}) {
      CHECK(error_of([&] { simd::topk(x, ks, ke, k); }) == error_of([&] { ref::topk(x, ks, ke, k); }));
      CHECK(error_of([&] { simd::topk(x, ks, ke_bad, k); }) == error_of([&] { ref::topk(x, ks, ke_bad, k); }));
      CHECK(error_of([&] { simd::topk(x, ks_short, ke, k); }) ==
            error_of([&] { ref::topk(x, ks_short, ke, k); }));
    }
    CHECK(error_of([&] { simd::topk(x, ks, ke, 0); }) == error_of([&] { ref::topk(x, ks, ke, 0); }));
    Tensor<float> x3({4, 10, 1});
    CHECK(error_of([&] { simd::topk(x3, ks, ke, 2); }) == error_of([&] { ref::topk(x3, ks, ke, 2); }));
  });
  CHECK(error_of([&] { ref::topk(x, ks, ke, 3); }) == "topk logits: NaN at row 2, column 4");
}

TEST_CASE("simd: streaming indexer top-k equals ref::topk of ref logits") {
  struct Case {
    Shape4 sh;
    Dist dist;
    Windows windows;
  };
  const std::vector<Case> cases = {
      {{9, 23, 5, 7}, Dist::ties, Windows::varied},   {{13, 61, 8, 33}, Dist::normal, Windows::varied},
      {{1, 53, 3, 16}, Dist::ties, Windows::causal},  {{6, 47, 9, 33}, Dist::integer, Windows::causal},
      {{4, 5, 2, 7}, Dist::normal, Windows::varied},
  };
  for (const Case& c : cases) {
    CAPTURE(c.sh.s_q);
    CAPTURE(c.sh.s_kv);
    CAPTURE(c.sh.D);
    CAPTURE(dist_name(c.dist));
    const IndexerInputs in = make_indexer(c.sh.s_q, c.sh.s_kv, c.sh.H, c.sh.D, c.dist, 31, c.windows);
    const Tensor<float> logits = ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke);
    // Blocks of 1 key, of a few keys (not a multiple of any panel), and longer than every row.
    std::vector<int64_t> blocks = {7, 4096, std::numeric_limits<int64_t>::max()};
    if (c.sh.s_kv <= 32) blocks.push_back(1);
    for (int64_t k : {int64_t(1), int64_t(4), c.sh.s_kv, c.sh.s_kv + 5}) {
      CAPTURE(k);
      const Tensor<int32_t> exp = ref::topk(logits, in.ks, in.ke, k);
      for_each_target([&](const std::string&, int) {
        for (int64_t block : blocks) {
          CAPTURE(block);
          const Tensor<int32_t> got =
              simd::indexer_topk_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke, k, block);
          REQUIRE(got.shape == exp.shape);
          REQUIRE(got.data == exp.data);
        }
      });
    }
  }
}

TEST_CASE("simd: streaming top-k reports ref's NaN error and refuses bad k") {
  IndexerInputs in = make_indexer(7, 29, 4, 8, Dist::normal, 5);
  in.k.at(20, 3) = e4m3_t{0x7F};  // key 20 is NaN for every row whose window holds it
  in.k.at(9, 0) = e4m3_t{0xFF};
  const std::string exp = error_of([&] {
    ref::topk(ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke), in.ks, in.ke, 3);
  });
  REQUIRE(exp.find("NaN at row") != std::string::npos);
  for_each_target([&](const std::string&, int) {
    for (int64_t block : {3, 4096})
      CHECK(error_of([&] { simd::indexer_topk_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke, 3, block); }) == exp);
  });
  CHECK(error_of([&] { simd::indexer_topk_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke, 0); }) ==
        error_of([&] { ref::topk(Tensor<float>({7, 29}), in.ks, in.ke, 0); }));
  CHECK_THROWS_WITH_AS(simd::indexer_topk_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke, 3, 0),
                       doctest::Contains("key_block must be >= 1"), Error);
}

// ---- attention ----------------------------------------------------------------------------------
//
// Tolerance: what any summation order would meet (the contract is stronger, bit-identical; this
// check tells a reordering bug from a rounding difference when the bitwise check fails). Both compute in double and round each output to f32 once, so
// the double-level difference is bounded first, then one f32 rounding step is added. With
// u = 2^-53, gamma(k) = k u / (1 - k u) (Higham's bound for a k-term sum in any order), for one
// (t, h) over n valid rows with d = d_qk:
//   logits   P_i = sm * sum_j q_j k_ij: |dP| <= dP := gamma(d + 1) |sm| max_i S_i,
//            S_i = sum_j |q_j k_ij| (products are exact; the +1 is the scale multiply)
//   max      m is a max of computed logits: |dm| <= dP
//   exp      e_i = exp(P_i - m): argument error <= 2 dP + u R (R = max_i |P_i - m|, the
//            subtraction's rounding), exp's own error <= 2u relative, so
//            rel(e_i) <= eps_e := 2 dP + u R + 2u (first order)
//   sum      l = sum_i e_i: rel(l) <= eps_l := eps_e + gamma(n)
//   lse      m + log(l): |dlse| <= dlse := dP + eps_l + 2u |lse|
//   sink     g = 1 / (1 + exp(s - lse)): rel(g) <= dlse + 4u (dg/dlse = g (1 - g))
//   out      (sum_i e_i v_ic) / l * g: |dout_c| <= (2 eps_l + dlse + 8u) M_c with
//            M_c = g sum_i softmax_i |v_ic| (>= |out_c|; covers the numerator's and l's errors)
// The bound is first order, so it is doubled. Rounding two doubles within E of each other to f32
// gives values within E + ulp_f32 (each rounding moves at most half an ulp); out_bf16 adds
// ulp_bf16 on top of out's bound. Non-finite reference values (empty rows: lse +inf, max -inf;
// a +inf sink: out exactly 0) must match exactly.
namespace {

struct AttnCase {
  Tensor<bf16_t> q, kv;
  float sm_scale = 0;
  int64_t d_v = 0;
  Tensor<int32_t> indices, topk_length, ks, ke;
  Tensor<float> sink;
  bool dense = false, use_topk_length = false, use_sink = false;
};

AttnCase make_attention(int64_t s_q, int64_t h_q, int64_t d_qk, int64_t d_v, int64_t s_kv,
                        int64_t topk, uint64_t seed) {
  AttnCase c;
  Tensor<float> qf({s_q, h_q, d_qk}), kf({s_kv, 1, d_qk});
  fill(qf.ptr(), qf.numel(), Dist::normal, 1.0f, seed, 1);
  fill(kf.ptr(), kf.numel(), Dist::normal, 1.0f, seed, 2);
  c.q = Tensor<bf16_t>(qf.shape);
  c.kv = Tensor<bf16_t>(kf.shape);
  for (int64_t i = 0; i < qf.numel(); ++i) c.q[i] = f32_to_bf16(qf[i]);
  for (int64_t i = 0; i < kf.numel(); ++i) c.kv[i] = f32_to_bf16(kf[i]);
  c.sm_scale = 1.0f / std::sqrt(float(d_qk));
  c.d_v = d_v;
  // Indices in [-3, s_kv + 3): invalid ones on both sides, duplicates; row 1 all invalid.
  c.indices = Tensor<int32_t>({s_q, 1, topk});
  Xoshiro256 g(seed);
  for (int64_t i = 0; i < c.indices.numel(); ++i) c.indices[i] = int32_t(int64_t(g.below(uint64_t(s_kv + 6))) - 3);
  if (s_q > 1)
    for (int64_t j = 0; j < topk; ++j) c.indices[topk + j] = (j % 2) ? -1 : int32_t(s_kv + j);
  c.topk_length = Tensor<int32_t>({s_q});
  for (int64_t t = 0; t < s_q; ++t) c.topk_length[t] = int32_t((t * 5) % (topk + 1));
  c.sink = Tensor<float>({h_q});
  fill(c.sink.ptr(), h_q, Dist::normal, 2.0f, seed, 3);
  c.sink[0] = kInf;
  if (h_q > 1) c.sink[1] = -kInf;
  c.ks = Tensor<int32_t>({s_q});
  c.ke = Tensor<int32_t>({s_q});
  for (int64_t t = 0; t < s_q; ++t) {  // causal windows, one empty
    c.ks[t] = int32_t((t * 2) % 5);
    c.ke[t] = int32_t(std::min<int64_t>(s_kv, s_kv - s_q + t + 1));
  }
  c.ks[0] = c.ke[0];
  return c;
}

ref::AttentionOut run_ref(const AttnCase& c) {
  const Tensor<float>* sink = c.use_sink ? &c.sink : nullptr;
  if (c.dense) return ref::dense_attention(c.q, c.kv, c.sm_scale, c.d_v, c.ks, c.ke, sink);
  return ref::sparse_attention(c.q, c.kv, c.indices, c.sm_scale, c.d_v,
                               c.use_topk_length ? &c.topk_length : nullptr, sink);
}

ref::AttentionOut run_simd(const AttnCase& c) {
  const Tensor<float>* sink = c.use_sink ? &c.sink : nullptr;
  if (c.dense) return simd::dense_attention(c.q, c.kv, c.sm_scale, c.d_v, c.ks, c.ke, sink);
  return simd::sparse_attention(c.q, c.kv, c.indices, c.sm_scale, c.d_v,
                                c.use_topk_length ? &c.topk_length : nullptr, sink);
}

// The valid kv rows of query t, as the semantics define them (independent of both implementations).
std::vector<int64_t> valid_rows(const AttnCase& c, int64_t t) {
  std::vector<int64_t> rows;
  const int64_t s_kv = c.kv.dim(0);
  if (c.dense) {
    for (int64_t i = c.ks[t]; i < c.ke[t]; ++i) rows.push_back(i);
  } else {
    const int64_t topk = c.indices.dim(2), len = c.use_topk_length ? c.topk_length[t] : topk;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = c.indices[t * topk + j];
      if (0 <= i && i < s_kv) rows.push_back(i);
    }
  }
  return rows;
}

double ulp_f32(double x) {
  const float f = float(std::fabs(x));
  if (!std::isfinite(f)) return kInf;
  return double(std::nextafter(f, kInf)) - double(f);
}
double ulp_bf16(double x) { return ulp_f32(x) * 65536.0; }

bool within(float got, float exp, double tol) {
  if (!std::isfinite(exp)) return same_bits(got, exp);
  return std::fabs(double(got) - double(exp)) <= tol;
}

// Checks got against exp with the bound derived above; returns the number of violations.
int64_t attention_violations(const AttnCase& c, const ref::AttentionOut& got, const ref::AttentionOut& exp) {
  const double u = std::ldexp(1.0, -53);
  const auto gamma = [u](double k) { return k * u / (1.0 - k * u); };
  const int64_t s_q = c.q.dim(0), h_q = c.q.dim(1), d = c.q.dim(2), d_v = c.d_v;
  const double sm = double(c.sm_scale);
  int64_t bad = 0;
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int64_t> rows = valid_rows(c, t);
    const double n = double(rows.size());
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      double s_max = 0, p_max = -kInf, p_min = kInf;
      std::vector<double> p(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        double s = 0, dot = 0;
        for (int64_t j = 0; j < d; ++j) {
          const double prod = double(bf16_to_f32(c.q.at(t, h, j))) * double(bf16_to_f32(c.kv[rows[i] * d + j]));
          s += std::fabs(prod);
          dot += prod;
        }
        s_max = std::max(s_max, s);
        p[i] = dot * sm;
        p_max = std::max(p_max, p[i]);
        p_min = std::min(p_min, p[i]);
      }
      const double dP = gamma(double(d + 1)) * std::fabs(sm) * s_max;
      const double range = rows.empty() ? 0.0 : p_max - p_min;
      const double eps_e = 2 * dP + u * range + 2 * u;
      const double eps_l = eps_e + gamma(n);
      const double lse = double(exp.lse[th]);
      const double dlse = dP + eps_l + 2 * u * (std::isfinite(lse) ? std::fabs(lse) : 0.0);
      double g = 1.0;
      if (c.use_sink && std::isfinite(lse)) g = 1.0 / (1.0 + std::exp(double(c.sink[h]) - lse));
      double l = 0;
      for (double x : p) l += std::exp(x - p_max);
      std::vector<double> softmax(p.size());
      for (size_t i = 0; i < p.size(); ++i) softmax[i] = std::exp(p[i] - p_max) / l;
      bad += !within(got.max_logits[th], exp.max_logits[th], 2 * dP + ulp_f32(exp.max_logits[th]));
      bad += !within(got.lse[th], exp.lse[th], 2 * dlse + ulp_f32(exp.lse[th]));
      for (int64_t col = 0; col < d_v; ++col) {
        double mc = 0;
        for (size_t i = 0; i < rows.size(); ++i)
          mc += softmax[i] * std::fabs(double(bf16_to_f32(c.kv[rows[i] * d + col])));
        mc *= g;
        const double e = 2 * (2 * eps_l + dlse + 8 * u) * mc;
        const int64_t o = th * d_v + col;
        const double tol = e + ulp_f32(std::fabs(double(exp.out[o])) + e);
        bad += !within(got.out[o], exp.out[o], tol);
        const float gb = bf16_to_f32(got.out_bf16[o]), eb = bf16_to_f32(exp.out_bf16[o]);
        bad += !within(gb, eb, tol + ulp_bf16(std::fabs(double(exp.out[o])) + tol));
      }
    }
  }
  return bad;
}

bool attention_bitwise(const ref::AttentionOut& a, const ref::AttentionOut& b) {
  return first_diff(a.out, b.out) == -1 && first_diff(a.lse, b.lse) == -1 &&
         first_diff(a.max_logits, b.max_logits) == -1 && a.out_bf16.data == b.out_bf16.data;
}

void check_attention(const AttnCase& c) {
  const ref::AttentionOut exp = run_ref(c);
  std::map<std::string, ref::AttentionOut> one_thread;
  for_each_target([&](const std::string& target, int threads) {
    const ref::AttentionOut got = run_simd(c);
    REQUIRE(attention_violations(c, got, exp) == 0);
    REQUIRE(attention_bitwise(got, exp));
    // Profiling the call (simd::AttentionPhases) changes no bit; its parts fit in its total.
    simd::AttentionPhases ph;
    const Tensor<float>* sink = c.use_sink ? &c.sink : nullptr;
    const ref::AttentionOut prof =
        c.dense ? simd::dense_attention(c.q, c.kv, c.sm_scale, c.d_v, c.ks, c.ke, sink, &ph)
                : simd::sparse_attention(c.q, c.kv, c.indices, c.sm_scale, c.d_v,
                                         c.use_topk_length ? &c.topk_length : nullptr, sink, &ph);
    REQUIRE(attention_bitwise(prof, exp));
    CHECK(ph.total > 0);
    CHECK(ph.qk_tiles + ph.pv_tiles + ph.k_gather + ph.v_gather + ph.q_decode + ph.softmax <= ph.total * (1 + 1e-9));
    if (threads == 1)
      one_thread.emplace(target, got);
    else
      REQUIRE(attention_bitwise(got, one_thread.at(target)));
  });
}

}  // namespace

TEST_CASE("simd: sparse and dense attention bit-identical to ref on every target and thread count") {
  struct Dims {
    int64_t s_q, h_q, d_qk, d_v, s_kv, topk;
  };
  // h_q not a multiple of a head tile (9, 3), d_qk / d_v not multiples of a lane count; the last
  // two shapes have rows lists of 128+ (the radix sort) and more rows than one P.V sub-chunk, with
  // whole P.V slices (d_v 64) or a whole and a narrower last one (d_v 40: 32 + 8 columns on AVX3,
  // 16 + 16 + 8 on AVX2), and four head tiles in pass 1 (h_q 16) or two (h_q 5).
  for (const Dims& dm : std::vector<Dims>{{6, 9, 40, 32, 53, 24},
                                          {4, 3, 33, 7, 29, 31},
                                          {2, 1, 1, 1, 5, 3},
                                          {3, 5, 48, 40, 700, 600},
                                          {2, 16, 64, 64, 300, 256}}) {
    CAPTURE(dm.d_qk);
    CAPTURE(dm.d_v);
    AttnCase c = make_attention(dm.s_q, dm.h_q, dm.d_qk, dm.d_v, dm.s_kv, dm.topk, 40 + uint64_t(dm.d_qk));
    for (int variant = 0; variant < 5; ++variant) {
      CAPTURE(variant);
      c.dense = variant == 4;
      c.use_topk_length = variant == 1 || variant == 3;
      c.use_sink = variant >= 2;
      check_attention(c);
    }
  }
}

// ---- the oracle's computations (ref/bounds.h) ---------------------------------------------------
namespace {

bool same_bits_d(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}
// The first element whose bits differ (NaNs equal), -1 when none: bounds are f32 (rounded up).
int64_t first_diff_d(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits_d(double(a[i]), double(b[i]))) return int64_t(i);
  return -1;
}

// simd's emulation and attention bounds against ref's, bit for bit, on every target and 1 and 2
// threads (the emulation sets the budget that golden writes into the manifest).
void check_emulation_and_bounds(const AttnCase& c) {
  const Tensor<int32_t>* tl = c.use_topk_length ? &c.topk_length : nullptr;
  const Tensor<float>* sink = c.use_sink ? &c.sink : nullptr;
  const ref::AttentionOut emu = cmp::emulate_attention_lowp(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, sink);
  const ref::AttentionOut exact = ref::sparse_attention(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, sink);
  const cmp::AttentionBounds bounds = cmp::attention_bounds(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, exact);
  // With the softmax-scale direction: the same bounds, and the direction (with the sink's factor).
  const cmp::AttentionBounds with_sm = cmp::attention_bounds_sm(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, sink, exact);
  REQUIRE(first_diff_d(with_sm.out, bounds.out) == -1);
  REQUIRE(with_sm.sm_out.size() == bounds.out.size());
  REQUIRE(with_sm.sm_lse.size() == bounds.lse.size());
  auto same_f = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for_each_target([&](const std::string&, int) {
    REQUIRE(attention_bitwise(simd::emulate_attention_lowp(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, sink), emu));
    // kv converted once for every query row, and by each row for its own keys (no shared copy).
    for (const int64_t shared_max : {simd::bounds_shared_kv_max_bytes, int64_t(0)}) {
      CAPTURE(shared_max);
      const int64_t saved = simd::bounds_shared_kv_max_bytes;
      simd::bounds_shared_kv_max_bytes = shared_max;
      const cmp::AttentionBounds b = simd::attention_bounds(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, exact);
      REQUIRE(first_diff_d(b.out, bounds.out) == -1);
      REQUIRE(first_diff_d(b.lse, bounds.lse) == -1);
      REQUIRE(first_diff_d(b.max_logits, bounds.max_logits) == -1);
      const cmp::AttentionBounds s = simd::attention_bounds_sm(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, sink, exact);
      REQUIRE(first_diff_d(s.out, bounds.out) == -1);
      REQUIRE(first_diff_d(s.lse, bounds.lse) == -1);
      REQUIRE(first_diff_d(s.max_logits, bounds.max_logits) == -1);
      REQUIRE(same_f(s.sm_out, with_sm.sm_out));
      REQUIRE(same_f(s.sm_lse, with_sm.sm_lse));
      simd::bounds_shared_kv_max_bytes = saved;
    }
  });
  // Through the kernel table, as golden and diff call them.
  const ref::Kernels k = simd::kernels();
  REQUIRE(attention_bitwise(k.emulate_attention_lowp(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, sink), emu));
  REQUIRE(first_diff_d(k.attention_bounds(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, exact).out, bounds.out) == -1);
  REQUIRE(same_f(k.attention_bounds_sm(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, sink, exact, nullptr).sm_out, with_sm.sm_out));
  // kv's shared work prepared once (prepare_bounds_kv, as diff's blocks of rows use it): every
  // block of query rows gets the bits of one call over every row. A wrong kv: refused.
  REQUIRE(bool(k.prepare_bounds_kv));
  for (const int64_t shared_max : {simd::bounds_shared_kv_max_bytes, int64_t(0)}) {
    CAPTURE(shared_max);
    const int64_t saved = simd::bounds_shared_kv_max_bytes;
    simd::bounds_shared_kv_max_bytes = shared_max;
    const std::unique_ptr<cmp::BoundsKv> skv = k.prepare_bounds_kv(c.kv, c.q.dim(2));
    const cmp::AttentionBounds whole = k.attention_bounds_sm(c.q, c.kv, c.indices, c.sm_scale, c.d_v, tl, sink, exact, nullptr);
    simd::bounds_shared_kv_max_bytes = saved;
    const int64_t s_q = c.q.dim(0), h_q = c.q.dim(1), d_qk = c.q.dim(2), topk = c.indices.dim(2);
    for (int64_t r0 = 0; r0 < s_q; r0 += 2) {
      const int64_t n = std::min<int64_t>(2, s_q - r0);
      const BorrowedTensor<bf16_t> qb({n, h_q, d_qk}, c.q.ptr() + r0 * h_q * d_qk);
      const BorrowedTensor<int32_t> ib({n, 1, topk}, c.indices.ptr() + r0 * topk);
      std::optional<BorrowedTensor<int32_t>> lb;
      if (tl) lb.emplace(Shape{n}, tl->ptr() + r0);
      ref::AttentionOut xb;
      xb.out = Tensor<float>({n, h_q, c.d_v});
      std::copy(exact.out.ptr() + r0 * h_q * c.d_v, exact.out.ptr() + (r0 + n) * h_q * c.d_v, xb.out.ptr());
      xb.lse = Tensor<float>({n, h_q});
      std::copy(exact.lse.ptr() + r0 * h_q, exact.lse.ptr() + (r0 + n) * h_q, xb.lse.ptr());
      xb.max_logits = Tensor<float>({n, h_q});
      std::copy(exact.max_logits.ptr() + r0 * h_q, exact.max_logits.ptr() + (r0 + n) * h_q, xb.max_logits.ptr());
      const cmp::AttentionBounds s = k.attention_bounds_sm(qb, c.kv, ib, c.sm_scale, c.d_v, lb ? &lb->get() : nullptr, sink, xb, skv.get());
      const size_t o = size_t(r0 * h_q * c.d_v), e = size_t(r0 * h_q);
      // Every bit of simd's one call over every row (NaN signs and payloads included), which is ref's
      // (checked above, NaNs equal as everywhere in this test).
      REQUIRE(std::memcmp(s.out.data(), whole.out.data() + o, s.out.size() * sizeof(float)) == 0);
      REQUIRE(std::memcmp(s.lse.data(), whole.lse.data() + e, s.lse.size() * sizeof(float)) == 0);
      REQUIRE(std::memcmp(s.max_logits.data(), whole.max_logits.data() + e, s.max_logits.size() * sizeof(float)) == 0);
      REQUIRE(std::memcmp(s.sm_out.data(), whole.sm_out.data() + o, s.sm_out.size() * sizeof(float)) == 0);
      REQUIRE(std::memcmp(s.sm_lse.data(), whole.sm_lse.data() + e, s.sm_lse.size() * sizeof(float)) == 0);
    }
    const Tensor<bf16_t> other = c.kv;  // the same values elsewhere: not the kv it was made from
    CHECK_THROWS_WITH_AS(k.attention_bounds_sm(c.q, other, c.indices, c.sm_scale, c.d_v, tl, sink, exact, skv.get()),
                         doctest::Contains("made from another kv"), Error);
  }
}

}  // namespace

TEST_CASE("simd: the budget emulation and the attention bounds are bit-identical to ref's on every target") {
  struct Dims {
    int64_t s_q, h_q, d_qk, d_v, s_kv, topk;
  };
  // Odd head counts (not a multiple of a tile or a vector: 9, 3, 1, 5), d_qk / d_v not multiples
  // of a lane count, rows of 1 to 600 keys (a key count not a multiple of the tile), one realistic
  // MLA shape (576 / 512, 16 heads). make_attention gives every case an empty row (row 1: every
  // index invalid), invalid indices on both sides and duplicates; topk_length adds rows of 0 slots.
  for (const Dims& dm : std::vector<Dims>{{6, 9, 40, 32, 53, 24},
                                          {4, 3, 33, 7, 29, 31},
                                          {2, 1, 1, 1, 5, 3},
                                          {3, 5, 48, 40, 700, 600},
                                          {3, 16, 576, 512, 160, 67}}) {
    CAPTURE(dm.h_q);
    CAPTURE(dm.d_qk);
    AttnCase c = make_attention(dm.s_q, dm.h_q, dm.d_qk, dm.d_v, dm.s_kv, dm.topk, 90 + uint64_t(dm.d_qk));
    for (int variant = 0; variant < 4; ++variant) {
      CAPTURE(variant);
      c.use_topk_length = variant == 1 || variant == 3;
      c.use_sink = variant >= 2;  // sinks of +inf, -inf and finite values
      check_emulation_and_bounds(c);
    }
  }
  // Non-finite inputs: NaN and inf in q and kv reach the same positions.
  AttnCase c = make_attention(4, 5, 20, 12, 30, 9, 7);
  c.q.at(0, 2, 3) = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  c.kv[5 * 20 + 1] = f32_to_bf16(kInf);
  c.q.at(2, 1, 0) = f32_to_bf16(-kInf);
  check_emulation_and_bounds(c);
  // The emulation's sums are sequential in f32: with q . k terms 2^60, 1, -2^60 (d ascending) the
  // sequential dot is 0 (2^60 + 1 rounds to 2^60), and with one key lse = max_logits = 0; any
  // other order that pairs the large terms first gives 1.
  {
    Tensor<bf16_t> q({1, 1, 3}), kv({1, 1, 3});
    q[0] = kv[0] = f32_to_bf16(0x1p30f);
    q[1] = kv[1] = f32_to_bf16(1.0f);
    q[2] = f32_to_bf16(-0x1p30f), kv[2] = f32_to_bf16(0x1p30f);
    const Tensor<int32_t> idx({1, 1, 1}, 0);
    CHECK(cmp::emulate_attention_lowp(q, kv, idx, 1.0f, 2, nullptr, nullptr).max_logits[0] == 0.0f);
    for_each_target([&](const std::string&, int threads) {
      if (threads == 1) CHECK(simd::emulate_attention_lowp(q, kv, idx, 1.0f, 2, nullptr, nullptr).max_logits[0] == 0.0f);
    });
  }
  // Products below f32's subnormal grid: q . k = 2^-125 + 1.25 * 2^-149 with d ascending. ref
  // rounds the second product to 2^-149 first, then the sum ties to even at 2^-125; a fused
  // multiply-add would round once, up to 2^-125 + 2^-148. simd fuses only when every product is
  // exact (ExpRange in simd/compare.cc), so it must keep ref's 2^-125 here. d_qk 2, and 64 (zeros
  // after the two terms): the exponent scans take the values in their vector lanes, not the tail.
  for (const int64_t D : {2, 64}) {
    CAPTURE(D);
    Tensor<bf16_t> q({1, 1, D}), kv({4, 1, D});  // four equal keys: a whole pass-1 tile
    q[0] = f32_to_bf16(0x1p-62f), q[1] = f32_to_bf16(0x1.4p-74f);
    for (int64_t r = 0; r < 4; ++r) kv[r * D] = f32_to_bf16(0x1p-63f), kv[r * D + 1] = f32_to_bf16(0x1p-75f);
    Tensor<int32_t> idx({1, 1, 4});
    for (int32_t j = 0; j < 4; ++j) idx[j] = j;
    CHECK(cmp::emulate_attention_lowp(q, kv, idx, 1.0f, 2, nullptr, nullptr).max_logits[0] == 0x1p-125f);
    for_each_target([&](const std::string&, int threads) {
      if (threads == 1) CHECK(simd::emulate_attention_lowp(q, kv, idx, 1.0f, 2, nullptr, nullptr).max_logits[0] == 0x1p-125f);
    });
  }
  // The bounds' logits are f32 sums too (ref/bounds.h): the same q . k = 2^-125 + 1.25 * 2^-149
  // over eight equal keys (a whole pass-1 tile on every target) must keep ref's unfused 2^-125,
  // which the softmax-scale direction's d lse / d ln sm = m + zbar = s (sm_scale 1) shows (d_qk 2
  // and 64, as above).
  for (const int64_t D : {2, 64}) {
    CAPTURE(D);
    Tensor<bf16_t> q({1, 1, D}), kv({8, 1, D});
    q[0] = f32_to_bf16(0x1p-62f), q[1] = f32_to_bf16(0x1.4p-74f);
    for (int64_t r = 0; r < 8; ++r) kv[r * D] = f32_to_bf16(0x1p-63f), kv[r * D + 1] = f32_to_bf16(0x1p-75f);
    Tensor<int32_t> idx({1, 1, 8});
    for (int32_t j = 0; j < 8; ++j) idx[j] = j;
    const ref::AttentionOut exact = ref::sparse_attention(q, kv, idx, 1.0f, 2, nullptr, nullptr);
    const cmp::AttentionBounds rb = cmp::attention_bounds_sm(q, kv, idx, 1.0f, 2, nullptr, nullptr, exact);
    CHECK(rb.sm_lse[0] == 0x1p-125f);
    for_each_target([&](const std::string&, int threads) {
      if (threads == 1) CHECK(simd::attention_bounds_sm(q, kv, idx, 1.0f, 2, nullptr, nullptr, exact).sm_lse[0] == 0x1p-125f);
    });
  }
  // The bounds' A and direction sums fuse only where every product is exact (ExpRange): three keys
  // with logits 0, 1, 2 (q = e_2, the third column of kv) and V (the first two columns) near f32's
  // subnormal grid, where a product u_i V_ic rounds before its add. The direction's D (sm_out, no
  // sink: D itself) is ref's multiply-then-add sum; a fused multiply-add would give other bits
  // (checked here, so the case exercises the fallback).
  {
    Tensor<bf16_t> q({1, 1, 3}), kv({3, 1, 3});
    q[2] = f32_to_bf16(1.0f);
    const float vs[3] = {0x1p-127f, 0x1.28p-127f, 0x1.0cp-127f};
    for (int64_t r = 0; r < 3; ++r)
      kv[r * 3] = f32_to_bf16(vs[r]), kv[r * 3 + 1] = f32_to_bf16(-vs[r]), kv[r * 3 + 2] = f32_to_bf16(float(r));
    Tensor<int32_t> idx({1, 1, 3});
    for (int32_t j = 0; j < 3; ++j) idx[j] = j;
    // ref's u_i = round_16(f32(w_i (z_i - zbar))) for logits 0, 1, 2.
    double pz[3], l = 0, zbar = 0;
    for (int i = 0; i < 3; ++i) l += (pz[i] = std::exp(double(i) - 2));
    for (int i = 0; i < 3; ++i) zbar += pz[i] / l * (double(i) - 2);
    float unfused = 0, fused = 0;
    for (int i = 0; i < 3; ++i) {
      float u = float(pz[i] / l * (double(i) - 2 - zbar));
      uint32_t ub;
      std::memcpy(&ub, &u, 4);
      ub = (ub + 0x80u) & ~0xFFu;
      std::memcpy(&u, &ub, 4);
      const float prod = u * vs[i];
      unfused = unfused + prod;
      fused = std::fma(u, vs[i], fused);
    }
    REQUIRE(unfused != fused);
    const ref::AttentionOut exact = ref::sparse_attention(q, kv, idx, 1.0f, 2, nullptr, nullptr);
    const cmp::AttentionBounds rb = cmp::attention_bounds_sm(q, kv, idx, 1.0f, 2, nullptr, nullptr, exact);
    CHECK(rb.sm_out[0] == unfused);
    for_each_target([&](const std::string&, int) {
      const cmp::AttentionBounds sb = simd::attention_bounds_sm(q, kv, idx, 1.0f, 2, nullptr, nullptr, exact);
      CHECK(first_diff_d(sb.out, rb.out) == -1);
      CHECK(first_diff_d(sb.sm_out, rb.sm_out) == -1);
    });
  }
  // The output's bf16 rounding ties to even: q = 0 (p = 1 for both keys, factor 1/2), V[:, 0] =
  // 1 + 2^-7 and 1 + 2^-6: out = 1 + 3 * 2^-8, halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  {
    Tensor<bf16_t> q({1, 1, 2}), kv({2, 1, 2});
    kv.at(0, 0, 0) = f32_to_bf16(1.0f + 0x1p-7f), kv.at(1, 0, 0) = f32_to_bf16(1.0f + 0x1p-6f);
    Tensor<int32_t> idx({1, 1, 2});
    idx[0] = 0, idx[1] = 1;
    CHECK(cmp::emulate_attention_lowp(q, kv, idx, 1.0f, 2, nullptr, nullptr).out[0] == 1.0f + 0x1p-6f);
    for_each_target([&](const std::string&, int threads) {
      if (threads == 1) CHECK(simd::emulate_attention_lowp(q, kv, idx, 1.0f, 2, nullptr, nullptr).out[0] == 1.0f + 0x1p-6f);
    });
  }
  // P.V runs over the valid rows ascending whatever their order in the indices: q = 0 (every p =
  // 1), V[:, 0] = 1 at row 2, 2^60 at row 5, -2^60 at row 9, given as 9, 5, 2. Ascending: 1 + 2^60
  // rounds to 2^60, minus 2^60: out 0; descending would give 1 / 3.
  {
    Tensor<bf16_t> q({1, 1, 2}), kv({10, 1, 2});
    kv.at(2, 0, 0) = f32_to_bf16(1.0f), kv.at(5, 0, 0) = f32_to_bf16(0x1p60f), kv.at(9, 0, 0) = f32_to_bf16(-0x1p60f);
    Tensor<int32_t> idx({1, 1, 3});
    idx[0] = 9, idx[1] = 5, idx[2] = 2;
    CHECK(cmp::emulate_attention_lowp(q, kv, idx, 1.0f, 2, nullptr, nullptr).out[0] == 0.0f);
    for_each_target([&](const std::string&, int threads) {
      if (threads == 1) CHECK(simd::emulate_attention_lowp(q, kv, idx, 1.0f, 2, nullptr, nullptr).out[0] == 0.0f);
    });
  }
}

TEST_CASE("simd: the indexer logits rule is bit-identical to ref's on every target") {
  // Key counts below, at and past the 32-key padding, H and D not multiples of a lane count,
  // windows with empty rows (-inf logits: bound 0, left out of the metric's sums).
  const std::vector<Shape4> shapes = {{1, 1, 1, 1}, {9, 23, 5, 7}, {7, 64, 16, 64}, {5, 97, 3, 128}};
  for (const Shape4& sh : shapes) {
    CAPTURE(sh.s_kv);
    const IndexerInputs in = make_indexer(sh.s_q, sh.s_kv, sh.H, sh.D, Dist::normal, 11 + uint64_t(sh.D));
    const Tensor<float> logits = ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke);
    const cmp::FloatRule exp = cmp::indexer_logits_rule(in.q, in.k, in.k_scale, in.w, logits);
    for_each_target([&](const std::string&, int) {
      const cmp::FloatRule got = simd::indexer_logits_rule(in.q, in.k, in.k_scale, in.w, logits);
      REQUIRE(first_diff_d(got.bound, exp.bound) == -1);
      REQUIRE(same_bits_d(got.metric_max, exp.metric_max));
      CHECK(got.derivation == exp.derivation);
    });
    const cmp::FloatRule k = simd::kernels().indexer_logits_rule(in.q, in.k, in.k_scale, in.w, logits);
    CHECK(first_diff_d(k.bound, exp.bound) == -1);
  }
}

TEST_CASE("simd: attention errors are ref's") {
  AttnCase c = make_attention(3, 2, 8, 8, 10, 4, 9);
  const Tensor<int32_t> bad_len({3}, 5);
  CHECK(error_of([&] { simd::sparse_attention(c.q, c.kv, c.indices, 1.0f, 8, &bad_len); }) ==
        error_of([&] { ref::sparse_attention(c.q, c.kv, c.indices, 1.0f, 8, &bad_len); }));
  CHECK(error_of([&] { simd::sparse_attention(c.q, c.kv, c.indices, 1.0f, 9); }) ==
        error_of([&] { ref::sparse_attention(c.q, c.kv, c.indices, 1.0f, 9); }));
  Tensor<int32_t> ke_bad = c.ke;
  ke_bad[1] = 11;
  CHECK(error_of([&] { simd::dense_attention(c.q, c.kv, 1.0f, 8, c.ks, ke_bad); }) ==
        error_of([&] { ref::dense_attention(c.q, c.kv, 1.0f, 8, c.ks, ke_bad); }));
  const Tensor<float> sink_bad({3});
  CHECK(error_of([&] { simd::dense_attention(c.q, c.kv, 1.0f, 8, c.ks, c.ke, &sink_bad); }) ==
        error_of([&] { ref::dense_attention(c.q, c.kv, 1.0f, 8, c.ks, c.ke, &sink_bad); }));
}

// Larger shapes (DeepSeek-like head counts and dims), skipped by default; run with
//   indexshare_tests -tc='simd: slow:*' --no-skip
TEST_CASE("simd: slow: realistic shapes on every target" * doctest::skip()) {
  {
    const IndexerInputs in = make_indexer(48, 1100, 64, 128, Dist::normal, 77, Windows::causal);
    const Tensor<float> logits = ref::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke);
    const Tensor<int32_t> exp = ref::topk(logits, in.ks, in.ke, 256);
    for_each_target([&](const std::string&, int) {
      REQUIRE(first_diff(simd::indexer_logits_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke), logits) == -1);
      REQUIRE(simd::topk(logits, in.ks, in.ke, 256).data == exp.data);
      for (int64_t block : {333, 4096})
        REQUIRE(simd::indexer_topk_fp8(in.q, in.k, in.k_scale, in.w, in.ks, in.ke, 256, block).data == exp.data);
    });
  }
  {
    AttnCase c = make_attention(4, 32, 576, 512, 700, 256, 78);
    for (int variant : {0, 3, 4}) {
      c.dense = variant == 4;
      c.use_topk_length = variant == 3;
      c.use_sink = variant == 3;
      check_attention(c);
    }
  }
}
