// indexshare: the gradients' per-element bounds (the derivation is in judge/grad_bounds.h).
#include "tools/judge/grad_bounds.h"

#include <algorithm>
#include <cmath>

#include "ref/bounds.h"
#include "ref/numerics.h"

namespace indexshare::cmp {

namespace {

constexpr double kU = 0x1p-24, kB = 0x1p-8;
double gam(double n) { return n * kU / (1 - n * kU); }

double bf(bf16_t x) { return double(bf16_to_f32(x)); }

// The bound to store: the margin, the final rounding of the value, at or above the derivation.
float finish_bound(double b, double x) { return bound_f32(kGradMargin * b + 2 * kU * std::fabs(x)); }

// Row t's valid slots: (slot j, kv row) for the indices in [0, s_kv) among its first topk_length
// slots, duplicates kept.
std::vector<std::pair<int64_t, int64_t>> valid_slots(const Tensor<int32_t>& ind, int64_t t, int64_t s_kv, const Tensor<int32_t>* len) {
  std::vector<std::pair<int64_t, int64_t>> v;
  const int64_t k = ind.dim(2), n = len ? std::min<int64_t>(std::max<int32_t>((*len)[t], 0), k) : k;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = ind[t * k + j];
    if (i >= 0 && i < s_kv) v.push_back({j, i});
  }
  return v;
}

// Row t's quantities of the header that delta and d_sink read, for every head h at once (the
// loops run slot by slot, so each kv row is converted once for all heads; every sum keeps the
// header's order per (t, h): d ascending for the logits, slots ascending for sum_i P_i |V_ic|, c
// ascending for E_D).
struct RowHeads {
  std::vector<double> E_D, dlse;  // [h_q]
};

RowHeads row_heads(const AttentionBackwardTruth& a, int64_t t, const std::vector<std::pair<int64_t, int64_t>>& slots) {
  const Tensor<bf16_t>& q = *a.q;
  const Tensor<bf16_t>& kv = *a.kv;
  const int64_t h_q = q.dim(1), d_qk = q.dim(2), d_v = a.d_v, topk = a.p->dim(2);
  const double n = double(slots.size());
  std::vector<double> qT(size_t(d_qk * h_q)), x(static_cast<size_t>(d_qk)), abs_dot(static_cast<size_t>(h_q)), dot(static_cast<size_t>(h_q)), E_s(size_t(h_q), 0.0);
  std::vector<double> pv(size_t(h_q * d_v), 0.0);  // [h, c]: sum_i P_i |V_ic|
  for (int64_t h = 0; h < h_q; ++h)
    for (int64_t d = 0; d < d_qk; ++d) qT[size_t(d * h_q + h)] = bf(q.ptr()[(t * h_q + h) * d_qk + d]);
  for (const auto& [j, i] : slots) {
    for (int64_t d = 0; d < d_qk; ++d) x[size_t(d)] = bf(kv[i * d_qk + d]);
    std::fill(abs_dot.begin(), abs_dot.end(), 0.0);
    std::fill(dot.begin(), dot.end(), 0.0);
    for (int64_t d = 0; d < d_qk; ++d) {
      const double* qd = qT.data() + d * h_q;
      for (int64_t h = 0; h < h_q; ++h) {
        const double prod = qd[h] * x[size_t(d)];
        abs_dot[size_t(h)] += std::fabs(prod);
        dot[size_t(h)] += prod;
      }
    }
    for (int64_t h = 0; h < h_q; ++h) {
      E_s[size_t(h)] = std::max(E_s[size_t(h)], gam(double(d_qk)) * a.sm * abs_dot[size_t(h)] + kU * std::fabs(a.sm * dot[size_t(h)]));
      const double P = a.p->ptr()[(t * h_q + h) * topk + j];
      double* pvh = pv.data() + h * d_v;
      for (int64_t c = 0; c < d_v; ++c) pvh[c] += P * std::fabs(x[size_t(c)]);
    }
  }
  RowHeads r{std::vector<double>(size_t(h_q)), std::vector<double>(size_t(h_q))};
  for (int64_t h = 0; h < h_q; ++h) {
    const bf16_t* dO = a.d_out->ptr() + (t * h_q + h) * d_v;
    const float* O = a.out->ptr() + (t * h_q + h) * d_v;
    const double lse = a.lse->ptr()[t * h_q + h];
    r.dlse[size_t(h)] = E_s[size_t(h)] + gam(n) + 4 * kU + kU * std::fabs(lse);
    double eP = 2 * E_s[size_t(h)] + gam(n) + 8 * kU + kU * std::fabs(lse);
    if (a.sink) eP += r.dlse[size_t(h)] + 4 * kU;
    // Delta's error through the kernel's saved bf16 out.
    double E_D = 0;
    for (int64_t c = 0; c < d_v; ++c) {
      const double eO = kB * std::fabs(O[c]) + (eP + gam(n) + kB) * pv[size_t(h * d_v + c)];
      E_D += std::fabs(bf(dO[c])) * eO + gam(double(d_v)) * std::fabs(double(O[c]) * bf(dO[c]));
    }
    r.E_D[size_t(h)] = E_D;
  }
  return r;
}

}  // namespace

