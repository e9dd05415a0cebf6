// indexshare simd/: cmp::attention_backward_bounds (ref/train/attention_bwd.h), the per-element
// bounds of a sparse MLA backward's dq and dkv, with ref's bits on every target and thread count.
//
// ref runs per (query row t, head h, valid slot i), each sum sequential in a fixed order. Here the
// query rows run in chunks, ascending (the per-slot terms exist for one chunk only):
//   phase 1  OpenMP over the chunk's rows; per row, every head at once in double lanes: |q[t]| and
//            |dO[t]| transposed to [d][h]; per slot its kv row decoded once, then m_i = sum_d |q_d
//            k_d| and a_i = sum_c |dO_c k_c| (d, c ascending: ref's order per head); G, b, epsP and
//            eDelta per head and E_i per (slot, head) in ref's scalar expressions; dq's two sums over
//            the slots (ascending) in lanes over columns, a block of columns at a time
//   phase 2  OpenMP over blocks of dkv columns (each block owns its columns of every kv row): the
//            chunk's rows ascending, then heads, then slots, as ref's loops, add sm E_i |q_c| + epsP
//            P_i |dO_c| and sm |dS_i| |q_c| + P_i |dO_c| in lanes over columns (a Mul, a Mul, an
//            Add, never fused, as ref's expression)
//   end      the dkv bounds per element, ref's expression.
// Every lane holds one of ref's sums in its order, so the threads and the vector width never change
// a bit.

#ifndef INDEXSHARE_SIMD_ATTENTION_BWD_BOUNDS_STATE_
#define INDEXSHARE_SIMD_ATTENTION_BWD_BOUNDS_STATE_
#include <cstdint>
#include <vector>

#include "ref/tensor.h"

namespace indexshare::simd::detail {
// What the phases share (shapes checked by the caller).
struct BackwardBoundsState {
  const bf16_t *q = nullptr, *kv = nullptr, *d_out = nullptr;
  const float *p = nullptr, *ds = nullptr, *out = nullptr, *dq = nullptr;
  int64_t s_q = 0, h_q = 0, d_qk = 0, s_kv = 0, d_v = 0, topk = 0;
  int64_t dpad = 0;  // d_qk rounded up to a multiple of 8: the row stride of kv_err / kv_mag
  double sm = 0;
  bool from_bf16_out = false;
  // The present chunk, rows [c0, c1): row t's valid slots at [off[t - c0], off[t - c0 + 1]) of
  // slot_j (its list position) and slot_r (its kv row); per slot and head, sm E_i and sm |dS_i| at
  // [slot * h_q + h] of se and sd; per row and head, epsP at eps[(t - c0) * h_q + h].
  int64_t c0 = 0, c1 = 0;
  std::vector<int64_t> off, slot_j, slot_r;
  std::vector<double> se, sd, eps;
  std::vector<double> kv_err, kv_mag;  // dkv's two sums, [s_kv, dpad]
  float* dq_bound = nullptr;           // [s_q, h_q, d_qk]
};
}  // namespace indexshare::simd::detail
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/attention_bwd_bounds.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cmath>

#include "hwy/aligned_allocator.h"
#include "ref/bounds.h"
#include "ref/numerics.h"
#include "ref/train/attention_bwd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace bwd_bounds {

constexpr int64_t kDqCols = 64;  // dq's columns per block (its accumulators: 2 x h_q x 64 doubles)

inline double val(bf16_t x) { return std::fabs(double(bf16_to_f32(x))); }

}  // namespace bwd_bounds

