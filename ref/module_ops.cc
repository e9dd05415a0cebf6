#include "ref/module_ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "ref/numerics.h"

namespace indexshare::ref {

namespace {

void check_rope_dim(int rope_dim, const char* fn) {
  require(rope_dim >= 2 && rope_dim % 2 == 0,
          std::string(fn) + ": rope_dim must be even and >= 2, got " + std::to_string(rope_dim));
}

}  // namespace

// ---- RoPE frequencies -----------------------------------------------------------------------

std::vector<float> rope_inv_freq(int rope_dim, double theta) {
  check_rope_dim(rope_dim, "rope_inv_freq");
  require(std::isfinite(theta) && theta > 0,
          "rope_inv_freq: theta must be finite and > 0, got " + std::to_string(theta));
  const int half = rope_dim / 2;
  const float base = float(theta);  // torch casts the Python scalar base to the tensor's f32
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    const float e = float(2 * i) / float(rope_dim);                 // f32 division
    const float p = float(std::pow(double(base), double(e)));       // pow in double, one rounding
    inv[size_t(i)] = 1.0f / p;                                      // f32 division
  }
  return inv;
}

std::pair<int, int> yarn_correction_range(int rope_dim, double theta, int original_seq_len,
                                          double beta_fast, double beta_slow) {
  check_rope_dim(rope_dim, "yarn_correction_range");
  require(std::isfinite(theta) && theta > 0 && theta != 1.0,
          "yarn_correction_range: theta must be finite, > 0 and != 1");
  require(original_seq_len > 0, "yarn_correction_range: original_seq_len must be > 0, got " +
                                    std::to_string(original_seq_len));
  require(std::isfinite(beta_fast) && beta_fast > 0 && std::isfinite(beta_slow) && beta_slow > 0,
          "yarn_correction_range: beta_fast and beta_slow must be finite and > 0");
  // find_correction_dim, evaluated left to right as in Python (double).
  auto corr_dim = [&](double num_rotations) {
    return double(rope_dim) *
           std::log(double(original_seq_len) / (num_rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(theta));
  };
  const int low = int(std::floor(corr_dim(beta_fast)));
  const int high = int(std::ceil(corr_dim(beta_slow)));
  return {std::max(low, 0), std::min(high, rope_dim - 1)};
}

std::vector<float> yarn_inv_freq(int rope_dim, double theta, double factor, int original_seq_len,
                                 double beta_fast, double beta_slow) {
  require(std::isfinite(factor) && factor > 0,
          "yarn_inv_freq: factor must be finite and > 0, got " + std::to_string(factor));
  std::vector<float> freqs = rope_inv_freq(rope_dim, theta);
  const auto [low, high] = yarn_correction_range(rope_dim, theta, original_seq_len, beta_fast, beta_slow);
  // linear_ramp_factor: `if min == max: max += 0.001`, then (arange - min) / (max - min) in f32
  // (the Python scalar max - min becomes an f32 operand).
  const double high_d = (low == high) ? double(high) + 0.001 : double(high);
  const float span = float(high_d - double(low));
  const float factor_f = float(factor);
  for (size_t i = 0; i < freqs.size(); ++i) {
    const float ramp = std::clamp((float(i) - float(low)) / span, 0.0f, 1.0f);
    const float smooth = 1.0f - ramp;
    const float f = freqs[i];
    freqs[i] = (f / factor_f) * (1.0f - smooth) + f * smooth;
  }
  return freqs;
}

double yarn_mscale(double factor, double mscale) {
  if (factor <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(factor) + 1.0;
}

// ---- RoPE -----------------------------------------------------------------------------------

std::string rope_layout_name(RopeLayout layout) {
  switch (layout) {
    case RopeLayout::half_split: return "half_split";
    case RopeLayout::interleaved: return "interleaved";
  }
  return "?";
}

RopeLayout parse_rope_layout(const std::string& name) {
  for (RopeLayout l : {RopeLayout::half_split, RopeLayout::interleaved})
    if (rope_layout_name(l) == name) return l;
  throw Error("unknown rope layout '" + name + "' (expected half_split or interleaved)");
}

void apply_rope(float* x, int rope_dim, int64_t pos, const std::vector<float>& inv_freq,
                RopeLayout layout) {
  check_rope_dim(rope_dim, "apply_rope");
  const int half = rope_dim / 2;
  require(int64_t(inv_freq.size()) == half,
          "apply_rope: inv_freq has " + std::to_string(inv_freq.size()) +
              " entries, expected rope_dim/2 = " + std::to_string(half));
  require(pos >= 0, "apply_rope: pos must be >= 0, got " + std::to_string(pos));
  const float pos_f = float(pos);
  for (int j = 0; j < half; ++j) {
    const int ia = (layout == RopeLayout::half_split) ? j : 2 * j;
    const int ib = (layout == RopeLayout::half_split) ? j + half : 2 * j + 1;
    const float angle = pos_f * inv_freq[size_t(j)];
    const float c = float(std::cos(double(angle)));
    const float s = float(std::sin(double(angle)));
    const float a = x[ia], b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = a * s + b * c;
  }
}

// ---- Hadamard rotation ----------------------------------------------------------------------

void hadamard_transform(float* x, int n) {
  require(n >= 1 && (n & (n - 1)) == 0,
          "hadamard_transform: n must be a power of two >= 1, got " + std::to_string(n));
  for (int h = 1; h < n; h *= 2) {
    for (int b = 0; b < n; b += 2 * h) {
      for (int j = b; j < b + h; ++j) {
        const float u = x[j], v = x[j + h];
        x[j] = u + v;
        x[j + h] = u - v;
      }
    }
  }
  const float scale = float(std::pow(double(n), -0.5));
  for (int i = 0; i < n; ++i) x[i] = x[i] * scale;
}

// ---- Normalization --------------------------------------------------------------------------

void layer_norm(const float* x, float* y, int64_t n, const float* weight, const float* bias,
                float eps) {
  require(n >= 1, "layer_norm: n must be >= 1, got " + std::to_string(n));
  require(std::isfinite(eps) && eps >= 0, "layer_norm: eps must be finite and >= 0");
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]);
  const double mean = sum / double(n);
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(x[i]) - mean;
    sq += d * d;
  }
  const double var = sq / double(n);
  const double denom = std::sqrt(var + double(eps));
  for (int64_t i = 0; i < n; ++i) {
    const double w = weight ? double(weight[i]) : 1.0;
    const double b = bias ? double(bias[i]) : 0.0;
    y[i] = float((double(x[i]) - mean) / denom * w + b);
  }
}

