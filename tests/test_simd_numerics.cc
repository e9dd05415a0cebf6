// Tests of simd/ against ref/ (continued from tests/test_simd.cc), on every compiled Highway target
// and with 1 and 2 OpenMP threads: exp_portable, linear and head_linear, the module-level indexer
// and the toy model, the reduction orders, overlap statistics, FP8 quantization, the generator's
// fills, and the Impl rules.
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

TEST_CASE("simd: exp_portable equals ref's bit for bit on every target, tails and specials included") {
  std::vector<double> x;
  Xoshiro256 g(77);
  for (int i = 0; i < 20000; ++i) x.push_back(-800.0 + 1600.0 * double(g.next() >> 11) * 0x1p-53);
  for (int i = 0; i < 20000; ++i) x.push_back(-30.0 * double(g.next() >> 11) * 0x1p-53);
  const double inf = std::numeric_limits<double>::infinity();
  for (double s : {0.0, -0.0, inf, -inf, std::numeric_limits<double>::quiet_NaN(), -746.0, -745.5, -745.13,
                   -708.4, 709.78, 709.79, 710.0, 1e300, -1e300, 0x1p-1074, -0x1p-1074})
    x.push_back(s);
  for (int64_t n : {int64_t(x.size()), int64_t(x.size()) - 1, int64_t(x.size()) - 3, int64_t(5), int64_t(1)}) {
    CAPTURE(n);
    std::vector<double> expect(static_cast<size_t>(n));
    const int64_t off = int64_t(x.size()) - n;  // the specials sit at the end: every n sees them
    for (int64_t i = 0; i < n; ++i) expect[size_t(i)] = exp_portable(x[size_t(off + i)]);
    for_each_target([&](const std::string&, int threads) {
      if (threads != 1) return;
      std::vector<double> got(static_cast<size_t>(n), -1.0);
      simd::exp_portable(x.data() + off, got.data(), n);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool na = std::isnan(expect[size_t(i)]), nb = std::isnan(got[size_t(i)]);
        if (na != nb || (!na && std::memcmp(&expect[size_t(i)], &got[size_t(i)], 8) != 0)) ++bad;
      }
      CHECK(bad == 0);
    });
  }
}

// ---- module level ---------------------------------------------------------------------------------

TEST_CASE("simd: linear equals ref::linear bit for bit on every target (odd shapes, NaN and inf)") {
  struct Dims {
    int64_t rows, in, out;
  };
  for (const Dims& dm : std::vector<Dims>{{1, 1, 1}, {3, 7, 5}, {9, 33, 25}, {17, 130, 49}, {8, 64, 24}, {2, 0, 3}}) {
    CAPTURE(dm.rows);
    CAPTURE(dm.in);
    CAPTURE(dm.out);
    Tensor<float> x({dm.rows, dm.in}), w({dm.out, dm.in});
    fill(x.ptr(), x.numel(), Dist::normal, 1.0f, 11, stream_tag("x"));
    fill(w.ptr(), w.numel(), Dist::uniform, 0.25f, 11, stream_tag("w"));  // f32 values, not only bf16
    if (dm.rows > 2 && dm.in > 2) {
      x.at(1, 2) = std::numeric_limits<float>::quiet_NaN();
      x.at(2, 0) = std::numeric_limits<float>::infinity();
    }
    const Tensor<float> expect = ref::linear(x, w);
    for_each_target([&](const std::string&, int) {
      const Tensor<float> got = simd::linear(x, w);
      REQUIRE(got.shape == expect.shape);
      CHECK(first_diff(got, expect) == -1);
    });
  }
  Tensor<float> x({2, 3}), w({4, 5});
  CHECK(error_of([&] { simd::linear(x, w); }) == error_of([&] { ref::linear(x, w); }));
}

