#include "ref/module_ops.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ref/error.h"
#include "ref/numerics.h"

using namespace indexshare;
using namespace indexshare::ref;

namespace {

// One f32 unit roundoff (half an ulp of 1.0).
constexpr double kU = 0x1p-24;

// |got - want| <= tol, with the values in the failure message.
void check_close(double got, double want, double tol) {
  INFO("got " << got << ", want " << want << ", tol " << tol);
  CHECK(std::fabs(got - want) <= tol);
}

// Deterministic inputs in [-1, 1) that are not all small integers (so rounding happens).
std::vector<float> wavy(int n, double phase) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = float(std::sin(0.7 * i + phase) * 0.9 + 0.05 * (i % 3));
  return v;
}

// Values of cos and sin at a few angles, written out (not computed by the code under test).
constexpr double kCos1 = 0.5403023058681398, kSin1 = 0.8414709848078965;
constexpr double kCosHalf = 0.8775825618903728, kSinHalf = 0.479425538604203;
constexpr double kCos2 = -0.4161468365471424, kSin2 = 0.9092974268256817;
constexpr double kCosQuarter = 0.9689124217106447, kSinQuarter = 0.24740395925452294;

// The documented rotation of one pair, in f32 with separately rounded products.
void rotate_pair(float a, float b, double c_exact, double s_exact, float& a_out, float& b_out) {
  const float c = float(c_exact), s = float(s_exact);
  const float ac = a * c, bs = b * s, as = a * s, bc = b * c;
  a_out = ac - bs;
  b_out = as + bc;
}

// The rope tests compare against rotations built from the literal cos/sin values above; the code
// computes cos/sin with the C library in double and rounds to f32. Both sides round the same
// (correctly rounded to within a fraction of a double ulp) value to f32, so they agree unless a
// libm value sits on an f32 rounding boundary. One ulp of c or s moves a product by at most
// |a| 2^-24 and each of the two products and the sum may then round the other way (one f32 ulp of
// a value <= 8 each), so allow 4 f32 ulps at magnitude 8: 4 * 2^-20.
constexpr double kRopeTol = 4 * 0x1p-20;  // |a|, |b| <= 4 and |a'|, |b'| < 8 in these tests

}  // namespace

// ---- RoPE frequencies -----------------------------------------------------------------------

TEST_CASE("module_ops: rope_inv_freq matches 1/theta^(2i/d)") {
  const std::vector<float> f = rope_inv_freq(64, 10000.0);
  REQUIRE(f.size() == 32);
  // Exactly representable cases: theta^0 = 1, 10000^(16/64) = 10, 10000^(32/64) = 100.
  CHECK(f[0] == 1.0f);
  CHECK(f[8] == 1.0f / 10.0f);
  CHECK(f[16] == 1.0f / 100.0f);
  // Every entry within 2 f32 ulps of the double formula: the f32 exponent 2i/64 is exact (a
  // multiple of 1/32), the double pow rounded to f32 is within half an ulp, and the f32 reciprocal
  // adds another half ulp.
  for (int i = 0; i < 32; ++i) {
    const double want = 1.0 / std::pow(10000.0, 2.0 * i / 64.0);
    check_close(f[size_t(i)], want, 2 * 2 * kU * want);
  }
  // GLM-5.2's theta 8e6 with dim 64.
  const std::vector<float> g = rope_inv_freq(64, 8e6);
  for (int i = 0; i < 32; ++i) {
    const double want = 1.0 / std::pow(8e6, 2.0 * i / 64.0);
    check_close(g[size_t(i)], want, 2 * 2 * kU * want);
  }
  CHECK_THROWS_AS(rope_inv_freq(7, 10000.0), Error);
  CHECK_THROWS_AS(rope_inv_freq(0, 10000.0), Error);
  CHECK_THROWS_AS(rope_inv_freq(64, 0.0), Error);
}

