// indexshare: number formats and FP8 block quantization, as the GPU stacks define them.
//
// Formats
//   bf16   : IEEE-style bfloat16 (1 sign, 8 exponent, 7 mantissa bits). f32 -> bf16 rounds to
//            nearest, ties to even; overflow rounds to +-inf as IEEE does; every NaN becomes the
//            quiet NaN 0x7FC0 with the input's sign (the rule of Eigen / ml_dtypes / PyTorch).
//   e4m3fn : float8_e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinity).
//            Codes 0x7F / 0xFF are NaN; the largest finite magnitude is 448 (code 0x7E).
//            The smallest subnormal is 2^-9, the smallest normal 2^-6.
//            f32 -> e4m3fn rounds to nearest, ties to even, then SATURATES: a finite value whose
//            rounded magnitude exceeds 448 (that is |x| > 464; 464 itself ties to 448 because 448's
//            mantissa is even) and +-inf become +-448 (PTX cvt ".satfinite" semantics). NaN becomes
//            0x7F with the input's sign bit (0x7F or 0xFF). Inside [-464, 464] the result equals
//            the non-saturating IEEE conversion (ml_dtypes, PyTorch), which give NaN beyond it.
//
// Scale rules (one scale per block of `block` consecutive values along the last dimension;
// amax = max |x| over the block, computed in f32; NaN or infinity in a block is an input error)
//   deepseek_ue8m0 : DeepSeek-V3.2 `act_quant` with scale_fmt "ue8m0":
//                    s = pow2_ceil(max(amax, 1e-4f) * fp32(1/448))     (a multiply, not a divide)
//   flashmla_pow2  : FlashMLA's V32 FP8 KV cache quantizer (tests/quant.py):
//                    s = pow2_ceil(max(amax / 448, 1e-4f))              (the clamp is on the scale)
//   fp32_amax      : plain fp32 scales, the non-ue8m0 path of vLLM's indexer k-cache:
//                    s = max(amax, 1e-4f) / 448
//   pow2_ceil(s) is the smallest power of two >= s, computed exactly from the bits of s:
//   e = biased_exponent(s) - 127 + (mantissa(s) != 0), result 2^e. (A float log2 as in the
//   PyTorch form can round log2(2^k * (1 + 2^-23)) down to k; the bit rule cannot.)
//   Quantized value: code = e4m3(clamp(x / s, -448, 448)) with an IEEE f32 division (exact when s
//   is a power of two); dequantized value: e4m3_to_f32(code) * s in f32.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "ref/tensor.h"

namespace indexshare {

// ---- bf16 -----------------------------------------------------------------------------------
// Rounding: add 0x7FFF plus the lowest kept bit, then truncate. This rounds the 16 dropped bits
// to nearest with ties to even, and carries into the exponent (up to infinity) as IEEE requires.
// NaN keeps its sign and becomes the quiet NaN 0x7FC0. (Inline: the generator rounds every value.)
inline bf16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bf16_t{uint16_t((u >> 16 & 0x8000u) | 0x7FC0u)};
  const uint32_t lsb = (u >> 16) & 1u;
  return bf16_t{uint16_t((u + 0x7FFFu + lsb) >> 16)};
}
inline float bf16_to_f32(bf16_t x) {
  const uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// x rounded to the nearest bf16 value, returned as f32.
inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
// A bf16 tensor's values as f32 (exact), element by element.
inline Tensor<float> bf16_to_f32(const Tensor<bf16_t>& x) {
  Tensor<float> y(x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}

// ---- float8 e4m3fn --------------------------------------------------------------------------
e4m3_t f32_to_e4m3(float x);
float e4m3_to_f32(e4m3_t x);
constexpr float kE4m3Max = 448.0f;

// ---- scales ---------------------------------------------------------------------------------
enum class ScaleRule { deepseek_ue8m0, flashmla_pow2, fp32_amax };
std::string scale_rule_name(ScaleRule r);
ScaleRule parse_scale_rule(const std::string& name);  // throws Error naming the bad value

// Smallest power of two >= s, for finite s > 0 (exact, from the bits).
float pow2_ceil(float s);
// The scale of one block whose max |x| is `amax` (finite, >= 0) under `rule`.
float block_scale(float amax, ScaleRule rule);

// Quantizes a [rows, cols] f32 matrix in blocks of `block` columns (the last block of a row may be
// shorter when cols % block != 0). codes: [rows, cols]; scales: [rows, ceil(cols / block)].
// `what` names the tensor in error messages (NaN / infinity in a block).
void quantize_rows(const float* x, int64_t rows, int64_t cols, int block, ScaleRule rule,
                   e4m3_t* codes, float* scales, const std::string& what);
struct Quantized {
  Tensor<e4m3_t> codes;  // same shape as the input
  Tensor<float> scales;  // input shape with the last dim replaced by ceil(last / block)
};
Quantized quantize(const Tensor<float>& x, int block, ScaleRule rule, const std::string& what);
// Inverse: value = e4m3_to_f32(code) * scale, in f32.
Tensor<float> dequantize(const Quantized& q, int block);

// ---- exp ------------------------------------------------------------------------------------
// exp(x) in double by a fixed sequence of IEEE-754 operations, the exponential of the attention
// softmax. The C library's exp is not specified to the bit (glibc, musl, MSVC and vector math
// libraries differ in the last place), so goldens computed with it could change from machine to
// machine; this one cannot, and simd/ performs the very same operations lane by lane, so its
// softmax equals ref's bit for bit on every target. Error: within 2 ulp of the true exp (measured
// against the C library in tests/test_numerics.cc); not correctly rounded.
//
//   NaN        returned unchanged
//   clamp      x to [kExpLo, kExpHi] = [-746, 710]: beyond them the result is 0 (the true value
//              is below half the smallest subnormal) or +inf (above the largest double) anyway
//   reduce     k = nearbyint(x * kLog2e)          (round half to even; |k| <= 1076)
//              r = (x - k * kLn2Hi) - k * kLn2Lo  (Cody-Waite: kLn2Hi has 32 significant bits, so
//                                                  k * kLn2Hi is exact; |r| <= ~0.347)
//   polynomial p = Taylor series of exp(r) to degree 13, by Horner's rule from the top:
//              p = c13; p = p * r + c_n for n = 12 .. 0 (a multiply then an add, never fused),
//              c_n = 1 / n! rounded to double (truncation error < 5e-18 on |r| <= 0.347)
//   scale      p * 2^k (std::ldexp: exact unless the result is subnormal or overflows, then one
//              rounding, which is what p * 2^floor(k/2) * 2^(k - floor(k/2)) gives too)
constexpr double kExpLo = -746.0, kExpHi = 710.0;
constexpr double kLog2e = 1.4426950408889634;            // 0x1.71547652b82fep+0
constexpr double kLn2Hi = 6.93147180369123816490e-01;    // 0x1.62e42feep-1
constexpr double kLn2Lo = 1.90821492927058770002e-10;    // 0x1.a39ef35793c76p-33
constexpr int kExpDegree = 13;
// c_n = 1 / n! (n! is exact in double for n <= 18, so each c_n is one correctly rounded division).
constexpr std::array<double, kExpDegree + 1> kExpCoefficients = [] {
  std::array<double, kExpDegree + 1> c{};
  double factorial = 1.0;
  for (int n = 0; n <= kExpDegree; ++n) {
    if (n > 1) factorial *= n;
    c[size_t(n)] = 1.0 / factorial;
  }
  return c;
}();
double exp_portable(double x);

}  // namespace indexshare
