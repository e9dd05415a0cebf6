// indexshare simd/: the oracle's own computations of ref/bounds.cc, bit-identical to ref's:
//   emulate_attention_lowp   the FlashAttention-style budget's low-precision emulation
//   attention_bounds         the per-element bounds of attention out / lse / max_logits (f32 sums
//                            inflated to upper bounds, ref/bounds.h)
//   (indexer_logits_rule, the per-element bounds of the indexer logits: simd/compare_logits.cc)
//
// Every sum of ref's is sequential (f32 or double, one rounding per term). The vector code keeps
// each sum's order by putting independent sums in the lanes, never one sum across lanes:
//   dot products (q . k)     lanes over heads (q of one query row transposed to [d][head]), each
//                            lane summing d ascending with a separate multiply and add (ref's
//                            `a += b * c` under -ffp-contract=off, or a fused multiply-add where
//                            every product is exact in f32 (ExpRange), the same bits); the bounds'
//                            pass sums q.k and |q|.|k| in the same tile of keys x head vectors
//   P.V, A_c and D_c         lanes over output columns, each lane summing i (the sorted kv rows)
//                            ascending; a tile of heads x column vectors (the bounds' A and the
//                            direction's D share one pass over V, by blocks of 32 keys, fused
//                            where their 16-bit weights' products with V are exact)
// The scalar parts (max, exp, log, the softmax sum, the per-element bound formulas) run per
// element with ref's own expressions and the same C library calls (float std::exp / std::log in
// the emulation; in the bounds double std::exp / std::log per row and head), which cost little
// next to the dot products. The bounds' softmax exponentials (one per key and head) are ref's
// exp_portable, in lanes (simd/exp-inl.h).
// OpenMP splits over query rows only (independent outputs).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/compare.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "ref/bounds.h"
#include "ref/numerics.h"
#include "simd/common.h"
#include "simd/exp-inl.h"
#include "simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ref::valid_kv_rows (ref/attention.h): the valid kv rows of query row t (topk_length slots), sorted ascending,
// duplicates kept.
HWY_INLINE void ValidRows(const detail::AttentionView& v, int64_t t, std::vector<int64_t>& rows) {
  rows.clear();
  const int64_t len = v.topk_length ? v.topk_length[t] : v.topk;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t i = v.indices[t * v.topk + j];
    if (0 <= i && i < v.s_kv) rows.push_back(i);
  }
  std::sort(rows.begin(), rows.end());
}

HWY_INLINE int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// ---- the emulation (f32) -----------------------------------------------------------------------

using DF32 = hn::ScalableTag<float>;
using VF32 = hn::Vec<DF32>;

// The bf16 codes src[0, n) as f32 into dst[0, n) (exact), zeros up to n_pad.
HWY_INLINE void Bf16RowToF32(const uint16_t* HWY_RESTRICT src, int64_t n, int64_t n_pad, float* HWY_RESTRICT dst) {
  const DF32 df;
  const hn::RebindToUnsigned<DF32> du;
  const hn::Rebind<uint16_t, DF32> d16;
  const int64_t N = int64_t(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, src + i)))), df, dst + i);
  for (; i < n; ++i) dst[i] = bf16_to_f32(bf16_t{src[i]});
  for (; i < n_pad; ++i) dst[i] = 0.0f;
}

// ref's round_bf16 lane by lane: f32 -> bf16 (to nearest, ties to even, on the bits; NaN ->
// the quiet NaN 0x7FC0 with the sign kept), back to f32.
HWY_INLINE VF32 RoundBf16(DF32 df, VF32 x) {
  const hn::RebindToUnsigned<DF32> du;
  const auto u = hn::BitCast(du, x);
  const auto hi = hn::ShiftRight<16>(u);
  const auto is_nan = hn::Gt(hn::BitCast(hn::RebindToSigned<DF32>(), hn::And(u, hn::Set(du, 0x7FFFFFFFu))),
                             hn::Set(hn::RebindToSigned<DF32>(), 0x7F800000));
  const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du, 0x7FFFu)), hn::And(hi, hn::Set(du, 1u))));
  const auto nan = hn::Or(hn::And(hi, hn::Set(du, 0x8000u)), hn::Set(du, 0x7FC0u));
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::IfThenElse(hn::RebindMask(du, is_nan), nan, rounded)));
}

// ref's round_up_16 (add 0xFF) or round_16 (add 0x80) lane by lane: the f32 bits plus `add`, the
// low 8 bits cleared; non-finite lanes as they are.
template <class D>
HWY_INLINE hn::Vec<D> Round16(D df, hn::Vec<D> x, uint32_t add) {
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::BitCast(du, x);
  const auto r = hn::And(hn::Add(u, hn::Set(du, add)), hn::Set(du, ~0xFFu));
  const auto finite = hn::Lt(hn::And(u, hn::Set(du, 0x7FFFFFFFu)), hn::Set(du, 0x7F800000u));
  return hn::BitCast(df, hn::IfThenElse(finite, r, u));
}

// Pass 1 tile: dot[k][h] for kK keys (f32 rows kr + k * kstride) and kV vectors of heads from the
// transposed q (qt[d * hp + h]): per lane dot += q * k, d ascending, a multiply then an add.
// P[(i0 + k) * hp + h] = dot * scale.
template <size_t kK, size_t kV, bool kFused>
HWY_INLINE void EmuDotTile(const float* HWY_RESTRICT qt, int64_t hp, const float* HWY_RESTRICT kr, int64_t kstride,
                           int64_t d_qk, float scale, float* HWY_RESTRICT p) {
  const DF32 df;
  const size_t N = hn::Lanes(df);
  VF32 acc[kK][kV];
  for (size_t k = 0; k < kK; ++k)
    for (size_t u = 0; u < kV; ++u) acc[k][u] = hn::Zero(df);
  for (int64_t d = 0; d < d_qk; ++d) {
    VF32 q[kV];
    for (size_t u = 0; u < kV; ++u) q[u] = hn::LoadU(df, qt + d * hp + int64_t(u * N));
    for (size_t k = 0; k < kK; ++k) {
      const VF32 b = hn::Set(df, kr[int64_t(k) * kstride + d]);
      for (size_t u = 0; u < kV; ++u)
        acc[k][u] = kFused ? hn::MulAdd(q[u], b, acc[k][u]) : hn::Add(acc[k][u], hn::Mul(q[u], b));
    }
  }
  const VF32 s = hn::Set(df, scale);
  for (size_t k = 0; k < kK; ++k)
    for (size_t u = 0; u < kV; ++u) hn::StoreU(hn::Mul(acc[k][u], s), df, p + int64_t(k) * hp + int64_t(u * N));
}