TEST_CASE("module_ops: YaRN correction range and frequencies for DeepSeek-V3.2") {
  // dim 64, theta 1e4, orig 4096, beta_fast 32, beta_slow 1:
  //   corr_dim(32) = 64 ln(4096 / (64 pi)) / (2 ln 1e4) = 10.47 -> floor 10
  //   corr_dim(1)  = 64 ln(4096 / (2 pi))  / (2 ln 1e4) = 22.51 -> ceil 23
  const auto [low, high] = yarn_correction_range(64, 10000.0, 4096, 32.0, 1.0);
  CHECK(low == 10);
  CHECK(high == 23);
  // Clamping: a huge beta_fast gives a negative correction dim, clamped to 0.
  CHECK(yarn_correction_range(64, 10000.0, 4096, 1e6, 1.0).first == 0);

  const std::vector<float> y = yarn_inv_freq(64, 10000.0, 40.0, 4096, 32.0, 1.0);
  const std::vector<float> base = rope_inv_freq(64, 10000.0);
  REQUIRE(y.size() == 32);
  // i <= low: smooth = 1, so f/40 * 0 + f * 1 = f exactly.
  for (int i = 0; i <= 10; ++i) CHECK(y[size_t(i)] == base[size_t(i)]);
  // i >= high: smooth = 0, so the frequency is divided by 40 (f/40 * 1 + f * 0, one rounding).
  for (int i = 23; i < 32; ++i) CHECK(y[size_t(i)] == base[size_t(i)] / 40.0f);
  // In the ramp, computed independently in double from the closed form:
  //   freq_i = b_i * ((1 - s) / 40 + s), s = 1 - (i - 10) / 13, b_i = 10000^(-i/32).
  // The f32 evaluation has at most 6 roundings (b_i's pow and reciprocal, the ramp division,
  // /40, two products and the sum, each <= u relative on positive terms), so 8u relative.
  for (int i : {11, 16, 22}) {
    const double b = 1.0 / std::pow(10000.0, i / 32.0);
    const double s = 1.0 - (i - 10) / 13.0;
    const double want = b * ((1.0 - s) / 40.0 + s);
    check_close(y[size_t(i)], want, 8 * kU * want);
  }
}

TEST_CASE("module_ops: YaRN mscale and the DeepSeek MLA softmax scale") {
  CHECK(yarn_mscale(1.0, 1.0) == 1.0);
  CHECK(yarn_mscale(0.5, 1.0) == 1.0);
  const double m = yarn_mscale(40.0, 1.0);
  check_close(m, 1.3688879454, 1e-9);
  const double sm = std::pow(192.0, -0.5) * m * m;
  check_close(sm, 0.1352337789, 1e-10);
  CHECK(float(sm) == 0.13523377478f);
}

// ---- RoPE -----------------------------------------------------------------------------------

TEST_CASE("module_ops: rope layout names") {
  CHECK(rope_layout_name(RopeLayout::half_split) == "half_split");
  CHECK(rope_layout_name(RopeLayout::interleaved) == "interleaved");
  CHECK(parse_rope_layout("half_split") == RopeLayout::half_split);
  CHECK(parse_rope_layout("interleaved") == RopeLayout::interleaved);
  CHECK_THROWS_AS(parse_rope_layout("neox-ish"), Error);
}

TEST_CASE("module_ops: rope half_split rotates (j, j + d/2) by hand") {
  // rope_dim 4, inv_freq {1, 1/2}, pos 1: pair 0 = (x0, x2) by angle 1, pair 1 = (x1, x3) by 1/2.
  const std::vector<float> inv = {1.0f, 0.5f};
  float x[4] = {1.0f, 2.0f, 3.0f, -0.5f};
  apply_rope(x, 4, 1, inv, RopeLayout::half_split);
  float a0, b0, a1, b1;
  rotate_pair(1.0f, 3.0f, kCos1, kSin1, a0, b0);
  rotate_pair(2.0f, -0.5f, kCosHalf, kSinHalf, a1, b1);
  check_close(x[0], a0, kRopeTol);
  check_close(x[2], b0, kRopeTol);
  check_close(x[1], a1, kRopeTol);
  check_close(x[3], b1, kRopeTol);
  // And against the plain double formula (x0 cos 1 - x2 sin 1 = 0.540302 - 2.524413 = -1.984111).
  check_close(x[0], -1.9841106383554497, 1e-6);
  check_close(x[2], 1.0*kSin1 + 3.0*kCos1, 1e-6);
}

