// indexshare simd/: the register-blocked tiles of the sparse attention backward (simd/attention_bwd.cc).
// The logits tile and the softmax statistics are the forward's (simd/attention.cc DotTile and
// SoftmaxStats, the same operations, without its decode-in-tile and prefetch refinements), copied
// into namespace bwd so that the two translation units stay independent:
//   DotTile    a tile of kDotHeads heads x kDotKeys keys of 8-part dots, lanes = ref's 8 parts, each
//              part summing d ascending with MulAdd (bf16 x bf16 products are exact in double, so
//              fused or not rounds like ref's add), folded in ref's tree; used for the logits
//              (q . k_i, d_qk) and for dP (dO . V_i, d_v: the first d_v columns of the same block)
//   ChainTile  acc[h][cols] = fma(c[i][h], x_i[cols], acc) for i ascending: lanes over columns,
//              heads x vectors of accumulators (the forward's P.V tile); dq = sum_i dS_i k_i
//   KvTile     acc[j][cols] = fma(c[j][h], x_h[cols], acc) for h ascending: lanes over columns,
//              kv rows x vectors of accumulators; dkv's A_K (c = dS, x = q) and A_V (c = P, x = dO)
// Every fused chain calls std::fma per lane on targets without an FMA instruction.

#if defined(INDEXSHARE_SIMD_ATTENTION_BWD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef INDEXSHARE_SIMD_ATTENTION_BWD_INL_H_
#undef INDEXSHARE_SIMD_ATTENTION_BWD_INL_H_
#else
#define INDEXSHARE_SIMD_ATTENTION_BWD_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "hwy/highway.h"
#include "simd/common.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace bwd {
namespace hn = hwy::HWY_NAMESPACE;

using DF64 = hn::ScalableTag<double>;
using VF64 = hn::Vec<DF64>;

constexpr size_t kParts = 8;
HWY_INLINE size_t PartVecs() { return kParts / hn::Lanes(DF64()); }
static_assert(HWY_MAX_BYTES / sizeof(double) <= kParts, "more than 8 double lanes");

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kDotHeads = 4, kDotKeys = 6;
// ChainTile: heads x vectors; KvTile: kv rows x vectors.
constexpr size_t kChainHeads = 4, kChainVecs = 4, kKvRows = 6, kKvVecs = 4;
#else
constexpr size_t kDotHeads = 2, kDotKeys = 2;
constexpr size_t kChainHeads = 2, kChainVecs = HWY_LANES(double) >= 2 ? 4 : 8, kKvRows = 2,
                 kKvVecs = HWY_LANES(double) >= 2 ? 4 : 8;
#endif
static_assert(kParts % kDotHeads == 0, "kDotHeads must divide 8");
static_assert((kChainVecs * HWY_LANES(double)) % kParts == 0, "a chain slice must be whole 8-column groups");
static_assert((kKvVecs * HWY_LANES(double)) % kParts == 0, "a kv slice must be whole 8-column groups");
constexpr size_t kL1Bytes = 24 * 1024;  // a slice of x and the coefficients of its rows

HWY_INLINE int64_t Pad8(int64_t n) { return (n + int64_t(kParts) - 1) / int64_t(kParts) * int64_t(kParts); }

// The key-block layout: row i, column c at base[(i / kDotKeys) * kDotKeys * cols + (c / 8) *
// kDotKeys * 8 + (i % kDotKeys) * 8 + c % 8] (cols a multiple of 8).
HWY_INLINE double* KeyBlockAt(double* base, int64_t cols, int64_t i) {
  return base + (i / int64_t(kDotKeys)) * int64_t(kDotKeys) * cols + (i % int64_t(kDotKeys)) * int64_t(kParts);
}

// 8 bf16 codes -> doubles (exact) at dst[0, 8).
HWY_INLINE void Bf16x8ToF64(const uint16_t* HWY_RESTRICT src, double* HWY_RESTRICT dst) {
  const DF64 d;
  const hn::Rebind<uint16_t, DF64> d16;
  const hn::Rebind<uint32_t, DF64> d32;
  const hn::Rebind<float, DF64> df32;
  const size_t N = hn::Lanes(d);
  for (size_t a = 0; a < kParts / N; ++a) {
    const auto u = hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, src + a * N)));
    hn::Store(hn::PromoteTo(d, hn::BitCast(df32, u)), d, dst + a * N);
  }
}

