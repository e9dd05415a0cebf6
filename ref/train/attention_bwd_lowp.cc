// The low-precision emulation of the sparse attention backward (ref/train/attention_bwd.h,
// cmp::emulate_attention_backward_lowp) and TileLang's gradient similarity.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ref/bounds.h"
#include "ref/numerics.h"
#include "ref/train/attention_bwd.h"

namespace indexshare::cmp {

namespace {

// One (t, h) at kernel precision: bf16(P) and bf16(sm_scale dS) per list position into pb, dsb;
// Delta and 1 - f into delta, omf; dq's row.
void head_lowp(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<bf16_t>& d_out,
               const ref::AttentionOut& fwd, const std::vector<int64_t>& rows, float sm_scale, int64_t d_v,
               const float* sink, int64_t th, std::vector<float>& pb, std::vector<float>& dsb, float& delta,
               float& omf, float* dq, bool bf16_acc) {
  const int64_t d_qk = q.dim(2);
  const size_t n = rows.size();
  pb.assign(n, 0.0f);
  dsb.assign(n, 0.0f);
  delta = omf = 0.0f;
  std::fill(dq, dq + d_qk, 0.0f);
  if (n == 0) return;
  const bf16_t* qr = q.ptr() + th * d_qk;
  const bf16_t* dor = d_out.ptr() + th * d_v;
  const float lse = fwd.lse[th];
  const float f = sink ? 1.0f / (1.0f + std::exp(*sink - lse)) : 1.0f;
  // Delta from the kernel's saved bf16 out (emulate_attention_lowp's out holds bf16 values).
  for (int64_t c = 0; c < d_v; ++c) delta += fwd.out[th * d_v + c] * bf16_to_f32(dor[c]);
  for (size_t i = 0; i < n; ++i) {
    const bf16_t* k = kv.ptr() + rows[i] * d_qk;
    float dot = 0, dp = 0;
    for (int64_t d = 0; d < d_qk; ++d) dot += bf16_to_f32(qr[d]) * bf16_to_f32(k[d]);
    for (int64_t c = 0; c < d_v; ++c) dp += bf16_to_f32(dor[c]) * bf16_to_f32(k[c]);
    const float p = std::exp(dot * sm_scale - lse) * f;
    pb[i] = round_bf16(p);
    dsb[i] = round_bf16(sm_scale * (p * (dp - delta)));
  }
  for (int64_t d = 0; d < d_qk; ++d) {
    float acc = 0;
    for (size_t i = 0; i < n; ++i) {
      acc += dsb[i] * bf16_to_f32(kv[rows[i] * d_qk + d]);
      if (bf16_acc) acc = round_bf16(acc);
    }
    dq[d] = acc;
  }
  omf = 1.0f - f;
}

}  // namespace

ref::AttentionBackwardOut emulate_attention_backward_lowp(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                          const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                          const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                          const Tensor<float>* attn_sink, bool bf16_acc) {
  ref::check_attention_backward_inputs(q, kv, indices, d_v, d_out, topk_length, attn_sink);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0), topk = indices.dim(2);
  const ref::AttentionOut fwd = emulate_attention_lowp(q, kv, indices, sm_scale, d_v, topk_length, attn_sink);
  ref::AttentionBackwardOut o{fwd.out, fwd.lse, Tensor<float>({s_q, h_q}), Tensor<float>({s_q, h_q, topk}),
                              Tensor<float>({s_q, h_q, topk}), Tensor<float>({s_q, h_q, d_qk}),
                              Tensor<bf16_t>({s_q, h_q, d_qk}), Tensor<float>({s_kv, 1, d_qk}),
                              Tensor<bf16_t>({s_kv, 1, d_qk}), Tensor<float>({attn_sink ? h_q : 0})};
  std::vector<float> sink_acc(static_cast<size_t>(h_q), 0.0f), tile(static_cast<size_t>(d_qk));
  std::vector<std::vector<float>> pb(static_cast<size_t>(h_q)), dsb(static_cast<size_t>(h_q));
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int64_t> rows = ref::valid_kv_rows(indices, topk_length, t, s_kv);
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      float omf = 0;
      head_lowp(q, kv, d_out, fwd, rows, sm_scale, d_v, attn_sink ? &(*attn_sink)[h] : nullptr, th, pb[size_t(h)],
                dsb[size_t(h)], o.delta[th], omf, o.dq.ptr() + th * d_qk, bf16_acc);
      if (!rows.empty()) sink_acc[size_t(h)] -= omf * o.delta[th];
      // P and dS per slot (ds unscaled back to the truth's convention).
      for (int64_t j = 0; j < topk; ++j) {
        const int64_t i = indices[t * topk + j];
        const auto it = std::lower_bound(rows.begin(), rows.end(), i);
        const bool valid = j < (topk_length ? (*topk_length)[t] : topk) && it != rows.end() && *it == i;
        o.p[th * topk + j] = valid ? pb[size_t(h)][size_t(it - rows.begin())] : 0.0f;
        o.ds[th * topk + j] = valid ? dsb[size_t(h)][size_t(it - rows.begin())] / sm_scale : 0.0f;
      }
    }
    // dkv: per list position the GEMM tile over heads (f32), added to its kv row in f32.
    for (size_t i = 0; i < rows.size(); ++i) {
      std::fill(tile.begin(), tile.end(), 0.0f);
      for (int64_t h = 0; h < h_q; ++h) {
        const bf16_t* qr = q.ptr() + (t * h_q + h) * d_qk;
        const bf16_t* dor = d_out.ptr() + (t * h_q + h) * d_v;
        for (int64_t d = 0; d < d_qk; ++d) {
          tile[size_t(d)] += dsb[size_t(h)][i] * bf16_to_f32(qr[d]);
          if (d < d_v) tile[size_t(d)] += pb[size_t(h)][i] * bf16_to_f32(dor[d]);
          if (bf16_acc) tile[size_t(d)] = round_bf16(tile[size_t(d)]);
        }
      }
      for (int64_t d = 0; d < d_qk; ++d) {
        o.dkv[rows[i] * d_qk + d] += tile[size_t(d)];
        if (bf16_acc) o.dkv[rows[i] * d_qk + d] = round_bf16(o.dkv[rows[i] * d_qk + d]);
      }
    }
  }
  if (attn_sink)
    for (int64_t h = 0; h < h_q; ++h) o.d_sink[h] = sink_acc[size_t(h)];
  for (int64_t i = 0; i < o.dq.numel(); ++i) o.dq_bf16[i] = f32_to_bf16(o.dq[i]);
  for (int64_t i = 0; i < o.dkv.numel(); ++i) o.dkv_bf16[i] = f32_to_bf16(o.dkv[i]);
  return o;
}