TEST_CASE("simd: head_linear equals ref::head_linear bit for bit on every target (both layouts, odd shapes)") {
  struct Dims {
    int64_t rows, heads, in, out;
  };
  // in > 128 walks several input chunks, out > 24 several panels; 1 row, 1 head, in 0.
  for (const Dims& dm : std::vector<Dims>{{1, 1, 1, 1}, {3, 2, 7, 5}, {9, 3, 130, 49}, {17, 5, 33, 24}, {2, 3, 0, 4}}) {
    for (const bool transposed : {false, true}) {
      CAPTURE(dm.rows);
      CAPTURE(dm.heads);
      CAPTURE(dm.in);
      CAPTURE(dm.out);
      CAPTURE(transposed);
      // Heads 3 elements apart beyond their matrices (gaps), element (o, i) at o * os + i * is.
      const int64_t os = transposed ? 1 : dm.in, is = transposed ? dm.out : 1, hstride = dm.out * dm.in + 3;
      Tensor<float> x({dm.rows, dm.heads, dm.in}), wbuf({dm.heads * hstride + 1});
      fill(x.ptr(), x.numel(), Dist::normal, 1.0f, 12, stream_tag("x"));
      fill(wbuf.ptr(), wbuf.numel(), Dist::uniform, 0.25f, 12, stream_tag("w"));  // f32 values, not only bf16
      if (dm.rows > 2 && dm.in > 2) {
        x.at(1, 0, 2) = std::numeric_limits<float>::quiet_NaN();
        x.at(2, dm.heads - 1, 0) = -std::numeric_limits<float>::infinity();
      }
      const ref::HeadWeights w{wbuf.ptr(), dm.heads, dm.out, dm.in, hstride, os, is};
      const Tensor<float> expect = ref::head_linear(x, w);
      for_each_target([&](const std::string&, int) {
        const Tensor<float> got = simd::head_linear(x, w);
        REQUIRE(got.shape == expect.shape);
        CHECK(first_diff(got, expect) == -1);
      });
    }
  }
  Tensor<float> x({2, 3, 4}), wbuf({10});
  const ref::HeadWeights bad{wbuf.ptr(), 2, 1, 4, 4, 4, 1};  // x has 3 heads
  CHECK(error_of([&] { simd::head_linear(x, bad); }) == error_of([&] { ref::head_linear(x, bad); }));
}

TEST_CASE("simd: the module-level indexer and the toy model give ref's bits") {
  for (const char* preset : {"tiny-glm", "tiny-deepseek"}) {
    CAPTURE(preset);
    const ModelConfig cfg = model_preset(preset);
    const Schedule s = cfg.resolve_schedule();
    for (auto variant : {ref::IndexerVariant::deepseek_fp8, ref::IndexerVariant::hf_bf16}) {
      const ref::ToyModel m = ref::make_toy_model(cfg, s, 5, 0.7f, variant, true);
      ref::ToyCache c_ref;
      const ref::ToyForward f = ref::forward(m, c_ref, ref::toy_hidden(cfg, 5, 0, 40));
      const ref::ToyLayerTrace& l0 = f.layers[0];
      for_each_target([&](const std::string&, int) {
        const ref::IndexerModuleOut o = simd::indexer_module(cfg, m.layers[0].indexer, l0.x, l0.qr, 0, variant);
        CHECK(first_diff(o.q, l0.indexer.q) == -1);
        CHECK(first_diff(o.k, l0.indexer.k) == -1);
        CHECK(first_diff(o.weights, l0.indexer.weights) == -1);
        CHECK(o.q8.data == l0.indexer.q8.data);
        ref::ToyCache c_simd;
        const ref::ToyForward g = ref::forward(m, c_simd, ref::toy_hidden(cfg, 5, 0, 40), simd::kernels());
        CHECK(first_diff(g.h_out, f.h_out) == -1);
        CHECK(g.layers[0].q.data == f.layers[0].q.data);  // W_uk absorption (head_linear)
        CHECK(first_diff(g.layers[0].out, f.layers[0].out) == -1);  // W_uv (head_linear) and wo
        for (size_t l = 0; l < f.layers.size(); ++l) {
          CAPTURE(l);
          CHECK(g.layers[l].used_topk.data == f.layers[l].used_topk.data);
          CHECK(first_diff(g.layers[l].logits, f.layers[l].logits) == -1);
          CHECK(first_diff(g.layers[l].attn.lse, f.layers[l].attn.lse) == -1);
        }
      });
    }
  }
}

