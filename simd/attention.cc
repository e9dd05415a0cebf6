// indexshare simd/: sparse and dense attention with ref/attention.cc's semantics, operation for
// operation, so the outputs equal ref's bit for bit on every target.
//
// Per query row t (OpenMP splits over chunks of rows only, so the thread count never changes a bit):
//   rows     the valid kv rows, sorted ascending, duplicates kept (exactly ref's list)
//   pass 1   P[h][i] = (q[t,h,:] . k_i) * sm_scale with lanes over d: the accumulator lanes of
//            one dot are ref's 8 parts (lane l of accumulator a holds part a * N + l, N lanes per
//            vector, 8 / N accumulators), each part summing d ascending with MulAdd (bf16 x bf16
//            products are exact in double, so fused or not rounds like ref's add); the parts are
//            then folded in ref's tree. A tile of kDotHeads heads x kDotKeys keys is computed at
//            once from q (decoded once per row) and a block of gathered, decoded kv rows.
//   pass 2   per head: the maximum (order-free: P is never -0 and NaN never wins, as with
//            std::max from -inf), exp_portable lane by lane (simd/exp-inl.h), the sum l in ref's
//            order (i ascending; several heads interleaved), lse = m + log(l), the sink factor
//   pass 3   out = sum_i p_i * V_i, lanes over d_v columns, i ascending, one fused multiply-add
//            per term as ref's std::fma (targets without FMA instructions call std::fma per lane)

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/exp-inl.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "ref/numerics.h"
#include "simd/common.h"
#include "simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF64 = hn::ScalableTag<double>;
using VF64 = hn::Vec<DF64>;

// ref's dot product has 8 parts; a target with N lanes per vector holds them in 8 / N vectors.
constexpr size_t kParts = 8;
HWY_INLINE size_t PartVecs() { return kParts / hn::Lanes(DF64()); }
static_assert(HWY_MAX_BYTES / sizeof(double) <= kParts, "more than 8 double lanes");

// Pass 1 tile (accumulators: heads x keys x PartVecs() registers) and the kv rows per block.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kDotHeads = 4, kDotKeys = 6;
#elif HWY_TARGET == HWY_AVX2
constexpr size_t kDotHeads = 2, kDotKeys = 2;
#else
constexpr size_t kDotHeads = 2, kDotKeys = 2;
#endif
// Keys decoded at a time: one tile's worth, so that they stay in L1 while every head tile passes
// over them (the q rows stream from L2, kDotHeads loads per kDotHeads * kDotKeys MulAdds).
constexpr int64_t kKeyBlock = kDotKeys;
// Pass 3 tile: vectors of d_v x heads (accumulators), and rows of V decoded at a time (one
// kPVRows x kPVVecs-vector slice of V, 16 KiB on AVX3, stays in L1 for every head tile).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kPVVecs = 3, kPVHeads = 8;
#else
constexpr size_t kPVVecs = 4, kPVHeads = 2;
#endif
constexpr int64_t kPVRows = 128;

// The bf16 codes src[0, n) as doubles (exact), zeros up to n_pad, element e at
// dst[(e / 8) * stride + e % 8]: the interleaved layout of pass 1 (the 8-part blocks of
// consecutive rows or heads side by side); stride 8 gives a plain row (DecodeBf16).
HWY_INLINE void DecodeBf16Blocks(const uint16_t* HWY_RESTRICT src, int64_t n, int64_t n_pad,
                                 int64_t stride, double* HWY_RESTRICT dst) {
  const DF64 d;
  const hn::Rebind<uint16_t, DF64> d16;
  const hn::Rebind<uint32_t, DF64> d32;
  const hn::Rebind<float, DF64> df32;
  const int64_t N = int64_t(hn::Lanes(d));
  const auto at = [&](int64_t e) { return dst + (e / int64_t(kParts)) * stride + e % int64_t(kParts); };
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto u = hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, src + i)));
    hn::Store(hn::PromoteTo(d, hn::BitCast(df32, u)), d, at(i));
  }
  for (; i < n; ++i) *at(i) = detail::bf16_to_double(src[i]);
  for (; i < n_pad; ++i) *at(i) = 0.0;
}

