#include "ref/fp4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ref/error.h"

namespace indexshare::ref::fp4 {

namespace {

// The midpoints between adjacent magnitudes, and whether a tie on each goes up under
// nearest-even (the upper code is even: 0.75 -> 1 (code 2), 1.75 -> 2 (code 4), 3.5 -> 4 (code 6)).
constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
constexpr bool kTieUp[7] = {false, true, false, true, false, true, false};
constexpr double kMag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// The biased exponent of 2^ceil(log2 y) read from y's bits (y > 0, normal): the exponent, plus one
// when the mantissa is not zero; clamped to [1, 254].
uint8_t ceil_exponent(float y) {
  const uint32_t u = bits_of(y);
  const int e = int((u >> 23) & 0xFF) + ((u & 0x7FFFFFu) != 0 ? 1 : 0);
  return uint8_t(std::clamp(e, 1, 254));
}

}  // namespace

float bf16_of(double v) {
  if (v == 0 || !std::isfinite(v)) return float(v);
  int e = 0;
  std::frexp(v, &e);                            // |v| = m 2^e, m in [0.5, 1)
  const int quantum = std::max(e - 8, -133);    // 8 significant bits; bf16's subnormal step 2^-133
  const double r = std::ldexp(std::nearbyint(std::ldexp(v, -quantum)), quantum);
  if (std::fabs(r) > 0x1.FEp127) return std::copysign(INFINITY, v);  // above bf16's largest finite
  return float(r);
}

std::string rule_name(Rule r) {
  switch (r) {
    case Rule::toward_zero: return "toward-zero";
    case Rule::nearest_even: return "nearest-even";
    case Rule::aiter: return "aiter";
  }
  return "?";
}

Rule parse_rule(const std::string& name) {
  for (Rule r : {Rule::toward_zero, Rule::nearest_even, Rule::aiter})
    if (rule_name(r) == name) return r;
  throw Error("FP4 rounding rule '" + name + "': expected toward-zero (DeepGEMM), nearest-even (transformers, cvt.rn) or aiter");
}

uint8_t scale_byte(float amax, Rule r) {
  require(std::isfinite(amax) && amax >= 0, "fp4::scale_byte: amax must be finite and >= 0");
  switch (r) {
    case Rule::toward_zero: return ceil_exponent(std::max(amax, 1e-4f) / 6.0f);
    case Rule::nearest_even: return ceil_exponent(std::max(amax, std::ldexp(6.0f, -126)) * (1.0f / 6.0f));
    case Rule::aiter: {
      const float l = float(std::log2(double(std::max(amax, 1e-8f) / 6.0f)));  // log2 rounded to f32
      return uint8_t(std::clamp(127 + int(std::ceil(l)), 1, 254));
    }
  }
  return 127;
}

uint8_t code(float v, Rule r) {
  const float a = std::min(std::fabs(v), 6.0f);
  int c = 0;
  for (int i = 0; i < 7; ++i) {
    const bool up = r == Rule::toward_zero   ? a > kMid[i]
                    : r == Rule::nearest_even ? a > kMid[i] || (a == kMid[i] && kTieUp[i])
                                              : (v < 0 ? a >= kMid[i] : a > kMid[i]);  // aiter: toward -inf
    c += up ? 1 : 0;
  }
  const bool negative = r == Rule::nearest_even ? std::signbit(v) : (v < 0 && c != 0);
  return uint8_t(c | (negative ? 0x8 : 0));
}

double value(uint8_t c) {
  const double m = kMag[c & 0x7];
  return (c & 0x8) && m != 0 ? -m : m;
}

Quantized quantize(const Tensor<float>& x, Rule r) {
  require(x.rank() >= 1 && x.dim(x.rank() - 1) % kBlock == 0 && x.dim(x.rank() - 1) > 0,
          "fp4::quantize: the last dimension must be a positive multiple of 32, got " + shape_str(x.shape));
  const int64_t D = x.dim(x.rank() - 1), rows = x.numel() / D, blocks = D / kBlock;
  Shape data_shape = x.shape, scale_shape = x.shape;
  data_shape.back() = D / 2;
  scale_shape.back() = blocks;
  Quantized q{Tensor<uint8_t>(data_shape, 0), Tensor<uint8_t>(scale_shape, 0)};
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = x.ptr() + row * D + b * kBlock;
      float amax = 0;
      for (int i = 0; i < kBlock; ++i) {
        require(std::isfinite(v[i]), "fp4::quantize: a non-finite value in row " + std::to_string(row));
        amax = std::max(amax, std::fabs(v[i]));
      }
      const uint8_t e = scale_byte(amax, r);
      q.scales[row * blocks + b] = e;
      const float inv = std::ldexp(1.0f, 127 - int(e));  // 1 / sf, exact
      for (int i = 0; i < kBlock; ++i) {
        const uint8_t c = code(v[i] * inv, r);
        const int64_t d = b * kBlock + i;
        q.data[row * (D / 2) + d / 2] |= uint8_t(d % 2 ? c << 4 : c);
      }
    }
  return q;
}

