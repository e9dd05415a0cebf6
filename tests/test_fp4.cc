// The FP4 indexer's spec (ref/fp4.h): the three rounding rules' codes and scales on hand-picked
// values (the expected codes are written out here, from the upstream quantizers' definitions, not
// computed), the nibble and scale packing, and the logits against a plain double dot product.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ref/error.h"
#include "ref/fp4.h"
#include "ref/indexer.h"
#include "ref/rng.h"
#include "simd/fp4.h"
#include "tests/simd_targets.h"

using namespace indexshare;
using ref::fp4::Rule;

TEST_CASE("fp4: each rule's code on every midpoint, the sign of zero, and the clamp") {
  struct Case {
    float v;
    uint8_t toward_zero, nearest_even, aiter;
  };
  const std::vector<Case> cases = {
      // ties: DeepGEMM toward zero; transformers to the even code; aiter toward -inf
      {0.25f, 0x0, 0x0, 0x0},   {0.75f, 0x1, 0x2, 0x1},   {1.25f, 0x2, 0x2, 0x2},   {1.75f, 0x3, 0x4, 0x3},
      {2.5f, 0x4, 0x4, 0x4},    {3.5f, 0x5, 0x6, 0x5},    {5.0f, 0x6, 0x6, 0x6},    {-0.25f, 0x0, 0x8, 0x9},
      {-0.75f, 0x9, 0xA, 0xA},  {-1.25f, 0xA, 0xA, 0xB},  {-1.75f, 0xB, 0xC, 0xC},  {-2.5f, 0xC, 0xC, 0xD},
      {-3.5f, 0xD, 0xE, 0xE},   {-5.0f, 0xE, 0xE, 0xF},
      // no tie: every rule agrees on the magnitude
      {0.3f, 0x1, 0x1, 0x1},    {-0.3f, 0x9, 0x9, 0x9},   {2.9f, 0x5, 0x5, 0x5},    {5.5f, 0x7, 0x7, 0x7},
      {100.0f, 0x7, 0x7, 0x7},  {-7.0f, 0xF, 0xF, 0xF},
      // zero: transformers keeps the sign bit (code 0x8) of every negative value that rounds to zero
      {0.0f, 0x0, 0x0, 0x0},    {-0.0f, 0x0, 0x8, 0x0},   {-0.1f, 0x0, 0x8, 0x0},   {0.1f, 0x0, 0x0, 0x0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.v);
    CHECK(int(ref::fp4::code(c.v, Rule::toward_zero)) == c.toward_zero);
    CHECK(int(ref::fp4::code(c.v, Rule::nearest_even)) == c.nearest_even);
    CHECK(int(ref::fp4::code(c.v, Rule::aiter)) == c.aiter);
  }
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) CHECK(ref::fp4::value(uint8_t(c)) == (c >= 8 ? -mags[c - 8] : mags[c]) + 0.0);
  CHECK(!std::signbit(ref::fp4::value(0x8)));  // every decoder reads 0x8 as +0
  CHECK(ref::fp4::rule_name(ref::fp4::parse_rule("nearest-even")) == "nearest-even");
  CHECK_THROWS_WITH_AS(ref::fp4::parse_rule("rne"), doctest::Contains("expected toward-zero"), Error);
}

TEST_CASE("fp4: each rule's scale byte, the degenerate block, and aiter's f32 log2") {
  // amax 6: exactly 2^0 for all three. Just above: one power more, except aiter's where the f32
  // log2 of 2^20 (1 + 2^-23) rounds to 20.
  for (Rule r : {Rule::toward_zero, Rule::nearest_even, Rule::aiter}) CHECK(ref::fp4::scale_byte(6.0f, r) == 127);
  CHECK(ref::fp4::scale_byte(std::nextafter(6.0f, 7.0f), Rule::toward_zero) == 128);
  const float big = std::nextafter(std::ldexp(6.0f, 20), INFINITY);
  CHECK(ref::fp4::scale_byte(big, Rule::toward_zero) == 127 + 21);
  CHECK(ref::fp4::scale_byte(big, Rule::nearest_even) == 127 + 21);
  CHECK(ref::fp4::scale_byte(big, Rule::aiter) == 127 + 20);
  // An all-zero block: the clamps give 112 (1e-4 / 6), 1 (6 * 2^-126 / 6) and 98 (1e-8 / 6).
  CHECK(ref::fp4::scale_byte(0.0f, Rule::toward_zero) == 112);
  CHECK(ref::fp4::scale_byte(0.0f, Rule::nearest_even) == 1);
  CHECK(ref::fp4::scale_byte(0.0f, Rule::aiter) == 98);
  // transformers multiplies amax by f32(1/6), DeepGEMM divides by 6: for amax = 6 * 2^k they agree.
  CHECK(ref::fp4::scale_byte(48.0f, Rule::nearest_even) == 130);
  CHECK(ref::fp4::scale_byte(48.0f, Rule::toward_zero) == 130);
}