HWY_INLINE void DecodeBf16(const uint16_t* HWY_RESTRICT src, int64_t n, int64_t n_pad, double* HWY_RESTRICT dst) {
  DecodeBf16Blocks(src, n, n_pad, int64_t(kParts), dst);
}

// Prefetches the kv rows rows[from, from + count) (bytes each) into the cache: the rows of the next
// block are fetched while the present block is computed (gathered rows defeat the hardware
// prefetcher, which only follows a row once it has started).
HWY_INLINE void PrefetchRows(const uint16_t* kv, int64_t d_qk, const std::vector<int64_t>& rows,
                             int64_t from, int64_t count, int64_t bytes) {
  const int64_t end = std::min<int64_t>(int64_t(rows.size()), from + count);
  for (int64_t i = from; i < end; ++i) {
    const char* row = reinterpret_cast<const char*>(kv + rows[size_t(i)] * d_qk);
    for (int64_t b = 0; b < bytes; b += 64) hwy::Prefetch(row + b);
  }
}


// ref's fold of the 8 parts, ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)), for two dots x
// and y from their PartVecs() accumulators. With 8 or 4 lanes the folds are vector adds of
// permuted copies (every lane add is one of ref's adds; IEEE addition is commutative);
// otherwise the parts go through memory and the scalar tree.
HWY_INLINE void FoldPair(const VF64* x, const VF64* y, double& ox, double& oy) {
  const DF64 d;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // u = [x0+x4, x1+x5, x2+x6, x3+x7 | y0+y4, ...]; v: + the other 128-bit block of the same half;
  // w: + the neighbouring lane. Lane 0 holds x's result, lane 4 y's.
  const VF64 u = hn::Add(hn::ConcatLowerLower(d, y[0], x[0]), hn::ConcatUpperUpper(d, y[0], x[0]));
  const VF64 v = hn::Add(u, hn::SwapAdjacentBlocks(u));
  const VF64 w = hn::Add(v, hn::Shuffle01(v));
  ox = hn::ExtractLane(w, 0);
  oy = hn::ExtractLane(w, 4);
#elif HWY_TARGET == HWY_AVX2
  // Per dot: u = [p0+p4, p1+p5, p2+p6, p3+p7], v: + the other 128-bit half, w: + the neighbour.
  const auto fold = [&](const VF64* a) {
    const VF64 u = hn::Add(a[0], a[1]);
    const VF64 v = hn::Add(u, hn::ConcatLowerUpper(d, u, u));
    return hn::GetLane(hn::Add(v, hn::Shuffle01(v)));
  };
  ox = fold(x);
  oy = fold(y);
#else
  const size_t N = hn::Lanes(d);
  const auto fold = [&](const VF64* a) {
    HWY_ALIGN double part[kParts] = {};
    for (size_t i = 0; i < PartVecs(); ++i) hn::Store(a[i], d, part + i * N);
    return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
  };
  ox = fold(x);
  oy = fold(y);
#endif
}

