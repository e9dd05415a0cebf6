#include "tools/judge/emulate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#include <numbers>

#include "ref/error.h"
#include "ref/numerics.h"

namespace indexshare::emul {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// f32 dot product in the order an 8-wide vector loop computes it.
float dot8(const float* a, const float* b, int64_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int j = 0; j < 8; ++j) part[j] += a[d + j] * b[d + j];
  for (; d < n; ++d) part[d % 8] += a[d] * b[d];
  return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
}

// a + b rounded toward zero to f32 (a truncating accumulator).
float add_trunc(float a, double b) {
  const double s = double(a) + b;
  float f = float(s);
  if (std::fabs(double(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
  return f;
}

// x truncated toward zero to `bits` significant bits.
double trunc_bits(double x, int bits) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);
  const double scale = std::ldexp(1.0, bits - e);
  return std::trunc(x * scale) / scale;
}

}  // namespace

std::string AttentionVariant::name() const {
  std::string n = order == Order::ascending ? "asc" : order == Order::slots ? "slots" : "desc";
  n += block ? "-online" + std::to_string(block) : "-twopass";
  if (splits > 1) n += "-split" + std::to_string(splits);
  n += exp2 ? "-exp2" : "-exp";
  if (l_from_bf16) n += "-lbf16";
  if (truncate_acc) n += "-trunc";
  if (logits_bf16) n += "-logitsbf16";
  if (products_bf16) n += "-prodbf16";
  if (acc_bf16) n += "-accbf16";
  n += out_bf16 ? "-obf16" : "-of32";
  return n;
}

std::vector<AttentionVariant> attention_family() {
  using O = AttentionVariant::Order;
  return {
      {O::ascending, 0, 1, false, false, false, true},   // the naive kernel
      {O::slots, 64, 1, true, false, false, true},        // FlashMLA-like sparse prefill
      {O::descending, 64, 1, true, true, false, false},
      {O::slots, 128, 4, true, false, false, true},       // split-KV decode
      {O::ascending, 0, 1, false, false, true, true},     // truncating tensor-core accumulation
      {O::slots, 64, 2, true, false, true, false},
      {O::ascending, 32, 1, false, false, false, false},
      {O::descending, 0, 1, true, true, false, true},
  };
}

