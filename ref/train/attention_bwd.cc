#include "ref/train/attention_bwd.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ref/numerics.h"

namespace indexshare::ref {

namespace {

// The 8-part fold of ref/attention.h: ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)).
double fold8(const double* part) {
  return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
}

// a . b over n elements in the 8-part order: part r sums a[d] * b[d] for d = r (mod 8), d
// ascending, each product rounded then added (exact when both factors are bf16).
double dot8(const double* a, const double* b, int64_t n) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t d = 0; d < n; ++d) part[d % 8] += a[d] * b[d];
  return fold8(part);
}

// The bf16 values src[0, n) as doubles (exact).
std::vector<double> widen(const bf16_t* src, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t d = 0; d < n; ++d) v[size_t(d)] = double(bf16_to_f32(src[d]));
  return v;
}

// What the backward keeps of one (t, h) for the scatter into dkv and d_sink.
struct HeadGrad {
  std::vector<double> p, ds;  // per position of the row's sorted valid list
  double delta = 0, one_minus_f = 0;
};

// The whole per-(t, h) computation over the ascending list `rows`: lse, Delta and dq into o, P and
// dS (per list position) into g. kvd holds the listed kv rows widened, row r at r * d_qk.
void head_backward(const std::vector<double>& kvd, const std::vector<double>& qd, const std::vector<double>& dod,
                   size_t n, double sm_scale, int64_t d_qk, int64_t d_v, const float* sink, int64_t th,
                   AttentionBackwardOut& o, HeadGrad& g) {
  float* dq = o.dq.ptr() + th * d_qk;
  g.p.assign(n, 0.0);
  g.ds.assign(n, 0.0);
  if (n == 0) {  // empty row: lse +inf, no gradient
    std::fill(dq, dq + d_qk, 0.0f);
    o.lse[th] = std::numeric_limits<float>::infinity();
    o.delta[th] = 0.0f;
    g.delta = g.one_minus_f = 0.0;
    return;
  }
  const double* k = kvd.data();
  // The forward, operation for operation (ref/attention.cc attend): logits, max, exp, sum, lse.
  std::vector<double> e(n), dp(n);
  double m = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) {
    e[i] = dot8(qd.data(), k + i * size_t(d_qk), d_qk) * sm_scale;
    m = std::max(m, e[i]);
  }
  double l = 0.0;
  for (size_t i = 0; i < n; ++i) l += (e[i] = exp_portable(e[i] - m));
  const double lse = m + std::log(l);
  double factor = 1.0 / l, f = 1.0;
  if (sink) factor *= (f = 1.0 / (1.0 + exp_portable(double(*sink) - lse)));
  // P and dP per list position; Delta = sum_i P_i dP_i (i ascending, fused), which is O . dO.
  double delta = 0.0;
  for (size_t i = 0; i < n; ++i) {
    g.p[i] = e[i] * factor;
    dp[i] = dot8(dod.data(), k + i * size_t(d_qk), d_v);
    delta = std::fma(g.p[i], dp[i], delta);
  }
  // dS per list position; dq = sm_scale * sum_i dS_i k_i (i ascending, fused).
  for (size_t i = 0; i < n; ++i) g.ds[i] = g.p[i] * (dp[i] - delta);
  for (int64_t d = 0; d < d_qk; ++d) {
    double acc = 0.0;
    for (size_t i = 0; i < n; ++i) acc = std::fma(g.ds[i], k[i * size_t(d_qk) + size_t(d)], acc);
    dq[d] = float(sm_scale * acc);
  }
  o.lse[th] = float(lse);
  o.delta[th] = float(delta);
  g.delta = delta;
  g.one_minus_f = 1.0 - f;
}

}  // namespace

AttentionBackwardOut make_attention_backward_out(int64_t s_q, int64_t h_q, int64_t d_qk, int64_t topk, int64_t s_kv,
                                                 bool sink, bool slots) {
  const int64_t k = slots ? topk : 0;
  return AttentionBackwardOut{Tensor<float>({0}),                Tensor<float>({s_q, h_q}),
                              Tensor<float>({s_q, h_q}),         Tensor<float>({s_q, h_q, k}),
                              Tensor<float>({s_q, h_q, k}),      Tensor<float>({s_q, h_q, d_qk}),
                              Tensor<bf16_t>({s_q, h_q, d_qk}),  Tensor<float>({s_kv, 1, d_qk}),
                              Tensor<bf16_t>({s_kv, 1, d_qk}),   Tensor<float>({sink ? h_q : 0})};
}