void check_attention_backward_bounds_inputs(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                            int64_t d_v, const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                            const ref::AttentionBackwardOut& exact) {
  ref::check_attention_backward_inputs(q, kv, indices, d_v, d_out, topk_length, nullptr);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0), topk = indices.dim(2);
  require_shape(exact.p, {s_q, h_q, topk}, "attention backward bounds exact.p");
  require_shape(exact.ds, {s_q, h_q, topk}, "attention backward bounds exact.ds");
  require_shape(exact.out, {s_q, h_q, d_v}, "attention backward bounds exact.out");
  require_shape(exact.dq, {s_q, h_q, d_qk}, "attention backward bounds exact.dq");
  require_shape(exact.dkv, {s_kv, 1, d_qk}, "attention backward bounds exact.dkv");
}

AttentionBackwardBounds attention_backward_bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                  const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                  const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                  const ref::AttentionBackwardOut& exact, bool delta_from_bf16_out) {
  check_attention_backward_bounds_inputs(q, kv, indices, d_v, d_out, topk_length, exact);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0), topk = indices.dim(2);
  const double u = std::ldexp(1.0, -8), e = std::ldexp(1.0, -24), sm = double(sm_scale);
  const auto val = [](bf16_t x) { return std::fabs(double(bf16_to_f32(x))); };
  AttentionBackwardBounds b{std::vector<float>(size_t(s_q * h_q * d_qk)), std::vector<float>(size_t(s_kv * d_qk))};
  // dkv's two sums per element (the error terms, the magnitudes) and its contribution counts.
  std::vector<double> kv_err(size_t(s_kv * d_qk), 0.0), kv_mag(size_t(s_kv * d_qk), 0.0), q_err(static_cast<size_t>(d_qk)),
      q_mag(static_cast<size_t>(d_qk));
  std::vector<int64_t> contributions(size_t(s_kv), 0), slots;
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = topk_length ? (*topk_length)[t] : topk;
    slots.clear();
    for (int64_t j = 0; j < len; ++j)
      if (0 <= indices[t * topk + j] && indices[t * topk + j] < s_kv) slots.push_back(j);
    const double n = double(slots.size());
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      const bf16_t* qr = q.ptr() + th * d_qk;
      const bf16_t* dor = d_out.ptr() + th * d_v;
      double g = 0, mag_delta = 0;
      for (int64_t j : slots) {
        double m = 0;
        for (int64_t d = 0; d < d_qk; ++d) m += val(qr[d]) * val(kv[indices[t * topk + j] * d_qk + d]);
        g = std::max(g, sm * m);
      }
      for (int64_t c = 0; c < d_v; ++c) mag_delta += std::fabs(double(exact.out[th * d_v + c])) * val(dor[c]);
      const double eps_p = u + 2 * double(d_qk + 2) * e * g + (n + 8) * e;
      const double e_delta = double(d_v + 2) * e * mag_delta + (delta_from_bf16_out ? u * mag_delta : 0.0);
      std::fill(q_err.begin(), q_err.end(), 0.0);
      std::fill(q_mag.begin(), q_mag.end(), 0.0);
      for (int64_t j : slots) {
        const int64_t r = indices[t * topk + j];
        const bf16_t* k = kv.ptr() + r * d_qk;
        const double p = exact.p[th * topk + j], ds = std::fabs(double(exact.ds[th * topk + j]));
        double a = 0;
        for (int64_t c = 0; c < d_v; ++c) a += val(dor[c]) * val(k[c]);
        const double err = (u + eps_p + e) * ds + p * (double(d_v + 2) * e * a + e_delta);
        for (int64_t d = 0; d < d_qk; ++d) {
          q_err[size_t(d)] += err * val(k[d]);
          q_mag[size_t(d)] += ds * val(k[d]);
          const double vp = d < d_v ? p * val(dor[d]) : 0.0;
          kv_err[size_t(r * d_qk + d)] += sm * err * val(qr[d]) + eps_p * vp;
          kv_mag[size_t(r * d_qk + d)] += sm * ds * val(qr[d]) + vp;
        }
        ++contributions[size_t(r)];
      }
      for (int64_t d = 0; d < d_qk; ++d)
        b.dq[size_t(th * d_qk + d)] = bound_f32(
            kBackwardMultiple * (sm * (q_err[size_t(d)] + (n + 2) * e * q_mag[size_t(d)]) +
                                 u * std::fabs(double(exact.dq[th * d_qk + d]))));
    }
  }
  for (int64_t r = 0; r < s_kv; ++r)
    for (int64_t d = 0; d < d_qk; ++d) {
      const size_t i = size_t(r * d_qk + d);
      b.dkv[i] = bound_f32(kBackwardMultiple * (kv_err[i] + double(contributions[size_t(r)] + 2) * e * kv_mag[i] +
                                                u * std::fabs(double(exact.dkv[int64_t(i)]))));
    }
  return b;
}

