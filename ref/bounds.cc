#include "ref/bounds.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>

#include "ref/numerics.h"

namespace indexshare::cmp {

namespace {
constexpr double kBf16U = 0x1p-8;   // bf16 unit roundoff
constexpr double kF32E = 0x1p-24;   // f32 unit roundoff
}  // namespace

// ---- Attention ---------------------------------------------------------------------------------


namespace {
// The weights of the bounds' f32 sums, kept to 16 significant bits (compare.h: every product with
// a bf16 value is then exact in f32), on the f32 bits: up (the low 8 bits cleared, one step of
// 2^8 up where any was set; for x >= 0) or to nearest (ties away from zero). Non-finite x: as is.
// `add` is 0xFF (up) or 0x80 (to nearest) before the low 8 bits are cleared.
float keep_16_bits(float x, uint32_t add) {
  if (!std::isfinite(x)) return x;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + add) & ~0xFFu;
  std::memcpy(&x, &u, 4);
  return x;
}
float round_up_16(float x) { return keep_16_bits(x, 0xFFu); }
float round_16(float x) { return keep_16_bits(x, 0x80u); }

// attention_bounds, and with `dir` the softmax-scale direction too (attention_bounds_sm).
AttentionBounds bounds_impl(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                            float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                            const Tensor<float>* attn_sink, const AttentionOut& exact, bool dir) {
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0);
  AttentionBounds b;
  b.out.assign(size_t(s_q * h_q * d_v), 0.0f);
  b.lse.assign(size_t(s_q * h_q), 0.0f);
  b.max_logits.assign(size_t(s_q * h_q), 0.0f);
  if (dir) {
    b.sm_out.assign(size_t(s_q * h_q * d_v), 0.0f);
    b.sm_lse.assign(size_t(s_q * h_q), 0.0f);
  }
  const double sm = std::fabs(double(sm_scale));
  // f32 sums of nonnegative terms are inflated to sound upper bounds (compare.h): m roundings.
  auto inflate = [](double m) { return 1 + 2 * m * kF32E; };
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int64_t> rows = ref::valid_kv_rows(indices, topk_length, t, s_kv);
    const double k = double(rows.size());
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      if (rows.empty()) continue;  // out 0, lse +inf, max -inf: exact, bound 0
      // Logits s'_i = f32(q.k_i) * sm_scale (f32 sums, d ascending, a multiply then an add; the
      // product to double) and the magnitudes mag_i = sum_d |q_d| |k_id| (f32 likewise).
      std::vector<double> p(rows.size());
      double Gm = 0, m = -std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < rows.size(); ++i) {
        float dot = 0, mag = 0;
        for (int64_t d = 0; d < d_qk; ++d) {
          const float a = bf16_to_f32(q.at(t, h, d)), c = bf16_to_f32(kv[rows[i] * d_qk + d]);
          dot += a * c;
          mag += std::fabs(a) * std::fabs(c);
        }
        p[i] = double(dot) * double(sm_scale);
        Gm = std::max(Gm, double(mag));
        m = std::max(m, p[i]);
      }
      // G bounds sm max_i sum_d |q_d k_id|; delta bounds |s'_i - s_i| (f32 dot of d_qk terms).
      const double G = sm * Gm * inflate(double(d_qk) + 1);
      const double delta = 2 * (double(d_qk) + 1) * kF32E * G;
      // z_i = s_i - m (kept for the direction), then p_i = exp(z_i) summed into l.
      std::vector<double> z(p);
      for (double& v : z) v -= m;
      double l = 0;
      for (double& v : p) l += (v = exp_portable(v - m));
      if (dir) {
        // The softmax-scale direction (see compare.h): zbar = sum w_i z_i with w_i = p_i / l,
        // D_c = sum_i u_i V_ic with u_i = f32(w_i (z_i - zbar)), the sink factor f of the exact attention.
        double zbar = 0;
        for (size_t i = 0; i < rows.size(); ++i) zbar += p[i] / l * z[i];
        const double sbar = m + zbar, lse = m + std::log(l);
        const double f = attn_sink ? 1.0 / (1.0 + std::exp(double((*attn_sink)[h]) - lse)) : 1.0;
        // D in f32 (a regression direction needs ~1e-3, f32 gives ~1e-6): u_i rounded to f32,
        // then to 16 significant bits (relative 2^-17; the products u_i V_ic are exact).
        std::vector<float> u(rows.size());
        for (size_t i = 0; i < rows.size(); ++i) u[i] = round_16(float(p[i] / l * (z[i] - zbar)));
        for (int64_t c = 0; c < d_v; ++c) {
          float D = 0;
          for (size_t i = 0; i < rows.size(); ++i) D += u[i] * bf16_to_f32(kv[rows[i] * d_qk + c]);
          b.sm_out[size_t(th * d_v + c)] = float(f * double(D) + (1 - f) * sbar * double(exact.out[th * d_v + c]));
        }
        b.sm_lse[size_t(th)] = float(sbar);
      }
      const double logit_err = (double(d_qk) + 2) * kF32E * G;
      // A_c from the weights w'_i = f32(p_i / l) of the f32 logits, rounded up to 16 significant
      // bits, summed in f32 (i ascending, a multiply then an add; every product exact), inflated:
      // the true weights are within e^(2 delta) of the computed ones, and the f32 sum of k terms
      // (the weights' and the adds' roundings) within inflate(k + 2).
      const double A_up = std::exp(2 * delta) * inflate(k + 2);
      std::vector<float> w(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) w[i] = round_up_16(float(p[i] / l));
      for (int64_t c = 0; c < d_v; ++c) {
        float Af = 0;
        for (size_t i = 0; i < rows.size(); ++i) Af += w[i] * std::fabs(bf16_to_f32(kv[rows[i] * d_qk + c]));
        const double A = double(Af) * A_up;
        const double o = std::fabs(double(exact.out[th * d_v + c]));
        const double bound = kBf16U * o + kBf16U * A + ((k + 8) * kF32E + 2 * logit_err) * A;
        b.out[size_t(th * d_v + c)] = bound_f32(kAttentionMultiple * bound);
      }
      b.lse[size_t(th)] = bound_f32(kAttentionMultiple * (logit_err + (k + 8) * kF32E + 2 * kF32E * std::fabs(double(exact.lse[th]))));
      b.max_logits[size_t(th)] = bound_f32(kAttentionMultiple * (logit_err + kF32E * std::fabs(double(exact.max_logits[th]))));
    }
  }
  return b;
}
}  // namespace

