// indexshare: module-level building blocks of the DSA indexer and of MLA (RoPE and YaRN, the
// Hadamard rotation, LayerNorm / RMSNorm, linear layers), as the reference specification.
//
// Conventions
//   * Every function works on plain f32 values (bf16 values are carried as f32 holding a bf16
//     number; round_bf16_inplace / linear_bf16 produce them). Each function states where it
//     rounds and in which order it reduces; nothing here depends on threads or SIMD.
//   * Sums that feed an f32 result are accumulated in double in ascending index order and rounded
//     to f32 once, unless the comment says the step is f32 arithmetic on purpose (RoPE, YaRN and
//     the Hadamard butterfly mirror the fp32 arithmetic of the DeepSeek reference code).
//   * The project compiles with -ffp-contract=off, so `a * b - c * d` below is two rounded
//     products and one rounded difference, never an FMA.
//   * Input problems (odd rope_dim, a non-power-of-two Hadamard size, mismatched shapes) throw
//     indexshare::Error naming the argument.
//
// Sources: DeepSeek-V3.2 inference/model.py, transformers' GLM-5 and DeepSeek-V3.2 models
// (precompute_freqs_cis, apply_rotary_emb, rotate_activation, LayerNorm, RMSNorm).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ref/tensor.h"

namespace indexshare::ref {

// ---- RoPE frequencies -----------------------------------------------------------------------

// inv_freq[i] = 1 / theta^(2i / rope_dim), i = 0 .. rope_dim/2 - 1, in f32.
// rope_dim: even, >= 2; theta: finite, > 0.
// Evaluation, mirroring torch's `1.0 / (base ** (torch.arange(0, dim, 2, dtype=float32) / dim))`:
//   e   = f32(2i) / f32(rope_dim)                    (f32 division)
//   p   = f32( pow(double(f32(theta)), double(e)) )  (pow in double, rounded once to f32)
//   inv = 1.0f / p                                   (f32 division)
// torch evaluates the pow in f32 with the platform's powf (glibc on CPU, < 1 ulp; CUDA powf,
// documented <= 2 ulp); the double pow rounded once is the correctly rounded f32 power (barring
// a double-rounding tie, vanishingly rare). So an entry can differ from a given torch build by an
// ulp or two: numpy's float32 power, for one, differs in the last bit at 4 of the 32 entries for
// (64, 1e4). Downstream the angle goes through cos/sin and a bf16 cast, which absorb this.
std::vector<float> rope_inv_freq(int rope_dim, double theta);

// DeepSeek's YaRN correction range, in double as in Python:
//   corr_dim(r) = rope_dim * ln(original_seq_len / (r * 2 * pi)) / (2 * ln(theta))
//   low  = max(floor(corr_dim(beta_fast)), 0)
//   high = min(ceil(corr_dim(beta_slow)), rope_dim - 1)
// Returns {low, high}. DeepSeek-V3.2 (64, 1e4, 4096, 32, 1) gives {10, 23}.
std::pair<int, int> yarn_correction_range(int rope_dim, double theta, int original_seq_len,
                                          double beta_fast, double beta_slow);

// DeepSeek's YaRN frequencies (precompute_freqs_cis with YaRN active), all f32 arithmetic:
//   base   = rope_inv_freq(rope_dim, theta)
//   {low, high} = yarn_correction_range(...); if low == high, high_f = high + 0.001 (as torch)
//   ramp_i = clamp((f32(i) - f32(low)) / f32(high_f - low), 0, 1)     i = 0 .. rope_dim/2 - 1
//   smooth = 1 - ramp_i
//   freq_i = (base_i / f32(factor)) * (1 - smooth) + base_i * smooth   (left to right, f32)
// So dims below `low` keep their frequency, dims at or above `high` are divided by `factor`.
// The caller decides whether YaRN is active (DeepSeek: when max_seq_len > original_seq_len).
// factor: finite, > 0; original_seq_len > 0; beta_fast, beta_slow > 0.
std::vector<float> yarn_inv_freq(int rope_dim, double theta, double factor, int original_seq_len,
                                 double beta_fast, double beta_slow);

// YaRN attention-temperature factor, double: 0.1 * mscale * ln(factor) + 1 for factor > 1, else 1.
// DeepSeek's MLA softmax scale is qk_head_dim^-0.5 * yarn_mscale(factor, mscale)^2
// (192^-0.5 * 1.36888795^2 = 0.1352337789 for V3.2).
double yarn_mscale(double factor, double mscale);

// ---- RoPE -----------------------------------------------------------------------------------

// How the rope slice is split into (a, b) rotation pairs; pair j uses inv_freq[j].
enum class RopeLayout {
  half_split,   // NeoX / non-interleaved: pair (j, j + rope_dim/2). DeepSeek-V3.2 indexer.
  interleaved,  // GPT-J / interleaved: pair (2j, 2j + 1). MLA rope (both models), GLM-5.x indexer.
};
std::string rope_layout_name(RopeLayout layout);      // "half_split" / "interleaved"
RopeLayout parse_rope_layout(const std::string& name);  // throws Error naming the bad value

// Rotates x[0 .. rope_dim) in place for absolute position `pos` (>= 0).
// inv_freq: rope_dim/2 entries (rope_inv_freq or yarn_inv_freq); rope_dim even, >= 2.
// For each pair j with (a, b) picked by `layout`:
//   angle = f32(pos) * inv_freq[j]                     (f32, as torch.outer(t, freqs))
//   c = f32(cos(double(angle))), s = f32(sin(double(angle)))
//   a' = a * c - b * s ;  b' = a * s + b * c           (f32 products, f32 sums, no FMA)
// This is the complex64 product x * polar(1, angle) of apply_rotary_emb. The GPU's cosf/sinf
// (torch.polar) may differ from the correctly rounded values by an ulp, and nvcc may fuse the
// products into FMAs, so after the caller's bf16 cast a rare one-ulp bf16 flip is expected.
// pos = 0 is the identity.
void apply_rope(float* x, int rope_dim, int64_t pos, const std::vector<float>& inv_freq,
                RopeLayout layout);

// ---- Hadamard rotation ----------------------------------------------------------------------

// x[0 .. n) <- (x H_n) * f32(n^-0.5), in place, n a power of two >= 1 (Error otherwise).
// H_n is the Sylvester Hadamard matrix H[i][j] = (-1)^popcount(i & j) (symmetric, entries +-1,
// scipy.linalg.hadamard order), so out[i] = f32(n^-0.5) * sum_j (-1)^popcount(i & j) x[j].
// Evaluation: fast Walsh-Hadamard butterfly in f32, stages h = 1, 2, 4, ..., n/2; in stage h,
// for each block start b = 0, 2h, 4h, ... and each j in [b, b + h):
//   (x[j], x[j + h]) <- (x[j] + x[j + h], x[j] - x[j + h])
// then every element is multiplied by the f32 constant f32(pow(double(n), -0.5)) (Python's
// `n ** -0.5`, rounded to f32). This is DeepSeek's rotate_activation before its final bf16
// rounding, which the caller does. For n = 128 bf16 inputs the butterfly is usually exact, so
// the butterfly order rarely matters.
void hadamard_transform(float* x, int n);

// ---- Normalization --------------------------------------------------------------------------

// LayerNorm over x[0 .. n), n >= 1, writes y[0 .. n) (y may alias x).
// Two passes in double over ascending index:
//   mean = (sum_i x_i) / n ;  var = (sum_i (x_i - mean)^2) / n     (biased variance)
//   y_i  = f32( (x_i - mean) / sqrt(var + double(eps)) * w_i + b_i )  (double, rounded once)
// weight / bias may be nullptr, meaning w = 1 / b = 0. eps: finite, >= 0.
// torch's fp32 LayerNorm accumulates in f32 (Welford), so it can differ from this by a few ulps.
void layer_norm(const float* x, float* y, int64_t n, const float* weight, const float* bias,
                float eps);

// RMSNorm over x[0 .. n), n >= 1, writes y[0 .. n) (y may alias x).
//   ms  = (sum_i x_i^2) / n                  (double, ascending index)
//   y_i = f32( x_i / sqrt(ms + double(eps)) * w_i )   (double, rounded once)
// weight may be nullptr, meaning w = 1. eps: finite, >= 0.
void rms_norm(const float* x, float* y, int64_t n, const float* weight, float eps);

// ---- Linear ---------------------------------------------------------------------------------

// y = x W^T. x: [rows, in]; w: [out, in] (torch nn.Linear layout). Returns [rows, out] f32:
//   y[r, o] = f32( sum_{k ascending} double(x[r, k]) * double(w[o, k]) )
// Each f32 x f32 product is exact in double; the sum is rounded once to f32.
Tensor<float> linear(const Tensor<float>& x, const Tensor<float>& w);
// The shape checks linear starts with (x [rows, in], w [out, in]); throws Error naming the tensor.
// simd::linear calls it too.
void check_linear_inputs(const Tensor<float>& x, const Tensor<float>& w);
// A projection engine with linear's signature and result bits: ref::linear, or simd::linear (the
// same sums, vectorized). The module functions take one so that both paths share their code.
using LinearFn = Tensor<float> (*)(const Tensor<float>& x, const Tensor<float>& w);

// A stack of per-head weight matrices read in place from a larger tensor: head h's element
// (o, i) (output feature o < out, input feature i < in) is
//   base[h * head_stride + o * o_stride + i * i_stride].
// MLA's absorbed einsums read wkv_b [heads * (nope + v), kv_lora] this way (ref/module.h):
//   W_uk[h] as [out = kv_lora, in = nope]: o_stride 1, i_stride kv_lora (read transposed)
//   W_uv[h] as [out = v, in = kv_lora]:    o_stride kv_lora, i_stride 1 (torch's layout)
struct HeadWeights {
  const float* base = nullptr;
  int64_t heads = 0, out = 0, in = 0;
  int64_t head_stride = 0, o_stride = 0, i_stride = 0;
};

// linear, head by head. x: [rows, heads, in]; returns [rows, heads, out] f32:
//   y[r, h, o] = f32( sum_{i ascending} double(x[r, h, i]) * double(W_h(o, i)) )
// Exact products, one rounding to f32, the order of linear: an fp32-accumulating per-head einsum.
Tensor<float> head_linear(const Tensor<float>& x, const HeadWeights& w);
// The checks head_linear starts with (x [rows, heads, in] against w's heads and in; w's sizes
// and strides >= 0, base set when there are heads); throws Error. simd::head_linear calls it too.
void check_head_linear_inputs(const Tensor<float>& x, const HeadWeights& w);
// An engine with head_linear's signature and result bits (ref's, or simd::head_linear).
using HeadLinearFn = Tensor<float> (*)(const Tensor<float>& x, const HeadWeights& w);

// As linear, then each output rounded f32 -> bf16 (nearest even), returned as f32 holding bf16
// values. The double -> f32 -> bf16 double rounding is deliberate: it mirrors a GPU GEMM with an
// fp32 accumulator whose result is cast to bf16.
Tensor<float> linear_bf16(const Tensor<float>& x, const Tensor<float>& w);

// ---- Helpers --------------------------------------------------------------------------------

// Rounds every element to the nearest bf16 value (ties to even), in place.
void round_bf16_inplace(Tensor<float>& t);

}  // namespace indexshare::ref
