#include "ref/v4/compressor.h"

#include <cmath>
#include <limits>

#include "ref/error.h"
#include "ref/module_ops.h"
#include "ref/numerics.h"

namespace indexshare::ref::v4 {

RopeParams v4_main_rope() { return RopeParams{}; }

RopeParams v4_compress_rope() {
  RopeParams r;
  r.theta = 160000.0;
  r.yarn = true;
  r.factor = 16.0;
  r.original_max_pos = 65536;
  r.beta_fast = 32.0;
  r.beta_slow = 1.0;
  return r;
}

std::vector<float> inv_freq(const RopeParams& r) {
  return r.yarn ? yarn_inv_freq(r.rope_dim, r.theta, r.factor, r.original_max_pos, r.beta_fast, r.beta_slow)
                : rope_inv_freq(r.rope_dim, r.theta);
}

void rope_cos_sin(int64_t pos, const std::vector<float>& inv_freq, float* c, float* s) {
  require(pos >= 0, "rope_cos_sin: pos must be >= 0, got " + std::to_string(pos));
  const float pos_f = float(pos);
  for (size_t j = 0; j < inv_freq.size(); ++j) {
    const float angle = pos_f * inv_freq[j];
    c[j] = float(std::cos(double(angle)));
    s[j] = float(std::sin(double(angle)));
  }
}

void apply_rope_inverse(float* x, int rope_dim, const float* c, const float* s) {
  for (int j = 0; j < rope_dim / 2; ++j) {
    const float a = x[2 * j], b = x[2 * j + 1];
    x[2 * j] = a * c[j] + b * s[j];
    x[2 * j + 1] = b * c[j] - a * s[j];
  }
}

void apply_rope_inverse(float* x, int rope_dim, int64_t pos, const std::vector<float>& inv_freq) {
  require(rope_dim >= 2 && rope_dim % 2 == 0, "apply_rope_inverse: rope_dim must be even and >= 2");
  require(int64_t(inv_freq.size()) == rope_dim / 2, "apply_rope_inverse: inv_freq must have rope_dim/2 entries");
  require(pos >= 0, "apply_rope_inverse: pos must be >= 0, got " + std::to_string(pos));
  std::vector<float> c(inv_freq.size()), s(inv_freq.size());
  rope_cos_sin(pos, inv_freq, c.data(), s.data());
  apply_rope_inverse(x, rope_dim, c.data(), s.data());
}

std::string rounding_name(CompressorRounding r) { return r == CompressorRounding::f32 ? "f32" : "hf_bf16"; }

CompressorRounding parse_rounding(const std::string& name) {
  if (name == "f32" || name == "megatron") return CompressorRounding::f32;
  if (name == "hf_bf16" || name == "hf") return CompressorRounding::hf_bf16;
  throw Error("compressor rounding: unknown value '" + name + "' (expected f32, megatron, hf_bf16 or hf)");
}

namespace {
// transformers' bf16 RoPE on x[0, rope_dim) (interleaved pairs): bf16 cos / sin, f32 arithmetic,
// bf16 result (see the header).
void apply_rope_bf16(float* x, int rope_dim, int64_t pos, const std::vector<float>& freq) {
  const float pos_f = float(pos);
  for (int j = 0; j < rope_dim / 2; ++j) {
    const float angle = pos_f * freq[size_t(j)];
    const float c = round_bf16(float(std::cos(double(angle)))), s = round_bf16(float(std::sin(double(angle))));
    const float a = x[2 * j], b = x[2 * j + 1];
    x[2 * j] = round_bf16(a * c - b * s);
    x[2 * j + 1] = round_bf16(b * c + a * s);
  }
}
}  // namespace

void check_compressor_inputs(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& position_bias,
                             const Tensor<float>& norm_weight, const CompressorParams& p) {
  require(p.ratio >= 1, "compressor: ratio must be >= 1, got " + std::to_string(p.ratio));
  require(std::isfinite(p.eps) && p.eps >= 0, "compressor: eps must be finite and >= 0");
  require(kv.rank() == 2, "compressor kv: expected rank 2 [T, width], got " + shape_str(kv.shape));
  require(norm_weight.rank() == 1 && norm_weight.dim(0) >= 1,
          "compressor norm_weight: expected shape [D], got " + shape_str(norm_weight.shape));
  const int64_t D = norm_weight.dim(0), width = p.overlap ? 2 * D : D;
  require(kv.dim(1) == width, "compressor kv: width " + std::to_string(kv.dim(1)) + " is not " +
                                  (p.overlap ? "2D = " : "D = ") + std::to_string(width) + " (D from norm_weight)");
  require_shape(gate, kv.shape, "compressor gate");
  require_shape(position_bias, Shape{p.ratio, width}, "compressor position_bias");
  require(p.rope.rope_dim >= 2 && p.rope.rope_dim % 2 == 0 && p.rope.rope_dim <= D,
          "compressor rope_dim: must be even, >= 2 and <= D = " + std::to_string(D));
  // Every logit of a complete window must be finite (an all -inf window has no softmax).
  const int64_t used = (kv.dim(0) / p.ratio) * p.ratio;
  for (int64_t i = 0; i < used * width; ++i)
    require(std::isfinite(gate[i]), "compressor gate: non-finite value at token " + std::to_string(i / width) +
                                        ", column " + std::to_string(i % width));
  for (int64_t i = 0; i < position_bias.numel(); ++i)
    require(std::isfinite(position_bias[i]), "compressor position_bias: non-finite value at slot " +
                                                 std::to_string(i / width) + ", column " + std::to_string(i % width));
}

void compress_window(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& position_bias,
                     const Tensor<float>& norm_weight, const CompressorParams& p, const std::vector<float>& freq,
                     int64_t w, float* out) {
  const int64_t m = p.ratio, D = norm_weight.dim(0);
  // Slots: (token, column offset, bias row). Overlap: the previous window's Ca (absent for w = 0)
  // then this window's Cb; no overlap: this window's tokens.
  struct Slot {
    int64_t tok, col0, bias_row;
  };
  std::vector<Slot> slots;
  if (p.overlap && w > 0)
    for (int64_t j = 0; j < m; ++j) slots.push_back({(w - 1) * m + j, 0, j});
  for (int64_t j = 0; j < m; ++j) slots.push_back({w * m + j, p.overlap ? D : 0, j});
  const size_t n = slots.size();
  std::vector<float> z(n), prob(n);
  std::vector<double> e(n);
  std::vector<float> pooled(size_t(D), 0.0f);
  for (int64_t c = 0; c < D; ++c) {
    // Logits z_j = f32(gate + bias), their max, the exponentials and their sum (ascending j).
    double mx = -std::numeric_limits<double>::infinity();
    for (size_t j = 0; j < n; ++j) {
      const Slot& s = slots[j];
      z[j] = gate.at(s.tok, s.col0 + c) + position_bias.at(s.bias_row, s.col0 + c);
      mx = std::max(mx, double(z[j]));
    }
    double sum = 0.0;
    for (size_t j = 0; j < n; ++j) {
      e[j] = exp_portable(double(z[j]) - mx);
      sum += e[j];
    }
    for (size_t j = 0; j < n; ++j) prob[j] = float(e[j] / sum);
    // Pooled value: exact products of f32 weights and values, summed in double, rounded once
    // (hf_bf16: weights, products and the sum rounded to bf16).
    const bool bf = p.rounding == CompressorRounding::hf_bf16;
    double acc = 0.0;
    for (size_t j = 0; j < n; ++j) {
      const double v = kv.at(slots[j].tok, slots[j].col0 + c);
      acc += bf ? double(round_bf16(round_bf16(prob[j]) * float(v))) : double(prob[j]) * v;
    }
    pooled[size_t(c)] = bf ? round_bf16(float(acc)) : float(acc);
  }
  rms_norm(pooled.data(), out, D, norm_weight.ptr(), p.eps);
  if (p.rounding == CompressorRounding::hf_bf16) {
    for (int64_t c = 0; c < D; ++c) out[c] = round_bf16(out[c]);
    apply_rope_bf16(out + (D - p.rope.rope_dim), p.rope.rope_dim, w * m, freq);
    return;
  }
  apply_rope(out + (D - p.rope.rope_dim), p.rope.rope_dim, w * m, freq, RopeLayout::interleaved);
}

Tensor<float> compress(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& position_bias,
                       const Tensor<float>& norm_weight, const CompressorParams& p) {
  check_compressor_inputs(kv, gate, position_bias, norm_weight, p);
  const int64_t n_w = kv.dim(0) / p.ratio, D = norm_weight.dim(0);
  const std::vector<float> freq = inv_freq(p.rope);
  Tensor<float> out({n_w, D});
  for (int64_t w = 0; w < n_w; ++w) compress_window(kv, gate, position_bias, norm_weight, p, freq, w, out.ptr() + w * D);
  return out;
}

}  // namespace indexshare::ref::v4
