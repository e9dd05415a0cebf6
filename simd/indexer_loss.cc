// indexshare simd/: the indexer's distillation loss and its gradients (ref/train/indexer_loss.h),
// bit-identical to ref.
//
// Each query row is independent (I, the target, log q, kl, dI, dw' and dq of row t read only row
// t's inputs): OpenMP over rows. Within a row the heavy loops run in vector lanes, each lane doing
// ref's scalar operations in ref's order (separate multiply and add, never fused):
//   head scores  S[h, s] = q[t,h,:] . k[s,:] with keys as lanes and d ascending (k transposed to
//                [D][s_kv] doubles once per call), as ref's dot (acc = acc + q*k from 0)
//   teacher      P_i = (q_attn[t,h,:] . kv[R_i]) * scale with keys as lanes and eight partial sums
//                per lane, d = r (mod 8) into part r, folded as ref's dot8
//   exp          simd::exp_portable (ref's bits, lane by lane)
//   dq           dq[h,:] += dS * k[s,:] with d as lanes, s ascending
// The sums whose order is the rule (l, the head sum of I, sum p, kl, dw') stay sequential scalar
// loops in ref's order; elementwise steps (e / l * mass, the accumulation over heads) are the same
// single operations. dk[s, :] sums over every query row and head, t ascending then h: it is split
// over blocks of key rows (each dk row is written by one thread, never atomics), each term
// dS * q[t,h,:] added across D in lanes; 1[S > 0] comes from the same head-score kernel.
// The kl sum over rows and the loss are ref's finish.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/indexer_loss.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ref/train/indexer_loss.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// acc[d] = acc[d] + s * x[d] for d < n: a multiply then an add per lane, as ref's scalar loop.
void AddScaled(double* acc, double s, const double* x, int64_t n) {
  const hn::ScalableTag<double> d;
  const int64_t N = int64_t(hn::Lanes(d));
  const auto vs = hn::Set(d, s);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Add(hn::LoadU(d, acc + i), hn::Mul(vs, hn::LoadU(d, x + i))), d, acc + i);
  for (; i < n; ++i) acc[i] = acc[i] + s * x[i];
}

// S[h * n + j] = sum_d q[h*D + d] * kT[d * ld + lo + j] (d ascending, from 0) for keys lo + j < hi.
// Key chunks outside, heads inside (the chunk's D x lanes block of kT stays in L1), four heads at a
// time for independent chains; each lane's chain is ref's dot.
void HeadScores(const double* q, const double* kT, int64_t ld, int64_t lo, int64_t hi, int64_t H, int64_t D,
                double* S) {
  const hn::ScalableTag<double> dv;
  const int64_t N = int64_t(hn::Lanes(dv)), n = hi - lo;
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    const double* kc = kT + lo + j;
    int64_t h = 0;
    for (; h + 4 <= H; h += 4) {
      auto a0 = hn::Zero(dv), a1 = hn::Zero(dv), a2 = hn::Zero(dv), a3 = hn::Zero(dv);
      const double *q0 = q + h * D, *q1 = q0 + D, *q2 = q1 + D, *q3 = q2 + D;
      for (int64_t d = 0; d < D; ++d) {
        const auto kv = hn::LoadU(dv, kc + d * ld);
        a0 = hn::Add(a0, hn::Mul(hn::Set(dv, q0[d]), kv));
        a1 = hn::Add(a1, hn::Mul(hn::Set(dv, q1[d]), kv));
        a2 = hn::Add(a2, hn::Mul(hn::Set(dv, q2[d]), kv));
        a3 = hn::Add(a3, hn::Mul(hn::Set(dv, q3[d]), kv));
      }
      hn::StoreU(a0, dv, S + h * n + j), hn::StoreU(a1, dv, S + (h + 1) * n + j);
      hn::StoreU(a2, dv, S + (h + 2) * n + j), hn::StoreU(a3, dv, S + (h + 3) * n + j);
    }
    for (; h < H; ++h) {
      auto acc = hn::Zero(dv);
      for (int64_t d = 0; d < D; ++d) acc = hn::Add(acc, hn::Mul(hn::Set(dv, q[h * D + d]), hn::LoadU(dv, kc + d * ld)));
      hn::StoreU(acc, dv, S + h * n + j);
    }
  }
  for (; j < n; ++j)
    for (int64_t h = 0; h < H; ++h) {
      double acc = 0.0;
      for (int64_t d = 0; d < D; ++d) acc += q[h * D + d] * kT[d * ld + lo + j];
      S[h * n + j] = acc;
    }
}

