// Tests of ref/numerics: bf16 and e4m3fn conversions and the FP8 scale rules. Expected values
// come from the format definitions written out here, never from the code under test.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ref/numerics.h"
#include "ref/rng.h"

using namespace indexshare;

namespace {
float f_of(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }
uint32_t u_of(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
// e4m3fn value of a code, from the format definition (independent of e4m3_to_f32).
double e4m3_value(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? m / 512.0 : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}
}  // namespace

TEST_CASE("numerics: every bf16 code round-trips through f32") {
  for (uint32_t c = 0; c < 65536; ++c) {
    const float f = bf16_to_f32(bf16_t{uint16_t(c)});
    REQUIRE(u_of(f) == c << 16);  // decoding is the upper half of the f32 pattern
    const bool nan = (c & 0x7FFF) > 0x7F80;
    if (nan) {
      REQUIRE(std::isnan(f));
      REQUIRE(f32_to_bf16(f).bits == ((c & 0x8000) | 0x7FC0));
    } else {
      REQUIRE(f32_to_bf16(f).bits == c);
    }
  }
}

TEST_CASE("numerics: bf16 rounds to nearest even at every midpoint of finite codes") {
  for (uint32_t c = 0; c < 0x7F7F; ++c) {       // c and c+1 both finite positive
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t mid = (c << 16 | 0x8000u) | sign;
      const uint16_t even = uint16_t(((c & 1) ? c + 1 : c) | (sign >> 16));
      REQUIRE(f32_to_bf16(f_of(mid)).bits == even);
      REQUIRE(f32_to_bf16(f_of(mid - 1)).bits == uint16_t(c | (sign >> 16)));       // just below
      REQUIRE(f32_to_bf16(f_of(mid + 1)).bits == uint16_t((c + 1) | (sign >> 16))); // just above
    }
  }
  // Overflow follows IEEE: the largest f32 rounds to +inf; inf stays inf.
  CHECK(f32_to_bf16(std::numeric_limits<float>::max()).bits == 0x7F80);
  CHECK(f32_to_bf16(-std::numeric_limits<float>::infinity()).bits == 0xFF80);
  CHECK(f32_to_bf16(-0.0f).bits == 0x8000);
}

TEST_CASE("numerics: every e4m3fn code decodes to its defined value and round-trips") {
  for (int c = 0; c < 256; ++c) {
    const float f = e4m3_to_f32(e4m3_t{uint8_t(c)});
    if ((c & 0x7F) == 0x7F) {
      REQUIRE(std::isnan(f));
      REQUIRE(f32_to_e4m3(f).bits == (c & 0x80 ? 0xFF : 0x7F));
      continue;
    }
    REQUIRE(double(f) == e4m3_value(c));
    REQUIRE(std::signbit(f) == bool(c & 0x80));
    REQUIRE(int(f32_to_e4m3(f).bits) == c);
  }
  CHECK(e4m3_to_f32(e4m3_t{0x7E}) == 448.0f);
  CHECK(e4m3_to_f32(e4m3_t{0x01}) == std::ldexp(1.0f, -9));
  CHECK(e4m3_to_f32(e4m3_t{0x08}) == std::ldexp(1.0f, -6));
  CHECK(e4m3_to_f32(e4m3_t{0x38}) == 1.0f);
}

TEST_CASE("numerics: e4m3fn rounds to nearest even at every midpoint") {
  for (int c = 0; c < 0x7E; ++c) {  // c and c+1 finite, positive
    const double lo = e4m3_value(c), hi = e4m3_value(c + 1), mid = (lo + hi) / 2;
    const float fm = float(mid);
    REQUIRE(double(fm) == mid);  // midpoints are exact in f32
    const int even = (c & 1) ? c + 1 : c;  // the code's low bit is the mantissa's low bit
    REQUIRE(int(f32_to_e4m3(fm).bits) == even);
    REQUIRE(int(f32_to_e4m3(-fm).bits) == (even | 0x80));
    REQUIRE(int(f32_to_e4m3(std::nextafter(fm, 0.0f)).bits) == c);
    REQUIRE(int(f32_to_e4m3(std::nextafter(fm, 1e9f)).bits) == c + 1);
  }
}

