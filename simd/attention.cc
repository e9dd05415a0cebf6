// indexshare simd/: sparse and dense attention with ref/attention.cc's semantics, operation for
// operation, so the outputs equal ref's bit for bit on every target.
//
// Per query row t (OpenMP splits over chunks of rows only, so the thread count never changes a bit):
//   rows     the valid kv rows, sorted ascending, duplicates kept (exactly ref's list; a radix
//            sort for long lists)
//   pass 1   P[h][i] = (q[t,h,:] . k_i) * sm_scale with lanes over d: the accumulator lanes of
//            one dot are ref's 8 parts (lane l of accumulator a holds part a * N + l, N lanes per
//            vector, 8 / N accumulators), each part summing d ascending with MulAdd (bf16 x bf16
//            products are exact in double, so fused or not rounds like ref's add); the parts are
//            then folded in ref's tree (on AVX3 eight dots at once). A tile of kDotHeads heads x
//            kDotKeys keys is computed at once from q (decoded once per row) and a block of
//            gathered, decoded kv rows. P is kept key-major: P[i][h], the heads of a key side by side.
//   pass 2   lanes over heads, each lane performing ref's loop for its head: the maximum (from
//            -inf, i ascending, as std::max), exp_portable (simd/exp-inl.h) and the sum l
//            (i ascending); then lse = m + log(l) and the sink factor per head
//   pass 3   out = sum_i p_i * V_i, lanes over d_v columns, i ascending, one fused multiply-add
//            per term as ref's std::fma (targets without FMA instructions call std::fma per lane);
//            V is gathered and decoded a slice of columns x a sub-chunk of rows at a time into L1,
//            where every head tile reads it
//   output   out = f32(acc * factor) and its bf16 (ref's f32_to_bf16 lane by lane), per row

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
// kv rows are prefetched this many rows ahead of the row being decoded (about one key block of
// pass 1's work, several hundred cycles per row).
constexpr int64_t kPrefetchRows = int64_t(kDotKeys);

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