// src[0, n) as doubles, zeros up to n_pad (a multiple of 8), element e at dst[(e / 8) * stride + e % 8].
HWY_INLINE void DecodeBf16Blocks(const uint16_t* HWY_RESTRICT src, int64_t n, int64_t n_pad, int64_t stride,
                                 double* HWY_RESTRICT dst) {
  const int64_t full = n / int64_t(kParts) * int64_t(kParts);
  double* o = dst;
  for (int64_t e = 0; e < full; e += int64_t(kParts), o += stride) Bf16x8ToF64(src + e, o);
  for (int64_t e = full; e < n_pad; e += int64_t(kParts), o += stride)
    for (int64_t r = 0; r < int64_t(kParts); ++r) o[r] = e + r < n ? detail::bf16_to_double(src[e + r]) : 0.0;
}

// rows sorted ascending (duplicates kept): std::sort for short lists, else a stable LSD radix sort.
HWY_INLINE void SortRows(std::vector<int64_t>& rows, int64_t bound, std::vector<int64_t>& tmp) {
  const size_t n = rows.size();
  if (n < 128) {
    std::sort(rows.begin(), rows.end());
    return;
  }
  tmp.resize(n);
  for (int shift = 0; shift < 64 && (bound - 1) >> shift != 0; shift += 8) {
    size_t count[257] = {};
    for (size_t i = 0; i < n; ++i) ++count[size_t((rows[i] >> shift) & 0xFF) + 1];
    for (size_t b = 1; b < 257; ++b) count[b] += count[b - 1];
    for (size_t i = 0; i < n; ++i) tmp[count[size_t((rows[i] >> shift) & 0xFF)]++] = rows[i];
    rows.swap(tmp);
  }
}