TEST_CASE("numerics: e4m3fn saturates beyond 448 and keeps NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(f32_to_e4m3(448.0f).bits == 0x7E);
  CHECK(f32_to_e4m3(464.0f).bits == 0x7E);                          // tie to even (448)
  CHECK(f32_to_e4m3(std::nextafter(464.0f, 1e9f)).bits == 0x7E);    // would be 480: saturates
  CHECK(f32_to_e4m3(1e30f).bits == 0x7E);
  CHECK(f32_to_e4m3(std::numeric_limits<float>::max()).bits == 0x7E);
  CHECK(f32_to_e4m3(inf).bits == 0x7E);
  CHECK(f32_to_e4m3(-inf).bits == 0xFE);
  CHECK(f32_to_e4m3(-500.0f).bits == 0xFE);
  CHECK(f32_to_e4m3(std::nanf("")).bits == 0x7F);
  CHECK(f32_to_e4m3(-std::nanf("")).bits == 0xFF);
  // Below half the smallest subnormal everything is zero, with its sign.
  CHECK(f32_to_e4m3(std::ldexp(1.0f, -10)).bits == 0x00);           // tie between 0 and 2^-9: even
  CHECK(f32_to_e4m3(-std::ldexp(1.0f, -11)).bits == 0x80);
  CHECK(f32_to_e4m3(std::numeric_limits<float>::denorm_min()).bits == 0x00);
  CHECK(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)).bits == 0x01);
}

TEST_CASE("numerics: pow2_ceil is exact around powers of two") {
  for (int k = -140; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    REQUIRE(pow2_ceil(p) == p);
    if (k < 127) REQUIRE(pow2_ceil(std::nextafter(p, 1e38f)) == 2 * p);  // 2^k (1 + ulp) -> 2^(k+1)
    if (k > -140) REQUIRE(pow2_ceil(std::nextafter(p, 0.0f)) == p);
  }
  CHECK(pow2_ceil(3.0f) == 4.0f);
  CHECK(pow2_ceil(0.75f) == 1.0f);
  CHECK_THROWS_AS(pow2_ceil(0.0f), Error);
  CHECK_THROWS_AS(pow2_ceil(-1.0f), Error);
}

TEST_CASE("numerics: the three scale rules on hand-checked values") {
  // deepseek_ue8m0: pow2_ceil(max(amax, 1e-4) * fp32(1/448)).
  //   amax 448: 448 * fp32(1/448) == 1 exactly in f32 -> 1.
  //   amax 1: 1/448 = 0.00223 lies in (2^-9, 2^-8] -> 2^-8.
  //   amax 0: clamped to 1e-4; 1e-4/448 = 2.23e-7 in (2^-23, 2^-22] -> 2^-22.
  CHECK(block_scale(448.0f, ScaleRule::deepseek_ue8m0) == 1.0f);
  CHECK(block_scale(1.0f, ScaleRule::deepseek_ue8m0) == std::ldexp(1.0f, -8));
  CHECK(block_scale(0.0f, ScaleRule::deepseek_ue8m0) == std::ldexp(1.0f, -22));
  CHECK(block_scale(449.0f, ScaleRule::deepseek_ue8m0) == 2.0f);
  // flashmla_pow2: pow2_ceil(max(amax / 448, 1e-4)): the clamp is on the scale.
  //   amax 0 and amax 1e-5: scale clamped to 1e-4 in (2^-14, 2^-13] -> 2^-13.
  CHECK(block_scale(448.0f, ScaleRule::flashmla_pow2) == 1.0f);
  CHECK(block_scale(1.0f, ScaleRule::flashmla_pow2) == std::ldexp(1.0f, -8));
  CHECK(block_scale(0.0f, ScaleRule::flashmla_pow2) == std::ldexp(1.0f, -13));
  CHECK(block_scale(1e-5f, ScaleRule::flashmla_pow2) == std::ldexp(1.0f, -13));
  CHECK(block_scale(1e-5f, ScaleRule::deepseek_ue8m0) == std::ldexp(1.0f, -22));
  // fp32_amax: max(amax, 1e-4) / 448, not a power of two in general.
  CHECK(block_scale(3.5f, ScaleRule::fp32_amax) == 0.0078125f);  // 3.5 / 448 = 2^-7 exactly
  CHECK(block_scale(1.0f, ScaleRule::fp32_amax) == 1.0f / 448.0f);
  CHECK(block_scale(0.0f, ScaleRule::fp32_amax) == 1e-4f / 448.0f);
  CHECK(parse_scale_rule("flashmla_pow2") == ScaleRule::flashmla_pow2);
  CHECK_THROWS_WITH_AS(parse_scale_rule("ue8m0"), doctest::Contains("ue8m0"), Error);
}