// Prefetches the first `bytes` of kv row `row` (a row of the next block, while the present one is
// decoded or computed: gathered rows defeat the hardware prefetcher).
HWY_INLINE void PrefetchRow(const uint16_t* kv, int64_t d_qk, int64_t row, int64_t bytes) {
  const char* p = reinterpret_cast<const char*>(kv + row * d_qk);
  for (int64_t b = 0; b < bytes; b += 64) hwy::Prefetch(p + b);
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

// Rows rows[from, to) of kv, their first `cols` columns, decoded into the key-block layout with
// `pad_cols` columns (zeros past `cols`), list position i at KeyBlockAt(base, pad_cols, i - from);
// the rows kPrefetchRows ahead are prefetched as each row is decoded.
HWY_INLINE void DecodeRows(const uint16_t* kv, int64_t d_qk, const std::vector<int64_t>& rows,
                           int64_t from, int64_t to, int64_t cols, int64_t pad_cols, double* base) {
  const int64_t n = int64_t(rows.size());
  for (int64_t i = from; i < to; ++i) {
    if (i + kPrefetchRows < n) PrefetchRow(kv, d_qk, rows[size_t(i + kPrefetchRows)], cols * 2);
    DecodeBf16Blocks(kv + rows[size_t(i)] * d_qk, cols, pad_cols, int64_t(kDotKeys * kParts),
                     KeyBlockAt(base, pad_cols, i - from));
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

// acc[h][0, dvp) += P.V over all n rows, V gathered again from kv: per sub-chunk of rows and slice
// of columns, the slice is decoded into an L1 buffer (row-major, cw columns) that every head tile
// then reads; the next sub-chunk's lines of the same columns are prefetched into L2 meanwhile.
// Measured and dropped: slices outermost (one slice's accumulators stay in L1, but each row's V
// lines are then fetched at 16 different times: 7% slower); slice-major accumulators (no 4 KiB
// head stride), sub-chunks of 36-44 KiB, prefetching the next tile's accumulators or V rows into
// L1 (all neutral).
HWY_INLINE void PVFromRows(const double* pbuf, int64_t ps, int64_t h_q, const uint16_t* kv, int64_t d_qk,
                           int64_t d_v, const std::vector<int64_t>& rows, int64_t dvp, double* slice,
                           double* acc, detail::PhaseClock& clk, AttentionPhases& ph) {
  const int64_t N = int64_t(hn::Lanes(DF64()));
  const int64_t cw = int64_t(kPVVecs) * N;
  const int64_t sub = PVSubRows(ps, cw);
  const int64_t n = int64_t(rows.size());
  std::vector<const uint16_t*> src;  // the sub-chunk's kv rows at the slice's first column
  for (int64_t s0 = 0; s0 < n; s0 += sub) {
    const int64_t sn = std::min(sub, n - s0);
    const int64_t next_end = std::min(n, s0 + sub + sub);
    src.resize(size_t(sn));
    for (int64_t c0 = 0; c0 < dvp; c0 += cw) {
      const int64_t w = std::min(cw, dvp - c0), cn = std::min(w, d_v - c0);  // slice width, data columns
      // Lines of the next sub-chunk's rows that hold columns [c0, c0 + cn) (32 bf16 per line).
      for (int64_t i = s0 + sub; i < next_end; ++i) {
        const char* row = reinterpret_cast<const char*>(kv + rows[size_t(i)] * d_qk);
        for (int64_t b = (c0 * 2) / 64 * 64; b < (c0 + cn) * 2; b += 64) PrefetchL2(row + b);
      }
      if (kDecodeInTile && !clk.on && cn == cw && h_q >= int64_t(kPVHeads)) {
        // The first head tile decodes the slice as it goes (not when profiling: see pass 1).
        for (int64_t i = 0; i < sn; ++i) src[size_t(i)] = kv + rows[size_t(s0 + i)] * d_qk + c0;
        PVHeads<kPVVecs>(pbuf, ps, s0, h_q, slice, cw, 0, sn, c0, dvp, acc, src.data());
        clk.lap(&ph.pv_tiles);
        continue;
      }
      for (int64_t i = 0; i < sn; ++i)
        DecodeBf16Blocks(kv + rows[size_t(s0 + i)] * d_qk + c0, cn, w, int64_t(kParts), slice + i * w);
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

// dst[i] = f32_to_bf16(src[i]).bits for i < n: ref's rounding (to nearest, ties to even, on the
// bits; NaN -> quiet NaN with the sign kept), lane by lane on 32-bit integers.
HWY_INLINE void F32ToBf16(const float* HWY_RESTRICT src, uint16_t* HWY_RESTRICT dst, int64_t n) {
  const hn::ScalableTag<int32_t> di;
  const hn::RebindToUnsigned<decltype(di)> du;
  const hn::Rebind<uint16_t, decltype(di)> d16;
  const int64_t N = int64_t(hn::Lanes(di));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto u = hn::LoadU(di, reinterpret_cast<const int32_t*>(src + i));
    const auto hi = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, u)));  // u >> 16, logical
    const auto is_nan = hn::Gt(hn::And(u, hn::Set(di, 0x7FFFFFFF)), hn::Set(di, 0x7F800000));
    const auto lsb = hn::And(hi, hn::Set(di, 1));
    const auto rounded = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, hn::Add(hn::Add(u, hn::Set(di, 0x7FFF)), lsb))));
    const auto nan = hn::Or(hn::And(hi, hn::Set(di, 0x8000)), hn::Set(di, 0x7FC0));
    hn::StoreU(hn::DemoteTo(d16, hn::IfThenElse(is_nan, nan, rounded)), d16, dst + i);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]).bits;
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

// Pass 2 for kV vectors of heads side by side (independent chains, so the exps of both overlap):
// per lane, ref's loop for its head, i ascending: the maximum m (from -inf, x replaces m where
// m < x, as std::max(m, x)), then p = exp_portable(p - m) stored back and summed into l.
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