// ref's fold of the 8 parts of one dot from its PartVecs() accumulators.
HWY_INLINE double Fold(const VF64* a) {
  const DF64 d;
  const size_t N = hn::Lanes(d);
  HWY_ALIGN double part[kParts] = {};
  for (size_t i = 0; i < PartVecs(); ++i) hn::Store(a[i], d, part + i * N);
  return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// The fold for eight dots at once (one 8-lane accumulator each): lanes in the order v[0], v[4],
// v[1], v[5], v[2], v[6], v[3], v[7] (the forward's Fold8).
HWY_INLINE __m512d Fold8(const __m512d* v) {
  const auto halves = [](__m512d x, __m512d y) {
    return _mm512_add_pd(_mm512_shuffle_f64x2(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f64x2(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  const auto quarters = [](__m512d u, __m512d w) {
    return _mm512_add_pd(_mm512_shuffle_f64x2(u, w, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f64x2(u, w, _MM_SHUFFLE(3, 1, 3, 1)));
  };
  const __m512d a = quarters(halves(v[0], v[1]), halves(v[2], v[3]));
  const __m512d b = quarters(halves(v[4], v[5]), halves(v[6], v[7]));
  return _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
}
#endif

// out[key * out_stride + h] = (dot of head h and key) * scale for a tile of kDotHeads heads x
// kDotKeys keys, both interleaved: qt[jb * kDotHeads * 8 + h * 8 + r], kt[jb * kDotKeys * 8 + key *
// 8 + r], jb < dpad / 8.
HWY_INLINE void DotTile(const double* HWY_RESTRICT qt, const double* HWY_RESTRICT kt, int64_t dpad, double scale,
                        double* out, int64_t out_stride) {
  const int64_t steps = dpad / int64_t(kParts);
  const DF64 d;
  const size_t N = hn::Lanes(d);
  const size_t A = PartVecs();
  VF64 acc[kDotHeads][kDotKeys][kParts];
  for (size_t h = 0; h < kDotHeads; ++h)
    for (size_t k = 0; k < kDotKeys; ++k)
      for (size_t a = 0; a < A; ++a) acc[h][k][a] = hn::Zero(d);
  for (int64_t jb = 0; jb < steps; ++jb) {
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
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  static_assert(kDotHeads == 4 && kDotKeys % 2 == 0, "Fold8 folds 4 heads x 2 keys");
  const __m512d sv = _mm512_set1_pd(scale);
  for (size_t k = 0; k < kDotKeys; k += 2) {
    const __m512d v[8] = {acc[0][k][0].raw, acc[2][k][0].raw, acc[0][k + 1][0].raw, acc[2][k + 1][0].raw,
                          acc[1][k][0].raw, acc[3][k][0].raw, acc[1][k + 1][0].raw, acc[3][k + 1][0].raw};
    const __m512d r = _mm512_mul_pd(Fold8(v), sv);
    _mm256_storeu_pd(out + int64_t(k) * out_stride, _mm512_castpd512_pd256(r));
    _mm256_storeu_pd(out + int64_t(k + 1) * out_stride, _mm512_extractf64x4_pd(r, 1));
  }
#else
  for (size_t h = 0; h < kDotHeads; ++h)
    for (size_t k = 0; k < kDotKeys; ++k) out[int64_t(k) * out_stride + int64_t(h)] = Fold(acc[h][k]) * scale;
#endif
}

// Per lane (a head), ref's softmax loop over p[i * hs + lane], i < n: the maximum (from -inf, as
// std::max), then p = exp_portable(p - m) stored back and summed into l (i ascending).
template <size_t kV>
HWY_INLINE void SoftmaxStats(double* HWY_RESTRICT p, int64_t hs, int64_t n, double* HWY_RESTRICT mx,
                             double* HWY_RESTRICT l) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  VF64 mv[kV], sv[kV];
  for (size_t u = 0; u < kV; ++u) mv[u] = hn::Set(d, -std::numeric_limits<double>::infinity());
  for (int64_t i = 0; i < n; ++i)
    for (size_t u = 0; u < kV; ++u) {
      const VF64 x = hn::LoadU(d, p + i * hs + int64_t(u) * N);
      mv[u] = hn::IfThenElse(hn::Lt(mv[u], x), x, mv[u]);
    }
  for (size_t u = 0; u < kV; ++u) sv[u] = hn::Zero(d);
  for (int64_t i = 0; i < n; ++i)
    for (size_t u = 0; u < kV; ++u) {
      double* pi = p + i * hs + int64_t(u) * N;
      const VF64 e = ExpPortable(d, hn::Sub(hn::LoadU(d, pi), mv[u]));
      hn::StoreU(e, d, pi);
      sv[u] = hn::Add(sv[u], e);
    }
  for (size_t u = 0; u < kV; ++u) {
    hn::Store(mv[u], d, mx + int64_t(u) * N);
    hn::Store(sv[u], d, l + int64_t(u) * N);
  }
}

// acc[h][0, kVecs N) = fma(c[i * cs + h], x_i[vc0 + same columns], acc) for i ascending in [0, rn):
// c points at the tile's first head (cs doubles per row i), x_i is row i of a row-major slice
// buffer (row i at base + i * cols).
template <size_t kHeads, size_t kVecs>
HWY_INLINE void ChainTile(const double* HWY_RESTRICT c, int64_t cs, const double* HWY_RESTRICT base, int64_t cols,
                          int64_t vc0, int64_t rn, double* const* HWY_RESTRICT acc) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
#if HWY_NATIVE_FMA
  VF64 a[kHeads][kVecs];
  for (size_t h = 0; h < kHeads; ++h)
    for (size_t u = 0; u < kVecs; ++u) a[h][u] = hn::Load(d, acc[h] + int64_t(u) * N);
  for (int64_t i = 0; i < rn; ++i) {
    const double* HWY_RESTRICT xrow = base + i * cols + vc0;
    VF64 xv[kVecs];
    for (size_t u = 0; u < kVecs; ++u) xv[u] = hn::Load(d, xrow + int64_t(u) * N);
    const double* HWY_RESTRICT ci = c + i * cs;
    for (size_t h = 0; h < kHeads; ++h) {
      const VF64 cb = hn::Set(d, ci[h]);
      for (size_t u = 0; u < kVecs; ++u) a[h][u] = hn::MulAdd(cb, xv[u], a[h][u]);
    }
  }
  for (size_t h = 0; h < kHeads; ++h)
    for (size_t u = 0; u < kVecs; ++u) hn::Store(a[h][u], d, acc[h] + int64_t(u) * N);
#else
  for (size_t h = 0; h < kHeads; ++h)
    for (int64_t i = 0; i < rn; ++i)
      for (int64_t e = 0; e < int64_t(kVecs) * N; ++e)
        acc[h][e] = std::fma(c[i * cs + int64_t(h)], base[i * cols + vc0 + e], acc[h][e]);
#endif
}

// acc[h][c0 .. c0 + w) (accumulator rows ast apart) += the chain over rows [0, rn) of the slice
// buffer (cols doubles per row, w columns, a multiple of N), coefficients c[(r0 + i) * cs + h].
HWY_INLINE void ChainHeads(const double* cbuf, int64_t cs, int64_t r0, int64_t h_q, const double* base, int64_t cols,
                           int64_t w, int64_t rn, int64_t c0, int64_t ast, double* acc) {
  const int64_t N = int64_t(hn::Lanes(DF64()));
  const double* c = cbuf + r0 * cs;
  for (int64_t v0 = 0; v0 < w; v0 += N * int64_t(kChainVecs)) {
    const bool full = v0 + N * int64_t(kChainVecs) <= w;
    int64_t h = 0;
    for (; h + int64_t(kChainHeads) <= h_q; h += int64_t(kChainHeads)) {
      double* as[kChainHeads];
      for (size_t e = 0; e < kChainHeads; ++e) as[e] = acc + (h + int64_t(e)) * ast + c0 + v0;
      if (full) {
        ChainTile<kChainHeads, kChainVecs>(c + h, cs, base, cols, v0, rn, as);
      } else {
        for (int64_t u = v0; u < w; u += N) {
          double* a1[kChainHeads];
          for (size_t e = 0; e < kChainHeads; ++e) a1[e] = as[e] + (u - v0);
          ChainTile<kChainHeads, 1>(c + h, cs, base, cols, u, rn, a1);
        }
      }
    }
    for (; h < h_q; ++h)
      for (int64_t u = v0; u < std::min(w, v0 + N * int64_t(kChainVecs)); u += N) {
        double* a1[1] = {acc + h * ast + c0 + u};
        ChainTile<1, 1>(c + h, cs, base, cols, u, rn, a1);
      }
  }
}

// acc[h][0, cpad) += sum_i c[i * cs + h] x_i[0, cpad) over the n listed kv rows (i ascending, fused),
// x_i = kv[rows[i]][0, cols) gathered and decoded again a slice of columns x a sub-chunk of rows at
// a time into an L1 buffer that every head tile reads (the forward's P.V pass).
HWY_INLINE void ChainFromRows(const double* cbuf, int64_t cs, int64_t h_q, const uint16_t* kv, int64_t d_qk,
                              int64_t cols, const int64_t* rows, int64_t n, int64_t ast, double* slice,
                              double* acc) {
  const int64_t cw = int64_t(kChainVecs * hn::Lanes(DF64()));
  const int64_t cpad = Pad8(cols);
  const int64_t sub = std::max<int64_t>(1, int64_t(kL1Bytes) / (int64_t(sizeof(double)) * (cw + cs)));
  for (int64_t s0 = 0; s0 < n; s0 += sub) {
    const int64_t sn = std::min(sub, n - s0);
    for (int64_t c0 = 0; c0 < cpad; c0 += cw) {
      const int64_t w = std::min(cw, cpad - c0), cn = std::min(w, cols - c0);
      for (int64_t i = 0; i < sn; ++i)
        DecodeBf16Blocks(kv + rows[s0 + i] * d_qk + c0, cn, w, int64_t(kParts), slice + i * w);
      ChainHeads(cbuf, cs, s0, h_q, slice, w, w, sn, c0, ast, acc);
    }
  }
}

// acc[j][0, kVecs N) = fma(c[pos_j * cs + h], x[h * xs + same columns], acc) for h ascending in [0, h_q).
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

}  // namespace bwd
}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