// Reduction order matters only under cancellation; random inputs rarely show it after the f32
// rounding. These inputs do: products 2^60, 1, -2^60 in different parts / positions, so that an
// order other than the specified one gives another f32 result.
TEST_CASE("simd: reduction orders are the specified ones (cancellation-sensitive inputs)") {
  // Attention: one valid key, so lse = max_logits = P = (q . k) * sm_scale; d_qk = 24. With
  // q[d] * k[d] = 2^60 at d = 0, 1 at d = 1, -2^60 at d = 8: the 8-part order gives
  // part0 = 2^60 + -2^60 = 0, part1 = 1: dot 1; a sequential sum would lose the 1 (2^60 + 1 rounds
  // to 2^60) and give 0.
  const int64_t d_qk = 24;
  Tensor<bf16_t> q({1, 1, d_qk}), kv({1, 1, d_qk});
  const auto b = [](float v) { return f32_to_bf16(v); };
  for (int64_t d = 0; d < d_qk; ++d) q[d] = kv[d] = b(0.0f);
  q[0] = b(0x1p30f), kv[0] = b(0x1p30f);
  q[1] = b(1.0f), kv[1] = b(1.0f);
  q[8] = b(-0x1p30f), kv[8] = b(0x1p30f);
  Tensor<int32_t> idx({1, 1, 1}, 0);
  const ref::AttentionOut r = ref::sparse_attention(q, kv, idx, 1.0f, 8);
  CHECK(r.lse[0] == 1.0f);  // the 8-part order, worked out above
  for_each_target([&](const std::string&, int threads) {
    if (threads != 1) return;
    const ref::AttentionOut s = simd::sparse_attention(q, kv, idx, 1.0f, 8);
    CHECK(s.lse[0] == 1.0f);
    CHECK(s.max_logits[0] == 1.0f);
  });
  // P.V runs over the valid rows in ascending index order, whatever their order in the indices:
  // 200 rows (long enough for the radix sort), equal scores (q = 0, so every p = 1), V[:, 0] = 1 at
  // row 2, 2^60 at 256, -2^60 at 257, 0 elsewhere. Ascending: 1 + 2^60 rounds to 2^60, minus 2^60
  // gives 0. Sorting on the low byte only (256, 257, 2) would give 1 / 200 instead.
  {
    const int64_t s_kv = 600, n = 200;
    Tensor<bf16_t> q0({1, 1, 8}), kv0({s_kv, 1, 8});
    kv0.at(2, 0, 0) = b(1.0f), kv0.at(256, 0, 0) = b(0x1p60f), kv0.at(257, 0, 0) = b(-0x1p60f);
    Tensor<int32_t> rows({1, 1, n});
    rows[0] = 257, rows[1] = 256, rows[2] = 2;
    for (int64_t j = 3; j < n; ++j) rows[j] = int32_t(597 - j);  // descending, none of the three
    const ref::AttentionOut r0 = ref::sparse_attention(q0, kv0, rows, 1.0f, 8);
    CHECK(r0.out[0] == 0.0f);
    for_each_target([&](const std::string&, int threads) {
      if (threads != 1) return;
      CHECK(simd::sparse_attention(q0, kv0, rows, 1.0f, 8).out[0] == 0.0f);
    });
  }
  // Linear: sum over k ascending: x . w = 2^60 + 1 - 2^60 = 0 in that order (any pairing of the
  // two large terms first gives 1). head_linear: the same sum per head, its weights read through
  // strides (here transposed: element (o, i) at i * 2 + o).
  Tensor<float> x({1, 3}), w({2, 3}), xh({1, 1, 3});
  x[0] = xh[0] = 0x1p30f, x[1] = xh[1] = 1.0f, x[2] = xh[2] = -0x1p30f;
  for (int64_t o = 0; o < 2; ++o) w.at(o, 0) = 0x1p30f, w.at(o, 1) = 1.0f, w.at(o, 2) = 0x1p30f;
  const float wt[6] = {0x1p30f, 0x1p30f, 1.0f, 1.0f, 0x1p30f, 0x1p30f};
  const ref::HeadWeights hw{wt, 1, 2, 3, 6, 1, 2};
  CHECK(ref::linear(x, w)[0] == 0.0f);
  CHECK(ref::head_linear(xh, hw)[0] == 0.0f);
  for_each_target([&](const std::string&, int threads) {
    if (threads != 1) return;
    for (const Tensor<float>& y : {simd::linear(x, w), simd::head_linear(xh, hw)}) {
      CHECK(y[0] == 0.0f);
      CHECK(y[1] == 0.0f);
    }
  });
}

