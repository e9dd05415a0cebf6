// indexshare simd/: the sparse attention backward with ref/train/attention_bwd.cc's operations, so the
// outputs equal ref's bit for bit on every target and thread count. The logits tile, the softmax
// statistics and the chain tiles are the forward's (simd/attention-inl.h, shared with
// simd/attention.cc); the dkv tiles (KvTile) are here.
//
// The query rows are processed in chunks, ascending (the double P and dS exist for one chunk only):
//   phase 1  OpenMP over the chunk's rows; per row t, all heads at once:
//            list    the valid kv rows, sorted ascending, duplicates kept (ref's list)
//            logits  q[t] and dO[t] decoded once into head tiles; per block of kDotKeys gathered,
//                    decoded kv rows, DotTile gives s_i (q, d_qk) and dP_i (dO, the block's first
//                    d_v columns) for every head: ref's 8-part dots. Kept key-major, [i][h]
//            softmax lanes over heads: the forward's max, exp_portable and l (i ascending); then per
//                    head lse and factor as ref; P_i = e_i * factor, Delta = fma chain of P_i dP_i
//                    and dS_i = P_i (dP_i - Delta), lanes over heads (ref's per-head operations)
//            dq      the forward's P.V pass (PVFromRows) with dS for P and k for V: lanes over
//                    columns, heads x vectors, i ascending, fused (ref's chain), kv gathered again
//                    a slice of columns at a time
//   phase 2  OpenMP over blocks of kv rows (no atomics): for each query row t of the chunk,
//            ascending, the positions of t's sorted list inside the block are one contiguous range;
//            q[t] and dO[t] are decoded a slice of columns at a time, and KvTile adds sum_h dS_h
//            q[t,h] into A_K and sum_h P_h dO[t,h] into A_V for kKvRows kv rows at once (h
//            ascending, fused): per element ref's order, t ascending (chunks, then rows), then h.
//            A duplicated kv row takes KvDuplicate (h, then its occurrences, as ref)
//   end      dkv = f32(sm_scale A_K + A_V), d_sink's serial loop over t per head, bf16 copies

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
  int64_t hs = 0;  // doubles per key in P and dS: h_q rounded up to 8
  double sm_scale = 0;
  bool slots = true;
  // The present chunk, rows [c0, c1): row t's list at rows[off[t - c0], off[t - c0] + n[t - c0]),
  // its P and dS at p[off * hs], ds[off * hs] (key-major, hs per key; off counts padded keys).
  int64_t c0 = 0, c1 = 0;
  std::vector<int64_t> off, n, rows;
  double *p = nullptr, *ds = nullptr;  // hs doubles per key; lanes past the kDotHeads-rounded h_q are zeroed per row
  std::vector<double> delta, omf;  // [s_q * h_q]: Delta and 1 - f
  std::vector<double> a_k, a_v;    // dkv's accumulators, [s_kv, Pad8(d_qk)] and [s_kv, Pad8(d_v)]
  float *lse = nullptr, *delta_out = nullptr, *p_out = nullptr, *ds_out = nullptr, *dq = nullptr;
};
}  // namespace indexshare::simd::detail
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/attention_bwd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/exp-inl.h"
#include "simd/attention-inl.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "ref/numerics.h"
#include "ref/train/attention_bwd.h"
#include "simd/common.h"
#include "simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace bwd {

// KvTile: kv rows x vectors of accumulators.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kKvRows = 6, kKvVecs = 4;
#else
constexpr size_t kKvRows = 2, kKvVecs = HWY_LANES(double) >= 2 ? 4 : 8;
#endif
static_assert((kKvVecs * HWY_LANES(double)) % kParts == 0, "a kv slice must be whole 8-column groups");

// acc[j][0, kVecs N) = fma(c[pos_j * cs + h], x[h * xs + same columns], acc) for h ascending in [0, h_q):
// lanes over columns, kv rows x vectors of accumulators; dkv's A_K (c = dS, x = q) and A_V (c = P,
// x = dO). std::fma per lane on targets without an FMA instruction.
template <size_t kRows, size_t kVecs>
HWY_INLINE void KvTile(const double* HWY_RESTRICT c, int64_t cs, const int64_t* HWY_RESTRICT pos,
                       const double* HWY_RESTRICT x, int64_t xs, int64_t h_q, double* const* HWY_RESTRICT acc) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