AttentionBounds attention_bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                 float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                                 const AttentionOut& exact) {
  return bounds_impl(q, kv, indices, sm_scale, d_v, topk_length, nullptr, exact, false);
}

AttentionBounds attention_bounds_sm(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                    float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                                    const Tensor<float>* attn_sink, const AttentionOut& exact, const BoundsKv*) {
  return bounds_impl(q, kv, indices, sm_scale, d_v, topk_length, attn_sink, exact, true);
}

AttentionOut emulate_attention_lowp(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                    float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                                    const Tensor<float>* attn_sink) {
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0);
  AttentionOut o{Tensor<float>({s_q, h_q, d_v}), Tensor<bf16_t>({s_q, h_q, d_v}), Tensor<float>({s_q, h_q}),
                 Tensor<float>({s_q, h_q})};
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int64_t> rows = ref::valid_kv_rows(indices, topk_length, t, s_kv);
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      if (rows.empty()) {
        o.lse[th] = std::numeric_limits<float>::infinity();
        o.max_logits[th] = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < d_v; ++c) o.out[th * d_v + c] = 0.0f;
        continue;
      }
      // f32 logits, f32 softmax, P rounded to bf16, f32 accumulation, bf16 output.
      std::vector<float> p(rows.size());
      float m = -std::numeric_limits<float>::infinity();
      for (size_t i = 0; i < rows.size(); ++i) {
        float dot = 0;
        for (int64_t d = 0; d < d_qk; ++d) dot += bf16_to_f32(q.at(t, h, d)) * bf16_to_f32(kv[rows[i] * d_qk + d]);
        p[i] = dot * sm_scale;
        m = std::max(m, p[i]);
      }
      float l = 0;
      for (float& v : p) l += (v = std::exp(v - m));
      const float lse = m + std::log(l);
      float factor = 1.0f / l;
      if (attn_sink) factor *= 1.0f / (1.0f + std::exp((*attn_sink)[h] - lse));
      for (int64_t c = 0; c < d_v; ++c) {
        float acc = 0;
        for (size_t i = 0; i < rows.size(); ++i) acc += round_bf16(p[i]) * bf16_to_f32(kv[rows[i] * d_qk + c]);
        o.out[th * d_v + c] = round_bf16(acc * factor);
      }
      o.lse[th] = lse;
      o.max_logits[th] = m;
    }
  }
  for (int64_t i = 0; i < o.out.numel(); ++i) o.out_bf16[i] = f32_to_bf16(o.out[i]);
  return o;
}

