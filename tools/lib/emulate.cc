#include "tools/lib/emulate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

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

ref::AttentionOut attention(const AttentionVariant& v, const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                            const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                            const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink) {
  ref::check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0), topk = indices.dim(2);
  ref::AttentionOut o{Tensor<float>({s_q, h_q, d_v}), Tensor<bf16_t>({s_q, h_q, d_v}), Tensor<float>({s_q, h_q}),
                      Tensor<float>({s_q, h_q})};
  const float ln2 = float(std::numbers::ln2);
  const float c2 = float(double(sm_scale) * std::numbers::log2e);  // the folded constant
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = topk_length ? std::clamp<int64_t>((*topk_length)[t], 0, topk) : topk;
    std::vector<int64_t> rows;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = indices[t * topk + j];
      if (0 <= i && i < s_kv) rows.push_back(i);
    }
    if (v.order != AttentionVariant::Order::slots) std::sort(rows.begin(), rows.end());
    if (v.order == AttentionVariant::Order::descending) std::reverse(rows.begin(), rows.end());
    const int64_t n = int64_t(rows.size());
    std::vector<float> K(static_cast<size_t>(n * d_qk)), qf(static_cast<size_t>(d_qk)), s(static_cast<size_t>(n)),
        acc(static_cast<size_t>(d_v)), o_tot(static_cast<size_t>(d_v));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < d_qk; ++d) K[size_t(i * d_qk + d)] = bf16_to_f32(kv[rows[size_t(i)] * d_qk + d]);
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      if (n == 0) {
        for (int64_t c = 0; c < d_v; ++c) o.out[th * d_v + c] = 0.0f;
        o.lse[th] = kInf;
        o.max_logits[th] = -kInf;
        continue;
      }
      for (int64_t d = 0; d < d_qk; ++d) qf[size_t(d)] = bf16_to_f32(q.at(t, h, d));
      float mx = -kInf;
      for (int64_t i = 0; i < n; ++i) {
        const float dot = dot8(qf.data(), &K[size_t(i * d_qk)], d_qk);
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
      if (attn_sink) factor = 1.0f / (1.0f + std::exp((*attn_sink)[h] - lse_nat));
      for (int64_t c = 0; c < d_v; ++c) {
        const float y = o_tot[size_t(c)] * factor;
        o.out[th * d_v + c] = v.out_bf16 ? round_bf16(y) : y;
      }
      o.lse[th] = lse_nat;
      o.max_logits[th] = v.exp2 ? mx * ln2 : mx;
    }
  }
  for (int64_t i = 0; i < o.out.numel(); ++i) o.out_bf16[i] = f32_to_bf16(o.out[i]);
  return o;
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

Tensor<float> logits(const LogitsVariant& v, const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                     const Tensor<float>& k_scale, const Tensor<float>& weights, const Tensor<int32_t>& ks,
                     const Tensor<int32_t>& ke) {
  const int64_t s_q = q.dim(0), H = q.dim(1), D = q.dim(2), s_kv = k.dim(0);
  Tensor<float> out({s_q, s_kv}, -kInf);
  std::vector<float> kf(static_cast<size_t>(s_kv * D));
  for (int64_t i = 0; i < s_kv * D; ++i) kf[size_t(i)] = e4m3_to_f32(k[i]);
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < s_q; ++t) {
    std::vector<float> qf(static_cast<size_t>(H * D));
    for (int64_t i = 0; i < H * D; ++i) qf[size_t(i)] = e4m3_to_f32(q[t * H * D + i]);
    for (int64_t s = std::max<int64_t>(0, ks[t]); s < std::min<int64_t>(s_kv, ke[t]); ++s) {
      const float* kr = &kf[size_t(s * D)];
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
      out.at(t, s) = sum * k_scale[s];
    }
  }
  return out;
}

}  // namespace indexshare::emul
