// indexshare simd/: the pieces of the sparse attention that the forward (simd/attention.cc) and the
// backward (simd/attention_bwd.cc) share, one copy compiled into each per target:
//   decode     bf16 codes -> doubles (exact) in the interleaved 8-part layouts (DecodeBf16Blocks,
//              KeyBlockAt), the sorted row list (SortRows)
//   DotTile    a tile of kDotHeads heads x kDotKeys keys of 8-part dots, lanes = ref's 8 parts, each
//              part summing d ascending with MulAdd (bf16 x bf16 products are exact in double, so
//              fused or not rounds like ref's add), folded in ref's tree (on AVX3 eight dots at once);
//              the forward's logits, the backward's logits and dP (dO . V_i)
//   softmax    SoftmaxStats: lanes over heads, each lane ref's loop for its head (max, exp_portable, l)
//   chains     PVTile / PVHeads / PVFromRows: acc[h][cols] = fma(c[i][h], x_i[cols], acc) for i
//              ascending, lanes over columns, x gathered and decoded again an L1 slice at a time; the
//              forward's P.V and the backward's dq = sum_i dS_i k_i
// Every fused chain calls std::fma per lane on targets without an FMA instruction.

#if defined(INDEXSHARE_SIMD_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef INDEXSHARE_SIMD_ATTENTION_INL_H_
#undef INDEXSHARE_SIMD_ATTENTION_INL_H_
#else
#define INDEXSHARE_SIMD_ATTENTION_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "simd/common.h"
#include "simd/exp-inl.h"
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
// Pass 1 writes hpad heads (h_q rounded up to kDotHeads) per key into P, whose keys are hs apart
// (h_q rounded up to 8): hpad <= hs only when kDotHeads divides 8 (a 3-head tile on AVX2 wrote
// past P and corrupted the heap).
static_assert(kParts % kDotHeads == 0, "kDotHeads must divide 8");
// Pass 3 tile: vectors of d_v x heads (accumulators). V is gathered and decoded again, one L1-sized
// slice at a time (PVFromRows). Measured and dropped: keeping pass 1's decoded rows for pass 3
// (the buffer, 4.5 KiB per row, spills out of L2, and writing it costs more than decoding twice);
// copying V's bf16 codes in pass 1 into a contiguous buffer for pass 3 (the copy costs more than
// the gather it saves).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// 4 heads x 4 vectors: a slice is 32 columns, one 64-byte line of codes per row (8 heads x 3
// vectors, 24 columns that straddle lines, measured 5 % slower at h_q 16, 3 % at h_q 64).
constexpr size_t kPVVecs = 4, kPVHeads = 4;
#else
// A slice is a whole number of 8-column groups (the unit of DecodeBf16Blocks): 8 single-lane
// vectors on SCALAR, 4 elsewhere.
constexpr size_t kPVVecs = HWY_LANES(double) >= 2 ? 4 : 8, kPVHeads = 2;
#endif
static_assert((kPVVecs * HWY_LANES(double)) % kParts == 0, "a P.V slice must be whole 8-column groups");
// PVFromRows keeps a slice of V and the p of every head for its rows within this many bytes of L1.
constexpr size_t kPVL1Bytes = 24 * 1024;

// Doubles up to whole 8-part groups.
HWY_INLINE int64_t Pad8(int64_t n) { return (n + int64_t(kParts) - 1) / int64_t(kParts) * int64_t(kParts); }