// P[h][key] for a tile of kDotHeads heads and kDotKeys keys, both in the interleaved layout:
// qt[jb * kDotHeads * 8 + h * 8 + r] = q[h][8 jb + r], kt[jb * kDotKeys * 8 + key * 8 + r] likewise,
// jb < dpad / 8 (so each operand is one contiguous stream); out[h * out_stride + key] = dot * scale.
HWY_INLINE void DotTile(const double* HWY_RESTRICT qt, const double* HWY_RESTRICT kt, int64_t dpad,
                        double scale, double* out, int64_t out_stride) {
  const DF64 d;
  const size_t N = hn::Lanes(d);
  const size_t A = PartVecs();
  VF64 acc[kDotHeads][kDotKeys][kParts];
  for (size_t h = 0; h < kDotHeads; ++h)
    for (size_t k = 0; k < kDotKeys; ++k)
      for (size_t a = 0; a < A; ++a) acc[h][k][a] = hn::Zero(d);
  for (int64_t jb = 0; jb < dpad / int64_t(kParts); ++jb) {
    const double* HWY_RESTRICT qb = qt + jb * int64_t(kDotHeads * kParts);
    const double* HWY_RESTRICT kb = kt + jb * int64_t(kDotKeys * kParts);
    for (size_t a = 0; a < A; ++a) {
      VF64 kv[kDotKeys];
      for (size_t k = 0; k < kDotKeys; ++k) kv[k] = hn::Load(d, kb + k * kParts + a * N);
      for (size_t h = 0; h < kDotHeads; ++h) {
        const VF64 qv = hn::Load(d, qb + h * kParts + a * N);
        for (size_t k = 0; k < kDotKeys; ++k) acc[h][k][a] = hn::MulAdd(qv, kv[k], acc[h][k][a]);
      }
    }
  }
  static_assert(kDotKeys % 2 == 0, "FoldPair takes the keys two by two");
  for (size_t h = 0; h < kDotHeads; ++h)
    for (size_t k = 0; k < kDotKeys; k += 2) {
      double dx, dy;
      FoldPair(acc[h][k], acc[h][k + 1], dx, dy);
      out[int64_t(h) * out_stride + int64_t(k)] = dx * scale;
      out[int64_t(h) * out_stride + int64_t(k) + 1] = dy * scale;
    }
}

// acc[h][c0 .. c0 + kPVVecs * N) = fma(p[h][i], V[i][same columns], acc) for i ascending, with
// vbuf[i * cw + (0 .. cw)] = V[i][c0 .. c0 + cw), cw = kPVVecs * N.
template <size_t kHeads>
HWY_INLINE void PVTile(const double* const* HWY_RESTRICT p, const double* HWY_RESTRICT vbuf,
                       int64_t rn, int64_t c0, double* const* HWY_RESTRICT acc) {
  const DF64 d;
  const size_t N = hn::Lanes(d);
#if HWY_NATIVE_FMA
  VF64 a[kHeads][kPVVecs];
  for (size_t h = 0; h < kHeads; ++h)
    for (size_t u = 0; u < kPVVecs; ++u) a[h][u] = hn::Load(d, acc[h] + c0 + u * N);
  for (int64_t i = 0; i < rn; ++i) {
    const double* HWY_RESTRICT vrow = vbuf + i * int64_t(kPVVecs * N);
    VF64 vv[kPVVecs];
    for (size_t u = 0; u < kPVVecs; ++u) vv[u] = hn::Load(d, vrow + u * N);
    for (size_t h = 0; h < kHeads; ++h) {
      const VF64 pb = hn::Set(d, p[h][i]);
      for (size_t u = 0; u < kPVVecs; ++u) a[h][u] = hn::MulAdd(pb, vv[u], a[h][u]);
    }
  }
  for (size_t h = 0; h < kHeads; ++h)
    for (size_t u = 0; u < kPVVecs; ++u) hn::Store(a[h][u], d, acc[h] + c0 + u * N);
#else
  // No fused multiply-add instruction on this target: Highway's MulAdd would round twice.
  for (size_t h = 0; h < kHeads; ++h)
    for (int64_t i = 0; i < rn; ++i)
      for (size_t c = 0; c < kPVVecs * N; ++c)
        acc[h][c0 + int64_t(c)] = std::fma(p[h][i], vbuf[i * int64_t(kPVVecs * N) + int64_t(c)], acc[h][c0 + int64_t(c)]);
#endif
}