TEST_CASE("simd: overlap statistics and the pattern search on simd::kernels() equal ref's") {
  const Problem p = parse_problem("sq24 skv48 hq2 dqk16 dv8 ih4 id16 k6 nl4 sched=FSFS own=yes sim=0.6 seed3");
  ref::OverlapOptions ro, so;
  so.kernels = simd::kernels();
  CHECK(io::overlap_to_json(ref::overlap_report(p, so)).dump() == io::overlap_to_json(ref::overlap_report(p, ro)).dump());
  for (auto loss : {ref::SearchLoss::output, ref::SearchLoss::mass}) {
    ref::SearchOptions rs, ss;
    rs.n_full = ss.n_full = 2;
    rs.loss = ss.loss = loss;
    ss.kernels = simd::kernels();
    CHECK(io::search_to_json(ref::greedy_search(p, ss)).dump() == io::search_to_json(ref::greedy_search(p, rs)).dump());
  }
}

TEST_CASE("simd: f32_to_e4m3 equals ref's code for every f32 exponent and rounding case, on every target") {
  // Every upper half (sign, exponent, the top 7 mantissa bits) with lower halves at and around the
  // rounding points of both e4m3 grids (ties, just below and above), NaN and infinity included.
  std::vector<float> x;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu, 0x1234u}) {
      const uint32_t u = hi << 16 | lo;
      float f;
      std::memcpy(&f, &u, 4);
      x.push_back(f);
    }
  std::vector<uint8_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = f32_to_e4m3(x[i]).bits;
  for_each_target([&](const std::string&, int threads) {
    if (threads != 1) return;
    std::vector<e4m3_t> got(x.size(), e4m3_t{0x55});
    simd::f32_to_e4m3(x.data(), int64_t(x.size()), got.data());
    for (size_t i = 0; i < x.size(); ++i) {
      CAPTURE(x[i]);
      REQUIRE(got[i].bits == want[i]);
    }
  });
}