TEST_CASE("module_ops: rope interleaved rotates (2j, 2j + 1) by hand") {
  // rope_dim 8, inv_freq {1, 1/2, 1/4, 1/8}, pos 2: angles 2, 1, 1/2, 1/4.
  const std::vector<float> inv = {1.0f, 0.5f, 0.25f, 0.125f};
  const float in[8] = {1.0f, -2.0f, 0.5f, 3.0f, -1.5f, 2.5f, 4.0f, 0.25f};
  float x[8];
  std::copy(in, in + 8, x);
  apply_rope(x, 8, 2, inv, RopeLayout::interleaved);
  const double cs[4][2] = {{kCos2, kSin2}, {kCos1, kSin1}, {kCosHalf, kSinHalf}, {kCosQuarter, kSinQuarter}};
  for (int j = 0; j < 4; ++j) {
    float a, b;
    rotate_pair(in[2 * j], in[2 * j + 1], cs[j][0], cs[j][1], a, b);
    check_close(x[2 * j], a, kRopeTol);
    check_close(x[2 * j + 1], b, kRopeTol);
  }
}

TEST_CASE("module_ops: rope layouts differ, pos 0 is the identity, norms are kept") {
  const std::vector<float> inv = rope_inv_freq(8, 10000.0);
  const float in[8] = {0.3f, -1.0f, 2.0f, 0.75f, -0.5f, 1.25f, 0.1f, -2.0f};
  float h[8], il[8];
  std::copy(in, in + 8, h);
  std::copy(in, in + 8, il);
  apply_rope(h, 8, 5, inv, RopeLayout::half_split);
  apply_rope(il, 8, 5, inv, RopeLayout::interleaved);
  bool differ = false;
  for (int i = 0; i < 8; ++i) differ = differ || (h[i] != il[i]);
  CHECK(differ);
  // Each rotated pair keeps its length. Per output, the f32 cos/sin (u each), the two products
  // (u each) and the sum (u) err by <= 4u (|a| + |b|) <= 4 sqrt(2) u |pair|, so the pair length
  // errs by <= 8u |pair|; |pair| <= 2.5 here. Allow 16u * 2.5 (factor 2 for second-order terms).
  for (int j = 0; j < 4; ++j) {
    const double n_in = std::hypot(in[j], in[j + 4]), n_out = std::hypot(h[j], h[j + 4]);
    check_close(n_out, n_in, 16 * kU * 2.5);
  }
  // pos 0: cos = 1, sin = 0 for every pair, so a' = a, b' = b exactly.
  for (RopeLayout layout : {RopeLayout::half_split, RopeLayout::interleaved}) {
    float z[8];
    std::copy(in, in + 8, z);
    apply_rope(z, 8, 0, inv, layout);
    for (int i = 0; i < 8; ++i) CHECK(z[i] == in[i]);
  }
  float e[8] = {};
  CHECK_THROWS_AS(apply_rope(e, 7, 1, inv, RopeLayout::half_split), Error);
  CHECK_THROWS_AS(apply_rope(e, 6, 1, inv, RopeLayout::half_split), Error);  // 4 freqs, need 3
  CHECK_THROWS_AS(apply_rope(e, 8, -1, inv, RopeLayout::interleaved), Error);
}

// ---- Hadamard -------------------------------------------------------------------------------

namespace {

// Sylvester Hadamard entry, from the definition.
int sylvester(int i, int j) { return (std::popcount(unsigned(i & j)) % 2) ? -1 : 1; }

// out = (H x) in double (H symmetric, so x H = H x), from the explicit matrix.
std::vector<double> hadamard_matvec(const std::vector<float>& x) {
  const int n = int(x.size());
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) out[size_t(i)] += sylvester(i, j) * double(x[size_t(j)]);
  return out;
}

}  // namespace