// Pass 3 tile: acc[h][c] = sum_i pb[i * hp + h] * V[i][c] for kH heads and kV column vectors
// (V rows vr + i * vstride), i ascending, a multiply then an add; stored to o[h * ostride + c].
template <size_t kH, size_t kV, bool kFused>
HWY_INLINE void EmuPVTile(const float* HWY_RESTRICT pb, int64_t hp, const float* HWY_RESTRICT vr, int64_t vstride,
                          int64_t n, float* HWY_RESTRICT o, int64_t ostride) {
  const DF32 df;
  const size_t N = hn::Lanes(df);
  VF32 acc[kH][kV];
  for (size_t h = 0; h < kH; ++h)
    for (size_t u = 0; u < kV; ++u) acc[h][u] = hn::Zero(df);
  for (int64_t i = 0; i < n; ++i) {
    VF32 x[kV];
    for (size_t u = 0; u < kV; ++u) x[u] = hn::LoadU(df, vr + i * vstride + int64_t(u * N));
    for (size_t h = 0; h < kH; ++h) {
      const VF32 w = hn::Set(df, pb[i * hp + int64_t(h)]);
      for (size_t u = 0; u < kV; ++u)
        acc[h][u] = kFused ? hn::MulAdd(w, x[u], acc[h][u]) : hn::Add(acc[h][u], hn::Mul(w, x[u]));
    }
  }
  for (size_t h = 0; h < kH; ++h)
    for (size_t u = 0; u < kV; ++u) hn::StoreU(acc[h][u], df, o + int64_t(h) * ostride + int64_t(u * N));
}

// The products of pass 1 (bf16 q x bf16 k) and pass 3 (bf16-rounded p x bf16 V) have at most 16
// significant bits, so each is exact in f32 unless it overflows or falls below f32's subnormal
// grid; then ref's multiply-then-add rounds once, like a fused multiply-add, and the tiles use
// MulAdd (half the floating-point operations). ExpRange tracks, over nonzero values, the least and
// greatest exponent e (|x| in [2^e, 2^(e+1)), subnormals counted as e = -126, whose lowest bit is
// 2^(e-7) as for a normal bf16) and whether anything is not finite. A product of values with
// exponents ea, eb is exact when ea + eb >= -135 (lowest bit 2^(ea+eb-14) >= 2^-149) and
// ea + eb <= 126 (|ab| < 2^128, at most 16 bits: <= FLT_MAX). Otherwise the unfused tiles run.
struct ExpRange {
  int lo = 1000, hi = -1000;
  bool finite = true;
  // Every product of a value in *this and one in o is exact in f32.
  bool exact_with(const ExpRange& o) const {
    if (!finite || !o.finite) return false;
    if (lo > hi || o.lo > o.hi) return true;  // a side with no nonzero value: products are zeros
    return lo + o.lo >= -135 && hi + o.hi <= 126;
  }
  // The same where *this holds values of 16 significant bits (the bounds' weights, lowest bit
  // 2^(e-15)) and o bf16 values: a product's lowest bit is 2^(ea+eb-22), at most 24 bits.
  bool exact16_with(const ExpRange& o) const {
    if (!finite || !o.finite) return false;
    if (lo > hi || o.lo > o.hi) return true;
    return lo + o.lo >= -127 && hi + o.hi <= 126;
  }
};

// The ExpRange of n values given by their bits x (f32 bits, or bf16's: the exponent field at bit
// kShift, the magnitude under `mag`): over the nonzero values the least exponent field (at least
// 1: a subnormal's exponent is -126) and the greatest, 0xFF marking a non-finite one. In vector
// lanes, then the lanes and the tail one by one (a minimum and a maximum: no order to keep).
template <class D, int kShift>
HWY_INLINE ExpRange RangeOfBits(D d, const hn::TFromD<D>* HWY_RESTRICT x, int64_t n, hn::TFromD<D> mag) {
  using T = hn::TFromD<D>;
  const int64_t L = int64_t(hn::Lanes(d));
  const hn::Vec<D> ff = hn::Set(d, T(0xFF)), one = hn::Set(d, T(1)), zero = hn::Zero(d), vmag = hn::Set(d, mag);
  hn::Vec<D> vmn = ff, vmx = zero;
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const hn::Vec<D> b = hn::LoadU(d, x + i);
    const hn::Vec<D> ex = hn::And(hn::ShiftRight<kShift>(b), ff);
    const auto nz = hn::Not(hn::Eq(hn::And(b, vmag), zero));
    vmn = hn::Min(vmn, hn::IfThenElse(nz, hn::Max(ex, one), ff));
    vmx = hn::Max(vmx, hn::IfThenElseZero(nz, ex));
  }
  T lmn[64], lmx[64];  // at most 32 lanes (16-bit lanes of AVX-512)
  static_assert(HWY_MAX_BYTES / sizeof(T) <= 64, "lanes");
  hn::StoreU(vmn, d, lmn);
  hn::StoreU(vmx, d, lmx);
  uint32_t mn = 0xFF, mx = 0;
  for (int64_t j = 0; j < L; ++j) {
    mn = std::min<uint32_t>(mn, lmn[j]);
    mx = std::max<uint32_t>(mx, lmx[j]);
  }
  for (; i < n; ++i) {
    const uint32_t b = x[i], ex = (b >> kShift) & 0xFFu;
    const bool nz = (b & mag) != 0;
    mn = std::min(mn, nz ? std::max(ex, 1u) : 0xFFu);
    mx = std::max(mx, nz ? ex : 0u);
  }
  ExpRange r;
  if (mx == 0xFF) r.finite = false;
  else if (mn != 0xFF) r.lo = int(mn) - 127, r.hi = std::max(int(mx), 1) - 127;
  return r;
}
// f32 values x[0, n).
HWY_INLINE ExpRange RangeOfF32(const float* x, int64_t n) {
  return RangeOfBits<hn::ScalableTag<uint32_t>, 23>(hn::ScalableTag<uint32_t>(), reinterpret_cast<const uint32_t*>(x), n, 0x7FFFFFFFu);
}
// bf16 values (their bits) x[0, n): a bf16's f32 value has its bits << 16, so the same range.
HWY_INLINE ExpRange RangeOfBf16(const uint16_t* x, int64_t n) {
  return RangeOfBits<hn::ScalableTag<uint16_t>, 7>(hn::ScalableTag<uint16_t>(), x, n, uint16_t(0x7FFFu));
}

constexpr size_t kEmuKeys = 4, kEmuHeadVecs = 2;  // pass 1 tile: 4 keys x 2 vectors of heads
constexpr size_t kEmuPVHeads = 4, kEmuPVVecs = 2;  // pass 3 tile: 4 heads x 2 vectors of columns

