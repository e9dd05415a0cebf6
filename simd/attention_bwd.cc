// indexshare simd/: the sparse attention backward with ref/train/attention_bwd.cc's operations, so the
// outputs equal ref's bit for bit on every target and thread count.
//
//   lists    the valid kv rows of every query row, sorted ascending (ref's lists), built once
//   phase 1  OpenMP over chunks of query rows (each (t, h) writes only its own out, lse, Delta, P,
//            dS and dq): the logits by an 8-part dot with the accumulator lanes holding ref's parts
//            (bf16 x bf16 products are exact, so the lanes' adds are ref's adds), the softmax with
//            ref's scalar exp_portable and log, O as one fused multiply-add per term in lanes over
//            columns (std::fma per lane where the target has no FMA), Delta as an 8-part dot of O
//            (double) and dO with a multiply then an add per term, as ref, and dq with lanes over
//            columns, list positions ascending, a multiply then an add (ref's order per column)
//   phase 2  dkv is a scatter: an inverted index (per kv row j, the (t, first list position,
//            occurrences) groups, t ascending, built serially) turns it into a gather, and OpenMP
//            splits the kv rows; each row sums its contributions t ascending, heads ascending,
//            occurrences ascending, in lanes over columns: ref's order for that row. No atomics.
//   d_sink   a serial loop over t per head, as ref.

#ifndef INDEXSHARE_SIMD_ATTENTION_BWD_STATE_
#define INDEXSHARE_SIMD_ATTENTION_BWD_STATE_
#include <cstdint>
#include <vector>

namespace indexshare::simd::detail {
// What the two phases share (plain data; shapes checked by the caller).
struct BackwardState {
  const uint16_t *q = nullptr, *kv = nullptr, *d_out = nullptr;
  const int32_t *indices = nullptr, *topk_length = nullptr;
  const float* sink = nullptr;
  int64_t s_q = 0, h_q = 0, d_qk = 0, s_kv = 0, d_v = 0, topk = 0;
  double sm_scale = 0;
  std::vector<int64_t> rows, row_off;  // row t's sorted valid kv rows: rows[row_off[t], row_off[t + 1])
  std::vector<double> p, ds;           // (t, h, list position i) at row_off[t] * h_q + h * n_t + i
  std::vector<double> delta, omf;      // [s_q * h_q]: Delta and 1 - f
  struct Group {
    int64_t t, i0, count;  // row t's list positions [i0, i0 + count) hold kv row j
  };
  std::vector<int64_t> inv_off;  // kv row j's groups: inv[inv_off[j], inv_off[j + 1])
  std::vector<Group> inv;
  float *out = nullptr, *lse = nullptr, *delta_out = nullptr, *p_out = nullptr, *ds_out = nullptr;
  float *dq = nullptr, *dkv = nullptr;
};
}  // namespace indexshare::simd::detail
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/attention_bwd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ref/numerics.h"
#include "simd/common.h"
#include "simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace bwd {
using DF64 = hn::ScalableTag<double>;
using VF64 = hn::Vec<DF64>;
static_assert(HWY_MAX_BYTES / sizeof(double) <= 8, "more than 8 double lanes");

// N bf16 codes -> N doubles (exact).
HWY_INLINE VF64 LoadBf16(const uint16_t* HWY_RESTRICT src) {
  const DF64 d;
  const hn::Rebind<uint16_t, DF64> d16;
  const hn::Rebind<uint32_t, DF64> d32;
  const hn::Rebind<float, DF64> df32;
  return hn::PromoteTo(d, hn::BitCast(df32, hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, src)))));
}
HWY_INLINE VF64 LoadAny(const uint16_t* src) { return LoadBf16(src); }
HWY_INLINE VF64 LoadAny(const double* src) { return hn::LoadU(DF64(), src); }
HWY_INLINE double Scalar(uint16_t v) { return detail::bf16_to_double(v); }
HWY_INLINE double Scalar(double v) { return v; }

