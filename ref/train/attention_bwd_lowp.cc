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

std::vector<int64_t> sorted_valid_rows(const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length, int64_t t,
                                       int64_t s_kv) {
  const int64_t topk = indices.dim(2), len = topk_length ? (*topk_length)[t] : topk;
  std::vector<int64_t> rows;
  for (int64_t j = 0; j < len; ++j)
    if (0 <= indices[t * topk + j] && indices[t * topk + j] < s_kv) rows.push_back(indices[t * topk + j]);
  std::sort(rows.begin(), rows.end());
  return rows;
}

// One (t, h) at kernel precision: bf16(P) and bf16(sm_scale dS) per list position into pb, dsb;
// Delta and 1 - f into delta, omf; dq's row.
void head_lowp(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<bf16_t>& d_out,
               const ref::AttentionOut& fwd, const std::vector<int64_t>& rows, float sm_scale, int64_t d_v,
               const float* sink, int64_t th, std::vector<float>& pb, std::vector<float>& dsb, float& delta,
               float& omf, float* dq) {
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
    for (size_t i = 0; i < n; ++i) acc += dsb[i] * bf16_to_f32(kv[rows[i] * d_qk + d]);
    dq[d] = acc;
  }
  omf = 1.0f - f;
}

}  // namespace

ref::AttentionBackwardOut emulate_attention_backward_lowp(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                          const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                          const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                          const Tensor<float>* attn_sink) {
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
    const std::vector<int64_t> rows = sorted_valid_rows(indices, topk_length, t, s_kv);
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      float omf = 0;
      head_lowp(q, kv, d_out, fwd, rows, sm_scale, d_v, attn_sink ? &(*attn_sink)[h] : nullptr, th, pb[size_t(h)],
                dsb[size_t(h)], o.delta[th], omf, o.dq.ptr() + th * d_qk);
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
        }
      }
      for (int64_t d = 0; d < d_qk; ++d) o.dkv[rows[i] * d_qk + d] += tile[size_t(d)];
    }
  }
  if (attn_sink)
    for (int64_t h = 0; h < h_q; ++h) o.d_sink[h] = sink_acc[size_t(h)];
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