TEST_CASE("simd: quantize_rows equals ref's codes and scales (blocks, tails, rules, magnitudes) on every target") {
  Xoshiro256 g(11);
  struct Case { int64_t rows, cols; int block; };
  for (const Case c : {Case{5, 128, 128}, Case{3, 130, 128}, Case{7, 300, 32}, Case{4, 7, 5}, Case{2, 1, 1},
                       Case{600, 128, 128}, Case{9, 40, 16}})
    for (ScaleRule rule : {ScaleRule::deepseek_ue8m0, ScaleRule::flashmla_pow2, ScaleRule::fp32_amax}) {
      CAPTURE(c.rows);
      CAPTURE(c.cols);
      CAPTURE(c.block);
      CAPTURE(scale_rule_name(rule));
      // Rows of different magnitudes (tiny rows hit the scale floor 1e-4, subnormal and zero
      // entries, -0), values on bf16's grid as the generator gives and off it.
      std::vector<float> x(size_t(c.rows * c.cols));
      for (int64_t r = 0; r < c.rows; ++r) {
        const float mag = std::ldexp(1.0f, int(g.below(60)) - 40);
        for (int64_t i = 0; i < c.cols; ++i) {
          float v = mag * (float(int64_t(g.below(1 << 24)) - (1 << 23)) * 0x1p-23f);
          if (g.below(8) == 0) v = round_bf16(v);
          if (g.below(50) == 0) v = g.below(2) ? -0.0f : 0x1p-140f;
          x[size_t(r * c.cols + i)] = v;
        }
      }
      const int64_t nb = (c.cols + c.block - 1) / c.block;
      std::vector<e4m3_t> want(x.size());
      std::vector<float> want_s(size_t(c.rows * nb));
      quantize_rows(x.data(), c.rows, c.cols, c.block, rule, want.data(), want_s.data(), "x");
      for_each_target([&](const std::string&, int) {
        std::vector<e4m3_t> got(x.size(), e4m3_t{0x55});
        std::vector<float> got_s(want_s.size(), -1.0f);
        simd::quantize_rows(x.data(), c.rows, c.cols, c.block, rule, got.data(), got_s.data(), "x");
        for (size_t i = 0; i < x.size(); ++i) REQUIRE(got[i].bits == want[i].bits);
        REQUIRE(std::memcmp(got_s.data(), want_s.data(), want_s.size() * sizeof(float)) == 0);
      });
    }
  // A non-finite value: ref's error, naming the first one in row-major order, on every target.
  std::vector<float> x(600 * 16, 1.0f);
  x[size_t(500 * 16 + 3)] = kInf;
  x[size_t(200 * 16 + 9)] = std::nanf("");
  std::vector<e4m3_t> codes(x.size());
  std::vector<float> scales(600);
  std::string want;
  try {
    quantize_rows(x.data(), 600, 16, 16, ScaleRule::deepseek_ue8m0, codes.data(), scales.data(), "layers.0.indexer.k");
  } catch (const Error& e) {
    want = e.what();
  }
  REQUIRE(want.find("row 200, column 9") != std::string::npos);
  for_each_target([&](const std::string&, int) {
    std::string got;
    try {
      simd::quantize_rows(x.data(), 600, 16, 16, ScaleRule::deepseek_ue8m0, codes.data(), scales.data(), "layers.0.indexer.k");
    } catch (const Error& e) {
      got = e.what();
    }
    CHECK(got == want);
  });
  CHECK((simd::kernels().quantize_rows == &simd::quantize_rows));
}

TEST_CASE("simd: the generator's fills equal ref's bit for bit on every target (partial chunks, every dist, scales)") {
  // Ranges: whole chunks in several groups of lanes, partial chunks at either end, fewer chunks
  // than lanes, empty; scales that round, underflow to subnormals and overflow to infinity.
  struct Range { int64_t start, n; };
  const std::vector<Range> ranges = {{0, 0},          {0, 1},
                                     {0, kChunk},     {0, 19 * kChunk},
                                     {123, 17 * kChunk + 77}, {5 * kChunk - 1, 9 * kChunk + 2},
                                     {3 * kChunk, 2 * kChunk}, {2 * kChunk + 4000, 96}};
  for (Dist dist : {Dist::uniform, Dist::normal, Dist::integer, Dist::dyadic, Dist::ties, Dist::narrow})
    for (float scale : {1.0f, 0.3f, 0x1p-140f, 3e38f})
      for (const Range& r : ranges) {
        CAPTURE(dist_name(dist));
        CAPTURE(scale);
        CAPTURE(r.start);
        CAPTURE(r.n);
        const uint64_t seed = 7, tag = stream_tag("layers.1.attn.q");
        std::vector<float> want(size_t(r.n));
        std::vector<bf16_t> want16(size_t(r.n));
        fill_range(want.data(), r.start, r.n, dist, scale, seed, tag);
        fill_range_bf16(want16.data(), r.start, r.n, dist, scale, seed, tag);
        for (int64_t i = 0; i < r.n; ++i) REQUIRE(want16[size_t(i)].bits == f32_to_bf16(want[size_t(i)]).bits);
        for_each_target([&](const std::string&, int) {
          std::vector<float> got(size_t(r.n), -1.0f);
          std::vector<bf16_t> got16(size_t(r.n), bf16_t{0x1234});
          simd::fill_range(got.data(), r.start, r.n, dist, scale, seed, tag);
          simd::fill_range_bf16(got16.data(), r.start, r.n, dist, scale, seed, tag);
          // An empty range has null data(): memcmp must not see it (UBSan's nonnull check).
          REQUIRE((r.n == 0 || std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0));
          for (int64_t i = 0; i < r.n; ++i) REQUIRE(got16[size_t(i)].bits == want16[size_t(i)].bits);
        });
      }
  // The kernel table's fills are simd's, and make_layer_inputs on them gives ref's inputs.
  const ref::Kernels k = simd::kernels();
  CHECK((k.fill_range == &simd::fill_range && k.fill_range_bf16 == &simd::fill_range_bf16));
  const Problem p = parse_problem("sq64 skv300 hq4 dqk576 dv512 ih8 id128 k8 seed5");
  const ref::LayerInputs a = ref::make_layer_inputs(p, 1, true), b = ref::make_layer_inputs(p, 1, true, ref::all_rows(p), k);
  CHECK(a.q.data == b.q.data);
  CHECK(a.kv.data == b.kv.data);
  CHECK(a.index_q8.data == b.index_q8.data);
  CHECK(a.index_k8.data == b.index_k8.data);
  CHECK(a.index_weights.data == b.index_weights.data);
}