// Phase 1 for query row t of the chunk.
void BoundsRow(detail::BackwardBoundsState* sp, int64_t t) {
  using bwd_bounds::val;
  detail::BackwardBoundsState& s = *sp;
  const hn::ScalableTag<double> d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = s.h_q, d_qk = s.d_qk, d_v = s.d_v, topk = s.topk;
  const int64_t hs = (h_q + N - 1) / N * N, cs = (bwd_bounds::kDqCols + N - 1) / N * N;
  const double u = std::ldexp(1.0, -8), e = std::ldexp(1.0, -24), sm = s.sm;
  const int64_t r0 = s.off[size_t(t - s.c0)], n_slots = s.off[size_t(t - s.c0 + 1)] - r0;
  const double n = double(n_slots);
  auto qa = hwy::AllocateAligned<double>(size_t(d_qk * hs));  // |q[t, h, d]| at [d * hs + h]
  auto da = hwy::AllocateAligned<double>(size_t(d_v * hs));   // |dO[t, h, c]| at [c * hs + h]
  auto ka = hwy::AllocateAligned<double>(size_t(std::max(d_qk, cs)));
  auto mv = hwy::AllocateAligned<double>(size_t(hs));
  auto av = hwy::AllocateAligned<double>(size_t(std::max<int64_t>(1, n_slots) * hs));  // a_i per (slot, head)
  std::fill(qa.get(), qa.get() + d_qk * hs, 0.0);
  std::fill(da.get(), da.get() + d_v * hs, 0.0);
  for (int64_t h = 0; h < h_q; ++h) {
    for (int64_t c = 0; c < d_qk; ++c) qa[size_t(c * hs + h)] = val(s.q[(t * h_q + h) * d_qk + c]);
    for (int64_t c = 0; c < d_v; ++c) da[size_t(c * hs + h)] = val(s.d_out[(t * h_q + h) * d_v + c]);
  }
  std::vector<double> g(size_t(h_q), 0.0), eps_p(static_cast<size_t>(h_q)), e_delta(static_cast<size_t>(h_q));
  for (int64_t i = 0; i < n_slots; ++i) {
    const bf16_t* k = s.kv + s.slot_r[size_t(r0 + i)] * d_qk;
    for (int64_t c = 0; c < d_qk; ++c) ka[size_t(c)] = val(k[c]);
    for (int64_t h0 = 0; h0 < hs; h0 += N) {
      auto m = hn::Zero(d), a = hn::Zero(d);
      int64_t c = 0;
      for (; c < d_v; ++c) {
        const auto kc = hn::Set(d, ka[size_t(c)]);
        m = hn::Add(m, hn::Mul(hn::Load(d, qa.get() + c * hs + h0), kc));
        a = hn::Add(a, hn::Mul(hn::Load(d, da.get() + c * hs + h0), kc));
      }
      for (; c < d_qk; ++c) m = hn::Add(m, hn::Mul(hn::Load(d, qa.get() + c * hs + h0), hn::Set(d, ka[size_t(c)])));
      hn::Store(m, d, mv.get() + h0);
      hn::Store(a, d, av.get() + i * hs + h0);
    }
    for (int64_t h = 0; h < h_q; ++h) g[size_t(h)] = std::max(g[size_t(h)], sm * mv[size_t(h)]);
  }
  // Per head: epsP and eDelta; per (slot, head): E_i and |dS_i| for dq, sm E_i and sm |dS_i| for
  // phase 2.
  std::vector<double> err(static_cast<size_t>(n_slots * h_q)), dsa(static_cast<size_t>(n_slots * h_q));
  for (int64_t h = 0; h < h_q; ++h) {
    const int64_t th = t * h_q + h;
    double mag_delta = 0;
    for (int64_t c = 0; c < d_v; ++c) mag_delta += std::fabs(double(s.out[th * d_v + c])) * val(s.d_out[th * d_v + c]);
    eps_p[size_t(h)] = u + 2 * double(d_qk + 2) * e * g[size_t(h)] + (n + 8) * e;
    e_delta[size_t(h)] = double(d_v + 2) * e * mag_delta + (s.from_bf16_out ? u * mag_delta : 0.0);
    s.eps[size_t((t - s.c0) * h_q + h)] = eps_p[size_t(h)];
    for (int64_t i = 0; i < n_slots; ++i) {
      const int64_t j = s.slot_j[size_t(r0 + i)];
      const double p = s.p[th * topk + j], ds = std::fabs(double(s.ds[th * topk + j]));
      const double E = (u + eps_p[size_t(h)] + e) * ds + p * (double(d_v + 2) * e * av[size_t(i * hs + h)] + e_delta[size_t(h)]);
      err[size_t(i * h_q + h)] = E;
      dsa[size_t(i * h_q + h)] = ds;
      s.se[size_t((r0 + i) * h_q + h)] = sm * E;
      s.sd[size_t((r0 + i) * h_q + h)] = sm * ds;
    }
  }
  // dq: q_err[d] = sum_i E_i |k_id|, q_mag[d] = sum_i |dS_i| |k_id| (i ascending), per head.
  auto qe = hwy::AllocateAligned<double>(size_t(h_q * cs));
  auto qm = hwy::AllocateAligned<double>(size_t(h_q * cs));
  for (int64_t c0 = 0; c0 < d_qk; c0 += bwd_bounds::kDqCols) {
    const int64_t w = std::min(bwd_bounds::kDqCols, d_qk - c0), wv = (w + N - 1) / N * N;
    std::fill(qe.get(), qe.get() + h_q * cs, 0.0);
    std::fill(qm.get(), qm.get() + h_q * cs, 0.0);
    std::fill(ka.get(), ka.get() + wv, 0.0);
    for (int64_t i = 0; i < n_slots; ++i) {
      const bf16_t* k = s.kv + s.slot_r[size_t(r0 + i)] * d_qk + c0;
      for (int64_t c = 0; c < w; ++c) ka[size_t(c)] = val(k[c]);
      for (int64_t h = 0; h < h_q; ++h) {
        const auto E = hn::Set(d, err[size_t(i * h_q + h)]), D = hn::Set(d, dsa[size_t(i * h_q + h)]);
        double* qeh = qe.get() + h * cs;
        double* qmh = qm.get() + h * cs;
        for (int64_t c = 0; c < wv; c += N) {
          const auto kc = hn::Load(d, ka.get() + c);
          hn::Store(hn::Add(hn::Load(d, qeh + c), hn::Mul(E, kc)), d, qeh + c);
          hn::Store(hn::Add(hn::Load(d, qmh + c), hn::Mul(D, kc)), d, qmh + c);
        }
      }
    }
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      for (int64_t c = 0; c < w; ++c)
        s.dq_bound[th * d_qk + c0 + c] = cmp::bound_f32(
            cmp::kBackwardMultiple * (sm * (qe[size_t(h * cs + c)] + (n + 2) * e * qm[size_t(h * cs + c)]) +
                                      u * std::fabs(double(s.dq[th * d_qk + c0 + c]))));
    }
  }
}