#if HWY_NATIVE_FMA
  VF64 a[kRows][kVecs];
  const double* HWY_RESTRICT cr[kRows];
  for (size_t j = 0; j < kRows; ++j) {
    cr[j] = c + pos[j] * cs;
    for (size_t u = 0; u < kVecs; ++u) a[j][u] = hn::LoadU(d, acc[j] + int64_t(u) * N);
  }
  for (int64_t h = 0; h < h_q; ++h) {
    VF64 xv[kVecs];
    for (size_t u = 0; u < kVecs; ++u) xv[u] = hn::Load(d, x + h * xs + int64_t(u) * N);
    for (size_t j = 0; j < kRows; ++j) {
      const VF64 cb = hn::Set(d, cr[j][h]);
      for (size_t u = 0; u < kVecs; ++u) a[j][u] = hn::MulAdd(cb, xv[u], a[j][u]);
    }
  }
  for (size_t j = 0; j < kRows; ++j)
    for (size_t u = 0; u < kVecs; ++u) hn::StoreU(a[j][u], d, acc[j] + int64_t(u) * N);
#else
  for (size_t j = 0; j < kRows; ++j)
    for (int64_t h = 0; h < h_q; ++h)
      for (int64_t e = 0; e < int64_t(kVecs) * N; ++e)
        acc[j][e] = std::fma(c[pos[j] * cs + h], x[h * xs + e], acc[j][e]);
#endif
}

// One duplicated kv row (list positions [i0, i0 + count)): acc[0, w) = fma(c[(i0 + o) * cs + h],
// x[h * xs + col], acc) for h ascending, then o ascending (ref's order), per column.
HWY_INLINE void KvDuplicate(const double* c, int64_t cs, int64_t i0, int64_t count, const double* x, int64_t xs,
                            int64_t h_q, int64_t w, double* acc) {
  for (int64_t e = 0; e < w; ++e) {
    double a = acc[e];
    for (int64_t h = 0; h < h_q; ++h)
      for (int64_t o = 0; o < count; ++o) a = std::fma(c[(i0 + o) * cs + h], x[h * xs + e], a);
    acc[e] = a;
  }
}

// Per head (lanes over heads, hs of them): P_i = e_i * factor in place, Delta = fma(P_i, dP_i,
// Delta) for i ascending from 0, then dS_i = P_i * (dP_i - Delta) over dP in place.
HWY_INLINE void PDeltaDs(double* HWY_RESTRICT p, double* HWY_RESTRICT ds, int64_t hs, int64_t n,
                         const double* HWY_RESTRICT factor, double* HWY_RESTRICT delta) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  for (int64_t h0 = 0; h0 < hs; h0 += N) {
    const VF64 f = hn::Load(d, factor + h0);
    VF64 acc = hn::Zero(d);
    for (int64_t i = 0; i < n; ++i) {
      const VF64 pi = hn::Mul(hn::LoadU(d, p + i * hs + h0), f);
      hn::StoreU(pi, d, p + i * hs + h0);
#if HWY_NATIVE_FMA
      acc = hn::MulAdd(pi, hn::LoadU(d, ds + i * hs + h0), acc);
#else
      HWY_ALIGN double a[kParts], x[kParts], y[kParts];
      hn::Store(acc, d, a);
      hn::Store(pi, d, x);
      hn::Store(hn::LoadU(d, ds + i * hs + h0), d, y);
      for (int64_t e = 0; e < N; ++e) a[e] = std::fma(x[e], y[e], a[e]);
      acc = hn::Load(d, a);
#endif
    }
    hn::Store(acc, d, delta + h0);
    for (int64_t i = 0; i < n; ++i) {
      double* dsi = ds + i * hs + h0;
      hn::StoreU(hn::Mul(hn::LoadU(d, p + i * hs + h0), hn::Sub(hn::LoadU(d, dsi), acc)), d, dsi);
    }
  }
}