// EmulateChunk's pass 2 for query row t: ref's per-head loops with lanes over heads (P is [i][hp]):
// the max (from -inf, i ascending, as std::max: m < x ? x : m), then exp(p - m) by the C library's
// float exp element by element, the sum (i ascending), and lse and the sink factor per head; p is
// then rounded to bf16 in place (what pass 3 multiplies). Padding heads are zeroed (finite, never
// stored).
// mx, lv: scratch of hp floats; factor[h]: the output's 1 / l times the sink factor.
HWY_INLINE void EmuSoftmax(const detail::AttentionView& v, int64_t t, float* P, int64_t n, int64_t hp, float* mx, float* lv,
                           float* factor, float* lse_out, float* max_out) {
  const DF32 df;
  const int64_t N = int64_t(hn::Lanes(df));
  const int64_t h_q = v.h_q;
  for (int64_t h0 = 0; h0 < hp; h0 += N) {
    VF32 m = hn::Set(df, -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < n; ++i) {
      const VF32 x = hn::Load(df, P + i * hp + h0);
      m = hn::IfThenElse(hn::Lt(m, x), x, m);
    }
    hn::Store(m, df, mx + h0);
  }
  for (int64_t i = 0; i < n; ++i) {
    float* pi = P + i * hp;
    for (int64_t h = 0; h < h_q; ++h) pi[h] = std::exp(pi[h] - mx[h]);
    for (int64_t h = h_q; h < hp; ++h) pi[h] = 0.0f;
  }
  for (int64_t h0 = 0; h0 < hp; h0 += N) {
    VF32 l = hn::Zero(df);
    for (int64_t i = 0; i < n; ++i) l = hn::Add(l, hn::Load(df, P + i * hp + h0));
    hn::Store(l, df, lv + h0);
  }
  for (int64_t h = 0; h < h_q; ++h) {
    const float m = mx[h], l = lv[h];
    const float lse = m + std::log(l);
    float f = 1.0f / l;
    if (v.sink) f *= 1.0f / (1.0f + std::exp(v.sink[h] - lse));
    factor[size_t(h)] = f;
    lse_out[t * h_q + h] = lse;
    max_out[t * h_q + h] = m;
  }
  for (int64_t e = 0; e < n * hp; e += N) hn::Store(RoundBf16(df, hn::Load(df, P + e)), df, P + e);
}

// ref's emulate_attention_lowp for query rows [t0, t1).
void EmulateChunk(const detail::AttentionView& v, int64_t t0, int64_t t1, float* out, uint16_t* out_bf16,
                  float* lse_out, float* max_out, int kv_lo, int kv_hi, bool kv_finite) {
  ExpRange kvr;
  kvr.lo = kv_lo, kvr.hi = kv_hi, kvr.finite = kv_finite;
  const DF32 df;
  const int64_t N = int64_t(hn::Lanes(df));
  const int64_t h_q = v.h_q, d_qk = v.d_qk, d_v = v.d_v;
  const int64_t hv = int64_t(kEmuHeadVecs) * N;                   // heads per pass 1 tile
  const int64_t hp = RoundUp(h_q, std::max<int64_t>(hv, int64_t(kEmuPVHeads)));  // padded heads
  const int64_t cw = int64_t(kEmuPVVecs) * N;                      // columns per pass 3 tile
  const int64_t dpad = RoundUp(d_qk, cw);                          // kv row stride (>= d_v padded)
  const int64_t dvp = RoundUp(d_v, cw);
  auto qt = hwy::AllocateAligned<float>(size_t(d_qk * hp));
  auto acc = hwy::AllocateAligned<float>(size_t(hp * dvp));
  auto mbuf = hwy::AllocateAligned<float>(size_t(hp)), lbuf = hwy::AllocateAligned<float>(size_t(hp));
  hwy::AlignedFreeUniquePtr<float[]> kf, pbuf;
  int64_t cap = 0;
  std::vector<int64_t> rows;
  std::vector<float> factor(static_cast<size_t>(h_q));
    std::vector<float> qrow(static_cast<size_t>(d_qk));
  std::fill(qt.get(), qt.get() + d_qk * hp, 0.0f);  // padding heads stay zero
  for (int64_t t = t0; t < t1; ++t) {
    ValidRows(v, t, rows);
    const int64_t n = int64_t(rows.size());
    if (n == 0) {
      for (int64_t h = 0; h < h_q; ++h) {
        lse_out[t * h_q + h] = std::numeric_limits<float>::infinity();
        max_out[t * h_q + h] = -std::numeric_limits<float>::infinity();
      }
      std::fill(out + t * h_q * d_v, out + (t + 1) * h_q * d_v, 0.0f);
      std::fill(out_bf16 + t * h_q * d_v, out_bf16 + (t + 1) * h_q * d_v, uint16_t{0});
      continue;
    }
    if (n > cap) {
      cap = n;
      kf = hwy::AllocateAligned<float>(size_t(cap * dpad));
      pbuf = hwy::AllocateAligned<float>(size_t(cap * hp));
      std::fill(pbuf.get(), pbuf.get() + cap * hp, 0.0f);
    }
    // q of row t transposed to [d][h]; the kv rows as f32 (zeros past d_qk).
    for (int64_t h = 0; h < h_q; ++h) {
      Bf16RowToF32(v.q + (t * h_q + h) * d_qk, d_qk, d_qk, qrow.data());
      for (int64_t d = 0; d < d_qk; ++d) qt[size_t(d * hp + h)] = qrow[size_t(d)];
    }
    const bool fused1 = RangeOfBf16(v.q + t * h_q * d_qk, h_q * d_qk).exact_with(kvr);
    for (int64_t i = 0; i < n; ++i) Bf16RowToF32(v.kv + rows[size_t(i)] * d_qk, d_qk, dpad, kf.get() + i * dpad);
    // Pass 1: p[i][h] = (sum_d q[h][d] * k_i[d]) * sm_scale, in f32.
    float* P = pbuf.get();
    const float sm = float(v.sm_scale);
    int64_t i0 = 0;
    for (; i0 + int64_t(kEmuKeys) <= n; i0 += int64_t(kEmuKeys))
      for (int64_t h0 = 0; h0 < hp; h0 += hv) {
        if (fused1)
          EmuDotTile<kEmuKeys, kEmuHeadVecs, true>(qt.get() + h0, hp, kf.get() + i0 * dpad, dpad, d_qk, sm, P + i0 * hp + h0);
        else
          EmuDotTile<kEmuKeys, kEmuHeadVecs, false>(qt.get() + h0, hp, kf.get() + i0 * dpad, dpad, d_qk, sm, P + i0 * hp + h0);
      }
    for (; i0 < n; ++i0)
      for (int64_t h0 = 0; h0 < hp; h0 += hv)
        EmuDotTile<1, kEmuHeadVecs, false>(qt.get() + h0, hp, kf.get() + i0 * dpad, dpad, d_qk, sm, P + i0 * hp + h0);
    // Pass 2: the softmax per head, p rounded to bf16 in place (EmuSoftmax).
    EmuSoftmax(v, t, P, n, hp, mbuf.get(), lbuf.get(), factor.data(), lse_out, max_out);
    const bool fused3 = RangeOfF32(P, n * hp).exact_with(kvr);
    // Pass 3: acc[h][c] = sum_i bf16(p[i][h]) * V_i[c], a column strip at a time (the strip of V
    // stays in L1 for every head tile).
    for (int64_t c0 = 0; c0 < dvp; c0 += cw)
      for (int64_t h0 = 0; h0 < hp; h0 += int64_t(kEmuPVHeads)) {
        if (fused3)
          EmuPVTile<kEmuPVHeads, kEmuPVVecs, true>(P + h0, hp, kf.get() + c0, dpad, n, acc.get() + h0 * dvp + c0, dvp);
        else
          EmuPVTile<kEmuPVHeads, kEmuPVVecs, false>(P + h0, hp, kf.get() + c0, dpad, n, acc.get() + h0 * dvp + c0, dvp);
      }
    // Output: bf16(acc * factor), as f32 and as bf16 bits (ref's rounding, lane by lane).
    const hn::RebindToUnsigned<DF32> du;
    const hn::RebindToSigned<DF32> di;
    const hn::Rebind<uint16_t, DF32> d16;
    for (int64_t h = 0; h < h_q; ++h) {
      const float* a = acc.get() + h * dvp;
      const VF32 fv = hn::Set(df, factor[size_t(h)]);
      float* o = out + (t * h_q + h) * d_v;
      uint16_t* ob = out_bf16 + (t * h_q + h) * d_v;
      int64_t c = 0;
      for (; c + N <= d_v; c += N) {
        const VF32 r = RoundBf16(df, hn::Mul(hn::Load(df, a + c), fv));
        hn::StoreU(r, df, o + c);
        hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, r)))), d16, ob + c);
      }
      for (; c < d_v; ++c) {
        ob[c] = f32_to_bf16(a[c] * factor[size_t(h)]).bits;
        o[c] = bf16_to_f32(bf16_t{ob[c]});
      }
    }
  }
}