Tensor<float> dequantize(const Quantized& q) {
  const int64_t half = q.data.dim(q.data.rank() - 1), D = 2 * half, rows = q.data.numel() / std::max<int64_t>(half, 1);
  require(q.scales.numel() * kBlock == rows * D, "fp4::dequantize: " + shape_str(q.scales.shape) + " scales for codes " +
                                                     shape_str(q.data.shape));
  Shape shape = q.data.shape;
  shape.back() = D;
  Tensor<float> out(shape);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t d = 0; d < D; ++d) {
      const uint8_t byte = q.data[row * half + d / 2];
      const uint8_t c = d % 2 ? uint8_t(byte >> 4) : uint8_t(byte & 0xF);
      out[row * D + d] = float(value(c) * std::ldexp(1.0, int(q.scales[row * (D / kBlock) + d / kBlock]) - 127));
    }
  return out;
}

Tensor<int32_t> pack_scales(const Tensor<uint8_t>& scales) {
  const int64_t blocks = scales.dim(scales.rank() - 1), rows = scales.numel() / std::max<int64_t>(blocks, 1);
  const int64_t words = (blocks + 3) / 4;
  Shape shape = scales.shape;
  shape.back() = words;
  Tensor<int32_t> out(shape);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t w = 0; w < words; ++w) {
      uint32_t u = 0;
      for (int j = 0; j < 4; ++j) {
        const int64_t b = w * 4 + j;
        u |= uint32_t(b < blocks ? scales[row * blocks + b] : 127) << (8 * j);
      }
      std::memcpy(&out[row * words + w], &u, 4);
    }
  return out;
}

void check_logits_inputs(const Quantized& q, const Quantized& k, const Tensor<float>& w, const Tensor<int32_t>& ks,
                         const Tensor<int32_t>& ke) {
  require(q.data.rank() == 3 && k.data.rank() == 2 && q.data.dim(2) == k.data.dim(1),
          "fp4::logits: q codes [s_q, H, D/2] and k codes [s_kv, D/2] of one D, got " + shape_str(q.data.shape) + " and " +
              shape_str(k.data.shape));
  const int64_t s_q = q.data.dim(0), H = q.data.dim(1), D = 2 * q.data.dim(2), s_kv = k.data.dim(0);
  const int64_t B = D / kBlock;
  require(D % kBlock == 0 && q.scales.shape == Shape{s_q, H, B} && k.scales.shape == Shape{s_kv, B},
          "fp4::logits: scales " + shape_str(q.scales.shape) + " / " + shape_str(k.scales.shape) + " for D " + std::to_string(D));
  require(w.shape == Shape{s_q, H} && ks.shape == Shape{s_q} && ke.shape == Shape{s_q},
          "fp4::logits: weights [s_q, H], ks and ke [s_q]");
  for (int64_t t = 0; t < s_q; ++t)
    require(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_kv, "fp4::logits: row " + std::to_string(t) + "'s [ks, ke) outside [0, s_kv]");
}

Tensor<float> logits(const Quantized& q, const Quantized& k, const Tensor<float>& w, const Tensor<int32_t>& ks,
                     const Tensor<int32_t>& ke, LogitsType type) {
  check_logits_inputs(q, k, w, ks, ke);
  const int64_t s_q = q.data.dim(0), H = q.data.dim(1), D = 2 * q.data.dim(2), s_kv = k.data.dim(0);
  const Tensor<float> qv = dequantize(q), kv = dequantize(k);
  Tensor<float> out({s_q, s_kv}, -INFINITY);
  for (int64_t t = 0; t < s_q; ++t) {
    for (int64_t s = ks[t]; s < ke[t]; ++s) {
      double acc = 0;
      for (int64_t h = 0; h < H; ++h) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot = dot + double(qv[(t * H + h) * D + d]) * double(kv[s * D + d]);
        acc = acc + double(w[t * H + h]) * (dot > 0 ? dot : 0.0);
      }
      out[t * s_kv + s] = type == LogitsType::f32 ? float(acc) : bf16_of(acc);
    }
  }
  return out;
}

}  // namespace indexshare::ref::fp4