// P[h * n + i] = dot8(q[h, :], kvT[:, i]) * scale for h < h_q, i < n (q [h_q][d_qk], kvT [d_qk][n]):
// eight partial sums per lane, folded as ref's dot8. Key chunks outside, heads inside.
void TeacherLogits(const double* q, int64_t h_q, const double* kvT, int64_t n, int64_t d_qk, double scale, double* P) {
  const hn::ScalableTag<double> dv;
  const int64_t N = int64_t(hn::Lanes(dv));
  int64_t i = 0;
  for (; i + N <= n; i += N)
    for (int64_t h = 0; h < h_q; ++h) {
      const double* qh = q + h * d_qk;
      hn::Vec<decltype(dv)> part[8];
      for (auto& v : part) v = hn::Zero(dv);
      for (int64_t d = 0; d < d_qk; ++d)
        part[d % 8] = hn::Add(part[d % 8], hn::Mul(hn::Set(dv, qh[d]), hn::LoadU(dv, kvT + d * n + i)));
      const auto dot = hn::Add(hn::Add(hn::Add(part[0], part[4]), hn::Add(part[2], part[6])),
                               hn::Add(hn::Add(part[1], part[5]), hn::Add(part[3], part[7])));
      hn::StoreU(hn::Mul(dot, hn::Set(dv, scale)), dv, P + h * n + i);
    }
  for (; i < n; ++i)
    for (int64_t h = 0; h < h_q; ++h) {
      double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t d = 0; d < d_qk; ++d) part[d % 8] += q[h * d_qk + d] * kvT[d * n + i];
      P[h * n + i] = (((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]))) * scale;
    }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cmath>
#include <limits>

#include "ref/numerics.h"
#include "simd/simd.h"