using DF64 = hn::ScalableTag<double>;
using VF64 = hn::Vec<DF64>;

// ---- the attention bounds (f32 sums, double scalars) -------------------------------------------

// Pass 1 tile of the bounds: per lane (head) dot += q * k and mag += |q| * |k| in f32, d
// ascending, for kK keys (f32 rows kr[k], and |kr[k]| at kr[k] + aoff) and kV vectors of heads
// (qt[d * hp + h]; |q| is taken in the registers). Stores the raw sums dot[k * hp + h] and
// mag[k * hp + h]. kFused: every product q * k is exact in f32 (ExpRange), so ref's
// multiply-then-add (one rounding) is one fused multiply-add, and so is |q| * |k| (the same
// product's magnitude).
template <size_t kK, size_t kV, bool kFused>
HWY_INLINE void BoundDotTile(const float* HWY_RESTRICT qt, int64_t hp, const float* const* kr, int64_t aoff,
                             int64_t d_qk, float* HWY_RESTRICT dot_out, float* HWY_RESTRICT mag_out) {
  const DF32 df;
  const size_t N = hn::Lanes(df);
  VF32 dot[kK][kV], mag[kK][kV];
  const float* rk[kK];
  for (size_t k = 0; k < kK; ++k) {
    rk[k] = kr[k];
    for (size_t u = 0; u < kV; ++u) dot[k][u] = mag[k][u] = hn::Zero(df);
  }
  for (int64_t d = 0; d < d_qk; ++d) {
    VF32 q[kV], a[kV];
    for (size_t u = 0; u < kV; ++u) {
      q[u] = hn::LoadU(df, qt + d * hp + int64_t(u * N));
      a[u] = hn::Abs(q[u]);
    }
    for (size_t k = 0; k < kK; ++k) {
      // |k|: AVX3 broadcasts it from the |kv| copy inside the fused multiply-add (an embedded
      // broadcast costs no instruction); targets without one take it from k in the register
      // (one logic op instead of a second broadcast load; on AVX2, pass 1 10 % faster).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      const VF32 b = hn::Set(df, rk[k][d]), ba = hn::Set(df, rk[k][aoff + d]);
#else
      (void)aoff;
      const VF32 b = hn::Set(df, rk[k][d]), ba = hn::Abs(b);
#endif
      for (size_t u = 0; u < kV; ++u) {
        dot[k][u] = kFused ? hn::MulAdd(q[u], b, dot[k][u]) : hn::Add(dot[k][u], hn::Mul(q[u], b));
        mag[k][u] = kFused ? hn::MulAdd(a[u], ba, mag[k][u]) : hn::Add(mag[k][u], hn::Mul(a[u], ba));
      }
    }
  }
  for (size_t k = 0; k < kK; ++k)
    for (size_t u = 0; u < kV; ++u) {
      hn::StoreU(dot[k][u], df, dot_out + int64_t(k) * hp + int64_t(u * N));
      hn::StoreU(mag[k][u], df, mag_out + int64_t(k) * hp + int64_t(u * N));
    }
}

// A_c and, with kDir, the direction's D_c in one pass over V (shared loads): for kH heads and kV
// vectors of columns from c0 (V_i: the f32 kv row vr[i]), A += w[i][h] * |V_i[c]| and D += u[i][h] *
// V_i[c], each in f32, i ascending, a multiply then an add (ref's `Af += w * |v|` and `D += u * v`),
// over keys [i0, i1): from zero when i0 == 0, else continuing from a / dd[h * ostride + c], where
// the sums are stored (a block of keys at a time keeps its V and weights in L1; the same sums).
// kFused: every product is exact (ExpRange::exact16_with), so a fused multiply-add gives ref's bits.
template <size_t kH, size_t kV, bool kDir, bool kFused>
HWY_INLINE void BoundADTile(const float* HWY_RESTRICT w, const float* HWY_RESTRICT uw, int64_t hp,
                            const float* const* vr, int64_t c0, int64_t i0, int64_t i1, float* HWY_RESTRICT a,
                            float* HWY_RESTRICT dd, int64_t ostride) {
  const DF32 df;
  const size_t N = hn::Lanes(df);
  VF32 acc[kH][kV], dir[kH][kV];
  for (size_t h = 0; h < kH; ++h)
    for (size_t u = 0; u < kV; ++u) {
      acc[h][u] = i0 == 0 ? hn::Zero(df) : hn::LoadU(df, a + int64_t(h) * ostride + int64_t(u * N));
      dir[h][u] = i0 == 0 || !kDir ? hn::Zero(df) : hn::LoadU(df, dd + int64_t(h) * ostride + int64_t(u * N));
    }
  for (int64_t i = i0; i < i1; ++i) {
    VF32 x[kV], xa[kV];
    for (size_t u = 0; u < kV; ++u) {
      x[u] = hn::LoadU(df, vr[i] + c0 + int64_t(u * N));
      xa[u] = hn::Abs(x[u]);
    }
    for (size_t h = 0; h < kH; ++h) {
      const VF32 p = hn::Set(df, w[i * hp + int64_t(h)]);
      for (size_t u = 0; u < kV; ++u) acc[h][u] = kFused ? hn::MulAdd(p, xa[u], acc[h][u]) : hn::Add(acc[h][u], hn::Mul(p, xa[u]));
      if (kDir) {
        const VF32 q = hn::Set(df, uw[i * hp + int64_t(h)]);
        for (size_t u = 0; u < kV; ++u) dir[h][u] = kFused ? hn::MulAdd(q, x[u], dir[h][u]) : hn::Add(dir[h][u], hn::Mul(q, x[u]));
      }
    }
  }
  for (size_t h = 0; h < kH; ++h)
    for (size_t u = 0; u < kV; ++u) {
      hn::StoreU(acc[h][u], df, a + int64_t(h) * ostride + int64_t(u * N));
      if (kDir) hn::StoreU(dir[h][u], df, dd + int64_t(h) * ostride + int64_t(u * N));
    }
}