namespace {

// One (row, head) of the variant: K holds the n valid kv rows in the variant's order, in f32
// ([n, d_qk]); qf the row's head in f32. Writes out[d_v], lse and the max logit (base e).
void attend(const AttentionVariant& v, const float* qf, const float* K, int64_t n, int64_t d_qk, int64_t d_v, float sm_scale,
            const float* sink, float* out, float& lse_out, float& max_out) {
  if (n == 0) {
    for (int64_t c = 0; c < d_v; ++c) out[c] = 0.0f;
    lse_out = kInf;
    max_out = -kInf;
    return;
  }
  const float ln2 = float(std::numbers::ln2);
  const float c2 = float(double(sm_scale) * std::numbers::log2e);  // the folded constant
  std::vector<float> s(static_cast<size_t>(n)), acc(static_cast<size_t>(d_v)), o_tot(static_cast<size_t>(d_v));
  float mx = -kInf;
  for (int64_t i = 0; i < n; ++i) {
    const float* kr = &K[size_t(i * d_qk)];
    float dot = 0;
    if (v.products_bf16)  // each product rounded to bf16, then summed in f32
      for (int64_t d = 0; d < d_qk; ++d) dot += round_bf16(qf[d] * kr[d]);
    else
      dot = dot8(qf, kr, d_qk);
    if (v.logits_bf16) dot = round_bf16(dot);
    s[size_t(i)] = v.exp2 ? dot * c2 : dot * sm_scale;
    mx = std::max(mx, s[size_t(i)]);
  }
  auto ex = [&](float x) { return v.exp2 ? std::exp2(x) : std::exp(x); };
  auto lg = [&](float x) { return v.exp2 ? std::log2(x) : std::log(x); };
  // Parts (split-KV), each an online softmax over blocks (block 0: the whole part at once).
  const int64_t S = std::min<int64_t>(std::max(1, v.splits), n);
  std::vector<float> part_lse(static_cast<size_t>(S));
  std::vector<std::vector<float>> part_out(static_cast<size_t>(S), std::vector<float>(static_cast<size_t>(d_v)));
  for (int64_t p = 0; p < S; ++p) {
    const int64_t a = p * n / S, b = (p + 1) * n / S;
    const int64_t B = v.block > 0 ? v.block : (b - a);
    float m = -kInf, l = 0, lb = 0;  // l: sum of the f32 p (the LSE's); lb: of the rounded p
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t b0 = a; b0 < b; b0 += B) {
      const int64_t b1 = std::min(b, b0 + B);
      float mb = -kInf;
      for (int64_t i = b0; i < b1; ++i) mb = std::max(mb, s[size_t(i)]);
      const float m_new = std::max(m, mb);
      const float scale = m == -kInf ? 0.0f : ex(m - m_new);
      l = l * scale;
      lb = lb * scale;
      for (float& x : acc) x = x * scale;
      for (int64_t i = b0; i < b1; ++i) {
        const float pf = ex(s[size_t(i)] - m_new), pb = round_bf16(pf);
        l += pf;
        lb += pb;
        const float* V = &K[size_t(i * d_qk)];
        if (v.truncate_acc)
          for (int64_t c = 0; c < d_v; ++c) acc[size_t(c)] = add_trunc(acc[size_t(c)], double(pb) * double(V[c]));
        else if (v.acc_bf16)  // a bf16 accumulator: every partial sum rounded to bf16
          for (int64_t c = 0; c < d_v; ++c) acc[size_t(c)] = round_bf16(acc[size_t(c)] + pb * V[c]);
        else
          for (int64_t c = 0; c < d_v; ++c) acc[size_t(c)] += pb * V[c];
      }
      m = m_new;
    }
    const float norm = v.l_from_bf16 ? lb : l;
    for (int64_t c = 0; c < d_v; ++c) part_out[size_t(p)][size_t(c)] = acc[size_t(c)] / norm;
    part_lse[size_t(p)] = m + lg(l);
  }
  float lse = part_lse[0];
  if (S == 1) {
    o_tot = part_out[0];
  } else {  // FlashMLA's combine: lse = M + log sum exp(lse_p - M), out = sum exp(lse_p - lse) out_p
    float M = -kInf, sum = 0;
    for (float x : part_lse) M = std::max(M, x);
    for (float x : part_lse) sum += ex(x - M);
    lse = M + lg(sum);
    std::fill(o_tot.begin(), o_tot.end(), 0.0f);
    for (int64_t p = 0; p < S; ++p) {
      const float w = ex(part_lse[size_t(p)] - lse);
      for (int64_t c = 0; c < d_v; ++c) o_tot[size_t(c)] += w * part_out[size_t(p)][size_t(c)];
    }
  }
  const float lse_nat = v.exp2 ? lse * ln2 : lse;
  float factor = 1.0f;
  if (sink) factor = 1.0f / (1.0f + std::exp(*sink - lse_nat));
  for (int64_t c = 0; c < d_v; ++c) {
    const float y = o_tot[size_t(c)] * factor;
    out[c] = v.out_bf16 ? round_bf16(y) : y;
  }
  lse_out = lse_nat;
  max_out = v.exp2 ? mx * ln2 : mx;
}

// Row t's valid kv rows in the variant's order.
std::vector<int64_t> valid_rows(const AttentionVariant& v, const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length,
                                int64_t s_kv, int64_t t) {
  const int64_t topk = indices.dim(2);
  const int64_t len = topk_length ? std::clamp<int64_t>((*topk_length)[t], 0, topk) : topk;
  std::vector<int64_t> rows;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t i = indices[t * topk + j];
    if (0 <= i && i < s_kv) rows.push_back(i);
  }
  if (v.order != AttentionVariant::Order::slots) std::sort(rows.begin(), rows.end());
  if (v.order == AttentionVariant::Order::descending) std::reverse(rows.begin(), rows.end());
  return rows;
}