void rms_norm(const float* x, float* y, int64_t n, const float* weight, float eps) {
  require(n >= 1, "rms_norm: n must be >= 1, got " + std::to_string(n));
  require(std::isfinite(eps) && eps >= 0, "rms_norm: eps must be finite and >= 0");
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sq += double(x[i]) * double(x[i]);
  const double denom = std::sqrt(sq / double(n) + double(eps));
  for (int64_t i = 0; i < n; ++i) {
    const double w = weight ? double(weight[i]) : 1.0;
    y[i] = float(double(x[i]) / denom * w);
  }
}

// ---- Linear ---------------------------------------------------------------------------------

void check_linear_inputs(const Tensor<float>& x, const Tensor<float>& w) {
  require(x.rank() == 2, "linear x: expected rank 2 [rows, in], got " + shape_str(x.shape));
  require(w.rank() == 2, "linear w: expected rank 2 [out, in], got " + shape_str(w.shape));
  require(w.dim(1) == x.dim(1), "linear w: in-features " + std::to_string(w.dim(1)) +
                                    " differ from x's " + std::to_string(x.dim(1)) + " (x " +
                                    shape_str(x.shape) + ", w " + shape_str(w.shape) + ")");
}

Tensor<float> linear(const Tensor<float>& x, const Tensor<float>& w) {
  check_linear_inputs(x, w);
  const int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  Tensor<float> y({rows, out});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0.0;
      for (int64_t k = 0; k < in; ++k) acc += double(x.at(r, k)) * double(w.at(o, k));
      y.at(r, o) = float(acc);
    }
  }
  return y;
}

Tensor<float> linear_bf16(const Tensor<float>& x, const Tensor<float>& w) {
  Tensor<float> y = linear(x, w);
  round_bf16_inplace(y);
  return y;
}

void check_head_linear_inputs(const Tensor<float>& x, const HeadWeights& w) {
  require(x.rank() == 3, "head_linear x: expected rank 3 [rows, heads, in], got " + shape_str(x.shape));
  require(w.heads >= 0 && w.out >= 0 && w.in >= 0 && w.head_stride >= 0 && w.o_stride >= 0 && w.i_stride >= 0,
          "head_linear w: sizes and strides must be >= 0");
  require(x.dim(1) == w.heads && x.dim(2) == w.in,
          "head_linear x: expected [rows, heads=" + std::to_string(w.heads) + ", in=" + std::to_string(w.in) +
              "], got " + shape_str(x.shape));
  require(w.base != nullptr || w.heads == 0, "head_linear w: no data");
}

Tensor<float> head_linear(const Tensor<float>& x, const HeadWeights& w) {
  check_head_linear_inputs(x, w);
  const int64_t rows = x.dim(0), heads = w.heads, in = w.in, out = w.out;
  Tensor<float> y({rows, heads, out});
  std::vector<double> acc(static_cast<size_t>(out));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* wh = w.base + h * w.head_stride;
      // Every y[r, h, o] is the sum over i ascending, acc[o] = 0 + x_0 W(o, 0) + x_1 W(o, 1) + ...
      // Both loop orders below perform exactly that sequence per element; the inner loop walks
      // the index along which W is contiguous (o for W_uk read transposed, i otherwise).
      if (w.o_stride == 1 && w.i_stride != 1) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t i = 0; i < in; ++i) {
          const double xi = double(x.at(r, h, i));
          const float* wi = wh + i * w.i_stride;
          for (int64_t o = 0; o < out; ++o) acc[size_t(o)] += xi * double(wi[o]);
        }
      } else {
        for (int64_t o = 0; o < out; ++o) {
          double a = 0.0;
          for (int64_t i = 0; i < in; ++i) a += double(x.at(r, h, i)) * double(wh[o * w.o_stride + i * w.i_stride]);
          acc[size_t(o)] = a;
        }
      }
      for (int64_t o = 0; o < out; ++o) y.at(r, h, o) = float(acc[size_t(o)]);
    }
  }
  return y;
}

// ---- Helpers --------------------------------------------------------------------------------

void round_bf16_inplace(Tensor<float>& t) {
  for (float& v : t.data) v = round_bf16(v);
}

}  // namespace indexshare::ref