// The scratch of one call of BackwardRows.
struct RowScratch {
  int64_t dq_pad, dv_pad, hpad;
  hwy::AlignedFreeUniquePtr<double[]> qd, dod, kbuf, acc, slice, mx, l, factor, delta;
  std::vector<int64_t> list, tmp, pos;
  RowScratch(const detail::BackwardState& s)
      : dq_pad(Pad8(s.d_qk)), dv_pad(Pad8(s.d_v)),
        hpad((s.h_q + int64_t(kDotHeads) - 1) / int64_t(kDotHeads) * int64_t(kDotHeads)) {
    const int64_t cw = int64_t(kPVVecs * hn::Lanes(DF64()));
    qd = hwy::AllocateAligned<double>(size_t(hpad * dq_pad));
    dod = hwy::AllocateAligned<double>(size_t(hpad * dv_pad));
    std::fill(qd.get(), qd.get() + hpad * dq_pad, 0.0);  // padding heads stay zero
    std::fill(dod.get(), dod.get() + hpad * dv_pad, 0.0);
    kbuf = hwy::AllocateAligned<double>(size_t(int64_t(kDotKeys) * dq_pad));
    acc = hwy::AllocateAligned<double>(size_t(s.h_q * dq_pad));
    slice = hwy::AllocateAligned<double>(size_t(PVSubRows(s.hs, cw) * cw));  // PVFromRows' slice
    for (auto* b : {&mx, &l, &factor, &delta}) *b = hwy::AllocateAligned<double>(size_t(s.hs));
  }
};

// The logits and dP of row t's n listed kv rows into p and ds ([i][h], hs per key; n rounded up
// to whole key blocks): q[t] and dO[t] in head tiles, kv rows a key block at a time.
HWY_INLINE void LogitsAndDp(const detail::BackwardState& s, int64_t t, const int64_t* rows, int64_t n, RowScratch& w,
                            double* p, double* ds) {
  const int64_t h_q = s.h_q, d_qk = s.d_qk, kb = int64_t(kDotKeys), hb = int64_t(kDotHeads);
  for (int64_t h = 0; h < h_q; ++h) {
    DecodeBf16Blocks(s.q + (t * h_q + h) * d_qk, d_qk, w.dq_pad, hb * int64_t(kParts),
                     w.qd.get() + (h / hb) * hb * w.dq_pad + (h % hb) * int64_t(kParts));
    DecodeBf16Blocks(s.d_out + (t * h_q + h) * s.d_v, s.d_v, w.dv_pad, hb * int64_t(kParts),
                     w.dod.get() + (h / hb) * hb * w.dv_pad + (h % hb) * int64_t(kParts));
  }
  for (int64_t i0 = 0; i0 < n; i0 += kb) {
    const int64_t bn = std::min(kb, n - i0);
    for (int64_t i = 0; i < kb; ++i) {
      if (i + i0 + kb < n) {  // the next block's rows, into cache
        const char* r = reinterpret_cast<const char*>(s.kv + rows[i + i0 + kb] * d_qk);
        for (int64_t b = 0; b < d_qk * 2; b += 64) hwy::Prefetch(r + b);
      }
      DecodeBf16Blocks(i < bn ? s.kv + rows[i0 + i] * d_qk : nullptr, i < bn ? d_qk : 0, w.dq_pad,
                       kb * int64_t(kParts), KeyBlockAt(w.kbuf.get(), w.dq_pad, i));
    }
    for (int64_t h0 = 0; h0 < w.hpad; h0 += hb) {
      DotTile(w.qd.get() + h0 * w.dq_pad, w.kbuf.get(), w.dq_pad, s.sm_scale, p + i0 * s.hs + h0, s.hs);
      DotTile(w.dod.get() + h0 * w.dv_pad, w.kbuf.get(), w.dv_pad, 1.0, ds + i0 * s.hs + h0, s.hs);
    }
  }
}

}  // namespace bwd