TEST_CASE("module_ops: hadamard equals the Sylvester matrix product") {
  for (int n : {1, 2, 8, 128}) {
    INFO("n = " << n);
    const float scale = float(std::pow(double(n), -0.5));
    // Small-integer inputs: every butterfly sum is an integer of magnitude <= 8n, exact in f32,
    // so the only rounding is the final multiply by f32(n^-0.5): the result is exact to compare.
    std::vector<float> xi(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) xi[size_t(i)] = float((i * 7 + 3) % 17 - 8);
    const std::vector<double> si = hadamard_matvec(xi);
    std::vector<float> yi = xi;
    hadamard_transform(yi.data(), n);
    for (int i = 0; i < n; ++i) CHECK(yi[size_t(i)] == float(si[size_t(i)]) * scale);

    // General inputs: the butterfly has log2(n) = L stages, each output is a sum built by L
    // levels of f32 additions, so |error| <= L u sum|x| (first order); the f32 scale constant and
    // the final product add 2u relative of |sum| <= sum|x|. Bound: (L + 2) u n^-0.5 sum|x|.
    const std::vector<float> x = wavy(n, 0.3);
    const std::vector<double> s = hadamard_matvec(x);
    double abs_sum = 0.0;
    for (float v : x) abs_sum += std::fabs(double(v));
    const int L = std::countr_zero(unsigned(n));
    const double tol = (L + 2) * kU * std::pow(double(n), -0.5) * abs_sum;
    std::vector<float> y = x;
    hadamard_transform(y.data(), n);
    for (int i = 0; i < n; ++i) check_close(y[size_t(i)], s[size_t(i)] / std::sqrt(double(n)), tol);
  }
}

TEST_CASE("module_ops: hadamard applied twice returns the input") {
  for (int n : {1, 2, 8, 128}) {
    INFO("n = " << n);
    const std::vector<float> x = wavy(n, 1.1);
    double max_abs = 0.0;
    for (float v : x) max_abs = std::max(max_abs, std::fabs(double(v)));
    std::vector<float> y = x;
    hadamard_transform(y.data(), n);
    hadamard_transform(y.data(), n);
    // H/sqrt(n) is orthonormal and symmetric, so applying it twice is the identity. Error bound
    // (first order, L = log2 n): pass 1 leaves e1 <= (L + 2) u sqrt(n) max|x| per element (the
    // single-pass bound with sum|x| <= n max|x|); pass 2 maps it through H/sqrt(n), whose rows
    // have absolute sum sqrt(n), giving <= sqrt(n) e1, and adds its own (L + 2) u sqrt(n) max|y|
    // with max|y| <= sqrt(n) max|x|. Total <= 2 (L + 2) u n max|x|.
    const int L = std::countr_zero(unsigned(n));
    const double tol = 2 * (L + 2) * kU * n * max_abs;
    for (int i = 0; i < n; ++i) check_close(y[size_t(i)], x[size_t(i)], tol);
  }
  float z[6] = {};
  CHECK_THROWS_AS(hadamard_transform(z, 6), Error);
  CHECK_THROWS_AS(hadamard_transform(z, 0), Error);
  CHECK_THROWS_AS(hadamard_transform(z, 3), Error);
}

// ---- Norms ----------------------------------------------------------------------------------

namespace {

// Both the code and these direct formulas evaluate in double (relative error ~1e-15); the code
// rounds to f32 once, which is at most half an f32 ulp (<= u |value|). Tolerance: one f32 ulp of
// the expected value (2u |value|) plus 1e-12 absolute for outputs that land near zero.
double norm_tol(double want) { return 2 * kU * std::fabs(want) + 1e-12; }

}  // namespace