BudgetParts attention_budget_parts(const Tensor<float>& exact_out, const Tensor<float>& emulated_out) {
  BudgetParts b;
  for (int64_t i = 0; i < exact_out.numel(); ++i) {
    const double e = exact_out[i];
    if (!std::isfinite(e)) continue;
    b.emul = std::max(b.emul, std::fabs(double(emulated_out[i]) - e));
    b.ref_round = std::max(b.ref_round, std::fabs(double(round_bf16(exact_out[i])) - e));
  }
  return b;
}

double attention_budget(const BudgetParts& b) { return kBudgetMultiple * b.emul + 2 * b.ref_round; }

namespace {
// Per row of x (dimension 0): max |x| and max |bf16(x) - x| over the finite elements, in f32, which
// holds both exactly (a bf16 rounding error is x's dropped low bits); rows in parallel.
void row_maxima(const Tensor<float>& x, std::vector<double>* max_abs, std::vector<double>* max_round) {
  const int64_t rows = x.dim(0), per_row = rows ? x.numel() / rows : 0;
  if (max_abs) max_abs->assign(static_cast<size_t>(rows), 0.0);
  if (max_round) max_round->assign(static_cast<size_t>(rows), 0.0);
#pragma omp parallel for schedule(static) if (x.numel() >= (int64_t(1) << 16))
  for (int64_t t = 0; t < rows; ++t) {
    const float* r = x.data.data() + t * per_row;
    // Maxima of non-negative floats as their bit patterns (the same order; integer maxima take
    // the compiler's vector lanes where float ones would need -ffast-math). Non-finite: skipped.
    uint32_t ma_bits = 0, mr_bits = 0;
    for (int64_t i = 0; i < per_row; ++i) {
      uint32_t u;
      std::memcpy(&u, &r[i], 4);
      const uint32_t a = u & 0x7FFFFFFFu;
      const bool finite = a < 0x7F800000u;
      const uint32_t rounded_bits = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;  // round_bf16, finite x
      float rounded;
      std::memcpy(&rounded, &rounded_bits, 4);
      const float d = std::fabs(rounded - r[i]);
      uint32_t db;
      std::memcpy(&db, &d, 4);
      ma_bits = std::max(ma_bits, finite ? a : 0u);
      mr_bits = std::max(mr_bits, finite ? db : 0u);
    }
    float ma, mr;
    std::memcpy(&ma, &ma_bits, 4);
    std::memcpy(&mr, &mr_bits, 4);
    if (max_abs) (*max_abs)[size_t(t)] = ma;
    if (max_round) (*max_round)[size_t(t)] = mr;
  }
}
}  // namespace

