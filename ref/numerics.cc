#include "ref/numerics.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace indexshare {

namespace {
uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
}  // namespace

// ---- bf16: inline in numerics.h ------------------------------------------------------------

// ---- e4m3fn ---------------------------------------------------------------------------------
// Decoding: exponent field e, mantissa m. e == 0: m * 2^-9 (subnormal); otherwise
// (8 + m) * 2^(e - 10); e == 15 && m == 7: NaN.
float e4m3_to_f32(e4m3_t x) {
  const int sign = x.bits >> 7, e = (x.bits >> 3) & 0xF, m = x.bits & 7;
  if (e == 15 && m == 7) return sign ? -std::nanf("") : std::nanf("");
  const float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return sign ? -mag : mag;
}

// Encoding works on the integer significand of the f32 input so that it does not depend on the
// floating-point environment:
//   1. value = sig * 2^(ee - 150) with sig the 24-bit significand (implicit bit included).
//   2. The target grid has spacing 2^qe: qe = E - 3 for E = floor(log2 |x|) >= -6 (e4m3 normal),
//      qe = -9 below (the e4m3 subnormal grid).
//   3. r = sig / 2^(qe - ee + 150) rounded to nearest, ties to even.
//   4. Subnormal grid: the code is r itself (r = 8 is the smallest normal, code 0x08).
//      Normal grid: r in [8, 16]; r == 16 carries into the exponent.
//   5. Exponent field > 15, or the NaN pattern (15, 7), saturates to 448 (code 0x7E).
e4m3_t f32_to_e4m3(float x) {
  const uint32_t u = bits_of(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t ef = (u >> 23) & 0xFFu, mf = u & 0x7FFFFFu;
  if (ef == 0xFF) return e4m3_t{uint8_t(sign | (mf ? 0x7F : 0x7E))};  // NaN kept, inf saturates
  if (ef == 0 && mf == 0) return e4m3_t{sign};
  const int ee = ef == 0 ? 1 : int(ef);             // effective biased exponent
  const uint64_t sig = ef == 0 ? mf : (mf | 0x800000u);
  const int E = int(ef) - 127;                      // floor(log2|x|) for normal f32 inputs
  const bool subnormal_grid = ef == 0 || E < -6;
  const int qe = subnormal_grid ? -9 : E - 3;
  const int shift = qe - (ee - 150);                // >= 20 for every input
  uint64_t r = 0;
  if (shift < 40) {
    const uint64_t rem = sig & ((uint64_t(1) << shift) - 1), half = uint64_t(1) << (shift - 1);
    r = sig >> shift;
    if (rem > half || (rem == half && (r & 1))) ++r;
  }
  if (subnormal_grid) return e4m3_t{uint8_t(sign | r)};  // r <= 8
  int exp_field = E + 7;
  if (r == 16) { r = 8; ++exp_field; }
  if (exp_field > 15 || (exp_field == 15 && r - 8 == 7)) return e4m3_t{uint8_t(sign | 0x7E)};
  return e4m3_t{uint8_t(sign | (exp_field << 3) | int(r - 8))};
}

// ---- scales ---------------------------------------------------------------------------------
std::string scale_rule_name(ScaleRule r) {
  switch (r) {
    case ScaleRule::deepseek_ue8m0: return "deepseek_ue8m0";
    case ScaleRule::flashmla_pow2: return "flashmla_pow2";
    case ScaleRule::fp32_amax: return "fp32_amax";
  }
  return "?";
}

ScaleRule parse_scale_rule(const std::string& name) {
  for (ScaleRule r : {ScaleRule::deepseek_ue8m0, ScaleRule::flashmla_pow2, ScaleRule::fp32_amax})
    if (scale_rule_name(r) == name) return r;
  throw Error("unknown scale rule '" + name + "' (expected deepseek_ue8m0, flashmla_pow2 or fp32_amax)");
}

float pow2_ceil(float s) {
  require(std::isfinite(s) && s > 0, "pow2_ceil: scale must be finite and positive");
  const uint32_t u = bits_of(s);
  if ((u >> 23) == 0) {  // subnormal input: 2^ceil(log2 s) from the highest set mantissa bit
    int hi = 22;
    while (!(u >> hi & 1u)) --hi;
    const int e = hi - 149 + ((u & ((1u << hi) - 1)) ? 1 : 0);
    return std::ldexp(1.0f, e);
  }
  const int e = int(u >> 23) - 127 + ((u & 0x7FFFFFu) ? 1 : 0);
  return std::ldexp(1.0f, e);
}

float block_scale(float amax, ScaleRule rule) {
  require(std::isfinite(amax) && amax >= 0, "block_scale: amax must be finite and >= 0");
  constexpr float kInv448 = 1.0f / 448.0f;  // fp32(1/448) = 0.0022321429569...
  switch (rule) {
    case ScaleRule::deepseek_ue8m0: return pow2_ceil(std::fmax(amax, 1e-4f) * kInv448);
    case ScaleRule::flashmla_pow2: return pow2_ceil(std::fmax(amax / 448.0f, 1e-4f));
    case ScaleRule::fp32_amax: return std::fmax(amax, 1e-4f) / 448.0f;
  }
  return 1.0f;
}

void quantize_rows(const float* x, int64_t rows, int64_t cols, int block, ScaleRule rule,
                   e4m3_t* codes, float* scales, const std::string& what) {
  require(block > 0, what + ": quantization block must be positive");
  const int64_t nblocks = (cols + block - 1) / block;
  // The first non-finite value (row-major order) is refused before any row is quantized, so the
  // rows, each with its own codes and scales, are then quantized in parallel (OpenMP).
  for (int64_t i = 0; i < rows * cols; ++i)
    if (!std::isfinite(x[i]))
      throw Error(what + ": non-finite value at row " + std::to_string(i / cols) + ", column " +
                  std::to_string(i % cols) + " cannot be quantized");
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t(1) << 16))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t c0 = b * block, c1 = std::min<int64_t>(cols, c0 + block);
      // Pass 1: amax over the block in f32 (max is exact, order does not matter).
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(x[r * cols + c]));
      // Pass 2: scale, then code = e4m3(clamp(x / s, -448, 448)).
      const float s = block_scale(amax, rule);
      scales[r * nblocks + b] = s;
      for (int64_t c = c0; c < c1; ++c) {
        const float y = std::fmin(std::fmax(x[r * cols + c] / s, -kE4m3Max), kE4m3Max);
        codes[r * cols + c] = f32_to_e4m3(y);
      }
    }
  }
}