// Pass 1 tile: keys x one vector of heads (x 2 sums: 16 accumulators with 32 registers, 8 with 16);
// one vector of heads keeps h_q 16 in whole f32 vectors on AVX-512.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kBoundKeys = 8, kBoundHeadVecs = 1;
#else
constexpr size_t kBoundKeys = 4, kBoundHeadVecs = 1;
#endif
// A and D tile: heads x vectors of columns x 2 sums (16 accumulators with 32 registers: 8 heads x
// one vector, each V vector loaded once for 16 fused multiply-adds whose weights are embedded
// broadcasts; 8 with 16: 2 heads x 2 vectors), over blocks of kBoundABlock keys (their weights,
// 2 x kBoundABlock x h_q floats, and a strip of V in L1). Measured on the 2-core EPYC (AVX3, one
// thread, sq256 hq64 k512): 8 x 1 over 64 keys made A and D's pass 1.2x faster than 4 x 2 over 32.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kBoundAHeads = 8, kBoundAVecs = 1;
constexpr int64_t kBoundABlock = 64;
#else
constexpr size_t kBoundAHeads = 2, kBoundAVecs = 2;
constexpr int64_t kBoundABlock = 32;
#endif

// The scalars of cmp::attention_bounds (ref/bounds.cc), as there.
constexpr double kBf16U = 0x1p-8, kF32E = 0x1p-24;
HWY_INLINE double Inflate(double m) { return 1 + 2 * m * kF32E; }

// q of one query row (bf16 codes [h_q][d_qk]) transposed to qt [d][h] (rows of hp floats) in blocks
// of 16 heads x 32 d, so that reads and writes stay in L1.
HWY_INLINE void TransposeQRow(const uint16_t* qrow16, int64_t h_q, int64_t d_qk, int64_t hp, float* qt) {
  for (int64_t hb = 0; hb < h_q; hb += 16)
    for (int64_t db = 0; db < d_qk; db += 32) {
      const int64_t he = std::min(h_q, hb + 16), de = std::min(d_qk, db + 32);
      for (int64_t d = db; d < de; ++d)
        for (int64_t h = hb; h < he; ++h) qt[size_t(d * hp + h)] = bf16_to_f32(bf16_t{qrow16[h * d_qk + d]});
    }
}

// BoundsChunk's pass 2 for one query row, ref's per-head loops with lanes over heads (a vector of
// heads at a time, i ascending in every sum): Gm over the f32 magnitudes (widening to double is exact and keeps their order,
// so the maximum, and std::max's choice on NaN, is ref's without a double copy of MA); then per
// vector of heads the logits p = double(dot) * sm_scale (an exact widening, then ref's product)
// and m (std::max); z = p - m (the direction's, where ref copies the logits first) and p =
// exp(z) by exp_portable in lanes (simd/exp-inl.h: ref's bits), summed into l; the weights p / l
// (IEEE division, the same in a lane), to f32 rounded up to 16 significant bits (ref's
// round_up_16(float(p / l))), and zbar = sum_i (p_i / l) z_i; u_i = round_16(float((p_i / l)
// (z_i - zbar))). Padding heads' weights: 0.
// In: DT, MA (pass 1's dot and mag, [n][hp]). Out: G (the maximum magnitude per head), P (the
// weights in double with the direction, else exp(z)), MG (z, with the direction), W and U (the
// f32 weights and u), mv, lv and zb per head (m, l, zbar). gf: scratch of hp floats.
HWY_INLINE void BoundSoftmax(const float* DT, const float* MA, int64_t n, int64_t hp, int64_t h_q, double scale, bool dir,
                             float* gf, double* G, double* P, double* MG, float* W, float* U, double* mv, double* lv,
                             double* zb) {
  const DF64 d64;
  const DF32 df;
  const int64_t N = int64_t(hn::Lanes(d64)), NF = int64_t(hn::Lanes(df));
  for (int64_t h0 = 0; h0 < hp; h0 += NF) {
    VF32 g = hn::Zero(df);
    for (int64_t i = 0; i < n; ++i) {
      const VF32 x = hn::Load(df, MA + i * hp + h0);
      g = hn::IfThenElse(hn::Lt(g, x), x, g);
    }
    hn::StoreU(g, df, gf + h0);
  }
  for (int64_t h = 0; h < hp; ++h) G[h] = double(gf[h]);
  {
    const hn::Rebind<float, DF64> dh;
    const VF64 vscale = hn::Set(d64, scale);
    for (int64_t h0 = 0; h0 < hp; h0 += N) {
      const auto real = hn::FirstN(d64, size_t(std::max<int64_t>(0, std::min<int64_t>(N, h_q - h0))));
      VF64 m = hn::Set(d64, -std::numeric_limits<double>::infinity());
      for (int64_t i = 0; i < n; ++i) {
        const VF64 y = hn::Mul(hn::PromoteTo(d64, hn::LoadU(dh, DT + i * hp + h0)), vscale);
        hn::Store(y, d64, P + i * hp + h0);
        m = hn::IfThenElse(hn::Lt(m, y), y, m);
      }
      hn::StoreU(m, d64, mv + h0);
      VF64 sum = hn::Zero(d64);
      for (int64_t i = 0; i < n; ++i) {
        const VF64 z = hn::Sub(hn::Load(d64, P + i * hp + h0), m);
        if (dir) hn::Store(z, d64, MG + i * hp + h0);
        const VF64 e = ExpPortable(d64, z);
        hn::Store(e, d64, P + i * hp + h0);
        sum = hn::Add(sum, e);
      }
      hn::StoreU(sum, d64, lv + h0);
      VF64 zs = hn::Zero(d64);
      for (int64_t i = 0; i < n; ++i) {
        const VF64 w = hn::IfThenElseZero(real, hn::Div(hn::Load(d64, P + i * hp + h0), sum));
        hn::StoreU(Round16(dh, hn::DemoteTo(dh, w), 0xFFu), dh, W + i * hp + h0);
        if (dir) {
          hn::Store(w, d64, P + i * hp + h0);
          zs = hn::Add(zs, hn::Mul(w, hn::Load(d64, MG + i * hp + h0)));
        }
      }
      if (!dir) continue;
      hn::StoreU(zs, d64, zb + h0);
      for (int64_t i = 0; i < n; ++i) {
        const VF64 u = hn::Mul(hn::Load(d64, P + i * hp + h0), hn::Sub(hn::Load(d64, MG + i * hp + h0), zs));
        hn::StoreU(Round16(dh, hn::DemoteTo(dh, u), 0x80u), dh, U + i * hp + h0);
      }
    }
  }
}