TEST_CASE("fp4: quantize packs the even element in the low nibble, one ue8m0 byte per 32, int32 scales") {
  Tensor<float> x({2, 64}, 0.0f);
  x[0] = 6.0f;    // row 0 block 0: amax 6, scale 1: codes are the values
  x[1] = -1.0f;
  x[2] = 0.5f;
  x[33] = 12.0f;  // block 1: amax 12, scale 2: 12 -> 6 (code 7)
  x[64 + 5] = 3.0f;
  const ref::fp4::Quantized q = ref::fp4::quantize(x, Rule::toward_zero);
  CHECK(q.data.shape == Shape{2, 32});
  CHECK(q.scales.shape == Shape{2, 2});
  CHECK(int(q.data[0]) == (0x7 | (0xA << 4)));  // 6 (code 7) low, -1 (code 0xA) high
  CHECK(int(q.data[1]) == 0x1);                 // 0.5, then 0
  CHECK(int(q.data[16]) == (0x7 << 4));         // element 33: the high nibble of byte 16
  CHECK(int(q.scales[0]) == 127);
  CHECK(int(q.scales[1]) == 128);
  CHECK(int(q.scales[3]) == 112);  // row 1 block 1: all zero
  const Tensor<float> back = ref::fp4::dequantize(q);
  CHECK(back[0] == 6.0f);
  CHECK(back[1] == -1.0f);
  CHECK(back[33] == 12.0f);
  CHECK(back[64 + 5] == 3.0f);
  const Tensor<int32_t> packed = ref::fp4::pack_scales(q.scales);
  CHECK(packed.shape == Shape{2, 1});
  uint32_t u;
  std::memcpy(&u, &packed[0], 4);
  CHECK(u == (127u | (128u << 8) | (127u << 16) | (127u << 24)));  // D 64: two bytes, then 127 127
  CHECK_THROWS_WITH_AS(ref::fp4::quantize(Tensor<float>({2, 48}, 0.0f), Rule::aiter), doctest::Contains("multiple of 32"), Error);
  Tensor<float> bad({1, 32}, 0.0f);
  bad[3] = NAN;
  CHECK_THROWS_WITH_AS(ref::fp4::quantize(bad, Rule::aiter), doctest::Contains("non-finite"), Error);
}

TEST_CASE("fp4: the logits equal a plain double dot product of the dequantized values, f32 and bf16") {
  const int64_t s_q = 3, H = 4, D = 128, s_kv = 20;
  Xoshiro256 g(17);
  auto u = [&] { return float(double(int64_t(g.below(1u << 20)) - (1 << 19)) / double(1 << 18)); };
  Tensor<float> qf({s_q, H, D}), kf({s_kv, D}), w({s_q, H});
  for (float& v : qf.data) v = u();
  for (float& v : kf.data) v = u();
  for (float& v : w.data) v = u() / 16;
  Tensor<int32_t> ks({s_q}), ke({s_q});
  ks.data = {0, 2, 5};
  ke.data = {7, 20, 5};  // row 2: an empty window
  for (Rule r : {Rule::toward_zero, Rule::nearest_even, Rule::aiter}) {
    CAPTURE(ref::fp4::rule_name(r));
    const ref::fp4::Quantized q = ref::fp4::quantize(qf, r), k = ref::fp4::quantize(kf, r);
    const Tensor<float> dq = ref::fp4::dequantize(q), dk = ref::fp4::dequantize(k);
    const Tensor<float> lg = ref::fp4::logits(q, k, w, ks, ke);
    const Tensor<float> lb = ref::fp4::logits(q, k, w, ks, ke, ref::fp4::LogitsType::bf16);
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t s = 0; s < s_kv; ++s) {
        if (s < ks[t] || s >= ke[t]) {
          CHECK(lg[t * s_kv + s] == -INFINITY);
          continue;
        }
        double acc = 0;
        for (int64_t h = 0; h < H; ++h) {
          double dot = 0;  // products of two f32 values are exact in double; these sums too (scales span < 2^40)
          for (int64_t d = 0; d < D; ++d) dot += double(dq[(t * H + h) * D + d]) * double(dk[s * D + d]);
          acc += double(w[t * H + h]) * std::max(dot, 0.0);
        }
        CHECK(lg[t * s_kv + s] == float(acc));
        uint32_t bits;
        std::memcpy(&bits, &lb[t * s_kv + s], 4);
        CHECK((bits & 0xFFFFu) == 0);
        CHECK(std::fabs(double(lb[t * s_kv + s]) - acc) <= std::ldexp(std::fabs(acc), -8));
      }
  }
}