Quantized quantize(const Tensor<float>& x, int block, ScaleRule rule, const std::string& what) {
  require(x.rank() >= 1, what + ": cannot quantize a rank-0 tensor");
  require(block > 0, what + ": quantization block must be positive");
  const int64_t cols = x.shape.back(), rows = cols ? x.numel() / cols : 0;
  Shape sshape = x.shape;
  sshape.back() = (cols + block - 1) / block;
  Quantized q{Tensor<e4m3_t>(x.shape), Tensor<float>(sshape)};
  quantize_rows(x.ptr(), rows, cols, block, rule, q.codes.ptr(), q.scales.ptr(), what);
  return q;
}

Tensor<float> dequantize(const Quantized& q, int block) {
  Tensor<float> out(q.codes.shape);
  const int64_t cols = q.codes.shape.back(), rows = cols ? q.codes.numel() / cols : 0;
  const int64_t nblocks = q.scales.shape.back();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = e4m3_to_f32(q.codes[r * cols + c]) * q.scales[r * nblocks + c / block];
  return out;
}

double exp_portable(double x) {
  if (std::isnan(x)) return x;
  x = std::min(std::max(x, kExpLo), kExpHi);
  const double k = std::nearbyint(x * kLog2e);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  double p = kExpCoefficients[kExpDegree];
  for (int n = kExpDegree - 1; n >= 0; --n) p = p * r + kExpCoefficients[size_t(n)];
  return std::ldexp(p, static_cast<int>(k));
}

}  // namespace indexshare