// BoundsChunk's bounds of query row t, ref's expressions element by element: out [h_q, d_v] from
// A (and the direction's sm_out from Dv), lse and max_logits per head; n: the row's valid keys.
HWY_INLINE void BoundRow(const detail::AttentionView& v, int64_t t, int64_t n, const double* G, const float* A, const float* Dv,
                         int64_t dvp, const double* mv, const double* lv, const double* zb, bool dir, const float* exact_out,
                         const float* exact_lse, const float* exact_max, float* b_out, float* b_lse, float* b_max,
                         float* sm_out, float* sm_lse) {
  const DF64 d64;
  const int64_t N = int64_t(hn::Lanes(d64));
  const int64_t h_q = v.h_q, d_qk = v.d_qk, d_v = v.d_v;
  const double sm = std::fabs(v.sm_scale), k = double(n);
  for (int64_t h = 0; h < h_q; ++h) {
    const int64_t th = t * h_q + h;
    const double Gh = sm * G[h] * Inflate(double(d_qk) + 1);
    const double delta = 2 * (double(d_qk) + 1) * kF32E * Gh;
    const double logit_err = (double(d_qk) + 2) * kF32E * Gh;
    const double A_up = std::exp(2 * delta) * Inflate(k + 2);
    const float* a = A + h * dvp;
    const double coef = (k + 8) * kF32E + 2 * logit_err;
    // ref's expression in double lanes (a multiply or an add per step, as ref's: no fusion),
    // then bound_f32: the demoted value, one ulp up (bits + 1: bounds are >= 0) where it fell below.
    const hn::Rebind<float, DF64> dh;
    const hn::Rebind<int32_t, DF64> di32;
    const VF64 vu = hn::Set(d64, kBf16U), vup = hn::Set(d64, A_up), vcoef = hn::Set(d64, coef),
               vmul = hn::Set(d64, cmp::kAttentionMultiple);
    int64_t c = 0;
    for (; c + N <= d_v; c += N) {
      const VF64 Ac = hn::Mul(hn::PromoteTo(d64, hn::LoadU(dh, a + c)), vup);
      const VF64 o = hn::Abs(hn::PromoteTo(d64, hn::LoadU(dh, exact_out + th * d_v + c)));
      const VF64 r = hn::Mul(vmul, hn::Add(hn::Add(hn::Mul(vu, o), hn::Mul(vu, Ac)), hn::Mul(vcoef, Ac)));
      const auto f = hn::DemoteTo(dh, r);
      const auto up = hn::DemoteTo(di32, hn::IfThenElseZero(hn::Lt(hn::PromoteTo(d64, f), r), hn::Set(d64, 1.0)));
      hn::StoreU(hn::BitCast(dh, hn::Add(hn::BitCast(di32, f), up)), dh, b_out + th * d_v + c);
    }
    for (; c < d_v; ++c) {
      const double Ac = double(a[c]) * A_up;
      const double o = std::fabs(double(exact_out[th * d_v + c]));
      const double bound = kBf16U * o + kBf16U * Ac + ((k + 8) * kF32E + 2 * logit_err) * Ac;
      b_out[th * d_v + c] = cmp::bound_f32(cmp::kAttentionMultiple * bound);
    }
    b_lse[th] = cmp::bound_f32(cmp::kAttentionMultiple * (logit_err + (k + 8) * kF32E + 2 * kF32E * std::fabs(double(exact_lse[th]))));
    b_max[th] = cmp::bound_f32(cmp::kAttentionMultiple * (logit_err + kF32E * std::fabs(double(exact_max[th]))));
    if (!dir) continue;
    // ref's direction expressions element by element.
    const double mh = mv[h], sbar = mh + zb[h], lse = mh + std::log(lv[h]);
    const double f = v.sink ? 1.0 / (1.0 + std::exp(double(v.sink[h]) - lse)) : 1.0;
    const float* dd = Dv + h * dvp;
    // ref's float(f * D + (1 - f) * sbar * out) in double lanes ((1 - f) * sbar first, as there).
    const double g = (1 - f) * sbar;
    const VF64 vf = hn::Set(d64, f), vg = hn::Set(d64, g);
    c = 0;
    for (; c + N <= d_v; c += N) {
      const VF64 r = hn::Add(hn::Mul(vf, hn::PromoteTo(d64, hn::LoadU(dh, dd + c))),
                             hn::Mul(vg, hn::PromoteTo(d64, hn::LoadU(dh, exact_out + th * d_v + c))));
      hn::StoreU(hn::DemoteTo(dh, r), dh, sm_out + th * d_v + c);
    }
    for (; c < d_v; ++c) sm_out[th * d_v + c] = float(f * double(dd[c]) + g * double(exact_out[th * d_v + c]));
    sm_lse[th] = float(sbar);
  }
}