// The kv rows query row t attends: its window [ks, ke) (dense), or its valid indices (topk_length
// slots; -1 and out-of-range ones skipped) sorted ascending, duplicates kept (sparse).
HWY_INLINE void AttentionRows(const detail::AttentionView& v, int64_t t, std::vector<int64_t>& rows,
                              std::vector<int64_t>& sort_tmp) {
  rows.clear();
  if (v.dense) {
    for (int64_t i = v.ks[t]; i < v.ke[t]; ++i) rows.push_back(i);
  } else {
    const int64_t len = v.topk_length ? v.topk_length[t] : v.topk;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = v.indices[t * v.topk + j];
      if (0 <= i && i < v.s_kv) rows.push_back(i);
    }
    SortRows(rows, v.s_kv, sort_tmp);
  }
}

// Pass 2 of query row t: the softmax statistics (SoftmaxStats: max and sum per head, lanes over
// heads, two vectors at a time; P [n keys][hs] becomes exp(p - m)), then per head lse, max_logits
// and the output's factor 1 / l (times the sink's 1 / (1 + exp(sink - lse))). mx, l: scratch of hs
// doubles.
HWY_INLINE void AttentionSoftmax(const detail::AttentionView& v, int64_t t, double* P, int64_t hs, int64_t n,
                                 double* mx, double* l, double* factor, float* lse_out, float* max_out) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = v.h_q;
  {
    int64_t h0 = 0;
    for (; h0 + 2 * N <= hs; h0 += 2 * N) SoftmaxStats<2>(P + h0, hs, n, mx + h0, l + h0);
    for (; h0 < hs; h0 += N) SoftmaxStats<1>(P + h0, hs, n, mx + h0, l + h0);
  }
  for (int64_t h = 0; h < h_q; ++h) {
    const double lse = mx[h] + std::log(l[h]);
    double f = 1.0 / l[h];
    if (v.sink) f *= 1.0 / (1.0 + indexshare::exp_portable(double(v.sink[h]) - lse));
    factor[size_t(h)] = f;
    lse_out[t * h_q + h] = float(lse);
    max_out[t * h_q + h] = float(mx[h]);
  }
}

// Query row t without keys (a lonely query, FlashMLA HEAD convention): out 0, lse +inf, max_logits
// -inf.
HWY_INLINE void StoreEmptyRow(const detail::AttentionView& v, int64_t t, float* out, uint16_t* out_bf16, float* lse_out,
                              float* max_out) {
  const int64_t h_q = v.h_q, d_v = v.d_v;
  std::fill(out + t * h_q * d_v, out + (t + 1) * h_q * d_v, 0.0f);
  std::fill(out_bf16 + t * h_q * d_v, out_bf16 + (t + 1) * h_q * d_v, uint16_t{0});
  for (int64_t h = 0; h < h_q; ++h) {
    lse_out[t * h_q + h] = std::numeric_limits<float>::infinity();
    max_out[t * h_q + h] = -std::numeric_limits<float>::infinity();
  }
}

// The outputs of query row t from acc [h_q][dvp]: out = f32(acc * factor) (one rounding, as ref),
// and its bf16.
HWY_INLINE void StoreAttentionRow(const detail::AttentionView& v, int64_t t, const double* acc, int64_t dvp,
                                  const double* factor, float* out, uint16_t* out_bf16) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = v.h_q, d_v = v.d_v;
  for (int64_t h = 0; h < h_q; ++h) {
    float* o = out + (t * h_q + h) * d_v;
    uint16_t* ob = out_bf16 + (t * h_q + h) * d_v;
    const double* a = acc + h * dvp;
    const hn::Rebind<float, DF64> df32;
    const VF64 fv = hn::Set(d, factor[size_t(h)]);
    int64_t c = 0;
    for (; c + N <= d_v; c += N) hn::StoreU(hn::DemoteTo(df32, hn::Mul(hn::Load(d, a + c), fv)), df32, o + c);
    for (; c < d_v; ++c) o[c] = float(a[c] * factor[size_t(h)]);
    F32ToBf16(o, ob, d_v);
  }
}