// The rows' kv in f32, [rows, d_qk].
std::vector<float> gather_kv(const Tensor<bf16_t>& kv, const std::vector<int64_t>& rows) {
  const int64_t d_qk = kv.dim(2);
  std::vector<float> K(rows.size() * size_t(d_qk));
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t d = 0; d < d_qk; ++d) K[i * size_t(d_qk) + size_t(d)] = bf16_to_f32(kv[rows[i] * d_qk + d]);
  return K;
}

}  // namespace

ref::AttentionOut attention(const AttentionVariant& v, const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                            const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                            const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink) {
  ref::check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0);
  ref::AttentionOut o{Tensor<float>({s_q, h_q, d_v}), Tensor<bf16_t>({s_q, h_q, d_v}), Tensor<float>({s_q, h_q}),
                      Tensor<float>({s_q, h_q})};
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int64_t> rows = valid_rows(v, indices, topk_length, s_kv, t);
    const std::vector<float> K = gather_kv(kv, rows);
    std::vector<float> qf(static_cast<size_t>(d_qk));
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      for (int64_t d = 0; d < d_qk; ++d) qf[size_t(d)] = bf16_to_f32(q.at(t, h, d));
      attend(v, qf.data(), K.data(), int64_t(rows.size()), d_qk, d_v, sm_scale, attn_sink ? &(*attn_sink)[h] : nullptr,
             &o.out[th * d_v], o.lse[th], o.max_logits[th]);
    }
  }
  for (int64_t i = 0; i < o.out.numel(); ++i) o.out_bf16[i] = f32_to_bf16(o.out[i]);
  return o;
}

Tensor<int32_t> drop_one_key(const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length, int64_t s_kv, bool last,
                             int64_t* dropped) {
  Tensor<int32_t> out = indices;
  const int64_t s_q = indices.dim(0), k = indices.numel() / std::max<int64_t>(1, s_q);
  int64_t n = 0;
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = topk_length ? std::clamp<int64_t>((*topk_length)[t], 0, k) : k;
    int64_t pick = -1;
    for (int64_t j = 0; j < len; ++j)
      if (const int32_t i = out[t * k + j]; i >= 0 && i < s_kv && (last || pick < 0)) pick = j;
    if (pick >= 0) { out[t * k + pick] = -1; ++n; }
  }
  if (dropped) *dropped = n;
  return out;
}

std::string LogitsVariant::name() const {
  std::string n = fp8_14 ? "fp8acc14" : "f32";
  if (d_block) n += "-dblock" + std::to_string(d_block);
  n += heads_descending ? "-hdesc" : "-hasc";
  return n;
}

std::vector<LogitsVariant> logits_family() {
  return {{false, false, 0}, {false, true, 32}, {true, false, 0}, {true, true, 0}};
}