// ref's attention_bounds for query rows [t0, t1): out [s_q, h_q, d_v], lse / max [s_q, h_q]
// (zero-initialised by the caller: empty rows keep bound 0); with sm_out / sm_lse (else null)
// attention_bounds_sm's softmax-scale direction too (v.sink: the sink of its factor f). kv_lo,
// kv_hi, kv_finite: kv's exponent range (ExpRange), for the fused pass 1. kvf: null, or kv in f32
// converted once by the caller (rows of kvstride floats, zeros past d_qk), |kv| at kvf + kvaoff;
// without it each query row converts its own keys.
void BoundsChunk(const detail::AttentionView& v, const float* exact_out, const float* exact_lse,
                 const float* exact_max, int64_t t0, int64_t t1, float* b_out, float* b_lse, float* b_max,
                 float* sm_out, float* sm_lse, int kv_lo, int kv_hi, bool kv_finite, const float* kvf,
                 int64_t kvaoff, int64_t kvstride) {
  ExpRange kvr;
  kvr.lo = kv_lo, kvr.hi = kv_hi, kvr.finite = kv_finite;
  const bool dir = sm_out != nullptr;
  const DF64 d64;
  const DF32 df;
  const int64_t N = int64_t(hn::Lanes(d64)), NF = int64_t(hn::Lanes(df));
  const int64_t h_q = v.h_q, d_qk = v.d_qk, d_v = v.d_v;
  const int64_t hv = int64_t(kBoundHeadVecs) * NF;
  const int64_t hp = RoundUp(h_q, std::max<int64_t>({hv, int64_t(kBoundAHeads), N}));
  const int64_t cw = int64_t(kBoundAVecs) * NF;
  const int64_t dpad = RoundUp(d_qk, cw), dvp = RoundUp(d_v, cw);  // V: the first d_v columns of a kv row
  const double scale = v.sm_scale;
  auto qt = hwy::AllocateAligned<float>(size_t(d_qk * hp));
  auto A = hwy::AllocateAligned<float>(size_t(hp * dvp));
  auto Dv = hwy::AllocateAligned<float>(size_t(dir ? hp * dvp : 1));
  hwy::AlignedFreeUniquePtr<float[]> kf, dotb, magb, wbuf, ubuf;
  std::vector<const float*> kp;  // the f32 rows of the row's keys, i ascending; |k| at + aoff
  int64_t aoff = kvaoff;
  hwy::AlignedFreeUniquePtr<double[]> pbuf, mbuf;
  int64_t cap = 0;
  std::vector<int64_t> rows;
  std::vector<float> gf(static_cast<size_t>(hp));
  std::vector<double> G(static_cast<size_t>(hp)), mv(static_cast<size_t>(hp)), lv(static_cast<size_t>(hp)),
      zb(static_cast<size_t>(hp));
  std::fill(qt.get(), qt.get() + d_qk * hp, 0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    ValidRows(v, t, rows);
    const int64_t n = int64_t(rows.size());
    if (n == 0) continue;  // out 0, lse +inf, max -inf: exact, bound 0
    if (n > cap) {
      cap = n;
      if (!kvf) {  // the rows of k, then those of |k|
        kf = hwy::AllocateAligned<float>(size_t(2 * cap * dpad));
        aoff = cap * dpad;
      }
      dotb = hwy::AllocateAligned<float>(size_t(cap * hp));
      magb = hwy::AllocateAligned<float>(size_t(cap * hp));
      wbuf = hwy::AllocateAligned<float>(size_t(cap * hp));
      pbuf = hwy::AllocateAligned<double>(size_t(cap * hp));
      if (dir) mbuf = hwy::AllocateAligned<double>(size_t(cap * hp));
      if (dir) ubuf = hwy::AllocateAligned<float>(size_t(cap * hp));
    }
    // q of row t transposed to [d][h] in blocks of 16 heads x 32 d (reads and writes stay in L1);
    // the kv rows in f32 (and |k|), zeros past d_qk. qr: the row's exponent range (ExpRange, on
    // the bf16 bits: the f32 value's bits are bits << 16), in one branch-free pass.
    const uint16_t* qrow16 = v.q + t * h_q * d_qk;
    TransposeQRow(qrow16, h_q, d_qk, hp, qt.get());
    const ExpRange qr = RangeOfBf16(qrow16, h_q * d_qk);
    const bool fused = qr.exact_with(kvr);
    kp.resize(size_t(n));
    if (kvf) {  // kv converted once by the caller: the rows in place
      for (int64_t i = 0; i < n; ++i) kp[size_t(i)] = kvf + rows[size_t(i)] * kvstride;
    } else {
      for (int64_t i = 0; i < n; ++i) {
        float* kr = kf.get() + i * dpad;
        Bf16RowToF32(v.kv + rows[size_t(i)] * d_qk, d_qk, dpad, kr);
        for (int64_t d = 0; d < dpad; d += NF) hn::Store(hn::Abs(hn::Load(df, kr + d)), df, kr + aoff + d);
        kp[size_t(i)] = kr;
      }
    }
    // Pass 1: the f32 sums dot and mag per key and head.
    float* DT = dotb.get();
    float* MA = magb.get();
    int64_t i0 = 0;
    for (; i0 + int64_t(kBoundKeys) <= n; i0 += int64_t(kBoundKeys))
      for (int64_t h0 = 0; h0 < hp; h0 += hv) {
        if (fused)
          BoundDotTile<kBoundKeys, kBoundHeadVecs, true>(qt.get() + h0, hp, kp.data() + i0, aoff, d_qk,
                                                         DT + i0 * hp + h0, MA + i0 * hp + h0);
        else
          BoundDotTile<kBoundKeys, kBoundHeadVecs, false>(qt.get() + h0, hp, kp.data() + i0, aoff, d_qk,
                                                          DT + i0 * hp + h0, MA + i0 * hp + h0);
      }
    for (; i0 < n; ++i0)
      for (int64_t h0 = 0; h0 < hp; h0 += hv)
        BoundDotTile<1, kBoundHeadVecs, false>(qt.get() + h0, hp, kp.data() + i0, aoff, d_qk, DT + i0 * hp + h0,
                                               MA + i0 * hp + h0);
    double* P = pbuf.get();
    double* MG = mbuf.get();
    // Pass 2: the softmax weights per head, in lanes over heads (BoundSoftmax).
    BoundSoftmax(DT, MA, n, hp, h_q, scale, dir, gf.data(), G.data(), P, MG, wbuf.get(), ubuf.get(), mv.data(), lv.data(),
                 zb.data());
    // Fused multiply-adds where every product of the weights (and of u) with V is exact.
    const bool fusedA = RangeOfF32(wbuf.get(), n * hp).exact16_with(kvr) && (!dir || RangeOfF32(ubuf.get(), n * hp).exact16_with(kvr));
    // A_c (and the direction's D_c) per head in f32 (|V| taken on load): blocks of kBoundABlock
    // keys, whose weights stay in L1 for every column strip, and whose strip of V for every head tile.
    for (int64_t i0 = 0; i0 < n; i0 += kBoundABlock) {
      const int64_t i1 = std::min(n, i0 + kBoundABlock);
      for (int64_t c0 = 0; c0 < dvp; c0 += cw) {
        if (c0 + cw < dvp)  // the next strip of the block's rows (scattered kv rows: no stream to detect)
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t c = c0 + cw; c < c0 + 2 * cw; c += 16) hwy::Prefetch(kp[size_t(i)] + c);
        for (int64_t h0 = 0; h0 < hp; h0 += int64_t(kBoundAHeads)) {
          float* a = A.get() + h0 * dvp + c0;
          float* dd = dir ? Dv.get() + h0 * dvp + c0 : nullptr;
          const float* uw = dir ? ubuf.get() + h0 : nullptr;
          if (dir && fusedA)
            BoundADTile<kBoundAHeads, kBoundAVecs, true, true>(wbuf.get() + h0, uw, hp, kp.data(), c0, i0, i1, a, dd, dvp);
          else if (dir)
            BoundADTile<kBoundAHeads, kBoundAVecs, true, false>(wbuf.get() + h0, uw, hp, kp.data(), c0, i0, i1, a, dd, dvp);
          else if (fusedA)
            BoundADTile<kBoundAHeads, kBoundAVecs, false, true>(wbuf.get() + h0, uw, hp, kp.data(), c0, i0, i1, a, dd, dvp);
          else
            BoundADTile<kBoundAHeads, kBoundAVecs, false, false>(wbuf.get() + h0, uw, hp, kp.data(), c0, i0, i1, a, dd, dvp);
        }
      }
    }
    // The bounds, ref's expressions element by element (BoundRow).
    BoundRow(v, t, n, G.data(), A.get(), Dv.get(), dvp, mv.data(), lv.data(), zb.data(), dir, exact_out, exact_lse, exact_max,
             b_out, b_lse, b_max, sm_out, sm_lse);
  }
}
}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <string>

#include "ref/error.h"