TEST_CASE("fp4: bf16 logits round the exact sum once, not its f32 rounding") {
  // One row, one key, two heads whose dots are 1: acc = w0 + w1. With w0 = 1 + 2^-8 (a bf16 tie)
  // and w1 = 2^-30, the exact sum is just above the tie: bf16 1 + 2^-7; through f32 it would be
  // the tie itself and go to even, 1.
  Tensor<float> x({1, 2, 32}, 0.0f), kx({1, 32}, 0.0f);
  x[0] = 1.0f;
  x[32] = 1.0f;
  kx[0] = 1.0f;
  const ref::fp4::Quantized q = ref::fp4::quantize(x, Rule::toward_zero), k = ref::fp4::quantize(kx, Rule::toward_zero);
  Tensor<float> w({1, 2});
  w[0] = 1.0f + std::ldexp(1.0f, -8);
  w[1] = std::ldexp(1.0f, -30);
  const Tensor<int32_t> ks({1}, 0), ke({1}, 1);
  CHECK(ref::fp4::logits(q, k, w, ks, ke, ref::fp4::LogitsType::bf16)[0] == 1.0f + std::ldexp(1.0f, -7));
  CHECK(ref::fp4::logits(q, k, w, ks, ke)[0] == float(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)));
  w[1] = 0;
  CHECK(ref::fp4::logits(q, k, w, ks, ke, ref::fp4::LogitsType::bf16)[0] == 1.0f);  // an exact tie: to even
}

// simd/ gives ref's bits: f32 and bf16 logits, D 64 and 128, every rule, every compiled target with 1
// and 2 threads; and ref's
// f32 logits are ref::indexer_logits_f32 on the dequantized values with k_scale 1 (the order the
// spec states).
TEST_CASE("fp4: simd logits equal ref's bit for bit, and ref's equal the f32 indexer on the dequantized values") {
  Xoshiro256 g(29);
  auto u = [&] { return float(double(int64_t(g.below(1u << 20)) - (1 << 19)) / double(1 << 17)); };
  for (const int64_t D : {64, 128}) {
    const int64_t s_q = 5, H = 8, s_kv = 300;
    Tensor<float> qf({s_q, H, D}), kf({s_kv, D}), w({s_q, H});
    for (float& v : qf.data) v = u();
    for (float& v : kf.data) v = (g.below(4) == 0) ? 0.25f * float(int(g.below(9)) - 4) : u();  // ties on the grid
    for (float& v : w.data) v = u() / 8;
    Tensor<int32_t> ks({s_q}), ke({s_q});
    ks.data = {0, 10, 0, 299, 150};
    ke.data = {300, 200, 0, 300, 151};
    for (Rule r : {Rule::toward_zero, Rule::nearest_even, Rule::aiter}) {
      CAPTURE(D);
      CAPTURE(ref::fp4::rule_name(r));
      const ref::fp4::Quantized q = ref::fp4::quantize(qf, r), k = ref::fp4::quantize(kf, r);
      const Tensor<float> f32 = ref::fp4::logits(q, k, w, ks, ke);
      const Tensor<float> via = ref::indexer_logits_f32(ref::fp4::dequantize(q), ref::fp4::dequantize(k), Tensor<float>({s_kv}, 1.0f), w, ks, ke);
      CHECK(std::memcmp(f32.ptr(), via.ptr(), size_t(f32.numel()) * 4) == 0);
      for (const auto type : {ref::fp4::LogitsType::f32, ref::fp4::LogitsType::bf16}) {
        const Tensor<float> a = ref::fp4::logits(q, k, w, ks, ke, type);
        simd_test::for_each_target([&](const std::string&, int) {
          const Tensor<float> b = simd::fp4_logits(q, k, w, ks, ke, type);
          CHECK(std::memcmp(a.ptr(), b.ptr(), size_t(a.numel()) * 4) == 0);
        });
      }
    }
  }
}