namespace {

// Logit (t, s) of the variant: qf the row's H x D query in f32, kr key s's D values in f32.
float logit_one(const LogitsVariant& v, const float* qf, const float* kr, const Tensor<float>& weights, float k_scale, int64_t t,
                int64_t H, int64_t D) {
  float sum = 0;
  for (int64_t hh = 0; hh < H; ++hh) {
    const int64_t h = v.heads_descending ? H - 1 - hh : hh;
    const float* qr = &qf[size_t(h * D)];
    float dot = 0;
    if (v.fp8_14) {
      double acc = 0;
      for (int64_t d0 = 0; d0 < D; d0 += 32) {
        double step = 0;  // exact: e4m3 products and their sums fit in double
        for (int64_t d = d0; d < std::min(D, d0 + 32); ++d) step += double(qr[d]) * double(kr[d]);
        acc = trunc_bits(acc + step, 14);
      }
      dot = float(acc);
    } else {
      const int64_t B = v.d_block > 0 ? v.d_block : D;
      for (int64_t d0 = 0; d0 < D; d0 += B) {
        float part = 0;
        for (int64_t d = d0; d < std::min(D, d0 + B); ++d) part += qr[d] * kr[d];
        dot += part;
      }
    }
    sum += weights.at(t, h) * std::max(dot, 0.0f);
  }
  return sum * k_scale;
}

std::vector<float> to_f32(const e4m3_t* x, int64_t n) {
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[size_t(i)] = e4m3_to_f32(x[i]);
  return f;
}

std::vector<float> to_f32(const bf16_t* x, int64_t n) {
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[size_t(i)] = bf16_to_f32(x[i]);
  return f;
}

// logits_at for FP8 or bf16 inputs (a bf16 set's indexer: exact products in f32 as well).
template <class In>
std::vector<float> logits_at_impl(const LogitsVariant& v, const Tensor<In>& q, const Tensor<In>& k, const Tensor<float>& k_scale,
                                  const Tensor<float>& weights, const std::vector<RowCol>& elems) {
  const int64_t H = q.dim(1), D = q.dim(2);
  std::vector<float> out(elems.size());
#pragma omp parallel
  {
    std::vector<float> qf;  // the row's query in f32, converted once per run of elements of one row
    int64_t row = -1;
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < int64_t(elems.size()); ++i) {
      const auto [t, s] = elems[size_t(i)];
      if (t != row) { qf = to_f32(q.ptr() + t * H * D, H * D); row = t; }
      const std::vector<float> kr = to_f32(k.ptr() + s * D, D);
      out[size_t(i)] = logit_one(v, qf.data(), kr.data(), weights, k_scale[s], t, H, D);
    }
  }
  return out;
}

}  // namespace

Tensor<float> logits(const LogitsVariant& v, const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                     const Tensor<float>& k_scale, const Tensor<float>& weights, const Tensor<int32_t>& ks,
                     const Tensor<int32_t>& ke) {
  const int64_t s_q = q.dim(0), H = q.dim(1), D = q.dim(2), s_kv = k.dim(0);
  Tensor<float> out({s_q, s_kv}, -kInf);
  const std::vector<float> kf = to_f32(k.ptr(), s_kv * D);
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<float> qf = to_f32(q.ptr() + t * H * D, H * D);
    for (int64_t s = std::max<int64_t>(0, ks[t]); s < std::min<int64_t>(s_kv, ke[t]); ++s)
      out.at(t, s) = logit_one(v, qf.data(), &kf[size_t(s * D)], weights, k_scale[s], t, H, D);
  }
  return out;
}

std::vector<float> logits_at(const LogitsVariant& v, const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                             const Tensor<float>& k_scale, const Tensor<float>& weights, const std::vector<RowCol>& elems) {
  return logits_at_impl(v, q, k, k_scale, weights, elems);
}

std::vector<float> logits_at(const LogitsVariant& v, const Tensor<bf16_t>& q, const Tensor<bf16_t>& k,
                             const Tensor<float>& k_scale, const Tensor<float>& weights, const std::vector<RowCol>& elems) {
  return logits_at_impl(v, q, k, k_scale, weights, elems);
}

std::vector<LogitsVariant> scores_family() {
  return {{false, false, 0}, {false, true, 0}, {false, false, 8}, {false, true, 32}};
}

Tensor<float> scores_f32(const LogitsVariant& v, const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& weights,
                         float scale, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke) {
  require(!v.fp8_14, "emul::scores_f32: the f32 scores have no FP8 accumulation variant");
  require(q.rank() == 3 && k.rank() == 2 && k.dim(1) == q.dim(2), "emul::scores_f32: expected q [T, H, D] and k [S, D], got " +
                                                                      shape_str(q.shape) + " and " + shape_str(k.shape));
  const int64_t T = q.dim(0), H = q.dim(1), D = q.dim(2), S = k.dim(0);
  require_shape(weights, Shape{T, H}, "emul::scores_f32 weights");
  Tensor<float> out({T, S}, -kInf);
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = std::max<int64_t>(0, ks[t]); s < std::min<int64_t>(S, ke[t]); ++s)
      out.at(t, s) = logit_one(v, q.ptr() + t * H * D, k.ptr() + s * D, weights, scale, t, H, D);
  return out;
}

}  // namespace indexshare::emul