// Phase 1 for query rows [t0, t1) of the present chunk: ref's head_backward for every head, the
// per-slot P and dS (ref's per_slot), the list for phase 2.
void BackwardRows(detail::BackwardState* sp, int64_t t0, int64_t t1) {
  using namespace bwd;
  detail::BackwardState& s = *sp;
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = s.h_q, d_qk = s.d_qk, hs = s.hs, topk = s.topk;
  RowScratch w(s);
  detail::PhaseClock no_clock;  // off: PVFromRows times nothing here
  AttentionPhases no_phases;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t len = s.topk_length ? s.topk_length[t] : topk;
    w.list.clear();
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = s.indices[t * topk + j];
      if (0 <= i && i < s.s_kv) w.list.push_back(i);
    }
    SortRows(w.list, s.s_kv, w.tmp);
    const int64_t n = int64_t(w.list.size()), off = s.off[size_t(t - s.c0)];
    int64_t* rows = s.rows.data() + off;
    std::copy(w.list.begin(), w.list.end(), rows);
    double* p = s.p + off * hs;
    double* ds = s.ds + off * hs;
    if (w.hpad < hs)  // lanes no tile writes: finite for the lanes-over-heads passes
      for (int64_t i = 0; i < s.off[size_t(t - s.c0 + 1)] - off; ++i) {
        std::fill(p + i * hs + w.hpad, p + (i + 1) * hs, 0.0);
        std::fill(ds + i * hs + w.hpad, ds + (i + 1) * hs, 0.0);
      }
    float* dq = s.dq + t * h_q * d_qk;
    if (n == 0) {
      std::fill(dq, dq + h_q * d_qk, 0.0f);
      for (int64_t h = 0; h < h_q; ++h) {
        s.lse[t * h_q + h] = std::numeric_limits<float>::infinity();
        s.delta_out[t * h_q + h] = 0.0f;
        s.delta[size_t(t * h_q + h)] = s.omf[size_t(t * h_q + h)] = 0.0;
      }
    } else {
      LogitsAndDp(s, t, rows, n, w, p, ds);
      int64_t h0 = 0;
      for (; h0 + 2 * N <= hs; h0 += 2 * N) SoftmaxStats<2>(p + h0, hs, n, w.mx.get() + h0, w.l.get() + h0);
      for (; h0 < hs; h0 += N) SoftmaxStats<1>(p + h0, hs, n, w.mx.get() + h0, w.l.get() + h0);
      for (int64_t h = 0; h < hs; ++h) {
        if (h >= h_q) {
          w.factor[size_t(h)] = 0.0;
          continue;
        }
        const double lse = w.mx[size_t(h)] + std::log(w.l[size_t(h)]);
        double factor = 1.0 / w.l[size_t(h)], f = 1.0;
        if (s.sink) factor *= (f = 1.0 / (1.0 + indexshare::exp_portable(double(s.sink[h]) - lse)));
        w.factor[size_t(h)] = factor;
        s.lse[t * h_q + h] = float(lse);
        s.omf[size_t(t * h_q + h)] = 1.0 - f;
      }
      PDeltaDs(p, ds, hs, n, w.factor.get(), w.delta.get());
      for (int64_t h = 0; h < h_q; ++h) {
        s.delta[size_t(t * h_q + h)] = w.delta[size_t(h)];
        s.delta_out[t * h_q + h] = float(w.delta[size_t(h)]);
      }
      // dq = f32(sm_scale * sum_i dS_i k_i).
      std::fill(w.acc.get(), w.acc.get() + h_q * w.dq_pad, 0.0);
      PVFromRows(ds, hs, h_q, s.kv, d_qk, d_qk, rows, n, w.dq_pad, w.slice.get(), w.acc.get(), no_clock, no_phases);
      for (int64_t h = 0; h < h_q; ++h)
        for (int64_t c = 0; c < d_qk; ++c) dq[h * d_qk + c] = float(s.sm_scale * w.acc[size_t(h * w.dq_pad + c)]);
    }
    if (!s.slots) continue;
    // P and dS per slot: the slot's list position (any occurrence: they hold the same values).
    w.pos.assign(size_t(topk), -1);
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = s.indices[t * topk + j];
      const int64_t* it = std::lower_bound(rows, rows + n, i);
      if (it != rows + n && *it == i) w.pos[size_t(j)] = it - rows;
    }
    for (int64_t h = 0; h < h_q; ++h)
      for (int64_t j = 0; j < topk; ++j) {
        const int64_t ps = w.pos[size_t(j)];
        s.p_out[(t * h_q + h) * topk + j] = ps >= 0 ? float(p[ps * hs + h]) : 0.0f;
        s.ds_out[(t * h_q + h) * topk + j] = ps >= 0 ? float(ds[ps * hs + h]) : 0.0f;
      }
  }
}