TEST_CASE("numerics: block quantization and dequantization") {
  // Two rows of 5 values, block 2: blocks {0,1}, {2,3}, {4} per row.
  Tensor<float> x({2, 5});
  const float vals[10] = {1.0f, -3.0f, 100.0f, 0.5f, 0.0f, 448.0f, -448.0f, 1e-3f, 2e-3f, -7.0f};
  for (int i = 0; i < 10; ++i) x[i] = vals[i];
  for (ScaleRule rule : {ScaleRule::deepseek_ue8m0, ScaleRule::flashmla_pow2, ScaleRule::fp32_amax}) {
    Quantized q = quantize(x, 2, rule, "x");
    REQUIRE(q.scales.shape == Shape{2, 3});
    Tensor<float> back = dequantize(q, 2);
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 5; ++c) {
        const int b = c / 2;
        float amax = 0;
        for (int j = b * 2; j < std::min(5, b * 2 + 2); ++j) amax = std::max(amax, std::fabs(x.at(r, j)));
        REQUIRE(q.scales.at(r, b) == block_scale(amax, rule));
        const float s = q.scales.at(r, b), v = x.at(r, c);
        // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 on normal values, plus half the
        // subnormal spacing s * 2^-9 / 2 near zero.
        REQUIRE(std::fabs(back.at(r, c) - v) <= std::ldexp(std::fabs(v), -4) + s * std::ldexp(1.0f, -10));
        REQUIRE(q.codes.at(r, c).bits == f32_to_e4m3(std::fmin(std::fmax(v / s, -448.0f), 448.0f)).bits);
      }
    }
  }
  // A power-of-two scale makes every e4m3-representable value multiple exact.
  Quantized q = quantize(x, 2, ScaleRule::flashmla_pow2, "x");
  CHECK(dequantize(q, 2).at(1, 0) == 448.0f);
  // Non-finite values are refused with the tensor, row and column named.
  x.at(1, 3) = std::nanf("");
  CHECK_THROWS_WITH_AS(quantize(x, 2, ScaleRule::deepseek_ue8m0, "layers.0.indexer.q"),
                       doctest::Contains("layers.0.indexer.q: non-finite value at row 1, column 3"), Error);
  x.at(1, 3) = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(quantize(x, 2, ScaleRule::deepseek_ue8m0, "x"), Error);
  CHECK_THROWS_AS(quantize(x, 0, ScaleRule::deepseek_ue8m0, "x"), Error);
}

// exp_portable against the C library's exp (glibc's is within 1 ulp of the true value; in
// practice correctly rounded): the documented bound is 2 ulp of the C library's result. Ulps are
// counted as the distance between the bit patterns of two non-negative doubles, which counts
// subnormal steps too.
TEST_CASE("numerics: exp_portable is within 2 ulp of the C library's exp and exact at 0") {
  const auto ulps = [](double a, double b) {
    int64_t ia, ib;
    std::memcpy(&ia, &a, 8);
    std::memcpy(&ib, &b, 8);
    return ia > ib ? ia - ib : ib - ia;
  };
  Xoshiro256 g(2026);
  const auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * double(g.next() >> 11) * 0x1p-53; };
  int64_t worst = 0;
  double worst_x = 0;
  const auto check = [&](double x) {
    const int64_t u = ulps(exp_portable(x), std::exp(x));
    if (u > worst) worst = u, worst_x = x;
  };
  for (int i = 0; i < 400000; ++i) check(uniform(-745.2, 709.78));   // the whole finite range
  for (int i = 0; i < 200000; ++i) check(uniform(-40.0, 0.0));       // where softmax arguments live
  for (int i = 0; i < 100000; ++i) check(uniform(-1e-3, 1e-3));      // around 0
  for (int k = -1074; k <= 1023; ++k) {                              // the range-reduction seams
    const double seam = (k + 0.5) * 0.69314718055994530942;
    for (double x : {std::nextafter(seam, -1e9), seam, std::nextafter(seam, 1e9)}) check(x);
  }
  CAPTURE(worst_x);
  CHECK(worst <= 2);
  CHECK(exp_portable(0.0) == 1.0);
  CHECK(exp_portable(-0.0) == 1.0);
  CHECK(exp_portable(1.0) == doctest::Approx(2.718281828459045).epsilon(1e-15));
  CHECK(exp_portable(-std::numeric_limits<double>::infinity()) == 0.0);
  CHECK(exp_portable(-746.0) == 0.0);
  CHECK(exp_portable(-1e300) == 0.0);
  CHECK(exp_portable(std::numeric_limits<double>::infinity()) == std::numeric_limits<double>::infinity());
  CHECK(exp_portable(709.79) == std::numeric_limits<double>::infinity());
  CHECK(std::isfinite(exp_portable(709.78)));
  CHECK(exp_portable(-745.13) > 0.0);  // the smallest subnormal, 2^-1074 = exp(-744.44)
  CHECK(std::isnan(exp_portable(std::numeric_limits<double>::quiet_NaN())));
}