TEST_CASE("module_ops: layer_norm against the direct formula") {
  // By hand: x = 1, 2, 3, 4 -> mean 2.5, biased var 1.25, eps 0: y = (x - 2.5) / sqrt(1.25).
  {
    const float x[4] = {1, 2, 3, 4};
    float y[4];
    layer_norm(x, y, 4, nullptr, nullptr, 0.0f);
    const double r = 1.0 / std::sqrt(1.25);
    const double want[4] = {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r};
    for (int i = 0; i < 4; ++i) check_close(y[i], want[i], norm_tol(want[i]));
  }
  // n = 128 with weight, bias and eps 1e-6 (the DeepSeek indexer k_norm configuration).
  const int n = 128;
  const std::vector<float> x = wavy(n, 0.2), w = wavy(n, 2.0), b = wavy(n, 4.0);
  const float eps = 1e-6f;
  double mean = 0.0;
  for (float v : x) mean += v;
  mean /= n;
  double var = 0.0;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= n;
  std::vector<float> y(static_cast<size_t>(n));
  layer_norm(x.data(), y.data(), n, w.data(), b.data(), eps);
  for (int i = 0; i < n; ++i) {
    const double want = (x[size_t(i)] - mean) / std::sqrt(var + double(eps)) * w[size_t(i)] + b[size_t(i)];
    check_close(y[size_t(i)], want, norm_tol(want));
  }
  // In place gives the same result.
  std::vector<float> z = x;
  layer_norm(z.data(), z.data(), n, w.data(), b.data(), eps);
  CHECK(z == y);
  float one = 1.0f;
  CHECK_THROWS_AS(layer_norm(&one, &one, 0, nullptr, nullptr, 1e-6f), Error);
}

TEST_CASE("module_ops: rms_norm against the direct formula") {
  // By hand: x = 3, 4 -> mean square 12.5, eps 0: y = x / sqrt(12.5).
  {
    const float x[2] = {3, 4};
    float y[2];
    rms_norm(x, y, 2, nullptr, 0.0f);
    check_close(y[0], 3.0 / std::sqrt(12.5), norm_tol(3.0 / std::sqrt(12.5)));
    check_close(y[1], 4.0 / std::sqrt(12.5), norm_tol(4.0 / std::sqrt(12.5)));
  }
  const int n = 96;
  const std::vector<float> x = wavy(n, 0.9), w = wavy(n, 3.0);
  const float eps = 1e-6f;
  double ms = 0.0;
  for (float v : x) ms += double(v) * v;
  ms /= n;
  std::vector<float> y(static_cast<size_t>(n));
  rms_norm(x.data(), y.data(), n, w.data(), eps);
  for (int i = 0; i < n; ++i) {
    const double want = x[size_t(i)] / std::sqrt(ms + double(eps)) * w[size_t(i)];
    check_close(y[size_t(i)], want, norm_tol(want));
  }
  float one = 1.0f;
  CHECK_THROWS_AS(rms_norm(&one, &one, 0, nullptr, 1e-6f), Error);
}

// ---- Linear ---------------------------------------------------------------------------------

TEST_CASE("module_ops: linear computes x W^T in torch layout") {
  Tensor<float> x({2, 3});
  x.data = {1, 2, 3, -1, 0.5f, 4};
  Tensor<float> w({2, 3});  // [out, in]
  w.data = {1, 0, -1, 2, 1, 0.25f};
  const Tensor<float> y = linear(x, w);
  REQUIRE(y.shape == Shape{2, 2});
  // By hand: row 0: 1 - 3 = -2; 2 + 2 + 0.75 = 4.75. Row 1: -1 - 4 = -5; -2 + 0.5 + 1 = -0.5.
  CHECK(y.at(0, 0) == -2.0f);
  CHECK(y.at(0, 1) == 4.75f);
  CHECK(y.at(1, 0) == -5.0f);
  CHECK(y.at(1, 1) == -0.5f);

  // One rounding: 1 + 2^-30 - 1 is exact in double (f32 would lose the 2^-30 before subtracting).
  Tensor<float> xa({1, 3});
  xa.data = {1.0f, 0x1p-30f, -1.0f};
  Tensor<float> wa({1, 3}, 1.0f);
  CHECK(linear(xa, wa)[0] == 0x1p-30f);
}