// ref's dot8: part r sums a[e] * b[e] over e = r (mod 8) ascending, a multiply then an add; lane l
// of accumulator v holds part v * N + l; the tail past the last whole 8 goes to the stored parts.
template <class TA>
HWY_INLINE double Dot8(const TA* HWY_RESTRICT a, const uint16_t* HWY_RESTRICT b, int64_t n) {
  const DF64 d;
  const size_t N = hn::Lanes(d), A = 8 / N;
  VF64 acc[8];
  for (size_t v = 0; v < A; ++v) acc[v] = hn::Zero(d);
  const int64_t full = n / 8 * 8;
  for (int64_t e = 0; e < full; e += 8)
    for (size_t v = 0; v < A; ++v) {
      const int64_t o = e + int64_t(v * N);
      acc[v] = hn::Add(acc[v], hn::Mul(LoadAny(a + o), LoadBf16(b + o)));
    }
  HWY_ALIGN double part[8];
  for (size_t v = 0; v < A; ++v) hn::Store(acc[v], d, part + v * N);
  for (int64_t e = full; e < n; ++e) part[e % 8] += Scalar(a[e]) * Scalar(b[e]);
  return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
}

// acc[c] += a * x[c] for c < n (a multiply then an add, as ref).
HWY_INLINE void Axpy(double* HWY_RESTRICT acc, double a, const uint16_t* HWY_RESTRICT x, int64_t n) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const VF64 va = hn::Set(d, a);
  int64_t c = 0;
  for (; c + N <= n; c += N) hn::StoreU(hn::Add(hn::LoadU(d, acc + c), hn::Mul(va, LoadBf16(x + c))), d, acc + c);
  for (; c < n; ++c) acc[c] += a * detail::bf16_to_double(x[c]);
}

// acc[c] = fma(a, x[c], acc[c]) for c < n (ref's std::fma).
HWY_INLINE void FmaAxpy(double* HWY_RESTRICT acc, double a, const uint16_t* HWY_RESTRICT x, int64_t n) {
  int64_t c = 0;
#if HWY_NATIVE_FMA
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const VF64 va = hn::Set(d, a);
  for (; c + N <= n; c += N) hn::StoreU(hn::MulAdd(va, LoadBf16(x + c), hn::LoadU(d, acc + c)), d, acc + c);
#endif
  for (; c < n; ++c) acc[c] = std::fma(a, detail::bf16_to_double(x[c]), acc[c]);
}
}  // namespace bwd

// Phase 1 for query rows [t0, t1): ref's head_backward per (t, h), and ref's per-slot P and dS.
void BackwardRows(detail::BackwardState* sp, int64_t t0, int64_t t1) {
  detail::BackwardState& s = *sp;
  const int64_t d_qk = s.d_qk, d_v = s.d_v, h_q = s.h_q, topk = s.topk;
  std::vector<double> e, od(static_cast<size_t>(d_v)), acc(static_cast<size_t>(std::max(d_qk, d_v)));
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t* rows = s.rows.data() + s.row_off[size_t(t)];
    const int64_t n = s.row_off[size_t(t + 1)] - s.row_off[size_t(t)];
    e.resize(size_t(n));
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t th = t * h_q + h;
      double* p = s.p.data() + s.row_off[size_t(t)] * h_q + h * n;
      double* ds = s.ds.data() + s.row_off[size_t(t)] * h_q + h * n;
      const uint16_t* qr = s.q + th * d_qk;
      const uint16_t* dor = s.d_out + th * d_v;
      float* dq = s.dq + th * d_qk;
      if (n == 0) {
        std::fill(s.out + th * d_v, s.out + (th + 1) * d_v, 0.0f);
        std::fill(dq, dq + d_qk, 0.0f);
        s.lse[th] = std::numeric_limits<float>::infinity();
        s.delta_out[th] = 0.0f;
        s.delta[size_t(th)] = s.omf[size_t(th)] = 0.0;
      } else {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < n; ++i) {
          e[size_t(i)] = bwd::Dot8(qr, s.kv + rows[i] * d_qk, d_qk) * s.sm_scale;
          m = std::max(m, e[size_t(i)]);
        }
        double l = 0.0;
        for (int64_t i = 0; i < n; ++i) l += (e[size_t(i)] = indexshare::exp_portable(e[size_t(i)] - m));
        const double lse = m + std::log(l);
        double factor = 1.0 / l, f = 1.0;
        if (s.sink) factor *= (f = 1.0 / (1.0 + indexshare::exp_portable(double(s.sink[h]) - lse)));
        std::fill(acc.begin(), acc.begin() + d_v, 0.0);
        for (int64_t i = 0; i < n; ++i) bwd::FmaAxpy(acc.data(), e[size_t(i)], s.kv + rows[i] * d_qk, d_v);
        for (int64_t c = 0; c < d_v; ++c) {
          od[size_t(c)] = acc[size_t(c)] * factor;
          s.out[th * d_v + c] = float(od[size_t(c)]);
        }
        const double delta = bwd::Dot8(od.data(), dor, d_v);
        for (int64_t i = 0; i < n; ++i) {
          p[i] = e[size_t(i)] * factor;
          ds[i] = p[i] * (bwd::Dot8(dor, s.kv + rows[i] * d_qk, d_v) - delta);
        }
        std::fill(acc.begin(), acc.begin() + d_qk, 0.0);
        for (int64_t i = 0; i < n; ++i) bwd::Axpy(acc.data(), ds[i], s.kv + rows[i] * d_qk, d_qk);
        for (int64_t d = 0; d < d_qk; ++d) dq[d] = float(s.sm_scale * acc[size_t(d)]);
        s.lse[th] = float(lse);
        s.delta_out[th] = float(delta);
        s.delta[size_t(th)] = delta;
        s.omf[size_t(th)] = 1.0 - f;
      }
      // P and dS per slot (ref's per_slot).
      const int64_t len = s.topk_length ? s.topk_length[t] : topk;
      for (int64_t j = 0; j < topk; ++j) {
        const int64_t i = s.indices[t * topk + j];
        const int64_t* it = std::lower_bound(rows, rows + n, i);
        const bool valid = j < len && it != rows + n && *it == i;
        s.p_out[th * topk + j] = valid ? float(p[it - rows]) : 0.0f;
        s.ds_out[th * topk + j] = valid ? float(ds[it - rows]) : 0.0f;
      }
    }
  }
}