std::map<std::string, std::vector<float>> delta_sink_bounds(const AttentionBackwardTruth& a) {
  const Tensor<bf16_t>& q = *a.q;
  const Tensor<bf16_t>& kv = *a.kv;
  const int64_t s_q = q.dim(0), h_q = q.dim(1), s_kv = kv.dim(0);
  std::vector<double> delta_b(size_t(s_q * h_q), 0.0), sink_t(a.sink ? size_t(s_q * h_q) : 0), mag_t(sink_t.size());
  // Rows are independent (OpenMP over t); d_sink's sums over t then run serially, t ascending.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < s_q; ++t) {
    const auto slots = valid_slots(*a.indices, t, s_kv, a.topk_length);
    if (slots.empty()) continue;
    const RowHeads r = row_heads(a, t, slots);
    for (int64_t h = 0; h < h_q; ++h) {
      delta_b[size_t(t * h_q + h)] = r.E_D[size_t(h)];
      if (a.sink) {
        const double lse = a.lse->ptr()[t * h_q + h];
        const double f = 1 / (1 + std::exp(double(a.sink->ptr()[h]) - lse)), Dl = std::fabs(a.delta->ptr()[t * h_q + h]);
        sink_t[size_t(t * h_q + h)] = (1 - f) * r.E_D[size_t(h)] + Dl * f * (1 - f) * (r.dlse[size_t(h)] + 4 * kU);
        mag_t[size_t(t * h_q + h)] = (1 - f) * Dl;
      }
    }
  }
  std::vector<double> sink_b(size_t(h_q), 0.0), sink_mag(size_t(h_q), 0.0);
  for (int64_t t = 0; t < s_q && a.sink; ++t)
    for (int64_t h = 0; h < h_q; ++h) {
      sink_b[size_t(h)] += sink_t[size_t(t * h_q + h)];
      sink_mag[size_t(h)] += mag_t[size_t(t * h_q + h)];
    }
  std::map<std::string, std::vector<float>> out;
  std::vector<float>& bd = out["delta"];
  bd.resize(delta_b.size());
  for (size_t e = 0; e < delta_b.size(); ++e) bd[e] = finish_bound(delta_b[e], a.delta->ptr()[e]);
  if (a.sink) {
    std::vector<float>& bs = out["d_sink"];
    bs.resize(size_t(h_q));
    // d_sink's exact value is not in the truth struct: its magnitude bounds it.
    for (int64_t h = 0; h < h_q; ++h) bs[size_t(h)] = finish_bound(sink_b[size_t(h)] + gam(double(s_q)) * sink_mag[size_t(h)], sink_mag[size_t(h)]);
  }
  return out;
}