std::vector<double> budget_row_max(const Tensor<float>& exact_out, double* ref_round) {
  std::vector<double> m, r;
  row_maxima(exact_out, &m, ref_round ? &r : nullptr);
  if (ref_round) *ref_round = r.empty() ? 0.0 : *std::max_element(r.begin(), r.end());
  return m;
}

std::vector<int64_t> budget_rows(const std::vector<double>& row_max) {
  const int64_t n = int64_t(row_max.size());
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) all[size_t(t)] = t;
  if (n <= kBudgetAllRows) return all;
  // The kBudgetTopRows largest (ties: the lower row), then every stride-th row.
  std::vector<int64_t> order = all;
  std::partial_sort(order.begin(), order.begin() + kBudgetTopRows, order.end(), [&](int64_t a, int64_t b) {
    return row_max[size_t(a)] != row_max[size_t(b)] ? row_max[size_t(a)] > row_max[size_t(b)] : a < b;
  });
  std::vector<char> take(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < kBudgetTopRows; ++i) take[size_t(order[size_t(i)])] = 1;
  const int64_t stride = (n + kBudgetStrideRows - 1) / kBudgetStrideRows;
  for (int64_t t = 0; t < n; t += stride) take[size_t(t)] = 1;
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < n; ++t)
    if (take[size_t(t)]) rows.push_back(t);
  return rows;
}

namespace {
// Rows `rows` of a row-major tensor (dimension 0), in that order.
template <typename T>
Tensor<T> take_rows(const Tensor<T>& x, const std::vector<int64_t>& rows) {
  Shape shape = x.shape;
  const int64_t per_row = x.dim(0) ? x.numel() / x.dim(0) : 0;
  shape[0] = int64_t(rows.size());
  Tensor<T> y(shape);
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(x.data.begin() + rows[r] * per_row, x.data.begin() + (rows[r] + 1) * per_row, y.data.begin() + int64_t(r) * per_row);
  return y;
}
}  // namespace

BudgetParts attention_budget_parts_rows(EmulateFn emulate, const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                        const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                        const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink,
                                        const Tensor<float>& exact_out, const std::vector<int64_t>& rows, bool floor,
                                        double* emulated_max, double ref_round) {
  const int64_t s_q = q.dim(0), per_row = s_q ? exact_out.numel() / s_q : 0;
  BudgetParts b;
  if (ref_round >= 0) {
    b.ref_round = ref_round;
  } else {
    std::vector<double> round_rows;  // the output rounding, over every row
    row_maxima(exact_out, nullptr, &round_rows);
    for (double r : round_rows) b.ref_round = std::max(b.ref_round, r);
  }
  // Every row: the emulation on the tensors as they are. A subset: on its rows alone (rows are
  // independent, so they equal the whole emulation's). Row r of emu.out is row rows[r].
  AttentionOut emu;
  if (int64_t(rows.size()) == s_q) {
    emu = emulate(q, kv, indices, sm_scale, d_v, topk_length, attn_sink);
  } else if (!rows.empty()) {
    const Tensor<int32_t> tl = topk_length ? take_rows(*topk_length, rows) : Tensor<int32_t>();
    emu = emulate(take_rows(q, rows), kv, take_rows(indices, rows), sm_scale, d_v, topk_length ? &tl : nullptr, attn_sink);
  }
  double emul = 0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t c = 0; c < per_row; ++c) {
      const double e = exact_out[rows[r] * per_row + c];
      if (std::isfinite(e)) emul = std::max(emul, std::fabs(double(emu.out[int64_t(r) * per_row + c]) - e));
    }
  if (emulated_max) *emulated_max = emul;
  b.emul = floor ? std::max(emul, b.ref_round) : emul;
  return b;
}

BudgetParts attention_budget_parts_set(EmulateFn emulate, const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                       const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                       const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink,
                                       const Tensor<float>& exact_out, int64_t* emulated_rows) {
  double ref_round = 0;
  const std::vector<int64_t> rows = budget_rows(budget_row_max(exact_out, &ref_round));
  if (emulated_rows) *emulated_rows = int64_t(rows.size());
  return attention_budget_parts_rows(emulate, q, kv, indices, sm_scale, d_v, topk_length, attn_sink, exact_out, rows,
                                     q.dim(0) > kBudgetAllRows, nullptr, ref_round);
}