// Phase 2 for kv rows [j0, j1): dkv[j] from its groups, ref's order for that row.
void BackwardKvRows(const detail::BackwardState* sp, int64_t j0, int64_t j1) {
  const detail::BackwardState& s = *sp;
  const int64_t d_qk = s.d_qk, d_v = s.d_v, h_q = s.h_q;
  std::vector<double> ak(static_cast<size_t>(d_qk)), av(static_cast<size_t>(d_v));
  for (int64_t j = j0; j < j1; ++j) {
    std::fill(ak.begin(), ak.end(), 0.0);
    std::fill(av.begin(), av.end(), 0.0);
    for (int64_t g = s.inv_off[size_t(j)]; g < s.inv_off[size_t(j + 1)]; ++g) {
      const detail::BackwardState::Group& grp = s.inv[size_t(g)];
      const int64_t n = s.row_off[size_t(grp.t + 1)] - s.row_off[size_t(grp.t)];
      const int64_t base = s.row_off[size_t(grp.t)] * h_q;
      for (int64_t h = 0; h < h_q; ++h) {
        const int64_t th = grp.t * h_q + h;
        for (int64_t o = 0; o < grp.count; ++o) {
          const size_t idx = size_t(base + h * n + grp.i0 + o);
          bwd::Axpy(ak.data(), s.ds[idx], s.q + th * d_qk, d_qk);
          bwd::Axpy(av.data(), s.p[idx], s.d_out + th * d_v, d_v);
        }
      }
    }
    float* out = s.dkv + j * d_qk;
    for (int64_t d = 0; d < d_qk; ++d) {
      const double kpart = s.sm_scale * ak[size_t(d)];
      out[d] = float(d < d_v ? kpart + av[size_t(d)] : kpart);
    }
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace indexshare::simd {

HWY_EXPORT(BackwardRows);
HWY_EXPORT(BackwardKvRows);

namespace {

// The sorted valid lists of every query row (ref's), and the inverted index of phase 2.
void build_lists(detail::BackwardState& s) {
  s.row_off.assign(size_t(s.s_q + 1), 0);
  for (int64_t t = 0; t < s.s_q; ++t) {
    const int64_t len = s.topk_length ? s.topk_length[t] : s.topk;
    const size_t first = s.rows.size();
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = s.indices[t * s.topk + j];
      if (0 <= i && i < s.s_kv) s.rows.push_back(i);
    }
    std::sort(s.rows.begin() + int64_t(first), s.rows.end());
    s.row_off[size_t(t + 1)] = int64_t(s.rows.size());
  }
  // Groups of equal kv rows per list (a duplicate's occurrences are adjacent), counted then placed,
  // t ascending within each kv row.
  std::vector<int64_t> count(size_t(s.s_kv + 1), 0);
  const auto for_groups = [&](auto&& fn) {
    for (int64_t t = 0; t < s.s_q; ++t)
      for (int64_t i = s.row_off[size_t(t)]; i < s.row_off[size_t(t + 1)];) {
        int64_t e = i + 1;
        while (e < s.row_off[size_t(t + 1)] && s.rows[size_t(e)] == s.rows[size_t(i)]) ++e;
        fn(s.rows[size_t(i)], detail::BackwardState::Group{t, i - s.row_off[size_t(t)], e - i});
        i = e;
      }
  };
  for_groups([&](int64_t j, const detail::BackwardState::Group&) { ++count[size_t(j + 1)]; });
  for (int64_t j = 0; j < s.s_kv; ++j) count[size_t(j + 1)] += count[size_t(j)];
  s.inv_off = count;
  s.inv.resize(size_t(count[size_t(s.s_kv)]));
  for_groups([&](int64_t j, const detail::BackwardState::Group& g) { s.inv[size_t(count[size_t(j)]++)] = g; });
}

}  // namespace

ref::AttentionBackwardOut sparse_attention_backward(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                    const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                    const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                    const Tensor<float>* attn_sink) {
  ref::check_attention_backward_inputs(q, kv, indices, d_v, d_out, topk_length, attn_sink);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0), topk = indices.dim(2);
  ref::AttentionBackwardOut o{Tensor<float>({s_q, h_q, d_v}),   Tensor<float>({s_q, h_q}),
                              Tensor<float>({s_q, h_q}),        Tensor<float>({s_q, h_q, topk}),
                              Tensor<float>({s_q, h_q, topk}),  Tensor<float>({s_q, h_q, d_qk}),
                              Tensor<bf16_t>({s_q, h_q, d_qk}), Tensor<float>({s_kv, 1, d_qk}),
                              Tensor<bf16_t>({s_kv, 1, d_qk}),  Tensor<float>({attn_sink ? h_q : 0})};
  detail::BackwardState s;
  s.q = reinterpret_cast<const uint16_t*>(q.ptr());
  s.kv = reinterpret_cast<const uint16_t*>(kv.ptr());
  s.d_out = reinterpret_cast<const uint16_t*>(d_out.ptr());
  s.indices = indices.ptr();
  s.topk_length = topk_length ? topk_length->ptr() : nullptr;
  s.sink = attn_sink ? attn_sink->ptr() : nullptr;
  s.s_q = s_q, s.h_q = h_q, s.d_qk = d_qk, s.s_kv = s_kv, s.d_v = d_v, s.topk = topk;
  s.sm_scale = double(sm_scale);
  s.out = o.out.ptr(), s.lse = o.lse.ptr(), s.delta_out = o.delta.ptr(), s.p_out = o.p.ptr(), s.ds_out = o.ds.ptr();
  s.dq = o.dq.ptr(), s.dkv = o.dkv.ptr();
  build_lists(s);
  s.p.assign(size_t(s.row_off[size_t(s_q)] * h_q), 0.0);
  s.ds.assign(s.p.size(), 0.0);
  s.delta.assign(size_t(s_q * h_q), 0.0);
  s.omf.assign(size_t(s_q * h_q), 0.0);
  // Phase 1 over chunks of query rows, phase 2 over chunks of kv rows: independent outputs only.
  const int threads = omp_get_max_threads();
  const int64_t rq = detail::chunk_rows(s_q, 8, threads), cq = (s_q + rq - 1) / rq;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < cq; ++c) HWY_DYNAMIC_DISPATCH(BackwardRows)(&s, c * rq, std::min(s_q, (c + 1) * rq));
  const int64_t rk = detail::chunk_rows(s_kv, 64, threads), ck = (s_kv + rk - 1) / rk;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < ck; ++c) HWY_DYNAMIC_DISPATCH(BackwardKvRows)(&s, c * rk, std::min(s_kv, (c + 1) * rk));
  if (attn_sink)
    for (int64_t h = 0; h < h_q; ++h) {
      double acc = 0.0;
      for (int64_t t = 0; t < s_q; ++t)
        if (s.row_off[size_t(t + 1)] > s.row_off[size_t(t)]) acc -= s.omf[size_t(t * h_q + h)] * s.delta[size_t(t * h_q + h)];
      o.d_sink[h] = float(acc);
    }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < o.dq.numel(); ++i) o.dq_bf16[i] = f32_to_bf16(o.dq[i]);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < o.dkv.numel(); ++i) o.dkv_bf16[i] = f32_to_bf16(o.dkv[i]);
  return o;
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