TEST_CASE("impl: one value for the path: its name, its kernel table and --impl's rules") {
  CHECK(impl_name(Impl::ref) == "ref");
  CHECK(impl_name(Impl::simd) == "simd");
  for (const Impl i : {Impl::ref, Impl::simd}) CHECK(impl_named(impl_name(i)) == i);
  for (const char* other : {"auto", "SIMD", "ref,simd", ""}) CHECK_FALSE(impl_named(other).has_value());
  const ref::Kernels r = kernels_for(Impl::ref), s = kernels_for(Impl::simd);
  CHECK((r.linear == &ref::linear && r.logits_fp8 == &ref::indexer_logits_fp8 && r.fused_topk_fp8 == nullptr &&
         r.dense_attention == &ref::dense_attention));
  CHECK((s.linear == &simd::linear && s.logits_fp8 == &simd::indexer_logits_fp8 && s.fused_topk_fp8 != nullptr &&
         s.quantize_rows == &simd::quantize_rows));
  // The table's dense attention (the Python binding's) is simd's, with ref's bits.
  const Problem p = parse_problem("sq24 skv80 hq3 dqk64 dv32 ih2 id16 k8 seed9 sink=random");
  const ref::LayerInputs in = ref::make_layer_inputs(p, 0, true);
  const ref::AttentionOut a = r.dense_attention(in.q, in.kv, p.sm_scale(), p.d_v, in.ks, in.ke, in.sink ? &*in.sink : nullptr);
  const ref::AttentionOut b = s.dense_attention(in.q, in.kv, p.sm_scale(), p.d_v, in.ks, in.ke, in.sink ? &*in.sink : nullptr);
  CHECK(std::memcmp(a.out.ptr(), b.out.ptr(), size_t(a.out.numel()) * sizeof(float)) == 0);
  CHECK(std::memcmp(a.lse.ptr(), b.lse.ptr(), size_t(a.lse.numel()) * sizeof(float)) == 0);
  // --impl: "ref" and "simd" as given, "auto" by the work; anything else refused.
  CHECK(choose_impl("ref", true) == Impl::ref);
  CHECK(choose_impl("simd", false) == Impl::simd);
  CHECK(choose_impl("auto", false) == Impl::ref);
  CHECK(choose_impl("auto", true) == Impl::simd);
  CHECK_THROWS_WITH_AS(choose_impl("Simd", false), "--impl: expected ref, simd or auto, got 'Simd'", Error);
  CHECK(resolve_impl("auto", parse_problem("sq16 skv96")) == Impl::ref);
  CHECK(resolve_impl("auto", parse_problem("sq4096 skv4096 ih64 id128")) == Impl::simd);
  CHECK(resolve_impl("auto", parse_problem("sq4096 skv4096 ih64 id128"), 1) == Impl::ref);
}