// y[i] = exp_portable(x[i]) (the export behind simd::exp_portable, for the tests).
void ExpArray(const double* x, double* y, int64_t n) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(ExpPortable(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {  // the tail through a padded vector, so that every value takes the vector path
    HWY_ALIGN double buf[kParts] = {};
    std::copy(x + i, x + n, buf);
    hn::Store(ExpPortable(d, hn::Load(d, buf)), d, buf);
    std::copy(buf, buf + (n - i), y + i);
  }
}

// Query rows [t0, t1), all heads, with this call's own scratch. No OpenMP in here: the caller
// (the HWY_ONCE part) splits the rows into chunks across threads. An OpenMP region inside a target
// function is outlined by the compiler into a function that need not carry the target's
// instruction set (clang 14 then fails to select SSE4.1 roundpd).
void AttentionChunk(const detail::AttentionView& v, int64_t t0, int64_t t1, float* out, float* lse_out,
                    float* max_out) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = v.h_q, d_qk = v.d_qk, d_v = v.d_v;
  const int64_t dpad = (d_qk + int64_t(kParts) - 1) / int64_t(kParts) * int64_t(kParts);
  const int64_t hpad = (h_q + int64_t(kDotHeads) - 1) / int64_t(kDotHeads) * int64_t(kDotHeads);
  const int64_t q_tile = int64_t(kDotHeads) * dpad;  // doubles per head tile of q
  const int64_t cw = int64_t(kPVVecs) * N;      // columns per P.V tile
  const int64_t dvp = (d_v + cw - 1) / cw * cw;  // d_v padded to whole tiles

  {
    auto qd = hwy::AllocateAligned<double>(size_t(hpad * dpad));
    auto kbuf = hwy::AllocateAligned<double>(size_t(kKeyBlock * dpad));
    auto vbuf = hwy::AllocateAligned<double>(size_t(kPVRows * cw));
    auto acc = hwy::AllocateAligned<double>(size_t(h_q * dvp));
    hwy::AlignedFreeUniquePtr<double[]> pbuf;
    int64_t pbuf_size = 0;
    std::vector<int64_t> rows;
    std::vector<double> factor(static_cast<size_t>(h_q)), l(static_cast<size_t>(h_q)), mx(static_cast<size_t>(h_q));
    std::fill(qd.get(), qd.get() + hpad * dpad, 0.0);  // padding heads stay zero

    for (int64_t t = t0; t < t1; ++t) {
      rows.clear();
      if (v.dense) {
        for (int64_t i = v.ks[t]; i < v.ke[t]; ++i) rows.push_back(i);
      } else {
        const int64_t len = v.topk_length ? v.topk_length[t] : v.topk;
        for (int64_t j = 0; j < len; ++j) {
          const int64_t i = v.indices[t * v.topk + j];
          if (0 <= i && i < v.s_kv) rows.push_back(i);
        }
        std::sort(rows.begin(), rows.end());
      }
      const int64_t n = int64_t(rows.size());
      if (n == 0) {  // lonely query: FlashMLA HEAD convention
        std::fill(out + t * h_q * d_v, out + (t + 1) * h_q * d_v, 0.0f);
        for (int64_t h = 0; h < h_q; ++h) {
          lse_out[t * h_q + h] = std::numeric_limits<float>::infinity();
          max_out[t * h_q + h] = -std::numeric_limits<float>::infinity();
        }
        continue;
      }
      const int64_t n_pad = (n + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
      if (hpad * n_pad > pbuf_size) {
        pbuf_size = hpad * n_pad;
        pbuf = hwy::AllocateAligned<double>(size_t(pbuf_size));
      }
      // Pass 1: P[h][i] = (q[t,h,:] . kv[rows[i]]) * sm_scale. q is decoded once per row into
      // head tiles, kv rows kKeyBlock at a time, both interleaved (see DotTile).
      for (int64_t h = 0; h < h_q; ++h)
        DecodeBf16Blocks(v.q + (t * h_q + h) * d_qk, d_qk, dpad, int64_t(kDotHeads * kParts),
                         qd.get() + (h / int64_t(kDotHeads)) * q_tile + (h % int64_t(kDotHeads)) * int64_t(kParts));
      PrefetchRows(v.kv, d_qk, rows, 0, kKeyBlock, d_qk * 2);
      for (int64_t i0 = 0; i0 < n; i0 += kKeyBlock) {
        const int64_t bn = std::min(kKeyBlock, n - i0);
        PrefetchRows(v.kv, d_qk, rows, i0 + kKeyBlock, kKeyBlock, d_qk * 2);
        for (int64_t i = 0; i < kKeyBlock; ++i) {
          if (i < bn)
            DecodeBf16Blocks(v.kv + rows[size_t(i0 + i)] * d_qk, d_qk, dpad, int64_t(kDotKeys * kParts),
                             kbuf.get() + i * int64_t(kParts));
          else
            DecodeBf16Blocks(nullptr, 0, dpad, int64_t(kDotKeys * kParts), kbuf.get() + i * int64_t(kParts));
        }
        for (int64_t h0 = 0; h0 < hpad; h0 += int64_t(kDotHeads))
          DotTile(qd.get() + (h0 / int64_t(kDotHeads)) * q_tile, kbuf.get(), dpad, v.sm_scale,
                  pbuf.get() + h0 * n_pad + i0, n_pad);
      }
      // Pass 2: softmax statistics per head, in ref's order.
      for (int64_t h = 0; h < h_q; ++h) {
        double* p = pbuf.get() + h * n_pad;
        int64_t i = 0;
        VF64 mv = hn::Set(d, -std::numeric_limits<double>::infinity());
        for (; i + N <= n; i += N) {
          const VF64 x = hn::LoadU(d, p + i);
          mv = hn::IfThenElse(hn::Lt(mv, x), x, mv);
        }
        HWY_ALIGN double lanes[kParts] = {};
        hn::Store(mv, d, lanes);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t e = 0; e < N; ++e) m = std::max(m, lanes[e]);
        for (; i < n; ++i) m = std::max(m, p[i]);
        const VF64 mb = hn::Set(d, m);
        for (i = 0; i + N <= n; i += N) hn::StoreU(ExpPortable(d, hn::Sub(hn::LoadU(d, p + i), mb)), d, p + i);
        for (; i < n; ++i) p[i] = indexshare::exp_portable(p[i] - m);
        mx[size_t(h)] = m;
      }
      // l[h] = sum_i p[h][i], i ascending (independent chains for several heads at once).
      constexpr int64_t kSumHeads = 8;
      for (int64_t h0 = 0; h0 < h_q; h0 += kSumHeads) {
        const int64_t hc = std::min(kSumHeads, h_q - h0);
        double s[kSumHeads] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t i = 0; i < n; ++i)
          for (int64_t e = 0; e < hc; ++e) s[e] += pbuf[size_t((h0 + e) * n_pad + i)];
        for (int64_t e = 0; e < hc; ++e) l[size_t(h0 + e)] = s[e];
      }
      for (int64_t h = 0; h < h_q; ++h) {
        const double lse = mx[size_t(h)] + std::log(l[size_t(h)]);
        double f = 1.0 / l[size_t(h)];
        if (v.sink) f *= 1.0 / (1.0 + indexshare::exp_portable(double(v.sink[h]) - lse));
        factor[size_t(h)] = f;
        lse_out[t * h_q + h] = float(lse);
        max_out[t * h_q + h] = float(mx[size_t(h)]);
      }
      // Pass 3: acc[h][c] = sum_i p[h][i] * V[rows[i]][c], rows ascending, fused.
      std::fill(acc.get(), acc.get() + h_q * dvp, 0.0);
      PrefetchRows(v.kv, d_qk, rows, 0, kPVRows, d_v * 2);
      for (int64_t r0 = 0; r0 < n; r0 += kPVRows) {
        const int64_t rn = std::min(kPVRows, n - r0);
        PrefetchRows(v.kv, d_qk, rows, r0 + kPVRows, kPVRows, d_v * 2);
        for (int64_t c0 = 0; c0 < dvp; c0 += cw) {
          const int64_t cn = std::min(cw, d_v - c0);
          for (int64_t i = 0; i < rn; ++i) DecodeBf16(v.kv + rows[size_t(r0 + i)] * d_qk + c0, cn, cw, vbuf.get() + i * cw);
          int64_t h = 0;
          for (; h + int64_t(kPVHeads) <= h_q; h += int64_t(kPVHeads)) {
            const double* ps[kPVHeads];
            double* as[kPVHeads];
            for (size_t e = 0; e < kPVHeads; ++e) {
              ps[e] = pbuf.get() + (h + int64_t(e)) * n_pad + r0;
              as[e] = acc.get() + (h + int64_t(e)) * dvp;
            }
            PVTile<kPVHeads>(ps, vbuf.get(), rn, c0, as);
          }
          for (; h < h_q; ++h) {
            const double* ps[1] = {pbuf.get() + h * n_pad + r0};
            double* as[1] = {acc.get() + h * dvp};
            PVTile<1>(ps, vbuf.get(), rn, c0, as);
          }
        }
      }
      for (int64_t h = 0; h < h_q; ++h) {
        float* o = out + (t * h_q + h) * d_v;
        const double* a = acc.get() + h * dvp;
        for (int64_t c = 0; c < d_v; ++c) o[c] = float(a[c] * factor[size_t(h)]);
      }
    }
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace indexshare::simd {

HWY_EXPORT(AttentionChunk);
HWY_EXPORT(ExpArray);

void exp_portable(const double* x, double* y, int64_t n) { HWY_DYNAMIC_DISPATCH(ExpArray)(x, y, n); }

namespace {

detail::AttentionView make_view(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                                int64_t d_v, const Tensor<float>* attn_sink) {
  static_assert(sizeof(bf16_t) == sizeof(uint16_t));
  detail::AttentionView v;
  v.q = reinterpret_cast<const uint16_t*>(q.ptr());
  v.kv = reinterpret_cast<const uint16_t*>(kv.ptr());
  v.s_q = q.dim(0);
  v.h_q = q.dim(1);
  v.d_qk = q.dim(2);
  v.s_kv = kv.dim(0);
  v.d_v = d_v;
  v.sm_scale = double(sm_scale);
  v.sink = attn_sink ? attn_sink->ptr() : nullptr;
  return v;
}

AttentionOut run(const detail::AttentionView& v) {
  AttentionOut o{Tensor<float>({v.s_q, v.h_q, v.d_v}), Tensor<bf16_t>({v.s_q, v.h_q, v.d_v}),
                 Tensor<float>({v.s_q, v.h_q}), Tensor<float>({v.s_q, v.h_q})};
  // Chunks of up to 8 query rows over the threads (independent outputs, so neither the thread
  // count nor the chunk size changes a bit); each chunk allocates its scratch once. Small s_q gets
  // smaller chunks so that every thread has some.
  const int64_t kChunkRows = std::clamp<int64_t>(v.s_q / (4 * int64_t(omp_get_max_threads())), 1, 8);
  const int64_t chunks = (v.s_q + kChunkRows - 1) / kChunkRows;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c)
    HWY_DYNAMIC_DISPATCH(AttentionChunk)(v, c * kChunkRows, std::min(v.s_q, (c + 1) * kChunkRows), o.out.ptr(),
                                         o.lse.ptr(), o.max_logits.ptr());
  for (int64_t i = 0; i < o.out.numel(); ++i) o.out_bf16[i] = f32_to_bf16(o.out[i]);
  return o;
}

}  // namespace

AttentionOut sparse_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                              const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                              const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink) {
  ref::check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0);
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
  detail::AttentionView v = make_view(q, kv, sm_scale, d_v, attn_sink);
  v.indices = indices.ptr();
  v.topk = topk;
  v.topk_length = topk_length ? topk_length->ptr() : nullptr;
  return run(v);
}

AttentionOut dense_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                             int64_t d_v, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                             const Tensor<float>* attn_sink) {
  ref::check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0), s_kv = kv.dim(0);
  require_shape(ks, {s_q}, "attention ks");
  require_shape(ke, {s_q}, "attention ke");
  for (int64_t t = 0; t < s_q; ++t)
    require(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_kv,
            "attention ks/ke: row " + std::to_string(t) + " bounds outside 0 <= ks <= ke <= s_kv");
  detail::AttentionView v = make_view(q, kv, sm_scale, d_v, attn_sink);
  v.dense = true;
  v.ks = ks.ptr();
  v.ke = ke.ptr();
  return run(v);
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