// The key-block layout: row i of a list, column c at
//   base[(i / kDotKeys) * kDotKeys * cols + (c / 8) * kDotKeys * 8 + (i % kDotKeys) * 8 + c % 8]
// (cols a multiple of 8): a block of kDotKeys rows has its 8-column groups side by side, the
// operand stream of DotTile. (P.V's slices are plain row-major: PVTile reads whole rows.)
HWY_INLINE double* KeyBlockAt(double* base, int64_t cols, int64_t i) {
  return base + (i / int64_t(kDotKeys)) * int64_t(kDotKeys) * cols + (i % int64_t(kDotKeys)) * int64_t(kParts);
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// 8 bf16 codes -> one vector of 8 doubles (exact). The 16 bytes in both 128-bit halves (a
// load-port broadcast), one byte shuffle placing each code in the upper half of a 32-bit lane (the
// f32 with the same value), one conversion to 8 doubles: three vector ALU uops for 8 values where
// zero-extend + shift + convert take four.
HWY_INLINE VF64 Bf16x8Vec(const uint16_t* HWY_RESTRICT src) {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  const __m256i idx = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,  //
                                       -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
  const hn::Rebind<float, DF64> df32;
  return hn::PromoteTo(DF64(), hn::Vec<decltype(df32)>{_mm256_castsi256_ps(_mm256_shuffle_epi8(b, idx))});
}
// The first head tile of a block or slice can decode its operands as it goes (DotTile, PVTile).
constexpr bool kDecodeInTile = true;
#else
constexpr bool kDecodeInTile = false;
#endif

// 8 bf16 codes -> doubles (exact), as one or more vectors of N lanes stored at dst[0, 8).
HWY_INLINE void Bf16x8ToF64(const uint16_t* HWY_RESTRICT src, double* HWY_RESTRICT dst) {
  const DF64 d;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  hn::Store(Bf16x8Vec(src), d, dst);
#else
  const hn::Rebind<uint16_t, DF64> d16;
  const hn::Rebind<uint32_t, DF64> d32;
  const hn::Rebind<float, DF64> df32;
  const size_t N = hn::Lanes(d);
  for (size_t a = 0; a < kParts / N; ++a) {
    const auto u = hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, src + a * N)));
    hn::Store(hn::PromoteTo(d, hn::BitCast(df32, u)), d, dst + a * N);
  }
#endif
}

// The bf16 codes src[0, n) as doubles (exact), zeros up to n_pad (a multiple of 8), element e at
// dst[(e / 8) * stride + e % 8]: the interleaved layouts of pass 1 (the 8-part blocks of
// consecutive rows or heads side by side); stride 8 gives a plain row.
HWY_INLINE void DecodeBf16Blocks(const uint16_t* HWY_RESTRICT src, int64_t n, int64_t n_pad,
                                 int64_t stride, double* HWY_RESTRICT dst) {
  const int64_t full = n / int64_t(kParts) * int64_t(kParts);
  double* o = dst;
  for (int64_t e = 0; e < full; e += int64_t(kParts), o += stride) Bf16x8ToF64(src + e, o);
  for (int64_t e = full; e < n_pad; e += int64_t(kParts), o += stride)
    for (int64_t r = 0; r < int64_t(kParts); ++r)
      o[r] = e + r < n ? detail::bf16_to_double(src[e + r]) : 0.0;
}

// Prefetches the cache line at p into L2 (x86; elsewhere into L1, the one hint Highway offers).
HWY_INLINE void PrefetchL2(const char* p) {
#if HWY_ARCH_X86
  _mm_prefetch(p, _MM_HINT_T1);
#else
  hwy::Prefetch(p);
#endif
}