ref::AttentionBackwardOut hypothesis_delta_from_bf16_out(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                         const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                         const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                         const ref::AttentionBackwardOut& exact) {
  ref::check_attention_backward_inputs(q, kv, indices, d_v, d_out, topk_length, nullptr);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0), topk = indices.dim(2);
  require_shape(exact.p, {s_q, h_q, topk}, "attention backward hypothesis exact.p");
  require_shape(exact.out, {s_q, h_q, d_v}, "attention backward hypothesis exact.out");
  require_shape(exact.dkv, {s_kv, 1, d_qk}, "attention backward hypothesis exact.dkv");
  const double sm = double(sm_scale);
  ref::AttentionBackwardOut o = exact;
  std::vector<double> dkv(exact.dkv.data.begin(), exact.dkv.data.end()), dq(static_cast<size_t>(d_qk));
  std::vector<double> d_sink(exact.d_sink.data.begin(), exact.d_sink.data.end());
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = topk_length ? (*topk_length)[t] : topk;
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      double dd = 0, sum_p = 0;
      for (int64_t c = 0; c < d_v; ++c)
        dd += (double(round_bf16(exact.out[th * d_v + c])) - double(exact.out[th * d_v + c])) *
              double(bf16_to_f32(d_out[th * d_v + c]));
      for (int64_t d = 0; d < d_qk; ++d) dq[size_t(d)] = exact.dq[th * d_qk + d];
      for (int64_t j = 0; j < len; ++j) {
        const int64_t r = indices[t * topk + j];
        if (r < 0 || r >= s_kv) continue;
        const double p = exact.p[th * topk + j], shift = -sm * dd * p;
        sum_p += p;
        o.ds[th * topk + j] = float(double(exact.ds[th * topk + j]) - p * dd);
        for (int64_t d = 0; d < d_qk; ++d) {
          dq[size_t(d)] += shift * double(bf16_to_f32(kv[r * d_qk + d]));
          dkv[size_t(r * d_qk + d)] += shift * double(bf16_to_f32(q[th * d_qk + d]));
        }
      }
      for (int64_t d = 0; d < d_qk; ++d) o.dq[th * d_qk + d] = float(dq[size_t(d)]);
      o.delta[th] = float(double(exact.delta[th]) + dd);
      if (!d_sink.empty() && sum_p > 0) d_sink[size_t(h)] -= (1.0 - sum_p) * dd;
    }
  }
  for (int64_t i = 0; i < o.dkv.numel(); ++i) o.dkv[i] = float(dkv[size_t(i)]);
  for (size_t h = 0; h < d_sink.size(); ++h) o.d_sink[int64_t(h)] = float(d_sink[h]);
  for (int64_t i = 0; i < o.dq.numel(); ++i) o.dq_bf16[i] = f32_to_bf16(o.dq[i]);
  for (int64_t i = 0; i < o.dkv.numel(); ++i) o.dkv_bf16[i] = f32_to_bf16(o.dkv[i]);
  return o;
}

double gradient_similarity(const Tensor<float>& x, const Tensor<float>& y) {
  require(x.shape == y.shape, "gradient_similarity: shapes " + shape_str(x.shape) + " and " + shape_str(y.shape) +
                                  " differ");
  double xy = 0, xx_yy = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    xy += double(x[i]) * double(y[i]);
    xx_yy += double(x[i]) * double(x[i]) + double(y[i]) * double(y[i]);
  }
  return xx_yy == 0 ? 0.0 : 1.0 - 2.0 * xy / xx_yy;
}

}  // namespace indexshare::cmp