namespace indexshare::simd {

HWY_EXPORT(AddScaled);
HWY_EXPORT(HeadScores);
HWY_EXPORT(TeacherLogits);

namespace {

using ref::train::IndexerLossOut;
using ref::train::detail::LossContext;

// One teacher layer's normalized p over R (ref's teacher_row): the dots in lanes, the sums in order.
std::vector<double> teacher_row(const ref::train::TeacherLayer& L, int64_t t, const std::vector<int64_t>& R) {
  const int64_t h_q = L.q->dim(1), d_qk = L.q->dim(2), n = int64_t(R.size());
  std::vector<double> acc(R.size(), 0.0);
  if (R.empty()) return acc;
  std::vector<double> kvT(static_cast<size_t>(d_qk * n)), qd(static_cast<size_t>(h_q * d_qk)),
      Pall(static_cast<size_t>(h_q * n)), P(R.size()), x(R.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < d_qk; ++d) kvT[size_t(d * n + i)] = double(bf16_to_f32(L.kv->at(R[size_t(i)], 0, d)));
  for (int64_t i = 0; i < h_q * d_qk; ++i) qd[size_t(i)] = bf16_to_f32(L.q->at(t, i / d_qk, i % d_qk));
  HWY_DYNAMIC_DISPATCH(TeacherLogits)(qd.data(), h_q, kvT.data(), n, d_qk, double(L.scale), Pall.data());
  for (int64_t h = 0; h < h_q; ++h) {
    std::copy(Pall.begin() + h * n, Pall.begin() + (h + 1) * n, P.begin());
    double m = -std::numeric_limits<double>::infinity();
    for (double v : P) m = std::max(m, v);
    for (size_t i = 0; i < R.size(); ++i) x[i] = P[i] - m;
    simd::exp_portable(x.data(), P.data(), n);
    double l = 0.0;
    for (double v : P) l += v;
    double mass = 1.0;
    if (L.non_compressed_lse) {
      const double lse_r = m + std::log(l);
      mass = indexshare::exp_portable(lse_r - ref::train::detail::logaddexp(double(L.non_compressed_lse->at(t, h)), lse_r));
    }
    for (size_t i = 0; i < R.size(); ++i) acc[i] += (P[i] / l) * mass;
  }
  double sum = 0.0;
  for (double a : acc) sum += a;
  const double denom = L.non_compressed_lse ? (sum > 0.0 ? sum : 1.0) : std::max(sum, 1e-10);
  for (double& a : acc) a /= denom;
  return acc;
}

// ref's loss_row for row t, with the head scores of the whole window from one lane kernel call.
void loss_row(LossContext& c, const std::vector<double>& kT, int64_t t, IndexerLossOut& out) {
  const int64_t H = c.H, D = c.D, s_kv = c.s_kv, lo = (*c.ks)[t], W = (*c.ke)[t] - lo;
  if (W <= 0) return;
  std::vector<double> S(static_cast<size_t>(H * W)), I(static_cast<size_t>(W));
  HWY_DYNAMIC_DISPATCH(HeadScores)(&c.q[size_t(t * H * D)], kT.data(), s_kv, lo, lo + W, H, D, S.data());
  for (int64_t j = 0; j < W; ++j) {
    double acc = 0.0;
    for (int64_t h = 0; h < H; ++h) {
      const double dot = S[size_t(h * W + j)];
      const double term = c.w[size_t(t * H + h)] * (c.o.relu ? (dot > 0.0 ? dot : 0.0) : dot);
      acc = acc + term;
    }
    I[size_t(j)] = acc;
    out.scores.at(t, lo + j) = float(acc);
  }
  const std::vector<int64_t>& R = c.rows[size_t(t)];
  if (R.empty()) return;
  std::vector<std::vector<double>> p_each(1, teacher_row((*c.teachers)[0], t, R));
  std::vector<double> p = p_each[0];
  if (c.o.target == ref::train::Target::served_layers) {
    for (size_t j = 1; j < c.teachers->size(); ++j) {
      p_each.push_back(teacher_row((*c.teachers)[j], t, R));
      for (size_t i = 0; i < R.size(); ++i) p[i] += p_each[j][i];
    }
    for (double& v : p) v /= double(c.teachers->size());
  }
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t s : R) m = std::max(m, I[size_t(s - lo)]);
  std::vector<double> x(R.size()), e(R.size());
  for (size_t i = 0; i < R.size(); ++i) x[i] = I[size_t(R[i] - lo)] - m;
  simd::exp_portable(x.data(), e.data(), int64_t(R.size()));
  double l = 0.0;
  for (double v : e) l += v;
  const double lse = m + std::log(l);
  ref::train::detail::kl_and_d_scores(c, t, I.data(), lo, p, e, l, lse, out);
  ref::train::detail::apply_kl_form(c, t, p_each, p, out);
  std::vector<double> dq(static_cast<size_t>(D));
  for (int64_t h = 0; h < H; ++h) {
    const double wh = c.w[size_t(t * H + h)];
    double dw = 0.0;
    std::fill(dq.begin(), dq.end(), 0.0);
    for (size_t i = 0; i < R.size(); ++i) {
      const double Sv = S[size_t(h * W + (R[i] - lo))], dI = c.dI[size_t(t * s_kv + R[i])];
      dw += dI * (c.o.relu ? (Sv > 0.0 ? Sv : 0.0) : Sv);
      const double dS = (!c.o.relu || Sv > 0.0) ? dI * wh : 0.0;
      HWY_DYNAMIC_DISPATCH(AddScaled)(dq.data(), dS, &c.k[size_t(R[i] * D)], D);
    }
    out.dw.at(t, h) = float(dw);
    for (int64_t d = 0; d < D; ++d) out.dq.at(t, h, d) = float(dq[size_t(d)]);
  }
}

// ref's dk_keys for the key rows [s_begin, s_end), the terms added across D in lanes.
void dk_block(const LossContext& c, const std::vector<double>& kT, int64_t s_begin, int64_t s_end,
              IndexerLossOut& out) {
  const int64_t H = c.H, D = c.D, n = s_end - s_begin;
  std::vector<double> acc(static_cast<size_t>(n * D), 0.0), S(static_cast<size_t>(H * n));
  for (int64_t t = 0; t < c.s_q; ++t) {
    const std::vector<int64_t>& R = c.rows[size_t(t)];
    auto it = std::lower_bound(R.begin(), R.end(), s_begin);
    if (it == R.end() || *it >= s_end) continue;
    if (c.o.relu) HWY_DYNAMIC_DISPATCH(HeadScores)(&c.q[size_t(t * H * D)], kT.data(), c.s_kv, s_begin, s_end, H, D, S.data());
    for (; it != R.end() && *it < s_end; ++it) {
      const int64_t s = *it;
      const double dI = c.dI[size_t(t * c.s_kv + s)];
      for (int64_t h = 0; h < H; ++h) {
        if (c.o.relu && !(S[size_t(h * n + (s - s_begin))] > 0.0)) continue;
        const double dS = dI * c.w[size_t(t * H + h)];
        HWY_DYNAMIC_DISPATCH(AddScaled)(&acc[size_t((s - s_begin) * D)], dS, &c.q[size_t((t * H + h) * D)], D);
      }
    }
  }
  for (int64_t s = s_begin; s < s_end; ++s)
    for (int64_t d = 0; d < D; ++d) out.dk.at(s, d) = float(acc[size_t((s - s_begin) * D + d)]);
}

IndexerLossOut run(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w, const Tensor<int32_t>& ks,
                   const Tensor<int32_t>& ke, const Tensor<int32_t>* topk,
                   const std::vector<ref::train::TeacherLayer>& teachers, const ref::train::IndexerLossOptions& o) {
  IndexerLossOut out;
  LossContext c = ref::train::detail::prepare(q, k, w, ks, ke, topk, teachers, o, out);
  std::vector<double> kT(static_cast<size_t>(c.D * c.s_kv));  // k transposed: [D][s_kv]
  for (int64_t s = 0; s < c.s_kv; ++s)
    for (int64_t d = 0; d < c.D; ++d) kT[size_t(d * c.s_kv + s)] = c.k[size_t(s * c.D + d)];
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < c.s_q; ++t) loss_row(c, kT, t, out);
  constexpr int64_t kKeyBlock = 32;
  const int64_t blocks = (c.s_kv + kKeyBlock - 1) / kKeyBlock;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < blocks; ++b) dk_block(c, kT, b * kKeyBlock, std::min(c.s_kv, (b + 1) * kKeyBlock), out);
  ref::train::detail::finish(c, out);
  return out;
}

}  // namespace

ref::train::IndexerLossOut indexer_loss(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w,
                                        const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                                        const Tensor<int32_t>* topk,
                                        const std::vector<ref::train::TeacherLayer>& teachers,
                                        const ref::train::IndexerLossOptions& o) {
  return run(q, k, w, ks, ke, topk, teachers, o);
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