namespace {

// Row t's support R, ascending (ref/train/indexer_loss.h).
std::vector<int64_t> support(const IndexerLossTruth& x, int64_t t) {
  const int64_t ks = (*x.ks)[t], ke = (*x.ke)[t];
  std::vector<int64_t> r;
  if (!x.topk) {
    for (int64_t s = ks; s < ke; ++s) r.push_back(s);
    return r;
  }
  const int64_t K = x.topk->dim(1);
  for (int64_t j = 0; j < K; ++j) {
    const int64_t v = x.topk->ptr()[t * K + j];
    if (v >= 0 && v < ke - ks) r.push_back(ks + v);
  }
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

// The teacher's relative error ep of row t (the header).
double teacher_error(const IndexerLossTruth& x, int64_t t, const std::vector<int64_t>& R) {
  double worst = 0;
  int64_t heads = 0;
  for (size_t L = 0; L < x.teacher_q.size(); ++L) {
    const Tensor<bf16_t>& q = *x.teacher_q[L];
    const Tensor<bf16_t>& kv = *x.teacher_kv[L];
    const int64_t h_q = q.dim(1), d_qk = q.dim(2);
    heads += h_q;
    for (int64_t h = 0; h < h_q; ++h) {
      double E_T = 0;
      for (int64_t s : R) {
        double a = 0;
        for (int64_t d = 0; d < d_qk; ++d) a += std::fabs(bf(q.ptr()[(t * h_q + h) * d_qk + d]) * bf(kv.ptr()[s * d_qk + d]));
        E_T = std::max(E_T, gam(double(d_qk)) * x.sm * a);
      }
      worst = std::max(worst, 2 * E_T + gam(double(R.size())) + 8 * kU);
    }
  }
  return 2 * (worst + gam(double(heads))) + gam(double(R.size())) + 4 * kU;
}

}  // namespace

std::map<std::string, std::vector<float>> indexer_loss_bounds(const IndexerLossTruth& x) {
  const Tensor<bf16_t>& q = *x.q;
  const Tensor<bf16_t>& k = *x.k;
  const int64_t s_q = q.dim(0), H = q.dim(1), D = q.dim(2), s_kv = k.dim(0);
  std::vector<double> bp(size_t(s_q * s_kv), 0.0), blq(bp.size(), 0.0), bdI(bp.size(), 0.0);
  std::vector<double> bkl(size_t(s_q), 0.0), bdw(size_t(s_q * H), 0.0), bdq(size_t(s_q * H * D), 0.0);
  std::vector<double> dk_err(size_t(s_kv * D), 0.0), dk_mag(size_t(s_kv * D), 0.0), dk_n(size_t(s_kv), 0.0);
  double kl_err = 0, kl_mag = 0;
  
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int64_t> R = support(x, t);
    if (R.empty()) continue;
    const double nR = double(R.size());
    const double ep = teacher_error(x, t, R);
    // Scores' errors and the student's lse.
    std::vector<double> eI(R.size());
    double E_I = 0, m = -INFINITY;
    for (size_t r = 0; r < R.size(); ++r) {
      double e = 0;
      for (int64_t h = 0; h < H; ++h) {
        double a = 0;
        for (int64_t d = 0; d < D; ++d) a += std::fabs(bf(q.ptr()[(t * H + h) * D + d]) * bf(k.ptr()[R[r] * D + d]));
        e += std::fabs(double(x.w->ptr()[t * H + h])) * a;
      }
      eI[r] = gam(double(D + H)) * e;
      E_I = std::max(E_I, eI[r]);
      m = std::max(m, double(x.scores->ptr()[t * s_kv + R[r]]));
    }
    double l = 0;
    for (int64_t s : R) l += std::exp(double(x.scores->ptr()[t * s_kv + s]) - m);
    const double lse = m + std::log(l);
    double kle = 0, klm = 0;
    for (size_t r = 0; r < R.size(); ++r) {
      const int64_t s = R[r], e = t * s_kv + s;
      const double I = x.scores->ptr()[e], P = x.p->ptr()[e], lq = x.log_q->ptr()[e], Q = std::exp(lq), dI = x.d_scores->ptr()[e];
      const double dlq = eI[r] + E_I + gam(nR) + 4 * kU + kU * (std::fabs(I) + std::fabs(lse));
      const double eq = dlq + 4 * kU;
      const double Ds = std::fabs(x.g) * (Q * (eq + ep) + P * ep + 2 * kU * (Q + P)) + 2 * kU * std::fabs(dI);
      bp[size_t(e)] = ep * P;
      blq[size_t(e)] = dlq;
      bdI[size_t(e)] = Ds;
      if (P > 0) {
        const double lp = std::log(std::max(P, 1e-10));
        kle += ep * P * std::fabs(lp - lq + 1) + P * dlq;
        klm += std::fabs(P * (lp - lq));
      }
      for (int64_t h = 0; h < H; ++h) {
        double dot = 0, a = 0;
        for (int64_t d = 0; d < D; ++d) {
          const double v = bf(q.ptr()[(t * H + h) * D + d]) * bf(k.ptr()[s * D + d]);
          dot += v;
          a += std::fabs(v);
        }
        const double eS = gam(double(D)) * a, w = std::fabs(double(x.w->ptr()[t * H + h]));
        const double act = x.relu ? std::max(dot, 0.0) : dot;
        bdw[size_t(t * H + h)] += Ds * std::fabs(act) + std::fabs(dI) * eS + gam(nR) * std::fabs(dI * act);
        const bool on = !x.relu || dot > -eS, flip = x.relu && std::fabs(dot) <= eS;
        const double coef = (on ? Ds : 0.0) + (flip ? std::fabs(dI) : 0.0), mag = (!x.relu || dot > 0) ? std::fabs(dI) : 0.0;
        dk_n[size_t(s)] += 1;
        for (int64_t d = 0; d < D; ++d) {
          const double kk = std::fabs(bf(k.ptr()[s * D + d])), qq = std::fabs(bf(q.ptr()[(t * H + h) * D + d]));
          bdq[size_t((t * H + h) * D + d)] += (coef + gam(nR + 1) * mag) * w * kk;
          dk_err[size_t(s * D + d)] += coef * w * qq;
          dk_mag[size_t(s * D + d)] += mag * w * qq;
        }
      }
    }
    bkl[size_t(t)] = kle + gam(nR) * klm;
    kl_err += bkl[size_t(t)];
    kl_mag += std::fabs(double(x.kl->ptr()[t]));
  }
  std::map<std::string, std::vector<float>> out;
  auto emit = [&](const char* name, const std::vector<double>& b, const Tensor<float>& v) {
    std::vector<float>& o = out[name];
    o.resize(b.size());
    for (size_t e = 0; e < b.size(); ++e) o[e] = finish_bound(b[e], v.ptr()[e]);
  };
  emit("p", bp, *x.p);
  emit("log_q", blq, *x.log_q);
  emit("d_scores", bdI, *x.d_scores);
  emit("kl", bkl, *x.kl);
  emit("dw", bdw, *x.dw);
  emit("dq", bdq, *x.dq);
  std::vector<double> bdk(dk_err.size());
  for (size_t e = 0; e < bdk.size(); ++e) bdk[e] = dk_err[e] + gam(dk_n[e / size_t(D)]) * dk_mag[e];
  emit("dk", bdk, *x.dk);
  out["loss"] = {finish_bound(x.coeff_over_n * (kl_err + gam(double(s_q)) * kl_mag), x.loss)};
  return out;
}

}  // namespace indexshare::cmp