std::string budget_rows_text(int64_t emulated, int64_t total) {
  if (total <= kBudgetAllRows) return "every row";
  return std::to_string(emulated) + " of " + std::to_string(total) + " rows: the " + std::to_string(kBudgetTopRows) +
         " with the largest max |out| and every " + std::to_string((total + kBudgetStrideRows - 1) / kBudgetStrideRows) +
         "th; the emulation term floored at the output rounding's maximum over every row (ref/bounds.h budget_rows)";
}

double attention_budget(const Tensor<float>& exact_out, const Tensor<float>& emulated_out) {
  return attention_budget(attention_budget_parts(exact_out, emulated_out));
}

// ---- Indexer logits ----------------------------------------------------------------------------

namespace {

inline float in_f32(e4m3_t x) { return e4m3_to_f32(x); }
inline float in_f32(bf16_t x) { return bf16_to_f32(x); }

template <class In>
FloatRule indexer_logits_rule_impl(const Tensor<In>& q, const Tensor<In>& k, const Tensor<float>& k_scale,
                                   const Tensor<float>& weights, const Tensor<float>& exact_logits) {
  const int64_t s_q = q.dim(0), H = q.dim(1), D = q.dim(2), s_kv = k.dim(0);
  const double C = logits_bound_coefficient(D, H);  // ref/bounds.h: the worst case, with its margin
  FloatRule rule;
  rule.bound.assign(size_t(s_q * s_kv), 0.0f);
  double sum_b2 = 0, sum_r2 = 0;
  std::vector<double> kd(static_cast<size_t>(s_kv * D)), qt(static_cast<size_t>(D));
  for (int64_t i = 0; i < s_kv * D; ++i) kd[size_t(i)] = std::fabs(double(in_f32(k[i])));
  for (int64_t t = 0; t < s_q; ++t) {
    // Qt[d] = sum_h |w[t,h]| |q[t,h,d]|, h ascending (each product exact in double).
    std::fill(qt.begin(), qt.end(), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      const double w = std::fabs(double(weights.at(t, h)));
      for (int64_t d = 0; d < D; ++d) qt[size_t(d)] += w * std::fabs(double(in_f32(q.at(t, h, d))));
    }
    for (int64_t s = 0; s < s_kv; ++s) {
      const double r = exact_logits.at(t, s);
      if (!std::isfinite(r)) continue;
      // M[t,s] / k_scale[s] = sum_d Qt[d] |k[s,d]|, d ascending.
      double mag = 0;
      for (int64_t d = 0; d < D; ++d) mag += qt[size_t(d)] * kd[size_t(s * D + d)];
      const double b = bound_f32(C * double(k_scale[s]) * mag);
      rule.bound[size_t(t * s_kv + s)] = float(b);
      sum_b2 += b * b;
      sum_r2 += 2 * r * r;
    }
  }
  // calc_diff ~ |x - y|^2 / (|x|^2 + |y|^2): every element off by its full bound.
  rule.metric_max = sum_r2 > 0 ? sum_b2 / sum_r2 : 0;
  rule.derivation = kLogitsDerivation;
  return rule;
}

}  // namespace

FloatRule indexer_logits_rule(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k, const Tensor<float>& k_scale,
                              const Tensor<float>& weights, const Tensor<float>& exact_logits) {
  return indexer_logits_rule_impl(q, k, k_scale, weights, exact_logits);
}

FloatRule indexer_logits_rule(const Tensor<bf16_t>& q, const Tensor<bf16_t>& k, const Tensor<float>& k_scale,
                              const Tensor<float>& weights, const Tensor<float>& exact_logits) {
  return indexer_logits_rule_impl(q, k, k_scale, weights, exact_logits);
}

}  // namespace indexshare::cmp