namespace indexshare::simd {

HWY_EXPORT(EmulateChunk);
HWY_EXPORT(BoundsChunk);

namespace {

// The exponent range of kv's nonzero values (see ExpRange in the target code): bf16 bits << 16.
void kv_exp_range(const Tensor<bf16_t>& kv, int& lo, int& hi, bool& finite) {
  lo = 1000, hi = -1000, finite = true;
  for (int64_t i = 0; i < kv.numel(); ++i) {
    const int e = (kv[i].bits >> 7) & 0xFF;
    if (e == 0xFF) finite = false;
    if (e == 0xFF || (kv[i].bits & 0x7FFF) == 0) continue;
    const int u = e == 0 ? -126 : e - 127;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
}

}  // namespace

AttentionOut emulate_attention_lowp(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                    float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                                    const Tensor<float>* attn_sink) {
  const int64_t s_q = q.dim(0), h_q = q.dim(1);
  // ref reads V as the first d_v columns of each kv row (ref/bounds.h); past d_qk there is none.
  require(d_v <= q.dim(2), "emulate_attention_lowp: d_v " + std::to_string(d_v) + " exceeds d_qk " + std::to_string(q.dim(2)));
  AttentionOut o{Tensor<float>({s_q, h_q, d_v}), Tensor<bf16_t>({s_q, h_q, d_v}), Tensor<float>({s_q, h_q}),
                 Tensor<float>({s_q, h_q})};
  const detail::AttentionView v = detail::sparse_view(q, kv, indices, sm_scale, d_v, topk_length, attn_sink);
  int kv_lo, kv_hi;
  bool kv_finite;
  kv_exp_range(kv, kv_lo, kv_hi, kv_finite);
  detail::over_rows(s_q, 8, [&](int64_t t0, int64_t t1) {
    HWY_DYNAMIC_DISPATCH(EmulateChunk)(v, t0, t1, o.out.ptr(), reinterpret_cast<uint16_t*>(o.out_bf16.ptr()),
                                       o.lse.ptr(), o.max_logits.ptr(), kv_lo, kv_hi, kv_finite);
  });
  return o;
}

namespace {
// simd's cmp::BoundsKv: kv's exponent range and (kvf non-null) kv in f32 then |kv|, rows of
// kvstride floats (zeros past d_qk; 64 is a whole number of every target's column tiles), |kv| at
// kvf + kvaoff; `kv`, s_kv and d_qk name the kv it was made from.
struct SharedKv final : cmp::BoundsKv {
  const bf16_t* kv = nullptr;
  int64_t s_kv = 0, d_qk = 0, kvstride = 0, kvaoff = 0;
  int lo = 0, hi = 0;
  bool finite = true;
  hwy::AlignedFreeUniquePtr<float[]> kvf;
};

// The exponent range always; the f32 copies when `convert` and they fit bounds_shared_kv_max_bytes.
void make_shared_kv(const Tensor<bf16_t>& kv, int64_t d_qk, bool convert, SharedKv& x) {
  x.kv = kv.ptr();
  x.s_kv = kv.dim(0);
  x.d_qk = d_qk;
  x.kvstride = (d_qk + 63) / 64 * 64;
  x.kvaoff = x.s_kv * x.kvstride;
  kv_exp_range(kv, x.lo, x.hi, x.finite);
  if (!convert || x.s_kv * x.kvstride * 8 > bounds_shared_kv_max_bytes) return;
  x.kvf = hwy::AllocateAligned<float>(size_t(2 * x.s_kv * x.kvstride));
  const uint16_t* src = reinterpret_cast<const uint16_t*>(kv.ptr());
  const int64_t kvstride = x.kvstride, kvaoff = x.kvaoff;
  float* kvf = x.kvf.get();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < x.s_kv; ++r) {
    float* f = kvf + r * kvstride;
    float* a = kvf + kvaoff + r * kvstride;
    for (int64_t d = 0; d < kvstride; ++d) {
      const uint32_t bits = d < d_qk ? uint32_t(src[r * d_qk + d]) << 16 : 0u, abits = bits & 0x7FFFFFFFu;
      std::memcpy(f + d, &bits, 4);
      std::memcpy(a + d, &abits, 4);
    }
  }
}

cmp::AttentionBounds bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                            float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                            const Tensor<float>* attn_sink, const AttentionOut& exact, bool dir,
                            const cmp::BoundsKv* shared) {
  const int64_t s_q = q.dim(0), h_q = q.dim(1);
  require(d_v <= q.dim(2), "attention_bounds: d_v " + std::to_string(d_v) + " exceeds d_qk " + std::to_string(q.dim(2)));
  cmp::AttentionBounds b;
  b.out.assign(size_t(s_q * h_q * d_v), 0.0f);
  b.lse.assign(size_t(s_q * h_q), 0.0f);
  b.max_logits.assign(size_t(s_q * h_q), 0.0f);
  if (dir) {
    b.sm_out.assign(size_t(s_q * h_q * d_v), 0.0f);
    b.sm_lse.assign(size_t(s_q * h_q), 0.0f);
  }
  const detail::AttentionView v = detail::sparse_view(q, kv, indices, sm_scale, d_v, topk_length, attn_sink);
  // kv's exponent range and f32 copies: prepared by the caller, or here (the copies when the query
  // rows' keys repeat kv rows, see simd.h).
  const SharedKv* pre = dynamic_cast<const SharedKv*>(shared);
  require(shared == nullptr || pre != nullptr, "attention_bounds_sm: the shared kv work was not made by simd::prepare_bounds_kv");
  if (pre)
    require(pre->kv == kv.ptr() && pre->s_kv == kv.dim(0) && pre->d_qk == q.dim(2),
            "attention_bounds_sm: the shared kv work was made from another kv");
  SharedKv own;
  if (!pre) make_shared_kv(kv, q.dim(2), s_q * indices.dim(2) >= kv.dim(0), own);
  const SharedKv& x = pre ? *pre : own;
  detail::over_rows(s_q, 8, [&](int64_t t0, int64_t t1) {
    HWY_DYNAMIC_DISPATCH(BoundsChunk)(v, exact.out.ptr(), exact.lse.ptr(), exact.max_logits.ptr(), t0, t1,
                                      b.out.data(), b.lse.data(), b.max_logits.data(), dir ? b.sm_out.data() : nullptr,
                                      dir ? b.sm_lse.data() : nullptr, x.lo, x.hi, x.finite, x.kvf.get(), x.kvaoff,
                                      x.kvstride);
  });
  return b;
}
}  // namespace

cmp::AttentionBounds attention_bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                      float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                                      const AttentionOut& exact) {
  return bounds(q, kv, indices, sm_scale, d_v, topk_length, nullptr, exact, false, nullptr);
}

cmp::AttentionBounds attention_bounds_sm(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                         float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                                         const Tensor<float>* attn_sink, const AttentionOut& exact,
                                         const cmp::BoundsKv* shared) {
  return bounds(q, kv, indices, sm_scale, d_v, topk_length, attn_sink, exact, true, shared);
}

std::unique_ptr<cmp::BoundsKv> prepare_bounds_kv(const Tensor<bf16_t>& kv, int64_t d_qk) {
  require(kv.numel() == kv.dim(0) * d_qk, "prepare_bounds_kv: kv holds " + std::to_string(kv.numel()) +
                                              " values, not s_kv x d_qk = " + std::to_string(kv.dim(0)) + " x " + std::to_string(d_qk));
  auto x = std::make_unique<SharedKv>();
  make_shared_kv(kv, d_qk, true, *x);
  return x;
}


}  // namespace indexshare::simd
#endif  // HWY_ONCE