TEST_CASE("module_ops: linear_bf16 rounds the output to bf16") {
  // 1 + 3 * 2^-9 lies between the bf16 neighbours 1 and 1 + 2^-7 and is nearer the latter.
  Tensor<float> x({1, 2});
  x.data = {1.0f, 3 * 0x1p-9f};
  Tensor<float> w({1, 2}, 1.0f);
  CHECK(linear(x, w)[0] == 1.0f + 3 * 0x1p-9f);
  CHECK(linear_bf16(x, w)[0] == 1.0f + 0x1p-7f);
  Tensor<float> t({3});
  t.data = {1.0f + 0x1p-9f, -(1.0f + 3 * 0x1p-9f), 2.0f};
  round_bf16_inplace(t);
  CHECK(t[0] == 1.0f);  // nearer 1 than 1 + 2^-7
  CHECK(t[1] == -(1.0f + 0x1p-7f));
  CHECK(t[2] == 2.0f);
}

TEST_CASE("module_ops: head_linear is linear per head, the weights read through their strides") {
  // A buffer holding 3 heads of [out=5, in=4] weights in both layouts, with gaps between heads.
  const int64_t rows = 3, heads = 3, in = 4, out = 5, head_stride = 29;
  std::vector<float> buf(size_t(heads * head_stride), std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> vals = wavy(int(heads * out * in), 0.3);
  Tensor<float> x({rows, heads, in});
  const std::vector<float> xv = wavy(int(x.numel()), 1.7);
  std::copy(xv.begin(), xv.end(), x.data.begin());
  for (const bool transposed : {false, true}) {
    CAPTURE(transposed);
    // Element (o, i) of head h at h * head_stride + o * os + i * is.
    const int64_t os = transposed ? 1 : in, is = transposed ? out : 1;
    std::fill(buf.begin(), buf.end(), std::numeric_limits<float>::quiet_NaN());  // gaps: never read
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) buf[size_t(h * head_stride + o * os + i * is)] = vals[size_t((h * out + o) * in + i)];
    const HeadWeights w{buf.data(), heads, out, in, head_stride, os, is};
    const Tensor<float> y = head_linear(x, w);
    REQUIRE(y.shape == Shape{rows, heads, out});
    for (int64_t h = 0; h < heads; ++h) {  // against linear on the gathered head
      Tensor<float> xh({rows, in}), wh({out, in});
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < in; ++i) xh.at(r, i) = x.at(r, h, i);
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) wh.at(o, i) = vals[size_t((h * out + o) * in + i)];
      const Tensor<float> yh = linear(xh, wh);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o) CHECK(std::bit_cast<uint32_t>(y.at(r, h, o)) == std::bit_cast<uint32_t>(yh.at(r, o)));
    }
  }
  // Errors name the tensor: x's rank and shape against w, negative strides, no data.
  const HeadWeights ok{buf.data(), heads, out, in, head_stride, in, 1};
  const auto msg = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(msg([&] { (void)head_linear(Tensor<float>({rows, in}), ok); }).find("head_linear x: expected rank 3") != std::string::npos);
  CHECK(msg([&] { (void)head_linear(Tensor<float>({rows, heads + 1, in}), ok); }).find("heads=3, in=4") != std::string::npos);
  HeadWeights neg = ok;
  neg.o_stride = -1;
  CHECK(msg([&] { (void)head_linear(x, neg); }).find(">= 0") != std::string::npos);
  HeadWeights none = ok;
  none.base = nullptr;
  CHECK(msg([&] { (void)head_linear(x, none); }).find("no data") != std::string::npos);
}

TEST_CASE("module_ops: linear shape errors") {
  Tensor<float> x({2, 3}), w_ok({4, 3}), w_bad({4, 5}), x1({3}), w3({1, 4, 3});
  CHECK(linear(x, w_ok).shape == Shape{2, 4});
  CHECK_THROWS_AS(linear(x, w_bad), Error);   // in-features 5 vs 3
  CHECK_THROWS_AS(linear(x1, w_ok), Error);   // x not rank 2
  CHECK_THROWS_AS(linear(x, w3), Error);      // w not rank 2
  CHECK_THROWS_AS(linear_bf16(x, w_bad), Error);
  try {
    (void)linear(x, w_bad);
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("in-features") != std::string::npos);
  }
}
