// indexshare: the FP4 indexer (DeepGEMM `fp8_fp4_mqa_logits` semantics): e2m1 codes with one ue8m0
// scale per 32 values, the three rounding rules the serving stacks use, and the logits.
//
// e2m1. A 4-bit code: bit 3 the sign, bits 0-2 index the magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
// Two codes a byte, the even element in the low nibble. Every decoder reads code 0x8 as +0.
//
// A row of D values (D = 64 or 128; q rows are [s_q, H, D], k rows [s_kv, D]) is cut into blocks of
// 32. Each block gets a power-of-two scale sf = 2^(e - 127), stored as its ue8m0 byte e, and each
// value x the code of x / sf. What the stacks disagree on, by name (Rule):
//
//   rule           scale                                           ties (|x| / sf on a midpoint)      zero
//   toward-zero    DeepGEMM: y = f32(max(amax, 1e-4)) / 6 in f32;  toward zero (code = number of       +0 (code 0)
//                  e = y's biased exponent, + 1 when its           midpoints strictly below |x|/sf)
//                  mantissa is not zero, clamped to [1, 254]
//   nearest-even   transformers (and the hardware's cvt.rn):       to the even code: 0.25 -> 0,       sign bit kept:
//                  y = f32(max(amax, 6 * 2^-126) * f32(1/6)),      0.75 -> 1, 1.25 -> 1, 1.75 -> 2,   a negative value
//                  then e as DeepGEMM's (ceil on the bits)         2.5 -> 2, 3.5 -> 4, 5 -> 4         rounding to zero
//                                                                                                     is code 0x8
//   aiter          aiter's test: e = 127 + ceil(log2 f32 of        toward -inf: positive ties toward  +0 (code 0)
//                  f32(max(amax, 1e-8)) / 6), the log2 rounded     zero, negative ties away from it
//                  to f32 (so an amax just above 6 * 2^k gives     (-0.25 -> -0.5)
//                  one power of two less than the exact rule)
//
// amax is the block's largest |x| (f32). x / sf is exact (a power of two) and clamped to 6 before
// the code is chosen. Degenerate blocks (all zero): scale bytes 112, 1 and 98 by rule.
//
// Logits (the FP4 path's weights carry only D^-1/2 H^-1/2: the kernel applies both scales inside
// the dot product):
//   logits[t, s] = sum_h w[t, h] * ReLU(sum_d dq(q)[t, h, d] * dq(k)[s, d])   ks[t] <= s < ke[t]
//   logits[t, s] = -inf                                                       otherwise
// Evaluation order (simd/ reproduces it bit for bit; it is ref::indexer_logits_f32's on the
// dequantized values with k_scale 1):
//   1. dot_h = sum over d ascending of double(dq(q)) * double(dq(k)), in double. A product is exact
//      (codes have 2 significant bits, scales are powers of two); so is every partial sum while a
//      row's scales span less than 2^40 (the usual case; beyond, one double rounding per add).
//   2. acc = 0; for h ascending: acc = acc + double(w[t, h]) * max(dot_h, 0) (never fused).
//   3. logits = acc rounded once: to f32, or (bf16 logits, DeepGEMM's logits_dtype) to bf16.
#pragma once

#include <cstdint>
#include <string>

#include "ref/tensor.h"

namespace indexshare::ref::fp4 {

enum class Rule { toward_zero, nearest_even, aiter };
std::string rule_name(Rule r);           // "toward-zero", "nearest-even", "aiter"
Rule parse_rule(const std::string& name);  // throws Error naming the bad value

constexpr int kBlock = 32;  // values per ue8m0 scale

// The ue8m0 byte of a block whose largest magnitude is amax (finite, >= 0), by rule.
uint8_t scale_byte(float amax, Rule r);
// The 4-bit code of v = x / sf (already scaled; any float), by rule: ties and the sign of zero.
uint8_t code(float v, Rule r);
// The value of a code (magnitudes {0, 0.5, ..., 6}, bit 3 the sign; 0x8 is +0).
double value(uint8_t code);

// Rows of D values quantized block by block.
struct Quantized {
  Tensor<uint8_t> data;    // [..., D / 2]: the codes, two a byte, even element in the low nibble
  Tensor<uint8_t> scales;  // [..., D / 32]: the blocks' ue8m0 bytes
};
// x [..., D] f32 (bf16 values widened exactly), D a multiple of 32 (64 or 128 for the kernels).
Quantized quantize(const Tensor<float>& x, Rule r);
// The dequantized values [..., D]: value(code) * 2^(e - 127), exact in f32 for every scale byte
// in [1, 254] (a block whose code scale overflows f32 decodes to inf, as every upstream decoder).
Tensor<float> dequantize(const Quantized& q);
// DeepGEMM's packed int32 scales [..., ceil(D / 128)]: four ue8m0 bytes an int32, little endian,
// block j in byte j % 4; at D = 64 the two unused bytes are 127 (scale 1).
Tensor<int32_t> pack_scales(const Tensor<uint8_t>& scales);

enum class LogitsType { f32, bf16 };
// v rounded once to bf16 (to nearest, ties to even; inf above bf16's largest), as a float.
float bf16_of(double v);
// q: codes [s_q, H, D / 2] and scales [s_q, H, D / 32]; k: [s_kv, D / 2] and [s_kv, D / 32];
// weights [s_q, H] f32; ks / ke [s_q]. Out [s_q, s_kv]: f32, or bf16 values widened to f32.
// check_logits_inputs: the shapes and 0 <= ks <= ke <= s_kv (Error naming what is wrong).
void check_logits_inputs(const Quantized& q, const Quantized& k, const Tensor<float>& weights, const Tensor<int32_t>& ks,
                         const Tensor<int32_t>& ke);
Tensor<float> logits(const Quantized& q, const Quantized& k, const Tensor<float>& weights, const Tensor<int32_t>& ks,
                     const Tensor<int32_t>& ke, LogitsType type = LogitsType::f32);

}  // namespace indexshare::ref::fp4