namespace {

// P and dS of each slot of row t, from the values per position of the sorted list `rows` (every
// occurrence of a duplicate has the same value); 0 on ignored slots.
void per_slot(const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length, int64_t t,
              const std::vector<int64_t>& rows, const HeadGrad& g, int64_t th, AttentionBackwardOut& o) {
  const int64_t topk = indices.dim(2), len = topk_length ? (*topk_length)[t] : topk;
  for (int64_t j = 0; j < topk; ++j) {
    const int64_t i = indices[t * topk + j];
    const auto it = std::lower_bound(rows.begin(), rows.end(), i);
    const bool valid = j < len && it != rows.end() && *it == i;
    const size_t pos = size_t(it - rows.begin());
    o.p[th * topk + j] = valid ? float(g.p[pos]) : 0.0f;
    o.ds[th * topk + j] = valid ? float(g.ds[pos]) : 0.0f;
  }
}

}  // namespace

void check_attention_backward_inputs(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                     const Tensor<int32_t>& indices, int64_t d_v, const Tensor<bf16_t>& d_out,
                                     const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink) {
  check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0), h_q = q.dim(1);
  require(indices.rank() == 3 && indices.dim(0) == s_q && indices.dim(1) == 1,
          "attention backward indices: expected [s_q=" + std::to_string(s_q) + ", 1, topk], got " +
              shape_str(indices.shape));
  const int64_t topk = indices.dim(2);
  if (topk_length) {
    require_shape(*topk_length, {s_q}, "attention backward topk_length");
    for (int64_t t = 0; t < s_q; ++t)
      require(0 <= (*topk_length)[t] && (*topk_length)[t] <= topk,
              "attention backward topk_length: row " + std::to_string(t) + " has " +
                  std::to_string((*topk_length)[t]) + ", outside [0, topk=" + std::to_string(topk) + "]");
  }
  require_shape(d_out, {s_q, h_q, d_v}, "attention backward d_out");
}

AttentionBackwardOut sparse_attention_backward(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                               const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                               const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                               const Tensor<float>* attn_sink) {
  return sparse_attention_backward(q, kv, indices, sm_scale, d_v, d_out, topk_length, attn_sink, true);
}

AttentionBackwardOut sparse_attention_backward(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                               const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                               const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                               const Tensor<float>* attn_sink, bool slots) {
  check_attention_backward_inputs(q, kv, indices, d_v, d_out, topk_length, attn_sink);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0), topk = indices.dim(2);
  AttentionBackwardOut o = make_attention_backward_out(s_q, h_q, d_qk, topk, s_kv, attn_sink != nullptr, slots);
  // dkv's two accumulators (the K part, all columns; the V part, columns < d_v) and d_sink's.
  std::vector<double> a_k(size_t(s_kv * d_qk), 0.0), a_v(size_t(s_kv * d_v), 0.0), sink_acc(size_t(h_q), 0.0);
  HeadGrad g;
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int64_t> rows = ref::valid_kv_rows(indices, topk_length, t, s_kv);
    std::vector<double> kvd;  // the listed kv rows, widened
    for (int64_t r : rows) {
      const std::vector<double> w = widen(kv.ptr() + r * d_qk, d_qk);
      kvd.insert(kvd.end(), w.begin(), w.end());
    }
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      const std::vector<double> qd = widen(q.ptr() + th * d_qk, d_qk), dod = widen(d_out.ptr() + th * d_v, d_v);
      head_backward(kvd, qd, dod, rows.size(), double(sm_scale), d_qk, d_v, attn_sink ? &(*attn_sink)[h] : nullptr,
                    th, o, g);
      if (slots) per_slot(indices, topk_length, t, rows, g, th, o);
      // The scatter into dkv: this (t, h)'s list positions ascending, fused multiply-adds.
      for (size_t i = 0; i < rows.size(); ++i) {
        double* ak = a_k.data() + rows[i] * d_qk;
        double* av = a_v.data() + rows[i] * d_v;
        for (int64_t d = 0; d < d_qk; ++d) ak[d] = std::fma(g.ds[i], qd[size_t(d)], ak[d]);
        for (int64_t c = 0; c < d_v; ++c) av[c] = std::fma(g.p[i], dod[size_t(c)], av[c]);
      }
      if (!rows.empty()) sink_acc[size_t(h)] -= g.one_minus_f * g.delta;
    }
  }
  for (int64_t j = 0; j < s_kv; ++j)
    for (int64_t d = 0; d < d_qk; ++d) {
      const double kpart = double(sm_scale) * a_k[size_t(j * d_qk + d)];
      o.dkv[j * d_qk + d] = float(d < d_v ? kpart + a_v[size_t(j * d_v + d)] : kpart);
    }
  if (attn_sink)
    for (int64_t h = 0; h < h_q; ++h) o.d_sink[h] = float(sink_acc[size_t(h)]);
  for (int64_t i = 0; i < o.dq.numel(); ++i) o.dq_bf16[i] = f32_to_bf16(o.dq[i]);
  for (int64_t i = 0; i < o.dkv.numel(); ++i) o.dkv_bf16[i] = f32_to_bf16(o.dkv[i]);
  return o;
}

}  // namespace indexshare::ref