namespace bwd {
// The tiles of one query row's positions [a, b) (kv rows inside the block) over one slice of
// columns [c0, c0 + w) (w a multiple of N): x holds the slice of q[t] or dO[t] (xs per head),
// c the coefficients (dS or P, [i][h]), acc the accumulator rows (ast apart).
HWY_INLINE void KvSlice(const double* c, int64_t hs, const int64_t* rows, const std::vector<int64_t>& singles,
                        const std::vector<int64_t>& dups, const double* x, int64_t xs, int64_t h_q, int64_t c0,
                        int64_t w, double* acc, int64_t ast) {
  const int64_t N = int64_t(hn::Lanes(DF64()));
  const int64_t full = int64_t(kKvVecs) * N;
  const size_t ns = singles.size();
  size_t k = 0;
  for (; k + kKvRows <= ns; k += kKvRows) {
    double* as[kKvRows];
    for (size_t j = 0; j < kKvRows; ++j) as[j] = acc + rows[singles[k + j]] * ast + c0;
    if (k + 2 * kKvRows <= ns)  // the next tile's accumulators, into cache
      for (size_t j = 0; j < kKvRows; ++j) {
        const char* r = reinterpret_cast<const char*>(acc + rows[singles[k + kKvRows + j]] * ast + c0);
        for (int64_t b = 0; b < w * 8; b += 64) hwy::Prefetch(r + b);
      }
    if (w == full) {
      KvTile<kKvRows, kKvVecs>(c, hs, &singles[k], x, xs, h_q, as);
    } else {
      for (int64_t u = 0; u < w; u += N) {
        double* a1[kKvRows];
        for (size_t j = 0; j < kKvRows; ++j) a1[j] = as[j] + u;
        KvTile<kKvRows, 1>(c, hs, &singles[k], x + u, xs, h_q, a1);
      }
    }
  }
  for (; k < ns; ++k) {
    double* a0 = acc + rows[singles[k]] * ast + c0;
    for (int64_t u = 0; u < w; u += N) {
      double* a1[1] = {a0 + u};
      KvTile<1, 1>(c, hs, &singles[k], x + u, xs, h_q, a1);
    }
  }
  for (size_t g = 0; g < dups.size(); g += 2)
    KvDuplicate(c, hs, dups[g], dups[g + 1], x, xs, h_q, w, acc + rows[dups[g]] * ast + c0);
}
}  // namespace bwd

