#include "ref/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ref/numerics.h"

namespace indexshare::ref {

namespace {

// q . k in the 8-part order of the header: part r sums q[d] * k[d] over d = r (mod 8), d
// ascending (each product exact in double), then the parts are folded in halves.
double dot8(const std::vector<double>& q, const bf16_t* k) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t d = 0; d < q.size(); ++d) part[d % 8] += q[d] * double(bf16_to_f32(k[d]));
  return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
}

// The whole computation for one (t, h) over an ascending list of kv rows.
void attend(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, int64_t t, int64_t h,
            const std::vector<int64_t>& rows, double sm_scale, int64_t d_v,
            const Tensor<float>* attn_sink, AttentionOut& o) {
  const int64_t h_q = q.dim(1), d_qk = q.dim(2);
  float* out = o.out.ptr() + (t * h_q + h) * d_v;
  const int64_t th = t * h_q + h;
  if (rows.empty()) {  // lonely query: FlashMLA HEAD convention
    std::fill(out, out + d_v, 0.0f);
    o.lse[th] = std::numeric_limits<float>::infinity();
    o.max_logits[th] = -std::numeric_limits<float>::infinity();
    return;
  }
  // Pass 1: logits P_i = (q . k_i) * sm_scale and their maximum m.
  std::vector<double> qd(static_cast<size_t>(d_qk)), p(rows.size());
  for (int64_t d = 0; d < d_qk; ++d) qd[size_t(d)] = bf16_to_f32(q.at(t, h, d));
  double m = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < rows.size(); ++i) {
    p[i] = dot8(qd, kv.ptr() + rows[i] * d_qk) * sm_scale;
    m = std::max(m, p[i]);
  }
  // Pass 2: unnormalised probabilities and their sum (rows ascending), lse = m + ln(l).
  double l = 0.0;
  for (size_t i = 0; i < rows.size(); ++i) l += (p[i] = exp_portable(p[i] - m));
  const double lse = m + std::log(l);
  // Pass 3: out = sum_i p_i V_i / l (fused multiply-adds, rows ascending), times the sink factor.
  double factor = 1.0 / l;
  if (attn_sink) factor *= 1.0 / (1.0 + exp_portable(double((*attn_sink)[h]) - lse));
  for (int64_t c = 0; c < d_v; ++c) {
    double acc = 0.0;
    for (size_t i = 0; i < rows.size(); ++i)
      acc = std::fma(p[i], double(bf16_to_f32(kv[rows[i] * d_qk + c])), acc);
    out[c] = float(acc * factor);
  }
  o.lse[th] = float(lse);
  o.max_logits[th] = float(m);
}

AttentionOut make_out(int64_t s_q, int64_t h_q, int64_t d_v) {
  return AttentionOut{Tensor<float>({s_q, h_q, d_v}), Tensor<bf16_t>({s_q, h_q, d_v}),
                      Tensor<float>({s_q, h_q}), Tensor<float>({s_q, h_q})};
}

void finish_bf16(AttentionOut& o) {
  for (int64_t i = 0; i < o.out.numel(); ++i) o.out_bf16[i] = f32_to_bf16(o.out[i]);
}

}  // namespace

void check_attention_inputs(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, int64_t d_v,
                const Tensor<float>* attn_sink) {
  require(q.rank() == 3, "attention q: expected rank 3 [s_q, h_q, d_qk], got " + shape_str(q.shape));
  require(kv.rank() == 3 && kv.dim(1) == 1,
          "attention kv: expected [s_kv, 1, d_qk], got " + shape_str(kv.shape));
  require(kv.dim(2) == q.dim(2), "attention kv: d_qk " + std::to_string(kv.dim(2)) +
                                     " differs from q's " + std::to_string(q.dim(2)));
  require(1 <= d_v && d_v <= q.dim(2), "attention: d_v must be in [1, d_qk], got " + std::to_string(d_v));
  if (attn_sink) require_shape(*attn_sink, {q.dim(1)}, "attention attn_sink");
}

std::vector<int64_t> valid_kv_rows(const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length, int64_t t,
                                   int64_t s_kv) {
  const int64_t topk = indices.dim(2), len = topk_length ? (*topk_length)[t] : topk;
  std::vector<int64_t> rows;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t i = indices[t * topk + j];
    if (0 <= i && i < s_kv) rows.push_back(i);
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

AttentionOut sparse_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                              const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                              const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink) {
  check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), s_kv = kv.dim(0);
  require(indices.rank() == 3 && indices.dim(0) == s_q && indices.dim(1) == 1,
          "attention indices: expected [s_q=" + std::to_string(s_q) + ", 1, topk], got " +
              shape_str(indices.shape));
  const int64_t topk = indices.dim(2);
  if (topk_length) {
    require_shape(*topk_length, {s_q}, "attention topk_length");
    for (int64_t t = 0; t < s_q; ++t)
      require(0 <= (*topk_length)[t] && (*topk_length)[t] <= topk,
              "attention topk_length: row " + std::to_string(t) + " has " +
                  std::to_string((*topk_length)[t]) + ", outside [0, topk=" + std::to_string(topk) + "]");
  }
  AttentionOut o = make_out(s_q, h_q, d_v);
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int64_t> rows = valid_kv_rows(indices, topk_length, t, s_kv);
    for (int64_t h = 0; h < h_q; ++h) attend(q, kv, t, h, rows, sm_scale, d_v, attn_sink, o);
  }
  finish_bf16(o);
  return o;
}

AttentionOut dense_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                             int64_t d_v, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                             const Tensor<float>* attn_sink) {
  check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), s_kv = kv.dim(0);
  require_shape(ks, {s_q}, "attention ks");
  require_shape(ke, {s_q}, "attention ke");
  AttentionOut o = make_out(s_q, h_q, d_v);
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < s_q; ++t) {
    require(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_kv,
            "attention ks/ke: row " + std::to_string(t) + " bounds outside 0 <= ks <= ke <= s_kv");
    rows.clear();
    for (int64_t i = ks[t]; i < ke[t]; ++i) rows.push_back(i);
    for (int64_t h = 0; h < h_q; ++h) attend(q, kv, t, h, rows, sm_scale, d_v, attn_sink, o);
  }
  finish_bf16(o);
  return o;
}

}  // namespace indexshare::ref