// Query rows [t0, t1), all heads, with this call's own scratch. No OpenMP in here: the caller
// (the HWY_ONCE part) splits the rows into chunks across threads. An OpenMP region inside a target
// function is outlined by the compiler into a function that need not carry the target's
// instruction set (clang 14 then fails to select SSE4.1 roundpd).
void AttentionChunk(const detail::AttentionView& v, int64_t t0, int64_t t1, float* out, uint16_t* out_bf16,
                    float* lse_out, float* max_out, AttentionPhases* phases) {
  AttentionPhases ph;
  double other = 0;  // row lists, accumulator reset, output: total minus the named phases
  detail::PhaseClock clk;
  clk.on = phases != nullptr;
  clk.start();
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = v.h_q, d_qk = v.d_qk, d_v = v.d_v;
  const int64_t kb = int64_t(kDotKeys);
  const int64_t dpad = (d_qk + int64_t(kParts) - 1) / int64_t(kParts) * int64_t(kParts);
  const int64_t hpad = (h_q + int64_t(kDotHeads) - 1) / int64_t(kDotHeads) * int64_t(kDotHeads);
  const int64_t q_tile = int64_t(kDotHeads) * dpad;  // doubles per head tile of q
  // P is key-major, hs doubles per key (h_q rounded up to whole 8-lane groups: softmax runs with
  // lanes over heads). Pass 1 never writes the heads past hpad: zero when pbuf is allocated, then
  // whatever finite values softmax leaves there; no output reads them.
  const int64_t hs = (h_q + int64_t(kParts) - 1) / int64_t(kParts) * int64_t(kParts);
  const int64_t cw = int64_t(kPVVecs) * N;  // columns per P.V tile
  // d_v padded to whole 8-column groups (every lane count divides 8): the last P.V slice may be
  // narrower than cw (d_v 40 = one slice of 32 + one of 8 on AVX3, no padded FMAs).
  const int64_t dvp = (d_v + int64_t(kParts) - 1) / int64_t(kParts) * int64_t(kParts);

  auto qd = hwy::AllocateAligned<double>(size_t(hpad * dpad));
  auto slice = hwy::AllocateAligned<double>(size_t(PVSubRows(hs, cw) * cw));  // PVFromRows' slice of V
  auto acc = hwy::AllocateAligned<double>(size_t(h_q * dvp));
  auto kbuf = hwy::AllocateAligned<double>(size_t(kb * dpad));  // one key block, pass 1's layout
  hwy::AlignedFreeUniquePtr<double[]> pbuf;
  int64_t pbuf_size = 0;
  std::vector<int64_t> rows, sort_tmp;
  std::vector<const char*> pf_lines(size_t(kb * ((d_qk * 2 + 63) / 64)));  // next block's kv lines
  std::vector<double> factor(static_cast<size_t>(h_q));
  auto l = hwy::AllocateAligned<double>(size_t(hs)), mx = hwy::AllocateAligned<double>(size_t(hs));
  std::fill(qd.get(), qd.get() + hpad * dpad, 0.0);  // padding heads stay zero

  for (int64_t t = t0; t < t1; ++t) {
    AttentionRows(v, t, rows, sort_tmp);
    const int64_t n = int64_t(rows.size());
    if (n == 0) {  // lonely query: FlashMLA HEAD convention
      StoreEmptyRow(v, t, out, out_bf16, lse_out, max_out);
      continue;
    }
    const int64_t n_pad = (n + kb - 1) / kb * kb;
    if (hs * n_pad > pbuf_size) {
      pbuf_size = hs * n_pad;
      pbuf = hwy::AllocateAligned<double>(size_t(pbuf_size));
      std::fill(pbuf.get(), pbuf.get() + pbuf_size, 0.0);
    }
    clk.lap(&other);
    // Pass 1: P[h][i] = (q[t,h,:] . kv[rows[i]]) * sm_scale. q is decoded once per row into
    // head tiles, kv rows a key block at a time, both interleaved (see DotTile).
    for (int64_t h = 0; h < h_q; ++h)
      DecodeBf16Blocks(v.q + (t * h_q + h) * d_qk, d_qk, dpad, int64_t(kDotHeads * kParts),
                       qd.get() + (h / int64_t(kDotHeads)) * q_tile + (h % int64_t(kDotHeads)) * int64_t(kParts));
    clk.lap(&ph.q_decode);
    for (int64_t i = 0; i < std::min(n, kPrefetchRows); ++i) PrefetchRow(v.kv, d_qk, rows[size_t(i)], d_qk * 2);
    // The next query row's q is fetched into L2 a few lines per key block, so that its decode
    // does not wait on memory.
    const char* q_next = t + 1 < t1 ? reinterpret_cast<const char*>(v.q + (t + 1) * h_q * d_qk) : nullptr;
    const int64_t q_bytes = h_q * d_qk * 2;
    const int64_t q_step = ((q_bytes + 63) / 64 + n_pad / kb - 1) / (n_pad / kb) * 64;  // bytes per block
    for (int64_t i0 = 0; i0 < n; i0 += kb) {
      const int64_t bn = std::min(kb, n - i0);
      double* blk = kbuf.get();
      if (q_next)
        for (int64_t b = (i0 / kb) * q_step; b < std::min(q_bytes, (i0 / kb + 1) * q_step); b += 64)
          PrefetchL2(q_next + b);
      // Whole blocks decode inside the first head tile, except when profiling (the phases then
      // time the decode and the tiles apart, on the same operations). The head tiles run in
      // alternating order from block to block (the last tile's q is still in L1 for the next
      // block's first), and the lines of the next block's rows are prefetched spread over the
      // tiles that do not decode (over the one tile when there is one).
      if (kDecodeInTile && !clk.on && bn == kb && d_qk % int64_t(kParts) == 0) {
        const uint16_t* src[kDotKeys];
        for (int64_t k = 0; k < kb; ++k) src[k] = v.kv + rows[size_t(i0 + k)] * d_qk;
        int64_t n_pf = 0;
        for (int64_t k = i0 + kb; k < std::min(n, i0 + 2 * kb); ++k)
          for (int64_t b = 0; b < d_qk * 2; b += 64)
            pf_lines[size_t(n_pf++)] = reinterpret_cast<const char*>(v.kv + rows[size_t(k)] * d_qk) + b;
        const int64_t tiles = hpad / int64_t(kDotHeads);
        const bool reverse = (i0 / kb) % 2 == 1;
        for (int64_t j = 0; j < tiles; ++j) {
          const int64_t h0 = (reverse ? tiles - 1 - j : j) * int64_t(kDotHeads);
          const double* qh = qd.get() + (h0 / int64_t(kDotHeads)) * q_tile;
          double* o = pbuf.get() + i0 * hs + h0;
          if (j == 0) {
            DotTile<true>(qh, blk, dpad, v.sm_scale, o, hs, src, pf_lines.data(), tiles == 1 ? n_pf : 0);
          } else {
            const int64_t l0 = (j - 1) * n_pf / (tiles - 1), l1 = j * n_pf / (tiles - 1);
            DotTile(qh, blk, dpad, v.sm_scale, o, hs, nullptr, pf_lines.data() + l0, l1 - l0);
          }
        }
        continue;
      }
      DecodeRows(v.kv, d_qk, rows, i0, i0 + bn, d_qk, dpad, blk);
      for (int64_t i = bn; i < kb; ++i)  // padding keys of the last block: zeros
        DecodeBf16Blocks(nullptr, 0, dpad, kb * int64_t(kParts), KeyBlockAt(blk, dpad, i));
      clk.lap(&ph.k_gather);
      for (int64_t h0 = 0; h0 < hpad; h0 += int64_t(kDotHeads))
        DotTile(qd.get() + (h0 / int64_t(kDotHeads)) * q_tile, blk, dpad, v.sm_scale,
                pbuf.get() + i0 * hs + h0, hs);
      clk.lap(&ph.qk_tiles);
    }
    // Pass 2: softmax statistics, lanes over heads (SoftmaxStats), two vectors of heads at a time.
    AttentionSoftmax(v, t, pbuf.get(), hs, n, mx.get(), l.get(), factor.data(), lse_out, max_out);
    clk.lap(&ph.softmax);
    // Pass 3: acc[h][c] = sum_i p[h][i] * V[rows[i]][c], rows ascending, fused; the rows are
    // gathered and decoded again (in L1-sized slices).
    std::fill(acc.get(), acc.get() + h_q * dvp, 0.0);
    clk.lap(&other);
    PVFromRows(pbuf.get(), hs, h_q, v.kv, d_qk, d_v, rows, dvp, slice.get(), acc.get(), clk, ph);
    StoreAttentionRow(v, t, acc.get(), dvp, factor.data(), out, out_bf16);
  }
  clk.lap(&other);
  if (phases) {
    ph.total = ph.qk_tiles + ph.pv_tiles + ph.k_gather + ph.v_gather + ph.q_decode + ph.softmax + other;
    *phases = ph;
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace indexshare::simd {

HWY_EXPORT(AttentionChunk);
HWY_EXPORT(ExpArray);

void exp_portable(const double* x, double* y, int64_t n) { HWY_DYNAMIC_DISPATCH(ExpArray)(x, y, n); }

AttentionPhases& AttentionPhases::operator+=(const AttentionPhases& o) {
  qk_tiles += o.qk_tiles, pv_tiles += o.pv_tiles, k_gather += o.k_gather, v_gather += o.v_gather;
  q_decode += o.q_decode, softmax += o.softmax, total += o.total;
  return *this;
}

namespace {

AttentionOut run(const detail::AttentionView& v, AttentionPhases* phases) {
  AttentionOut o{Tensor<float>({v.s_q, v.h_q, v.d_v}), Tensor<bf16_t>({v.s_q, v.h_q, v.d_v}),
                 Tensor<float>({v.s_q, v.h_q}), Tensor<float>({v.s_q, v.h_q})};
  // Chunks of up to 8 query rows over the threads (independent outputs, so neither the thread
  // count nor the chunk size changes a bit); each chunk allocates its scratch once. Small s_q gets
  // smaller chunks so that every thread has some.
  const int64_t kChunkRows = detail::chunk_rows(v.s_q, 8, omp_get_max_threads());
  const int64_t chunks = (v.s_q + kChunkRows - 1) / kChunkRows;
  std::vector<AttentionPhases> chunk_phases(phases ? size_t(chunks) : 0);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c)
    HWY_DYNAMIC_DISPATCH(AttentionChunk)(v, c * kChunkRows, std::min(v.s_q, (c + 1) * kChunkRows), o.out.ptr(),
                                         reinterpret_cast<uint16_t*>(o.out_bf16.ptr()), o.lse.ptr(),
                                         o.max_logits.ptr(), phases ? &chunk_phases[size_t(c)] : nullptr);
  if (phases) {
    *phases = AttentionPhases{};
    for (const AttentionPhases& cp : chunk_phases) *phases += cp;
  }
  return o;
}

}  // namespace

AttentionOut sparse_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                              const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                              const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink,
                              AttentionPhases* phases) {
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
  return run(detail::sparse_view(q, kv, indices, sm_scale, d_v, topk_length, attn_sink), phases);
}

AttentionOut dense_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                             int64_t d_v, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                             const Tensor<float>* attn_sink, AttentionPhases* phases) {
  ref::check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0), s_kv = kv.dim(0);
  require_shape(ks, {s_q}, "attention ks");
  require_shape(ke, {s_q}, "attention ke");
  for (int64_t t = 0; t < s_q; ++t)
    require(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_kv,
            "attention ks/ke: row " + std::to_string(t) + " bounds outside 0 <= ks <= ke <= s_kv");
  detail::AttentionView v = detail::attention_view(q, kv, sm_scale, d_v, attn_sink);
  v.dense = true;
  v.ks = ks.ptr();
  v.ke = ke.ptr();
  return run(v, phases);
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