// Phase 2 for kv rows [j0, j1): A_K and A_V of those rows from every query row of the chunk.
void BackwardKvRows(detail::BackwardState* sp, int64_t j0, int64_t j1) {
  using namespace bwd;
  detail::BackwardState& s = *sp;
  const int64_t N = int64_t(hn::Lanes(DF64()));
  const int64_t h_q = s.h_q, hs = s.hs, cw = int64_t(kKvVecs) * N;
  const int64_t dq_pad = Pad8(s.d_qk), dv_pad = Pad8(s.d_v);
  auto x = hwy::AllocateAligned<double>(size_t(h_q * cw));
  std::vector<int64_t> singles, dups;  // list positions; (first position, count) pairs
  for (int64_t t = s.c0; t < s.c1; ++t) {
    const int64_t off = s.off[size_t(t - s.c0)], n = s.n[size_t(t - s.c0)];
    const int64_t* rows = s.rows.data() + off;
    const int64_t a = std::lower_bound(rows, rows + n, j0) - rows, b = std::lower_bound(rows, rows + n, j1) - rows;
    if (a == b) continue;
    singles.clear();
    dups.clear();
    for (int64_t i = a; i < b;) {
      int64_t e = i + 1;
      while (e < b && rows[e] == rows[i]) ++e;
      if (e - i == 1) {
        singles.push_back(i);
      } else {
        dups.push_back(i);
        dups.push_back(e - i);
      }
      i = e;
    }
    // The K part (dS, q[t], all d_qk columns), then the V part (P, dO[t], d_v columns).
    for (int part = 0; part < 2; ++part) {
      const uint16_t* src = part == 0 ? s.q + t * h_q * s.d_qk : s.d_out + t * h_q * s.d_v;
      const int64_t cols = part == 0 ? s.d_qk : s.d_v, cpad = part == 0 ? dq_pad : dv_pad;
      const double* c = (part == 0 ? s.ds : s.p) + off * hs;
      double* acc = part == 0 ? s.a_k.data() : s.a_v.data();
      for (int64_t c0 = 0; c0 < cpad; c0 += cw) {
        const int64_t w = std::min(cw, cpad - c0), cn = std::min(w, cols - c0);
        for (int64_t h = 0; h < h_q; ++h) DecodeBf16Blocks(src + h * cols + c0, cn, w, int64_t(kParts), x.get() + h * cw);
        KvSlice(c, hs, rows, singles, dups, x.get(), cw, h_q, c0, w, acc, cpad);
      }
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
int64_t pad8(int64_t n) { return (n + 7) / 8 * 8; }
constexpr int64_t kMaxKeyBlock = 6;
constexpr int64_t kChunkBytes = int64_t(64) << 20;
std::atomic<int64_t> g_chunk_rows{0};  // set_attention_backward_chunk_rows
}  // namespace

void set_attention_backward_chunk_rows(int64_t rows) { g_chunk_rows.store(rows); }
int64_t attention_backward_chunk_rows() { return g_chunk_rows.load(); }

ref::AttentionBackwardOut sparse_attention_backward(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                    const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                    const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                    const Tensor<float>* attn_sink, bool slots) {
  ref::check_attention_backward_inputs(q, kv, indices, d_v, d_out, topk_length, attn_sink);
  const int64_t s_q = q.dim(0), h_q = q.dim(1), d_qk = q.dim(2), s_kv = kv.dim(0), topk = indices.dim(2);
  ref::AttentionBackwardOut o = ref::make_attention_backward_out(s_q, h_q, d_qk, topk, s_kv, attn_sink, slots);
  detail::BackwardState s;
  s.q = reinterpret_cast<const uint16_t*>(q.ptr());
  s.kv = reinterpret_cast<const uint16_t*>(kv.ptr());
  s.d_out = reinterpret_cast<const uint16_t*>(d_out.ptr());
  s.indices = indices.ptr();
  s.topk_length = topk_length ? topk_length->ptr() : nullptr;
  s.sink = attn_sink ? attn_sink->ptr() : nullptr;
  s.s_q = s_q, s.h_q = h_q, s.d_qk = d_qk, s.s_kv = s_kv, s.d_v = d_v, s.topk = topk;
  s.hs = pad8(h_q);
  s.sm_scale = double(sm_scale);
  s.slots = slots;
  s.lse = o.lse.ptr(), s.delta_out = o.delta.ptr(), s.dq = o.dq.ptr();
  s.p_out = slots ? o.p.ptr() : nullptr, s.ds_out = slots ? o.ds.ptr() : nullptr;
  s.delta.assign(size_t(s_q * h_q), 0.0);
  s.omf.assign(size_t(s_q * h_q), 0.0);
  s.a_k.assign(size_t(s_kv * pad8(d_qk)), 0.0);
  s.a_v.assign(size_t(s_kv * pad8(d_v)), 0.0);
  const int threads = omp_get_max_threads();
  // Query rows per chunk: the double P and dS of a chunk within kChunkBytes (each chunk ends in two
  // barriers, so fewer is better), at least 4 rows per thread.
  const int64_t row_bytes = std::max<int64_t>(1, (topk + kMaxKeyBlock) * s.hs * 2 * int64_t(sizeof(double)));
  const int64_t forced = g_chunk_rows.load();
  const int64_t chunk = std::max<int64_t>(
      1, std::min<int64_t>(s_q, forced > 0 ? forced : std::max<int64_t>(4 * int64_t(threads), kChunkBytes / row_bytes)));
  std::vector<int64_t> cuts, count(size_t(s_kv + 1));
  hwy::AlignedFreeUniquePtr<double[]> p_buf, ds_buf;
  int64_t pds_size = 0;
  for (s.c0 = 0; s.c0 < s_q; s.c0 = s.c1) {
    s.c1 = std::min(s_q, s.c0 + chunk);
    // Each row's list length (its padded key count places its P and dS).
    s.off.assign(size_t(s.c1 - s.c0 + 1), 0);
    s.n.assign(size_t(s.c1 - s.c0), 0);
    for (int64_t t = s.c0; t < s.c1; ++t) {
      const int64_t len = topk_length ? (*topk_length)[t] : topk;
      int64_t n = 0;
      for (int64_t j = 0; j < len; ++j) n += 0 <= indices[t * topk + j] && indices[t * topk + j] < s_kv;
      s.n[size_t(t - s.c0)] = n;
      s.off[size_t(t - s.c0 + 1)] = s.off[size_t(t - s.c0)] + (n + kMaxKeyBlock - 1) / kMaxKeyBlock * kMaxKeyBlock;
    }
    const int64_t keys = s.off.back();
    s.rows.resize(size_t(keys));
    if (keys * s.hs > pds_size) {  // uninitialised: phase 1 writes every lane it reads
      pds_size = keys * s.hs;
      p_buf = hwy::AllocateAligned<double>(size_t(pds_size));
      ds_buf = hwy::AllocateAligned<double>(size_t(pds_size));
      s.p = p_buf.get();
      s.ds = ds_buf.get();
    }
    const int64_t rows_here = s.c1 - s.c0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t r = 0; r < rows_here; ++r) HWY_DYNAMIC_DISPATCH(BackwardRows)(&s, s.c0 + r, s.c0 + r + 1);
    // Phase 2's blocks of kv rows: about 8 per thread with equal numbers of the chunk's list
    // entries (a causal selection puts them all in the first rows).
    std::fill(count.begin(), count.end(), 0);
    for (int64_t r = 0; r < rows_here; ++r)
      for (int64_t i = 0; i < s.n[size_t(r)]; ++i) ++count[size_t(s.rows[size_t(s.off[size_t(r)] + i)] + 1)];
    for (int64_t j = 0; j < s_kv; ++j) count[size_t(j + 1)] += count[size_t(j)];
    const int64_t blocks = 8 * int64_t(threads), total = count[size_t(s_kv)];
    cuts.assign(1, 0);
    for (int64_t j = 1; j < s_kv; ++j)
      if (count[size_t(j)] * blocks >= int64_t(cuts.size()) * total && count[size_t(j)] > count[size_t(cuts.back())])
        cuts.push_back(j);
    cuts.push_back(s_kv);
    const int64_t ck = int64_t(cuts.size()) - 1;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < ck; ++c) HWY_DYNAMIC_DISPATCH(BackwardKvRows)(&s, cuts[size_t(c)], cuts[size_t(c + 1)]);
  }
  const int64_t dq_pad = pad8(d_qk), dv_pad = pad8(d_v);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < s_kv; ++j)
    for (int64_t c = 0; c < d_qk; ++c) {
      const double kpart = s.sm_scale * s.a_k[size_t(j * dq_pad + c)];
      o.dkv[j * d_qk + c] = float(c < d_v ? kpart + s.a_v[size_t(j * dv_pad + c)] : kpart);
    }
  if (attn_sink)
    for (int64_t h = 0; h < h_q; ++h) {
      double acc = 0.0;
      for (int64_t t = 0; t < s_q; ++t) {
        const int64_t len = topk_length ? (*topk_length)[t] : topk;
        bool any = false;
        for (int64_t j = 0; j < len && !any; ++j) any = 0 <= indices[t * topk + j] && indices[t * topk + j] < s_kv;
        if (any) acc -= s.omf[size_t(t * h_q + h)] * s.delta[size_t(t * h_q + h)];
      }
      o.d_sink[h] = float(acc);
    }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < o.dq.numel(); ++i) o.dq_bf16[i] = f32_to_bf16(o.dq[i]);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < o.dkv.numel(); ++i) o.dkv_bf16[i] = f32_to_bf16(o.dkv[i]);
  return o;
}

ref::AttentionBackwardOut sparse_attention_backward(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                    const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                    const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                    const Tensor<float>* attn_sink) {
  return sparse_attention_backward(q, kv, indices, sm_scale, d_v, d_out, topk_length, attn_sink, true);
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