// rows sorted ascending (duplicates kept), every value in [0, bound): std::sort for short lists,
// else a least-significant-digit radix sort over 8-bit digits (stable, so the result is the same
// list; 2 passes up to 65536 keys, 3 up to 2^24), an order of magnitude faster at top-k 2048.
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

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// ref's fold of the 8 parts, ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)), for eight dots at
// once (one 8-lane accumulator each): 14 shuffles and 7 vector adds, every lane add one of ref's
// adds (IEEE addition is commutative). The result's lanes hold the dots of v in the order
// v[0], v[4], v[1], v[5], v[2], v[6], v[3], v[7].
HWY_INLINE __m512d Fold8(const __m512d* v) {
  // Level 1, per pair (x, y): [x0+x4, x1+x5, x2+x6, x3+x7, y0+y4, ..., y3+y7].
  const auto halves = [](__m512d x, __m512d y) {
    return _mm512_add_pd(_mm512_shuffle_f64x2(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f64x2(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  // Level 2, per pair of level-1 results (u, w): lanes 2j, 2j + 1 hold dot j's (p0+p4)+(p2+p6)
  // and (p1+p5)+(p3+p7), dots in the order u's two, w's two.
  const auto quarters = [](__m512d u, __m512d w) {
    return _mm512_add_pd(_mm512_shuffle_f64x2(u, w, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f64x2(u, w, _MM_SHUFFLE(3, 1, 3, 1)));
  };
  const __m512d a = quarters(halves(v[0], v[1]), halves(v[2], v[3]));
  const __m512d b = quarters(halves(v[4], v[5]), halves(v[6], v[7]));
  // Level 3: the two halves of each dot, a's dots interleaved with b's.
  return _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
}
#else
// ref's fold of the 8 parts for two dots x and y from their PartVecs() accumulators. With 4 lanes
// the folds are vector adds of permuted copies (every lane add is one of ref's adds); otherwise
// the parts go through memory and the scalar tree.
HWY_INLINE void FoldPair(const VF64* x, const VF64* y, double& ox, double& oy) {
  const DF64 d;
#if HWY_TARGET == HWY_AVX2
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
#endif

constexpr int64_t kQAhead = 8;  // DotTile's q prefetch distance, in 8-column steps

// P[h][key] for a tile of kDotHeads heads and kDotKeys keys, both in the interleaved layout:
// qt[jb * kDotHeads * 8 + h * 8 + r] = q[h][8 jb + r], kt[jb * kDotKeys * 8 + key * 8 + r] likewise,
// jb < dpad / 8 (so each operand is one contiguous stream); out[key * out_stride + h] = dot * scale
// (P is kept key-major: the heads of one key side by side, as softmax and P.V read them).
// kDecode (AVX3 only, whole key blocks, d_qk a multiple of 8): the keys are not read from kt but
// decoded from the bf16 rows src[k] as the tile goes and stored into kt for the following head
// tiles: the first head tile of a block hides the decode among its FMAs. The tile prefetches the
// n_pf cache lines pf[0, n_pf) evenly over its steps (lines of the next block's kv rows).
template <bool kDecode = false>
HWY_INLINE void DotTile(const double* HWY_RESTRICT qt, const double* HWY_RESTRICT kt, int64_t dpad,
                        double scale, double* out, int64_t out_stride,
                        const uint16_t* const* HWY_RESTRICT src = nullptr,
                        const char* const* HWY_RESTRICT pf = nullptr, int64_t n_pf = 0) {
  (void)src;  // read only by the kDecode tile on AVX3
  const int64_t steps = dpad / int64_t(kParts);
  int64_t pf_acc = 0, pf_i = 0;  // a line each time pf_acc passes `steps` (n_pf / steps per step)
  const DF64 d;
  const size_t N = hn::Lanes(d);
  const size_t A = PartVecs();
  VF64 acc[kDotHeads][kDotKeys][kParts];
  for (size_t h = 0; h < kDotHeads; ++h)
    for (size_t k = 0; k < kDotKeys; ++k)
      for (size_t a = 0; a < A; ++a) acc[h][k][a] = hn::Zero(d);
  for (int64_t jb = 0; jb < steps; ++jb) {
    for (pf_acc += n_pf; pf_acc >= steps; pf_acc -= steps) hwy::Prefetch(pf[pf_i++]);
    const double* HWY_RESTRICT qb = qt + jb * int64_t(kDotHeads * kParts);
    const double* HWY_RESTRICT kb = kt + jb * int64_t(kDotKeys * kParts);
    // q's head tiles stream from L2 (all of q does not fit in L1 beside the key block): fetch a
    // few steps ahead (past the end of a tile this touches the next tile, or harmless memory).
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(qb + kQAhead * int64_t(kDotHeads * kParts));
    for (size_t b = 0; b < kDotHeads * kParts * sizeof(double); b += 64) hwy::Prefetch(reinterpret_cast<const char*>(ahead + b));
    for (size_t a = 0; a < A; ++a) {
      VF64 kv[kDotKeys];
      if constexpr (kDecode && kDecodeInTile) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        for (size_t k = 0; k < kDotKeys; ++k) {
          kv[k] = Bf16x8Vec(src[k] + jb * int64_t(kParts));
          hn::Store(kv[k], d, const_cast<double*>(kb) + k * kParts);
        }
#endif
      } else {
        for (size_t k = 0; k < kDotKeys; ++k) kv[k] = hn::Load(d, kb + k * kParts + a * N);
      }
      for (size_t h = 0; h < kDotHeads; ++h) {
        const VF64 qv = hn::Load(d, qb + h * kParts + a * N);
        for (size_t k = 0; k < kDotKeys; ++k) acc[h][k][a] = hn::MulAdd(qv, kv[k], acc[h][k][a]);
      }
    }
  }
  static_assert(kDotKeys % 2 == 0, "the folds take the keys two by two");
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  static_assert(kDotHeads == 4, "Fold8 folds 4 heads x 2 keys");
  // Per pair of keys (k, k + 1), the 8 dots ordered so that Fold8's lanes are heads 0-3 of key k,
  // then of key k + 1: two 4-lane stores, one per key.
  const __m512d sv = _mm512_set1_pd(scale);
  for (size_t k = 0; k < kDotKeys; k += 2) {
    const __m512d v[8] = {acc[0][k][0].raw,     acc[2][k][0].raw, acc[0][k + 1][0].raw, acc[2][k + 1][0].raw,
                          acc[1][k][0].raw,     acc[3][k][0].raw, acc[1][k + 1][0].raw, acc[3][k + 1][0].raw};
    const __m512d r = _mm512_mul_pd(Fold8(v), sv);
    _mm256_storeu_pd(out + int64_t(k) * out_stride, _mm512_castpd512_pd256(r));
    _mm256_storeu_pd(out + int64_t(k + 1) * out_stride, _mm512_extractf64x4_pd(r, 1));
  }
#else
  for (size_t h = 0; h < kDotHeads; ++h)
    for (size_t k = 0; k < kDotKeys; k += 2) {
      double dx, dy;
      FoldPair(acc[h][k], acc[h][k + 1], dx, dy);
      out[int64_t(k) * out_stride + int64_t(h)] = dx * scale;
      out[int64_t(k + 1) * out_stride + int64_t(h)] = dy * scale;
    }
#endif
}

// acc[h][0 .. kVecs * N) = fma(p[i * ps + h], V_i[vc0 + same columns], acc) for i ascending in [0, rn):
// p points at the tile's first head in key-major P (ps doubles per key), V_i is row i of a
// row-major slice buffer (row i at base + i * cols, cols >= vc0 + kVecs * N), acc[h] points at the
// tile's first column. kVecs = kPVVecs but in the last, narrower slice.
// kDecode (AVX3 only, vc0 = 0): V is not read from base but decoded from the bf16 rows src[i]
// (pointing at the slice's first column) as the tile goes, and stored into base for the following
// tiles: the first head tile of a slice hides the decode among its FMAs.
template <size_t kHeads, size_t kVecs, bool kDecode = false>
HWY_INLINE void PVTile(const double* HWY_RESTRICT p, int64_t ps, const double* HWY_RESTRICT base, int64_t cols,
                       int64_t vc0, int64_t rn, double* const* HWY_RESTRICT acc,
                       const uint16_t* const* HWY_RESTRICT src = nullptr) {
  (void)src;  // read only by the kDecode tile on AVX3
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
#if HWY_NATIVE_FMA
  // No lambdas or helpers that take the accumulators by reference: GCC then keeps them in memory.
  VF64 a[kHeads][kVecs];
  for (size_t h = 0; h < kHeads; ++h)
    for (size_t u = 0; u < kVecs; ++u) a[h][u] = hn::Load(d, acc[h] + int64_t(u) * N);
  for (int64_t i = 0; i < rn; ++i) {
    const double* HWY_RESTRICT vrow = base + i * cols + vc0;
    VF64 vv[kVecs];
    if constexpr (kDecode && kDecodeInTile) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      for (size_t u = 0; u < kVecs; ++u) {
        vv[u] = Bf16x8Vec(src[i] + int64_t(u) * N);
        hn::Store(vv[u], d, const_cast<double*>(vrow) + int64_t(u) * N);
      }
#endif
    } else {
      for (size_t u = 0; u < kVecs; ++u) vv[u] = hn::Load(d, vrow + int64_t(u) * N);
    }
    const double* HWY_RESTRICT pi = p + i * ps;  // the tile's heads of row i
    for (size_t h = 0; h < kHeads; ++h) {
      const VF64 pb = hn::Set(d, pi[h]);
      for (size_t u = 0; u < kVecs; ++u) a[h][u] = hn::MulAdd(pb, vv[u], a[h][u]);
    }
  }
  for (size_t h = 0; h < kHeads; ++h)
    for (size_t u = 0; u < kVecs; ++u) hn::Store(a[h][u], d, acc[h] + int64_t(u) * N);
#else
  // No fused multiply-add instruction on this target: Highway's MulAdd would round twice.
  for (size_t h = 0; h < kHeads; ++h)
    for (int64_t i = 0; i < rn; ++i) {
      const double* vrow = base + i * cols + vc0;
      for (int64_t c = 0; c < int64_t(kVecs) * N; ++c) {
        double& y = acc[h][c];
        y = std::fma(p[i * ps + int64_t(h)], vrow[c], y);
      }
    }
#endif
}

// Every head tile over one slice of columns: acc[h][c0, c0 + kVecs N) += sum over rows [0, rn) of
// P[r0 + i][h] * V_i[vc0 + (0, kVecs N)] (P key-major, ps doubles per key), V_i in a row-major
// slice buffer. With src (AVX3, a full first head tile, vc0 = 0), that tile first decodes V_i
// from the bf16 rows src[i] into base.
template <size_t kVecs>
HWY_INLINE void PVHeads(const double* pbuf, int64_t ps, int64_t r0, int64_t h_q, const double* base,
                        int64_t cols, int64_t vc0, int64_t rn, int64_t c0, int64_t dvp, double* acc,
                        const uint16_t* const* src = nullptr) {
  const double* p = pbuf + r0 * ps;
  int64_t h = 0;
  for (; h + int64_t(kPVHeads) <= h_q; h += int64_t(kPVHeads)) {
    double* as[kPVHeads];
    for (size_t e = 0; e < kPVHeads; ++e) as[e] = acc + (h + int64_t(e)) * dvp + c0;
    if (h == 0 && src)
      PVTile<kPVHeads, kVecs, true>(p + h, ps, base, cols, 0, rn, as, src);
    else
      PVTile<kPVHeads, kVecs>(p + h, ps, base, cols, vc0, rn, as);
  }
  for (; h < h_q; ++h) {
    double* as[1] = {acc + h * dvp + c0};
    PVTile<1, kVecs>(p + h, ps, base, cols, vc0, rn, as);
  }
}

// Rows per P.V sub-chunk (at least one): such that one slice of V (sub x cw doubles) and the P of
// those rows (sub x ps doubles, ps per key) stay in L1 while every head tile passes over them. The
// accumulators go through memory between sub-chunks; ref's order is per element, i ascending, so
// this changes no bit.
HWY_INLINE int64_t PVSubRows(int64_t ps, int64_t cw) {
  const int64_t fit = int64_t(kPVL1Bytes) / (int64_t(sizeof(double)) * (cw + ps));
  return std::max<int64_t>(1, fit);
}

// acc[h][0, dvp) += P.V over the n rows rows[0, n) (dvp = d_v padded to 8, the accumulator row
// stride; P key-major, ps doubles per key; V_i the first d_v columns of kv row rows[i]; the
// backward's dq passes dS and all d_qk columns, with a clock that is off). V is gathered again
// from kv: per sub-chunk of rows and slice of columns, the slice is decoded into an L1 buffer
// (row-major, cw columns) that every head tile then reads; the next sub-chunk's lines of the same columns are prefetched into L2 meanwhile.
// Measured and dropped: slices outermost (one slice's accumulators stay in L1, but each row's V
// lines are then fetched at 16 different times: 7% slower); slice-major accumulators (no 4 KiB
// head stride), sub-chunks of 36-44 KiB, prefetching the next tile's accumulators or V rows into
// L1 (all neutral).
HWY_INLINE void PVFromRows(const double* pbuf, int64_t ps, int64_t h_q, const uint16_t* kv, int64_t d_qk,
                           int64_t d_v, const int64_t* rows, int64_t n, int64_t dvp, double* slice,
                           double* acc, detail::PhaseClock& clk, AttentionPhases& ph) {
  const int64_t N = int64_t(hn::Lanes(DF64()));
  const int64_t cw = int64_t(kPVVecs) * N;
  const int64_t sub = PVSubRows(ps, cw);
  std::vector<const uint16_t*> src;  // the sub-chunk's kv rows at the slice's first column
  for (int64_t s0 = 0; s0 < n; s0 += sub) {
    const int64_t sn = std::min(sub, n - s0);
    const int64_t next_end = std::min(n, s0 + sub + sub);
    src.resize(size_t(sn));
    for (int64_t c0 = 0; c0 < dvp; c0 += cw) {
      const int64_t w = std::min(cw, dvp - c0), cn = std::min(w, d_v - c0);  // slice width, data columns
      // Lines of the next sub-chunk's rows that hold columns [c0, c0 + cn) (32 bf16 per line).
      for (int64_t i = s0 + sub; i < next_end; ++i) {
        const char* row = reinterpret_cast<const char*>(kv + rows[i] * d_qk);
        for (int64_t b = (c0 * 2) / 64 * 64; b < (c0 + cn) * 2; b += 64) PrefetchL2(row + b);
      }
      if (kDecodeInTile && !clk.on && cn == cw && h_q >= int64_t(kPVHeads)) {
        // The first head tile decodes the slice as it goes (not when profiling: see pass 1).
        for (int64_t i = 0; i < sn; ++i) src[size_t(i)] = kv + rows[s0 + i] * d_qk + c0;
        PVHeads<kPVVecs>(pbuf, ps, s0, h_q, slice, cw, 0, sn, c0, dvp, acc, src.data());
        clk.lap(&ph.pv_tiles);
        continue;
      }
      for (int64_t i = 0; i < sn; ++i)
        DecodeBf16Blocks(kv + rows[s0 + i] * d_qk + c0, cn, w, int64_t(kParts), slice + i * w);
      clk.lap(&ph.v_gather);
      if (w == cw) {
        PVHeads<kPVVecs>(pbuf, ps, s0, h_q, slice, w, 0, sn, c0, dvp, acc);
      } else {  // the last, narrower slice: one vector of columns at a time (columns are independent)
        for (int64_t u = 0; u < w / N; ++u)
          PVHeads<1>(pbuf, ps, s0, h_q, slice, w, u * N, sn, c0 + u * N, dvp, acc);
      }
      clk.lap(&ph.pv_tiles);
    }
  }
}

// Pass 2 for kV vectors of heads side by side (independent chains, so the exps of both overlap):
// per lane, ref's loop for its head, i ascending: the maximum m (from -inf, x replaces m where
// m < x, as std::max(m, x)), then p = exp_portable(p - m) stored back and summed into l.
// p, mx and l are vector-aligned (hs a multiple of 8 from an aligned buffer).
template <size_t kV>
HWY_INLINE void SoftmaxStats(double* HWY_RESTRICT p, int64_t hs, int64_t n, double* HWY_RESTRICT mx,
                             double* HWY_RESTRICT l) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  VF64 mv[kV], sv[kV];
  for (size_t u = 0; u < kV; ++u) mv[u] = hn::Set(d, -std::numeric_limits<double>::infinity());
  for (int64_t i = 0; i < n; ++i)
    for (size_t u = 0; u < kV; ++u) {
      const VF64 x = hn::Load(d, p + i * hs + int64_t(u) * N);
      mv[u] = hn::IfThenElse(hn::Lt(mv[u], x), x, mv[u]);
    }
  for (size_t u = 0; u < kV; ++u) sv[u] = hn::Zero(d);
  for (int64_t i = 0; i < n; ++i)
    for (size_t u = 0; u < kV; ++u) {
      double* pi = p + i * hs + int64_t(u) * N;
      const VF64 e = ExpPortable(d, hn::Sub(hn::Load(d, pi), mv[u]));
      hn::Store(e, d, pi);
      sv[u] = hn::Add(sv[u], e);
    }
  for (size_t u = 0; u < kV; ++u) {
    hn::Store(mv[u], d, mx + int64_t(u) * N);
    hn::Store(sv[u], d, l + int64_t(u) * N);
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