// Phase 2: dkv's sums on columns [c0, c1) of every kv row, over the chunk's rows.
void BoundsKvCols(detail::BackwardBoundsState* sp, int64_t c0, int64_t c1) {
  using bwd_bounds::val;
  detail::BackwardBoundsState& s = *sp;
  const hn::ScalableTag<double> d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = s.h_q, d_qk = s.d_qk, d_v = s.d_v, topk = s.topk, w = c1 - c0, wv = (w + N - 1) / N * N;
  auto qc = hwy::AllocateAligned<double>(size_t(wv));
  auto dc = hwy::AllocateAligned<double>(size_t(wv));  // |dO| on the columns < d_v, 0 past them (ref's vp = 0)
  std::fill(qc.get(), qc.get() + wv, 0.0);
  std::fill(dc.get(), dc.get() + wv, 0.0);
  for (int64_t t = s.c0; t < s.c1; ++t) {
    const int64_t r0 = s.off[size_t(t - s.c0)], r1 = s.off[size_t(t - s.c0 + 1)];
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      for (int64_t c = 0; c < w; ++c) {
        qc[size_t(c)] = val(s.q[th * d_qk + c0 + c]);
        dc[size_t(c)] = c0 + c < d_v ? val(s.d_out[th * d_v + c0 + c]) : 0.0;
      }
      const auto eps = hn::Set(d, s.eps[size_t((t - s.c0) * h_q + h)]);
      for (int64_t i = r0; i < r1; ++i) {
        const auto se = hn::Set(d, s.se[size_t(i * h_q + h)]), sd = hn::Set(d, s.sd[size_t(i * h_q + h)]);
        const auto p = hn::Set(d, double(s.p[th * topk + s.slot_j[size_t(i)]]));
        double* ke = s.kv_err.data() + s.slot_r[size_t(i)] * s.dpad + c0;
        double* km = s.kv_mag.data() + s.slot_r[size_t(i)] * s.dpad + c0;
        for (int64_t c = 0; c < wv; c += N) {
          const auto q = hn::Load(d, qc.get() + c);
          const auto vp = hn::Mul(p, hn::Load(d, dc.get() + c));
          hn::StoreU(hn::Add(hn::LoadU(d, ke + c), hn::Add(hn::Mul(se, q), hn::Mul(eps, vp))), d, ke + c);
          hn::StoreU(hn::Add(hn::LoadU(d, km + c), hn::Add(hn::Mul(sd, q), vp)), d, km + c);
        }
      }
    }
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "simd/simd.h"

namespace indexshare::simd {

HWY_EXPORT(BoundsRow);
HWY_EXPORT(BoundsKvCols);

cmp::AttentionBackwardBounds attention_backward_bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                       const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                       const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                       const ref::AttentionBackwardOut& exact, bool delta_from_bf16_out) {
  cmp::check_attention_backward_bounds_inputs(q, kv, indices, d_v, d_out, topk_length, exact);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0), topk = indices.dim(2);
  cmp::AttentionBackwardBounds b{std::vector<float>(size_t(s_q * h_q * d_qk)), std::vector<float>(size_t(s_kv * d_qk))};
  detail::BackwardBoundsState s;
  s.q = q.ptr();
  s.kv = kv.ptr();
  s.d_out = d_out.ptr();
  s.p = exact.p.ptr();
  s.ds = exact.ds.ptr();
  s.out = exact.out.ptr();
  s.dq = exact.dq.ptr();
  s.s_q = s_q, s.h_q = h_q, s.d_qk = d_qk, s.s_kv = s_kv, s.d_v = d_v, s.topk = topk;
  s.dpad = (d_qk + 7) / 8 * 8;  // phase 2's last column block stores whole vectors (at most 8 doubles)
  s.sm = double(sm_scale);
  s.from_bf16_out = delta_from_bf16_out;
  s.dq_bound = b.dq.data();
  s.kv_err.assign(size_t(s_kv * s.dpad), 0.0);
  s.kv_mag.assign(size_t(s_kv * s.dpad), 0.0);
  std::vector<int64_t> contributions(size_t(s_kv), 0);
  // Chunks of query rows whose per-slot terms (two doubles per slot and head) fit in about 64 MiB.
  const int64_t per_row = std::max<int64_t>(1, topk * h_q * 16);
  const int64_t forced = attention_backward_chunk_rows();
  const int64_t chunk = forced > 0 ? forced : std::clamp<int64_t>((int64_t(64) << 20) / per_row, 1, std::max<int64_t>(1, s_q));
  const int64_t col_blocks = (d_qk + 63) / 64;
  for (s.c0 = 0; s.c0 < s_q; s.c0 = s.c1) {
    s.c1 = std::min(s_q, s.c0 + chunk);
    s.off.assign(1, 0);
    s.slot_j.clear();
    s.slot_r.clear();
    for (int64_t t = s.c0; t < s.c1; ++t) {  // ref's slots: j < len with a valid index, ascending
      const int64_t len = topk_length ? (*topk_length)[t] : topk;
      for (int64_t j = 0; j < len; ++j)
        if (0 <= indices[t * topk + j] && indices[t * topk + j] < s_kv) {
          s.slot_j.push_back(j);
          s.slot_r.push_back(indices[t * topk + j]);
          contributions[size_t(indices[t * topk + j])] += h_q;  // ref counts every (t, h, i)
        }
      s.off.push_back(int64_t(s.slot_j.size()));
    }
    s.se.resize(s.slot_j.size() * size_t(h_q));
    s.sd.resize(s.slot_j.size() * size_t(h_q));
    s.eps.resize(size_t((s.c1 - s.c0) * h_q));
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = s.c0; t < s.c1; ++t) HWY_DYNAMIC_DISPATCH(BoundsRow)(&s, t);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t cb = 0; cb < col_blocks; ++cb)
      HWY_DYNAMIC_DISPATCH(BoundsKvCols)(&s, cb * 64, std::min(d_qk, cb * 64 + 64));
  }
  const double u = std::ldexp(1.0, -8), e = std::ldexp(1.0, -24);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < s_kv; ++r)
    for (int64_t c = 0; c < d_qk; ++c) {
      const size_t i = size_t(r * d_qk + c), k = size_t(r * s.dpad + c);
      b.dkv[i] = cmp::bound_f32(cmp::kBackwardMultiple * (s.kv_err[k] + double(contributions[size_t(r)] + 2) * e * s.kv_mag[k] +
                                                          u * std::fabs(double(exact.dkv[int64_t(i)]))));
    }
  return b;
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
